/*
 * fuzz_common.c - scratch files, counters and the leak check of the reader
 * fuzz harnesses (fuzz.h). Test code: the counters are this process's globals.
 */
#include "config.h"
#include "tests/fuzz/fuzz.h"
#include "core/error.h"
#include "core/spec.h"
#include "model/gpt2_spec.h"
#include "model/model.h"

#include <hdf5.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The readers need GPT-2's parameter table (gpt2_spec.c), never its
 * kernels: an empty ops table keeps gpt2.c and the compute layer out. */
const struct fsdp_model_ops fsdp_gpt2_ops;

static char fz_dir[256];
static unsigned long fz_accepted, fz_refused;

/* Rewrites this process's counts in $FSDPC_FUZZ_STATS.<pid>: libFuzzer's
 * fork mode ends its jobs without running exit handlers, so the counts are
 * kept current as they go. */
static void fuzz_stats(void)
{
    const char *stats = getenv("FSDPC_FUZZ_STATS");
    char path[512];
    if (!stats) {
        return;
    }
    snprintf(path, sizeof(path), "%s.%d", stats, (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%lu %lu\n", fz_accepted, fz_refused);
        fclose(f);
    }
}

static void fuzz_report(void)
{
    fuzz_stats();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fz_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "fuzz: could not remove %s\n", fz_dir);
    }
}

void fuzz_init(void)
{
    if (fz_dir[0]) {
        return;
    }
    setenv("FSDPC_LOG", "error", 0);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (fsdp_arch_register(&fsdp_gpt2_arch) < 0) {
        fsdp_err_clear(); /* registered already */
    }
    snprintf(fz_dir, sizeof(fz_dir), "%s/fsdpc-fuzz.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(fz_dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fuzz_report);
}

const char *fuzz_dir(void)
{
    return fz_dir;
}

const char *fuzz_write(const char *name, const uint8_t *data, size_t size)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", fz_dir, name);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size) {
        perror("fuzz: write");
        abort();
    }
    close(fd);
    return path;
}

int fuzz_copy(const char *src, const char *name)
{
    char buf[1 << 16], path[512];
    snprintf(path, sizeof(path), "%s/%s", fz_dir, name);
    int in = open(src, O_RDONLY | O_CLOEXEC);
    int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ssize_t n = 0;
    while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof(buf))) > 0) {
        if (write(out, buf, (size_t)n) != n) {
            n = -1;
            break;
        }
    }
    int rc = in < 0 || out < 0 || n < 0 ? -1 : 0;
    if (in >= 0) {
        close(in);
    }
    if (out >= 0) {
        close(out);
    }
    return rc;
}

void fuzz_done(int rc)
{
    if (rc == 0) {
        fz_accepted++;
    } else {
        fz_refused++;
    }
    if ((fz_accepted + fz_refused) % 16 == 0) {
        fuzz_stats();
    }
    fsdp_err_clear();
    H5Eclear2(H5E_DEFAULT);
    ssize_t open_objs = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open_objs > 0) {
        fprintf(stderr, "fuzz: %zd HDF5 objects left open by the reader\n", open_objs);
        __builtin_trap();
    }
}
