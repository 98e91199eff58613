/*
 * tcp_probe.c - one rank of a tcp backend fault test. Joins the job through
 * fsdp_dist_init (env:// as test_tcp_faults.sh launches it), creates the tcp
 * backend for the whole world directly, and runs a loop of allreduces whose
 * results it checks. Any failure ends the rank through fsdp_die, which
 * prints one line naming the cause and exits non-zero.
 *
 *   tcp_probe [--count N] [--iters K] [--timeout S] [--ready PATH]
 *             [--delay S] [--addr-file PATH] [--knock FLIP] [--knock-key BIT]
 *             [--knock-mac last|echo]
 *   --iters 0      loop until the job is killed or fails
 *   --ready PATH   PATH.<rank> is created once the first allreduce completed
 *   --delay S      sleep before creating the backend (rank 0 only)
 *   --addr-file P  (rank 1) write rank 1's tcp listening address to P as
 *                  soon as it is published, for a foreign client to knock on
 *   --knock FLIP   (rank 0) before dialling, knock once on rank 1 with the
 *                  hello rank 0 would send but with the job nonce XOR FLIP
 *                  (hex), and say whether rank 1 refused it. FLIP 0 keeps
 *                  the right nonce and claims world rank 99 instead, the one
 *                  check after the nonce that refuses: it shows that the
 *                  hello gets past everything but what the knock changes.
 *   --knock-key BIT (rank 0) knock with rank 0's genuine hello, read rank
 *                  1's answer, and complete the handshake with a MAC made
 *                  from the job key with bit BIT flipped: what a process
 *                  that learnt the nonce but not the secret can do.
 *   --knock-mac M  (rank 0) as --knock-key, but the MAC is a near miss:
 *                  "last" the right MAC with its last byte flipped (caught
 *                  only by a comparison of all 32 bytes), "echo" rank 1's
 *                  own MAC sent back (caught only when the two directions
 *                  use different labels; the hello and its MAC are public).
 */
#include "config.h"
#include "backends/backend.h"
#include "backends/tcp/tcp.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const struct fsdp_backend_ops *ops = &fsdp_tcp_ops;

struct probe_opts {
    size_t count;
    long iters;
    double timeout_s;
    const char *ready;
    double delay_s;
    const char *addr_file;
    int knock;
    uint64_t knock_flip;
    int knock_key_bit; /* -1: none */
    int knock_mac;     /* PROBE_MAC_* */
};

enum { PROBE_MAC_KEY, PROBE_MAC_LAST, PROBE_MAC_ECHO };

static void probe_usage(void)
{
    fprintf(stderr, "usage: tcp_probe [--count N] [--iters K] [--timeout S] [--ready PATH] "
                    "[--delay S] [--addr-file PATH] [--knock FLIP] [--knock-key BIT] "
                    "[--knock-mac last|echo]\n");
    exit(2);
}

static void probe_parse(int argc, char **argv, struct probe_opts *o)
{
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        double x;
        if (!v) {
            probe_usage();
        }
        if (strcmp(a, "--count") == 0 && fsdp_parse_long(v, &n) == 0 && n >= 0) {
            o->count = (size_t)n;
        } else if (strcmp(a, "--iters") == 0 && fsdp_parse_long(v, &n) == 0 && n >= 0) {
            o->iters = (long)n;
        } else if (strcmp(a, "--timeout") == 0 && fsdp_parse_double(v, &x) == 0 && x > 0) {
            o->timeout_s = x;
        } else if (strcmp(a, "--delay") == 0 && fsdp_parse_double(v, &x) == 0 && x >= 0) {
            o->delay_s = x;
        } else if (strcmp(a, "--ready") == 0) {
            o->ready = v;
        } else if (strcmp(a, "--addr-file") == 0) {
            o->addr_file = v;
        } else if (strcmp(a, "--knock") == 0) {
            char *end;
            errno = 0;
            o->knock_flip = strtoull(v, &end, 16);
            if (errno || end == v || *end) {
                probe_usage();
            }
            o->knock = 1;
        } else if (strcmp(a, "--knock-key") == 0) {
            o->knock_key_bit = atoi(v);
            if (o->knock_key_bit < 0 || o->knock_key_bit >= 8 * FSDP_AUTH_KEY_BYTES) {
                probe_usage();
            }
            o->knock = 1;
        } else if (strcmp(a, "--knock-mac") == 0) {
            if (strcmp(v, "last") && strcmp(v, "echo")) {
                probe_usage();
            }
            o->knock_mac = strcmp(v, "last") == 0 ? PROBE_MAC_LAST : PROBE_MAC_ECHO;
            o->knock_key_bit = 0; /* unused: the MAC is made from the job key */
            o->knock = 1;
        } else {
            probe_usage();
        }
    }
}

struct addr_job {
    struct fsdp_store *store;
    const char *path;
    double timeout_s;
};

/* Rank 1's listening address "ip:port" (the backend's first-generation key
 * in the group's store), once published. 0, or -1 when it never was. */
static int probe_rank1_addr(struct fsdp_store *store, double timeout_s, char *addr, size_t cap)
{
    void *val;
    size_t len;
    int exists = 0;
    double t0 = fsdp_now();
    /* poll: a blocking get would hold the store client that the backend's
     * own rendezvous needs (a client serializes its requests) */
    while (!exists && fsdp_now() - t0 < timeout_s) {
        if (fsdp_store_check(store, "tcp/0/addr/1", &exists) < 0) {
            return -1;
        }
        if (!exists) {
            usleep(20000);
        }
    }
    if (!exists || fsdp_store_get(store, "tcp/0/addr/1", &val, &len, 1.0) < 0) {
        return -1;
    }
    snprintf(addr, cap, "%.*s", (int)len, (char *)val);
    free(val);
    return 0;
}

/* Publishes rank 1's listening address to a file, atomically. */
static void *probe_addr_writer(void *p)
{
    struct addr_job *aj = p;
    char addr[TCP_ADDR_MAX], tmp[1024];
    if (probe_rank1_addr(aj->store, aj->timeout_s, addr, sizeof(addr)) < 0) {
        return NULL;
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", aj->path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%s\n", addr);
        fclose(f);
        rename(tmp, aj->path);
    }
    return NULL;
}

/* The hello rank 0 of group "world" sends. The group hash is recomputed as
 * tcp_ops.c does; the knock with FLIP 0 tells when the two drift apart. */
static void probe_hello(const struct fsdp_dist *d, const int *world, struct tcp_hello *h)
{
    struct tcp_config cfg;
    int rc = fsdp_tcp_config_read(&cfg);
    if (rc < 0) {
        fsdp_die(rc, "reading the FSDPC_TCP_* settings", NULL);
    }
    memset(h, 0, sizeof(*h));
    h->magic = TCP_HELLO_MAGIC;
    h->version = TCP_PROTO_VERSION;
    h->nonce = d->nonce;
    h->group_hash = fsdp_hash64("world", strlen("world"), 0x7463700000000000ull);
    h->group_hash = fsdp_hash64(world, (size_t)d->world_size * sizeof(int), h->group_hash);
    h->rank = 0;
    h->size = d->world_size;
    h->world_rank = 0;
    h->direct_max = cfg.direct_max;
    h->small_bytes = cfg.small_bytes;
    h->chunk_bytes = cfg.chunk_bytes;
    h->algo = cfg.algo;
    snprintf(h->addr, sizeof(h->addr), "127.0.0.1:9");
}

/* Says hello to rank 1 with a near miss and reports how rank 1 answered:
 * a refusal closes the connection, a hello let in is answered with rank
 * 1's own. */
/* The dialer's MAC of a knock (--knock-key, --knock-mac) over both hellos;
 * answer is rank 1's hello and MAC. */
static void probe_knock_mac(const struct fsdp_dist *d, int key_bit, int how,
                            const struct tcp_hello *h, const unsigned char *answer,
                            unsigned char mac[FSDP_AUTH_MAC_BYTES])
{
    struct fsdp_auth_key key = d->job_key;
    struct tcp_hello theirs;
    memcpy(&theirs, answer, sizeof(theirs));
    if (how == PROBE_MAC_KEY) {
        key.k[key_bit / 8] ^= (unsigned char)(1u << (key_bit % 8));
    }
    fsdp_auth_mac(&key, "fsdpc tcp dialer", h, sizeof(*h), &theirs, sizeof(theirs), mac);
    if (how == PROBE_MAC_LAST) {
        mac[FSDP_AUTH_MAC_BYTES - 1] ^= 0x01;
    } else if (how == PROBE_MAC_ECHO) {
        memcpy(mac, answer + sizeof(theirs), FSDP_AUTH_MAC_BYTES);
    }
}

static void probe_knock(struct fsdp_store *gs, const struct fsdp_dist *d, const int *world,
                        uint64_t flip, int key_bit, int mac_how, double timeout_s)
{
    struct tcp_hello h;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char addr[TCP_ADDR_MAX];
    unsigned char buf[sizeof(h) + FSDP_AUTH_MAC_BYTES];
    const char *how;
    probe_hello(d, world, &h);
    h.nonce ^= flip;
    if (flip == 0 && key_bit < 0) {
        h.world_rank = 99;
    }
    if (probe_rank1_addr(gs, timeout_s, addr, sizeof(addr)) < 0) {
        fsdp_fatal("rank 0: rank 1 published no address to knock on within %.1f s", timeout_s);
    }
    char *colon = strrchr(addr, ':');
    if (colon) {
        *colon = '\0';
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!colon || inet_pton(AF_INET, addr, &sa.sin_addr) != 1 || fd < 0) {
        fsdp_fatal("rank 0: cannot knock on rank 1's address '%s'", addr);
    }
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        write(fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) {
        fsdp_fatal("rank 0: knocking on rank 1 at %s:%s: %s", addr, colon + 1, strerror(errno));
    }
    ssize_t n = read(fd, buf, sizeof(buf));
    if (key_bit >= 0) {
        /* the genuine hello is answered; the MAC is what gives us away */
        size_t got = n > 0 ? (size_t)n : 0;
        while (n > 0 && got < sizeof(buf)) {
            n = read(fd, buf + got, sizeof(buf) - got);
            got += n > 0 ? (size_t)n : 0;
        }
        if (got < sizeof(buf)) {
            fsdp_fatal("rank 0: rank 1 did not answer a genuine hello (%zu bytes)", got);
        }
        unsigned char mac[FSDP_AUTH_MAC_BYTES];
        probe_knock_mac(d, key_bit, mac_how, &h, buf, mac);
        if (write(fd, mac, sizeof(mac)) != (ssize_t)sizeof(mac)) {
            fsdp_fatal("rank 0: sending the MAC: %s", strerror(errno));
        }
        char one;
        n = read(fd, &one, 1);
    }
    how = n == 0 || (n < 0 && errno == ECONNRESET) ? "refused"
          : n > 0 ? "let in (rank 1 answered)"
                  : "no answer within 3 s";
    close(fd);
    if (mac_how != PROBE_MAC_KEY) {
        printf("rank 0: knock with the right nonce and %s: %s\n", mac_how == PROBE_MAC_LAST
               ? "the right MAC but its last byte flipped" : "rank 1's own MAC echoed", how);
    } else if (key_bit >= 0) {
        printf("rank 0: knock with the right nonce and the job key off in bit %d: %s\n",
               key_bit, how);
    } else {
        printf("rank 0: knock with nonce %016" PRIx64 " (job nonce xor %016" PRIx64 ")%s: %s\n",
               h.nonce, flip, flip ? "" : " claiming world rank 99", how);
    }
    fflush(stdout);
}

static void probe_abort_cb(void *arg, const char *why)
{
    ops->abort(arg, why);
}

static void probe_loop(struct fsdp_backend *be, const struct probe_opts *o, int rank, int n)
{
    float *v = fsdp_alloc(o->count * sizeof(float) + 64);
    if (!v) {
        fsdp_fatal("rank %d: cannot allocate %zu floats", rank, o->count);
    }
    for (long it = 1; o->iters == 0 || it <= o->iters; it++) {
        struct fsdp_work *w;
        for (size_t i = 0; i < o->count; i++) {
            v[i] = (float)((rank + 1) * (int)(i % 7));
        }
        int rc = ops->allreduce(be, v, v, o->count, FSDP_F32, FSDP_SUM, NULL, &w);
        if (rc == 0) {
            rc = ops->work_wait(w, -1.0);
            ops->work_free(w);
        }
        if (rc < 0) {
            fsdp_die(rc, "allreduce failed", NULL);
        }
        float k = (float)(n * (n + 1) / 2);
        for (size_t i = 0; i < o->count; i++) {
            if (v[i] != k * (float)(i % 7)) {
                fsdp_fatal("rank %d: iteration %ld: element %zu is %g, expected %g", rank, it,
                           i, v[i], k * (float)(i % 7));
            }
        }
        if (it == 1 && o->ready) {
            char path[1024];
            snprintf(path, sizeof(path), "%s.%d", o->ready, rank);
            FILE *f = fopen(path, "w");
            if (f) {
                fclose(f);
            }
        }
    }
    printf("rank %d: %ld allreduces of %zu floats correct\n", rank, o->iters, o->count);
    fsdp_free(v);
}

int main(int argc, char **argv)
{
    struct probe_opts o = {.count = 1 << 20, .iters = 10, .timeout_s = 5.0, .knock_key_bit = -1};
    struct fsdp_dist *d;
    struct fsdp_store *gs;
    struct fsdp_backend *be;
    pthread_t writer;
    int have_writer = 0;
    probe_parse(argc, argv, &o);
    if (fsdp_dist_init(&argc, &argv, "env://", o.timeout_s, &d) < 0) {
        fsdp_die(FSDP_ERR_INVALID, "dist init failed", NULL);
    }
    if (fsdp_store_prefix(d->store, "world", &gs) < 0) {
        fsdp_die(FSDP_ERR_NOMEM, "store prefix", NULL);
    }
    int *world = calloc((size_t)d->world_size, sizeof(int));
    for (int q = 0; q < d->world_size; q++) {
        world[q] = q;
    }
    struct addr_job aj = {.store = gs, .path = o.addr_file, .timeout_s = o.timeout_s};
    if (o.addr_file && d->rank == 1) {
        have_writer = pthread_create(&writer, NULL, probe_addr_writer, &aj) == 0;
    }
    if (d->rank == 0 && o.knock && d->world_size > 1) {
        probe_knock(gs, d, world, o.knock_flip, o.knock_key_bit, o.knock_mac, o.timeout_s);
    }
    if (d->rank == 0 && o.delay_s > 0) {
        usleep((useconds_t)(o.delay_s * 1e6));
    }
    struct fsdp_group_info info = {
        .name = "world", .rank = d->rank, .size = d->world_size, .world_ranks = world,
        .world_rank = d->rank, .nonce = d->nonce, .auth_key = &d->job_key,
        .timeout_s = d->timeout_s, .store = gs,
    };
    if (ops->create(&info, &be) < 0) {
        fsdp_die(FSDP_ERR_PEER, "tcp backend create failed", NULL);
    }
    fsdp_dist_on_abort(d, probe_abort_cb, be);
    if (have_writer) {
        pthread_join(writer, NULL);
    }
    probe_loop(be, &o, d->rank, d->world_size);
    fsdp_dist_off_abort(d, be);
    ops->destroy(be);
    fsdp_store_destroy(gs);
    free(world);
    fsdp_dist_finalize(d);
    return 0;
}
