/*
 * test_ckpt_direct.c - the shard writer's direct writes (io/ckpt/ckpt_direct.c),
 * made by its writer threads while the caller fills the next buffer: every
 * one goes through the pwrite that crash_shim wraps (so the crash tests see
 * them), and a failed one, wherever it falls (the first, one in the middle,
 * the last, still in flight when the commit begins), fails the save with
 * the dataset's name and the OS's reason, and leaves no shard file behind.
 * A commit that did not wait for the writes in flight before its fsync
 * would commit a shard with a hole in it: the last case catches that.
 * Then the read-ahead (io/ckpt/ckpt_ahead.c) on the saved shard: every
 * tensor read in file order (the window runs on), in reverse (it moves for
 * each piece) and the middle third of each (pieces that start inside a
 * chunk), at the default request shape and at the smallest and largest,
 * each value compared. A file system without O_DIRECT (tmpfs) skips.
 */
#include "config.h"
#include "core/error.h"
#include "core/spec.h"
#include "io/ckpt/ckpt.h"
#include "io/util/fileutil.h"
#include "model/model.h"
#include "tests/ckpt/crash_shim.h"
#include "tests/tap.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One shard (of one) of every tensor of every kind into dir; 0, or the
 * error's message in msg. */
static int save(const char *dir, const struct fsdp_model_spec *s, const struct fsdp_ckpt_kinds *k,
                const float *buf, char *msg, size_t len)
{
    struct fsdp_ckpt_shard_writer *w = NULL;
    int rc = mkdir(dir, 0755) == 0 ? 0 : fsdp_err(FSDP_ERR_IO, "%s: mkdir failed", dir);
    rc = rc < 0 ? rc : fsdp_ckpt_shard_create(dir, 0, 1, 1, s, k, &w);
    for (int kind = 0; rc == 0 && kind < k->n; kind++) {
        for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
            rc = fsdp_ckpt_shard_put(w, kind, i, buf);
        }
    }
    rc = rc < 0 ? rc : fsdp_ckpt_shard_commit(w);
    fsdp_ckpt_shard_destroy(w);
    msg[0] = '\0';
    if (rc < 0) {
        fsdp_err_take(msg, len);
    }
    return rc;
}

enum order { FORWARD, BACKWARD, MIDDLE };

/* Every tensor of dir's checkpoint (one shard) read in order o, compared
 * with buf; 0, or -1 with the first difference in msg. */
static int read_back(const char *dir, enum order o, const float *buf, float *got, char *msg,
                     size_t len)
{
    struct fsdp_ckpt *ck;
    int rc = fsdp_ckpt_open_lazy(dir, fsdp_arch_registered(), &ck);
    if (rc < 0) {
        fsdp_err_take(msg, len);
        return -1;
    }
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(ck);
    const int nk = fsdp_ckpt_kinds(ck)->n;
    const size_t total = (size_t)nk * s->n_params;
    for (size_t j = 0; rc == 0 && j < total; j++) {
        size_t t = o == BACKWARD ? total - 1 - j : j;
        const struct fsdp_param_spec *p = &s->params[t % s->n_params];
        size_t rows = p->shape[0], cols = p->shape[1], r0 = 0;
        if (o == MIDDLE && rows >= 3) {
            r0 = rows / 3;
            rows = rows / 3;
        }
        rc = fsdp_ckpt_read_rows(ck, (int)(t / s->n_params), t % s->n_params, r0, rows, got);
        if (rc < 0) {
            fsdp_err_take(msg, len);
            break;
        }
        for (size_t e = 0; e < rows * cols; e++) {
            if (got[e] != buf[r0 * cols + e]) {
                snprintf(msg, len, "%s kind %zu rows [%zu, %zu): element %zu is %g, not %g",
                         p->name, t / s->n_params, r0, r0 + rows, e, (double)got[e],
                         (double)buf[r0 * cols + e]);
                rc = -1;
                break;
            }
        }
    }
    fsdp_ckpt_close(ck);
    return rc < 0 ? -1 : 0;
}

/* The saved shard read back in each order at each request shape. */
static void read_checks(const char *dir, const struct fsdp_model_spec *s,
                        const struct fsdp_ckpt_kinds *k, const float *buf, size_t n)
{
    static const char *const shapes[3] = {NULL, "2,1", "8,8"};
    static const char *const orders[3] = {"in file order", "in reverse", "middle thirds"};
    char msg[2048];
    struct fsdp_ckpt_meta m = {.step = 1, .world_size = 1, .n_shards = 1, .loss_scale = 1};
    snprintf(m.mesh, sizeof(m.mesh), "dp=1");
    snprintf(m.backends, sizeof(m.backends), "dp=none");
    float *got = malloc(n * sizeof(float));
    if (!got || fsdp_ckpt_index_write(dir, s, k, &m) < 0) {
        fsdp_err_take(msg, sizeof(msg));
        tap_ok(0, "index.h5 of the saved shard: %s", got ? msg : "no memory");
        free(got);
        return;
    }
    for (int sh = 0; sh < 3; sh++) {
        if (shapes[sh]) {
            setenv("FSDPC_CKPT_READ_IO", shapes[sh], 1);
        } else {
            unsetenv("FSDPC_CKPT_READ_IO");
        }
        for (int o = FORWARD; o <= MIDDLE; o++) {
            msg[0] = '\0';
            int rc = read_back(dir, (enum order)o, buf, got, msg, sizeof(msg));
            if (rc < 0) {
                tap_diag("%s", msg);
            }
            tap_ok(rc == 0, "read back %s, read-ahead %s: every value", orders[o],
                   shapes[sh] ? shapes[sh] : "default");
        }
    }
    unsetenv("FSDPC_CKPT_READ_IO");
    free(got);
}

int main(void)
{
    const char *tmpdir = getenv("TMPDIR"), *states[2] = {"exp_avg", "exp_avg_sq"};
    char made[PATH_MAX], base[PATH_MAX], dir[PATH_MAX + 32], shard[PATH_MAX + 64], msg[2048];
    const struct fsdp_arch *arch;
    struct fsdp_model_spec *s;
    struct fsdp_ckpt_kinds kinds;
    void *cfg;
    snprintf(made, sizeof(made), "%s/fsdpc-direct.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    if (!mkdtemp(made) || !realpath(made, base)) {
        tap_skip("cannot create a temporary directory");
        return tap_done();
    }
    if (fsdp_model_registry_init() < 0 || fsdp_arch_preset("bench-small", &arch, &cfg) < 0 ||
        arch->spec_create(cfg, &s) < 0 || fsdp_ckpt_kinds_init(&kinds, 2, states) < 0) {
        tap_ok(0, "the bench-small preset's tensors");
        return tap_done();
    }
    free(cfg);
    size_t n = fsdp_model_spec_largest(s);
    float *buf = malloc(n * sizeof(float));
    for (size_t e = 0; buf && e < n; e++) {
        buf[e] = (float)(e % 1009) / 1009.0f;
    }
    crash_shim_arm(0, base, -1, 0);
    crash_shim_fail_direct(0);
    snprintf(dir, sizeof(dir), "%s/ok", base);
    int rc = save(dir, s, &kinds, buf, msg, sizeof(msg));
    long N = crash_shim_direct_writes();
    if (rc == 0 && N == 0) {
        tap_skip("%s: no O_DIRECT on this file system", base);
        return tap_done();
    }
    tap_ok(rc == 0 && N > 2,
           "a save of bench-small's %zu tensors x 3 (%s): its %ld direct writes "
           "went through the wrapped pwrite",
           s->n_params, rc == 0 ? "ok" : msg, N);
    if (rc == 0) {
        read_checks(dir, s, &kinds, buf, n);
    }
    const long at[5] = {1, 2, N / 2, N - 1, N};
    for (int t = 0; t < 5; t++) {
        if (t > 0 && at[t] <= at[t - 1]) {
            continue;
        }
        snprintf(dir, sizeof(dir), "%s/fail_%ld", base, at[t]);
        crash_shim_fail_direct(at[t]);
        rc = save(dir, s, &kinds, buf, msg, sizeof(msg));
        crash_shim_fail_direct(0);
        snprintf(shard, sizeof(shard), "%s/shard_0.h5", dir);
        int named = strstr(msg, "shard_0.h5: /") && strstr(msg, "Input/output error");
        int gone = access(shard, F_OK) != 0;
        if (rc == 0 || !named || !gone) {
            tap_diag("save: %s; message: %s; shard file %s", rc == 0 ? "committed" : "failed", msg,
                     gone ? "removed" : "left");
        }
        tap_ok(rc < 0 && named && gone,
               "direct write %ld of %ld failed: the save fails naming "
               "the dataset and EIO, its shard file removed",
               at[t], N);
    }
    free(buf);
    fsdp_model_spec_destroy(s);
    fsdp_file_rmtree(base);
    return tap_done();
}
