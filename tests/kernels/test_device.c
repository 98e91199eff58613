/*
 * test_device.c - the device seam's own contract (compute/device.h), on the
 * cpu and guarded devices: allocation is zeroed and counted, copies and
 * kernels reach device memory, a host read or write of guarded memory
 * stops the process with the buffer's name (checked in a child process),
 * host waits and device-to-host copies are counted, and an allocation past
 * the device's memory is one error naming the buffer, the bytes and the
 * free memory.
 */
#include "config.h"
#include "compute/device.h"
#include "core/error.h"
#include "tests/tap.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn(arg) in a child with stderr into a pipe; returns its signal (0:
 * none) and what it printed. */
static int child_signal(void (*fn)(void *), void *arg, char *out, size_t len)
{
    int fd[2];
    if (pipe(fd) != 0) {
        return -1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], STDERR_FILENO);
        fn(arg);
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < len && (r = read(fd[0], out + n, len - 1 - n)) > 0) {
        n += (size_t)r;
    }
    out[n] = '\0';
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static void host_reads(void *p)
{
    volatile float *x = p;
    fprintf(stderr, "%g\n", (double)x[3]);
}

static void host_memsets(void *p)
{
    memset(p, 0, 64);
}

static void test_device(const char *name)
{
    struct fsdp_device *d = NULL;
    if (!tap_ok(fsdp_device_create(name, 0, &d) == 0, "%s: created", name)) {
        return;
    }
    const int guarded = strcmp(name, "guarded") == 0;
    float host[16], back[16] = {0};
    void *p = NULL, *q = NULL;
    for (int i = 0; i < 16; i++) {
        host[i] = (float)i + 0.5f;
    }
    tap_ok(fsdp_device_alloc(d, sizeof(host), "test buffer", &p) == 0 &&
               fsdp_device_alloc(d, sizeof(host), "test output", &q) == 0,
           "%s: two named allocations", name);
    tap_ok(d->stats.bytes_now == 2 * sizeof(host), "%s: %zu bytes counted (want %zu)", name,
           d->stats.bytes_now, 2 * sizeof(host));
    fsdp_device_read(d, back, p, sizeof(back));
    tap_ok(back[0] == 0.0f && back[15] == 0.0f, "%s: allocations are zeroed", name);
    fsdp_device_write(d, p, host, sizeof(host));
    d->k->accumulate(d, q, p, 16);
    d->k->accumulate(d, q, p, 16);
    long waits = d->stats.host_waits, reads = d->stats.d2h_copies;
    fsdp_device_read(d, back, q, sizeof(back));
    tap_ok(back[3] == 7.0f && back[15] == 31.0f, "%s: write, two accumulate kernels, read back",
           name);
    tap_ok(d->stats.host_waits == waits + 1 && d->stats.d2h_copies == reads + 1,
           "%s: a read is one host wait and one device-to-host copy", name);
    char msg[2048];
    int sig = child_signal(host_reads, p, msg, sizeof(msg));
    if (guarded) {
        tap_ok(sig == SIGSEGV && strstr(msg, "'test buffer'") && strstr(msg, "64 bytes") &&
                   strstr(msg, "byte 12") && strstr(msg, "hint"),
               "guarded: a host read of device memory stops the process naming the buffer, its "
               "size and the offset (signal %d)",
               sig);
        tap_diag("%s", msg);
        sig = child_signal(host_memsets, q, msg, sizeof(msg));
        tap_ok(sig == SIGSEGV && strstr(msg, "'test output'"),
               "guarded: a host memset of device memory is stopped too (signal %d)", sig);
    } else {
        tap_ok(sig == 0, "cpu: the host may read the CPU device's memory");
    }
    d->ops->free(d, p);
    tap_ok(d->stats.bytes_now == sizeof(host) && d->stats.bytes_peak == 2 * sizeof(host),
           "%s: a free is counted, the peak kept", name);
    d->ops->free(d, q);
    size_t free_b = 0, total_b = 0;
    int mrc = d->ops->mem_info(d, &free_b, &total_b);
    tap_ok(mrc == 0 && total_b > 0 && free_b <= total_b, "%s: memory info (%zu of %zu bytes free)",
           name, free_b, total_b);
    if (guarded) {
        void *big = NULL;
        int rc = fsdp_device_alloc(d, total_b + 1, "a huge buffer", &big);
        const char *e = fsdp_err_msg();
        tap_ok(rc == FSDP_ERR_NOMEM && strstr(e, "'a huge buffer'") == NULL &&
                   strstr(e, "a huge buffer") && strstr(e, "free"),
               "guarded: out of memory names the buffer, the bytes and the free memory");
        tap_diag("%s", e);
        fsdp_err_clear();
    }
    fsdp_device_destroy(d);
}

int main(void)
{
    /* the guarded device's reservation, small for the test */
    setenv("FSDPC_GUARDED_BYTES", "67108864", 1);
    test_device("cpu");
    test_device("guarded");
    struct fsdp_device *d = NULL;
    int rc = fsdp_device_create("gpu9", 0, &d);
    tap_ok(rc < 0 && strstr(fsdp_err_msg(), "(devices: cpu, guarded)"),
           "an unknown device is refused naming the ones this build has");
    return tap_done();
}
