/*
 * bench_ckpt_io.c - the checkpoint io layer's save and load throughput at a
 * model's shape, without a trainer (so without its memory: a 1B-parameter
 * checkpoint on a machine that could not train one), for
 * tests/peers/run_ckpt_bench.sh.
 *
 *   bench_ckpt_io save PRESET DIR SHARDS   writes DIR (a step directory) as
 *       SHARDS processes would in a save, one shard file each (the same
 *       writer calls: create, put every tensor of every kind, commit with its
 *       fsync), then index.h5; prints bytes and seconds of the shards alone
 *       and with the index
 *   bench_ckpt_io load PRESET DIR SHARDS   reads DIR back as a resume on
 *       SHARDS ranks would: each process opens it lazily and reads its rows
 *       of every tensor of every kind through the checksums
 *
 * Every tensor's rows are a deterministic pattern of the tensor, so a load
 * also checks the values it gets (a wrong offset is a mismatch, not a
 * figure). Not a test: built with the checks, run only by the script.
 */
#include "config.h"
#include "io/ckpt/ckpt.h"
#include "model/model.h"
#include "core/error.h"
#include "core/spec.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The value of element e of rows from row0 of tensor (kind, idx). */
static float bench_value(int kind, size_t idx, size_t row0, size_t cols, size_t e)
{
    size_t g = row0 * cols + e;
    return (float)((g * 2654435761u + idx * 40503u + (size_t)kind * 977u) % 65521u) / 65521.0f;
}

static void bench_fill(float *buf, int kind, size_t idx, size_t row0, size_t rows, size_t cols)
{
    for (size_t e = 0; e < rows * cols; e++) {
        buf[e] = bench_value(kind, idx, row0, cols, e);
    }
}

/* Shard r of R of spec's tensors (kinds k) into dir. */
static int bench_save_shard(const char *dir, int r, int R, const struct fsdp_model_spec *s,
                            const struct fsdp_ckpt_kinds *k, float *buf)
{
    struct fsdp_ckpt_shard_writer *w;
    FSDP_CHECK(fsdp_ckpt_shard_create(dir, r, R, 1, s, k, &w));
    int rc = 0;
    for (int kind = 0; rc == 0 && kind < k->n; kind++) {
        for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
            size_t row0, rows;
            fsdp_ckpt_rows(s->params[i].shape[0], R, r, &row0, &rows);
            bench_fill(buf, kind, i, row0, rows, s->params[i].shape[1]);
            rc = fsdp_ckpt_shard_put(w, kind, i, buf);
        }
    }
    rc = rc < 0 ? rc : fsdp_ckpt_shard_commit(w);
    fsdp_ckpt_shard_destroy(w);
    return rc;
}

/* Shard r's rows of every tensor of the checkpoint at dir, checked. */
static int bench_load_shard(const char *dir, int r, int R, float *buf)
{
    struct fsdp_ckpt *ck;
    FSDP_CHECK(fsdp_ckpt_open_lazy(dir, fsdp_arch_registered(), &ck));
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(ck);
    int rc = 0;
    for (int kind = 0; rc == 0 && kind < fsdp_ckpt_kinds(ck)->n; kind++) {
        for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
            size_t row0, rows, cols = s->params[i].shape[1];
            fsdp_ckpt_rows(s->params[i].shape[0], R, r, &row0, &rows);
            rc = fsdp_ckpt_read_rows(ck, kind, i, row0, rows, buf);
            for (size_t e = 0; rc == 0 && e < rows * cols; e += 4093) {
                if (buf[e] != bench_value(kind, i, row0, cols, e)) {
                    rc = fsdp_err(FSDP_ERR_FORMAT, "%s: %s element %zu of rank %d's rows is %g",
                                  dir, s->params[i].name, e, r, (double)buf[e]);
                }
            }
        }
    }
    fsdp_ckpt_close(ck);
    return rc;
}

/* Runs one process per shard (fn for each r), waits for all: 0 when all succeeded. */
static int bench_fan_out(int R, int (*fn)(int r, void *arg), void *arg)
{
    for (int r = 0; r < R; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            return fsdp_err(FSDP_ERR_IO, "fork failed");
        }
        if (pid == 0) {
            int rc = fn(r, arg);
            if (rc < 0) {
                char msg[1024];
                fsdp_err_take(msg, sizeof(msg));
                fprintf(stderr, "bench_ckpt_io: shard %d: %s\n", r, msg);
            }
            _exit(rc < 0 ? 1 : 0);
        }
    }
    int bad = 0, st;
    while (wait(&st) > 0) {
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    return bad ? fsdp_err(FSDP_ERR_IO, "a shard's process failed") : 0;
}

struct bench_job {
    const char *dir;
    int R;
    const struct fsdp_model_spec *s;
    struct fsdp_ckpt_kinds kinds;
};

static int bench_save_one(int r, void *arg)
{
    const struct bench_job *j = arg;
    float *buf = fsdp_alloc(fsdp_model_spec_largest(j->s) * sizeof(float));
    int rc = buf ? bench_save_shard(j->dir, r, j->R, j->s, &j->kinds, buf)
                 : fsdp_err(FSDP_ERR_NOMEM, "one tensor");
    fsdp_free(buf);
    return rc;
}

static int bench_load_one(int r, void *arg)
{
    const struct bench_job *j = arg;
    float *buf = fsdp_alloc(fsdp_model_spec_largest(j->s) * sizeof(float));
    int rc = buf ? bench_load_shard(j->dir, r, j->R, buf) : fsdp_err(FSDP_ERR_NOMEM, "one tensor");
    fsdp_free(buf);
    return rc;
}

static int bench_run(const char *mode, const char *preset, const char *dir, int R)
{
    const struct fsdp_arch *arch;
    void *cfg;
    struct fsdp_model_spec *s;
    const char *states[2] = {"exp_avg", "exp_avg_sq"};
    FSDP_CHECK(fsdp_model_registry_init());
    FSDP_CHECK(fsdp_arch_preset(preset, &arch, &cfg));
    int rc = arch->spec_create(cfg, &s);
    free(cfg);
    FSDP_CHECK(rc);
    struct bench_job j = {dir, R, s, {0}};
    double bytes = (double)s->total_numel * sizeof(float) * 3.0, t0 = bench_now();
    rc = fsdp_ckpt_kinds_init(&j.kinds, 2, states);
    if (rc == 0 && strcmp(mode, "save") == 0) {
        rc = bench_fan_out(R, bench_save_one, &j);
        double t1 = bench_now();
        struct fsdp_ckpt_meta m = {.step = 1, .world_size = R, .n_shards = R, .loss_scale = 1};
        snprintf(m.mesh, sizeof(m.mesh), "dp=%d", R);
        snprintf(m.backends, sizeof(m.backends), "dp=none");
        rc = rc < 0 ? rc : fsdp_ckpt_index_write(dir, s, &j.kinds, &m);
        double t2 = bench_now();
        printf("save %s: %.0f bytes of tensors in %d shards: shards %.3f s (%.3f GB/s), with "
               "index.h5 %.3f s (%.3f GB/s)\n", preset, bytes, R, t1 - t0, bytes / (t1 - t0) / 1e9,
               t2 - t0, bytes / (t2 - t0) / 1e9);
    } else if (rc == 0) {
        rc = bench_fan_out(R, bench_load_one, &j);
        double t1 = bench_now();
        printf("load %s: %.0f bytes of tensors on %d ranks: %.3f s (%.3f GB/s)\n", preset, bytes,
               R, t1 - t0, bytes / (t1 - t0) / 1e9);
    }
    fsdp_model_spec_destroy(s);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[1], "save") != 0 && strcmp(argv[1], "load") != 0) ||
        atoi(argv[4]) < 1) {
        fprintf(stderr, "usage: bench_ckpt_io save|load PRESET DIR SHARDS\n");
        return 2;
    }
    int rc = bench_run(argv[1], argv[2], argv[3], atoi(argv[4]));
    if (rc < 0) {
        char msg[1024];
        fsdp_err_take(msg, sizeof(msg));
        fprintf(stderr, "bench_ckpt_io: %s\n", msg);
        return 1;
    }
    return 0;
}
