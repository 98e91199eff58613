/*
 * store_probe.c - one rank of a store test job. Brings up fsdp_dist with the
 * given --init, exercises the job's store against the other ranks, and
 * prints one "PASS what" or "FAIL what: detail" line per check; the exit
 * status is 0 only when every check passed. The test scripts launch several
 * of these (plain processes, mpiexec) and read the results.
 *
 *   store_probe [--init M] [--timeout S] [--big BYTES]
 *               [--mode full|init|hold|abort|key|serve] [--expect-size N] [--conflict]
 *               [--abort-log PATH]
 *   full   the checks below, then finalize
 *   init   init, print the identity line, finalize (bad-input tests)
 *   hold   init, write "conflict" = "old", then sleep until killed (leaves
 *          a store behind, as a crashed job would)
 *   abort  registers three abort callbacks (removes the second); the last
 *          rank dies with fsdp_fatal, the others wait in a barrier that only
 *          the job-wide abort can end early
 *   key    no job: serves a TCP store of its own and connects to it with keys
 *          that differ from the server's in one bit or come from a secret
 *          one character off
 *   serve  no job: a TCP store keyed by PROBE_SECRET/"probe" (store_wire.py
 *          derives the same key) for clients the test drives by hand
 */
#include "config.h"
#include "rendezvous/auth.h"
#include "rendezvous/dist.h"
#include "rendezvous/store.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

__attribute__((format(printf, 2, 3))) static void check(int ok, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (ok) {
        printf("PASS %s\n", buf);
    } else {
        printf("FAIL %s: %s\n", buf, fsdp_err_msg());
        failures++;
    }
    fsdp_err_clear();
    fflush(stdout);
}

/* get key and compare with want (NUL-terminated) */
static int get_is(struct fsdp_store *s, const char *key, const char *want, double t)
{
    void *v = NULL;
    size_t len = 0;
    if (fsdp_store_get(s, key, &v, &len, t) < 0) {
        return 0;
    }
    int ok = len == strlen(want) && memcmp(v, want, len) == 0;
    if (!ok) {
        fsdp_err(FSDP_ERR_MISMATCH, "'%s' holds '%.*s', want '%s'", key, (int)(len > 60 ? 60 : len),
                 (char *)v, want);
    }
    free(v);
    return ok;
}

static void probe_basic(struct fsdp_dist *d, double t)
{
    struct fsdp_store *s = d->store;
    char key[64], val[64];
    int n = d->world_size, r = d->rank;

    snprintf(key, sizeof(key), "probe/k/%d", r);
    snprintf(val, sizeof(val), "value of rank %d", r);
    check(fsdp_store_set(s, key, val, strlen(val)) == 0, "set %s", key);
    int all = 1;
    for (int p = 0; p < n; p++) {
        snprintf(key, sizeof(key), "probe/k/%d", (r + p) % n);
        snprintf(val, sizeof(val), "value of rank %d", (r + p) % n);
        all &= get_is(s, key, val, t);
    }
    check(all, "get the keys of all %d ranks", n);

    char keys[64][32];
    const char *kp[64];
    int nk = n < 64 ? n : 64;
    for (int p = 0; p < nk; p++) {
        snprintf(keys[p], sizeof(keys[p]), "probe/k/%d", p);
        kp[p] = keys[p];
    }
    check(fsdp_store_wait(s, kp, (size_t)nk, t) == 0, "wait on %d keys", nk);

    int e0 = -1, e1 = -1;
    check(fsdp_store_check(s, "probe/k/0", &e0) == 0 && e0 == 1, "check finds probe/k/0");
    check(fsdp_store_check(s, "probe/absent", &e1) == 0 && e1 == 0, "check misses probe/absent");

    /* concurrent adds from every rank */
    int64_t res = 0, prev = INT64_MIN;
    int mono = 1, iters = 200;
    for (int i = 0; i < iters; i++) {
        if (fsdp_store_add(s, "probe/ctr", r + 1, &res) < 0) {
            mono = 0;
            break;
        }
        mono &= res > prev;
        prev = res;
    }
    check(mono, "%d adds of %d, results increase", iters, r + 1);
    check(fsdp_store_barrier(s, "probe/after-add", n, t) == 0, "barrier after the adds");
    int64_t want = (int64_t)iters * n * (n + 1) / 2;
    int rc;
    res = -1;
    rc = fsdp_store_add(s, "probe/ctr", 0, &res);
    check(rc == 0 && res == want,
          "counter sums every rank's adds (%" PRId64 ", want %" PRId64 ")", res, want);

    snprintf(key, sizeof(key), "probe/str/%d", r);
    fsdp_store_set(s, key, "abc", 3);
    rc = fsdp_store_add(s, key, 1, &res);
    check(rc == FSDP_ERR_FORMAT, "add on a non-integer value fails (rc %d)", rc);
}

static void probe_nonce_identity(struct fsdp_dist *d, double t)
{
    char hex[32];
    snprintf(hex, sizeof(hex), "%016" PRIx64, d->nonce);
    if (d->rank == 0) {
        fsdp_store_set(d->store, "probe/nonce", hex, strlen(hex));
    }
    check(d->nonce != 0 && get_is(d->store, "probe/nonce", hex, t), "same job nonce on all ranks");
    check(d->local_size == d->world_size && d->local_rank == d->rank,
          "local rank %d of %d on one host", d->local_rank, d->local_size);
}

static void probe_prefix(struct fsdp_dist *d, double t)
{
    struct fsdp_store *a = NULL, *b = NULL;
    int n = d->world_size;
    check(fsdp_store_prefix(d->store, "grpA", &a) == 0 && fsdp_store_prefix(d->store, "grpB", &b) == 0,
          "prefix views");
    if (!a || !b) {
        return;
    }
    if (d->rank == 0) {
        fsdp_store_set(a, "x", "A", 1);
        fsdp_store_set(b, "x", "B", 1);
        fsdp_store_set(a, "onlyA", "1", 1);
    }
    check(fsdp_store_barrier(a, "bar", n, t) == 0, "barrier through a prefix view");
    check(get_is(a, "x", "A", t) && get_is(b, "x", "B", t), "same key, two groups, two values");
    check(get_is(d->store, "grpA/x", "A", t), "the view writes grpA/x in the base store");
    int e = -1;
    check(fsdp_store_check(b, "onlyA", &e) == 0 && e == 0, "group B does not see group A's key");
    fsdp_store_destroy(a);
    fsdp_store_destroy(b);
}

static void probe_barriers(struct fsdp_dist *d, double t)
{
    struct fsdp_store *s = d->store;
    char key[64];
    int n = d->world_size;
    for (int it = 0; it < 3; it++) {
        snprintf(key, sizeof(key), "probe/rep/%d/%d", it, d->rank);
        fsdp_store_set(s, key, "1", 1);
        int ok = fsdp_store_barrier(s, "probe/rep", n, t) == 0;
        /* after the barrier every rank's key of this round must be there */
        for (int p = 0; p < n && ok; p++) {
            int e = 0;
            snprintf(key, sizeof(key), "probe/rep/%d/%d", it, p);
            ok = fsdp_store_check(s, key, &e) == 0 && e;
            if (!ok) {
                fsdp_err(FSDP_ERR_INTERNAL, "%s missing after the barrier", key);
            }
        }
        check(ok, "reused barrier key, round %d", it);
    }
}

static void probe_timeouts(struct fsdp_dist *d)
{
    struct fsdp_store *s = d->store;
    char key[64];
    void *v = NULL;
    size_t len;
    snprintf(key, sizeof(key), "probe/never/%d", d->rank);
    double t0 = fsdp_now();
    int rc = fsdp_store_get(s, key, &v, &len, 0.5);
    double dt = fsdp_now() - t0;
    check(rc == FSDP_ERR_TIMEOUT && strstr(fsdp_err_msg(), key) && dt > 0.4 && dt < 3.0,
          "get of a missing key times out after %.2f s and names it", dt);
    free(v);

    const char *keys[2] = {"probe/k/0", "probe/never-wait"};
    rc = fsdp_store_wait(s, keys, 2, 0.3);
    check(rc == FSDP_ERR_TIMEOUT && strstr(fsdp_err_msg(), "probe/never-wait"),
          "wait times out and names the missing key");

    snprintf(key, sizeof(key), "probe/lonely/%d", d->rank);
    rc = fsdp_store_barrier(s, key, 2, 0.3);
    check(rc == FSDP_ERR_TIMEOUT && strstr(fsdp_err_msg(), "1 of 2"),
          "barrier timeout says how many arrived");
}

static void probe_big(struct fsdp_dist *d, size_t big, double t)
{
    struct fsdp_store *s = d->store;
    if (d->rank == 0) {
        unsigned char *b = malloc(big);
        for (size_t i = 0; i < big; i++) {
            b[i] = (unsigned char)((i * 2654435761u) >> 13);
        }
        check(fsdp_store_set(s, "probe/big", b, big) == 0, "set a %zu-byte value", big);
        free(b);
    }
    if (d->rank == d->world_size - 1) {
        void *v = NULL;
        size_t len = 0;
        int ok = fsdp_store_get(s, "probe/big", &v, &len, t) == 0 && len == big;
        size_t bad = big;
        for (size_t i = 0; ok && i < big; i++) {
            if (((unsigned char *)v)[i] != (unsigned char)((i * 2654435761u) >> 13)) {
                bad = i;
                ok = 0;
            }
        }
        if (bad < big) {
            fsdp_err(FSDP_ERR_MISMATCH, "first bad byte at %zu", bad);
        }
        check(ok, "get the %zu-byte value intact (%zu bytes)", big, len);
        free(v);
    }
}

/*
 * The handshake must depend on every bit of the key: a client whose key
 * differs in one bit, or comes from a secret one character off, must be
 * refused at once (it finds that the server cannot prove the client's key),
 * and the right key must still connect. Each case is its own line.
 */
#define PROBE_SECRET "fsdpc-probe-secret-0123"

static const struct key_case {
    int bit; /* of the 256-bit key to flip; -1: derive from another secret */
    const char *what;
} key_cases[] = {
    {0, "bit 0 of the key differs"},
    {7, "bit 7 of the key differs"},
    {128, "bit 128 of the key differs"},
    {255, "bit 255 of the key differs"},
    {-1, "the secret differs in its last character"},
};

static int key_connects(int port, const struct fsdp_auth_key *key, double t)
{
    struct fsdp_store *s = NULL;
    int ok = fsdp_store_tcp_connect("127.0.0.1", port, key, t, &s) == 0 &&
             fsdp_store_set(s, "probe/key-ok", "1", 1) == 0 && get_is(s, "probe/key-ok", "1", t);
    if (s) {
        fsdp_store_destroy(s);
    }
    return ok;
}

static int probe_keys(double t)
{
    struct fsdp_auth_key key;
    fsdp_auth_derive(PROBE_SECRET, strlen(PROBE_SECRET), "probe", &key);
    struct fsdp_store_server *srv = NULL;
    int port = 0;
    int rc = fsdp_store_tcp_serve("127.0.0.1", 0, &key, &srv, &port);
    check(rc == 0, "serve a store on 127.0.0.1 keyed by the probe's secret");
    if (rc < 0) {
        return 1;
    }
    check(key_connects(port, &key, t), "the right key connects");
    for (size_t i = 0; i < sizeof(key_cases) / sizeof(key_cases[0]); i++) {
        struct fsdp_auth_key wrong = key;
        if (key_cases[i].bit >= 0) {
            wrong.k[key_cases[i].bit / 8] ^= (unsigned char)(1u << (key_cases[i].bit % 8));
        } else {
            char other[] = PROBE_SECRET;
            other[sizeof(other) - 2] ^= 1;
            fsdp_auth_derive(other, strlen(other), "probe", &wrong);
        }
        struct fsdp_store *s = NULL;
        double t0 = fsdp_now();
        rc = fsdp_store_tcp_connect("127.0.0.1", port, &wrong, t, &s);
        double dt = fsdp_now() - t0;
        if (rc == 0) {
            fsdp_err(FSDP_ERR_INTERNAL, "the server accepted the client");
            fsdp_store_destroy(s);
        }
        check(rc == FSDP_ERR_AUTH && strstr(fsdp_err_msg(), "failed to prove") && dt < t / 2,
              "client with a wrong key (%s) is refused at once (%.2f s)", key_cases[i].what, dt);
    }
    check(key_connects(port, &key, t), "the right key still connects after the refusals");
    fsdp_store_tcp_server_stop(srv);
    printf("FINALIZED, %d failures\n", failures);
    return failures ? 1 : 0;
}

/* A store server keyed by PROBE_SECRET on 127.0.0.1, for seconds: prints
 * "PORT n" and "RSS-KB n" (its resident set) every 0.2 s, for clients the
 * test drives by hand (flood, quota, handshake attacks). */
static int probe_serve(double seconds)
{
    struct fsdp_auth_key key;
    fsdp_auth_derive(PROBE_SECRET, strlen(PROBE_SECRET), "probe", &key);
    struct fsdp_store_server *srv = NULL;
    int port = 0;
    if (fsdp_store_tcp_serve("127.0.0.1", 0, &key, &srv, &port) < 0) {
        printf("SERVE-FAILED %s\n", fsdp_err_msg());
        return 1;
    }
    printf("PORT %d\n", port);
    fflush(stdout);
    for (double t0 = fsdp_now(); fsdp_now() - t0 < seconds;) {
        long rss = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (f && fscanf(f, "%*s %ld", &rss) == 1) {
            printf("RSS-KB %ld\n", rss * (sysconf(_SC_PAGESIZE) / 1024));
            fflush(stdout);
        }
        if (f) {
            fclose(f);
        }
        usleep(200000);
    }
    fsdp_store_tcp_server_stop(srv);
    printf("FINALIZED\n");
    return 0;
}

static int abort_fd = STDOUT_FILENO;

static void abort_cb(void *arg, const char *why)
{
    /* runs inside the abort: write(2) only */
    char buf[256];
    int n = snprintf(buf, sizeof(buf), "ABORT-CB %s: %s\n", (const char *)arg, why);
    if (write(abort_fd, buf, (size_t)n) < 0) {
        _exit(3);
    }
}

/* The launcher may drop the output of a job being torn down: the callbacks
 * write to their own file when one is given. */
static void probe_abort(struct fsdp_dist *d, double t, const char *log)
{
    if (log && d->rank == d->world_size - 1) {
        abort_fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    fsdp_dist_on_abort(d, abort_cb, "first");
    fsdp_dist_on_abort(d, abort_cb, "removed");
    fsdp_dist_on_abort(d, abort_cb, "second");
    fsdp_dist_off_abort(d, "removed");
    if (d->rank == d->world_size - 1) {
        fsdp_fatal("probe: rank %d aborts the job", d->rank);
    }
    int rc = fsdp_store_barrier(d->store, "probe/never-complete", d->world_size, t);
    printf("BARRIER-RETURNED %d\n", rc);
}

static int count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        return -1;
    }
    while (readdir(d)) {
        n++;
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    const char *init = NULL, *mode = "full", *abort_log = NULL;
    double t = 20.0;
    size_t big = 0;
    int expect_size = 0, conflict = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--init") == 0 && i + 1 < argc) {
            init = argv[++i];
        } else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
            t = atof(argv[++i]);
        } else if (strcmp(argv[i], "--big") == 0 && i + 1 < argc) {
            big = (size_t)atoll(argv[++i]);
        } else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
            mode = argv[++i];
        } else if (strcmp(argv[i], "--expect-size") == 0 && i + 1 < argc) {
            expect_size = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--abort-log") == 0 && i + 1 < argc) {
            abort_log = argv[++i];
        } else if (strcmp(argv[i], "--conflict") == 0) {
            conflict = 1;
        } else {
            fprintf(stderr, "store_probe: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (strcmp(mode, "serve") == 0) {
        return probe_serve(t);
    }
    if (strcmp(mode, "key") == 0) {
        return probe_keys(t);
    }
    struct fsdp_dist *d = NULL;
    int fds_before = count_fds();
    int rc = fsdp_dist_init(&argc, &argv, init, t, &d);
    if (rc < 0) {
        fsdp_die(rc, "init", NULL);
    }
    printf("IDENT rank %d size %d local %d/%d method %s nonce %016" PRIx64 "\n", d->rank,
           d->world_size, d->local_rank, d->local_size, fsdp_dist_method_name(d), d->nonce);
    fflush(stdout);
    if (strcmp(mode, "hold") == 0) {
        fsdp_store_set(d->store, "conflict", "old", 3);
        fsdp_store_barrier(d->store, "probe/hold", d->world_size, t);
        printf("HOLDING\n");
        fflush(stdout);
        sleep(600);
        return 1;
    }
    if (strcmp(mode, "abort") == 0) {
        probe_abort(d, t, abort_log);
    }
    if (strcmp(mode, "full") == 0) {
        if (expect_size) {
            check(d->world_size == expect_size, "world size %d (want %d)", d->world_size,
                  expect_size);
        }
        probe_basic(d, t);
        probe_nonce_identity(d, t);
        probe_prefix(d, t);
        probe_barriers(d, t);
        probe_timeouts(d);
        if (big) {
            probe_big(d, big, t);
        }
        if (conflict) {
            if (d->rank == 0) {
                fsdp_store_set(d->store, "conflict", "new", 3);
            }
            check(get_is(d->store, "conflict", "new", t), "reads this job's value, not the "
                  "earlier job's");
        }
    }
    double t0 = fsdp_now();
    int mpi = d->method == FSDP_INIT_MPI;
    fsdp_dist_finalize(d);
    if (!mpi) { /* MPI keeps descriptors of its own */
        int fds_after = count_fds();
        check(fds_after == fds_before, "finalize closed every socket and file (%d descriptors "
              "before init, %d after finalize)", fds_before, fds_after);
    }
    printf("FINALIZED in %.2f s, %d failures\n", fsdp_now() - t0, failures);
    return failures ? 1 : 0;
}
