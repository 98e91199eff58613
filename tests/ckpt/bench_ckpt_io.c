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
 * Every tensor piece holds the same pattern, written into each process's
 * buffer before the clock starts, so a load also checks the values it gets
 * (a wrong offset is a mismatch, not a figure). Not a test: built with the
 * checks, run only by the script.
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

/* The value of element e of every tensor piece (filled once, before the
 * clock starts: the figures are the io layer's, not the pattern's). */
static float bench_value(size_t e)
{
    return (float)((e * 2654435761u) % 65521u) / 65521.0f;
}

/* Shard r of R of spec's tensors (kinds k) into dir. */
static int bench_save_shard(const char *dir, int r, int R, const struct fsdp_model_spec *s,
                            const struct fsdp_ckpt_kinds *k, const float *buf)
{
    struct fsdp_ckpt_shard_writer *w;
    FSDP_CHECK(fsdp_ckpt_shard_create(dir, r, R, 1, s, k, &w));
    int rc = 0;
    for (int kind = 0; rc == 0 && kind < k->n; kind++) {
        for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
            size_t row0, rows;
            fsdp_ckpt_rows(s->params[i].shape[0], R, r, &row0, &rows);
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
                if (buf[e] != bench_value(e)) {
                    rc = fsdp_err(FSDP_ERR_FORMAT, "%s: %s element %zu of rank %d's rows is %g",
                                  dir, s->params[i].name, e, r, (double)buf[e]);
                }
            }
        }
    }
    fsdp_ckpt_close(ck);
    return rc;
}

/* Runs one process per shard: each gets its buffer ready (prep), then all
 * run fn at once from *t0 (taken when every one is ready); 0 when all
 * succeeded. */
static int bench_fan_out(int R, int (*fn)(int r, void *arg, float *buf), void *arg,
                         float *(*prep)(void *arg), double *t0)
{
    int ready[2], go[2];
    char c = 0;
    if (pipe(ready) != 0 || pipe(go) != 0) {
        return fsdp_err(FSDP_ERR_IO, "pipe failed");
    }
    for (int r = 0; r < R; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            return fsdp_err(FSDP_ERR_IO, "fork failed");
        }
        if (pid == 0) {
            float *buf = prep(arg);
            int rc = buf ? 0 : fsdp_err(FSDP_ERR_NOMEM, "one tensor");
            if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) {
                _exit(1);
            }
            rc = rc < 0 ? rc : fn(r, arg, buf);
            if (rc < 0) {
                char msg[1024];
                fsdp_err_take(msg, sizeof(msg));
                fprintf(stderr, "bench_ckpt_io: shard %d: %s\n", r, msg);
            }
            _exit(rc < 0 ? 1 : 0);
        }
    }
    for (int r = 0; r < R; r++) {
        if (read(ready[0], &c, 1) != 1) {
            return fsdp_err(FSDP_ERR_IO, "a shard's process did not start");
        }
    }
    *t0 = bench_now();
    for (int r = 0; r < R; r++) {
        if (write(go[1], &c, 1) != 1) {
            return fsdp_err(FSDP_ERR_IO, "pipe failed");
        }
    }
    int bad = 0, st;
    while (wait(&st) > 0) {
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    close(ready[0]);
    close(ready[1]);
    close(go[0]);
    close(go[1]);
    return bad ? fsdp_err(FSDP_ERR_IO, "a shard's process failed") : 0;
}

struct bench_job {
    const char *dir;
    int R;
    const struct fsdp_model_spec *s;
    struct fsdp_ckpt_kinds kinds;
};

/* The largest tensor's buffer, its pattern written (every page touched). */
static float *bench_prep(void *arg)
{
    const struct bench_job *j = arg;
    size_t n = fsdp_model_spec_largest(j->s);
    float *buf = fsdp_alloc(n * sizeof(float));
    for (size_t e = 0; buf && e < n; e++) {
        buf[e] = bench_value(e);
    }
    return buf;
}

static int bench_save_one(int r, void *arg, float *buf)
{
    const struct bench_job *j = arg;
    return bench_save_shard(j->dir, r, j->R, j->s, &j->kinds, buf);
}

static int bench_load_one(int r, void *arg, float *buf)
{
    const struct bench_job *j = arg;
    return bench_load_shard(j->dir, r, j->R, buf);
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
    double bytes = (double)s->total_numel * sizeof(float) * 3.0, t0 = 0;
    rc = fsdp_ckpt_kinds_init(&j.kinds, 2, states);
    if (rc == 0 && strcmp(mode, "save") == 0) {
        rc = bench_fan_out(R, bench_save_one, &j, bench_prep, &t0);
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
        rc = bench_fan_out(R, bench_load_one, &j, bench_prep, &t0);
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
