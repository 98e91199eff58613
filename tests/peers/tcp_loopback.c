/*
 * tcp_loopback.c - the physical limit of loopback TCP between two processes:
 * what no TCP collective on this machine can beat.
 *
 *   tcp_loopback [--bytes 256M] [--chunk 1M] [--reps 3] [--csv FILE]
 *
 * Forks two processes joined by one loopback TCP connection (default socket
 * buffers, TCP_NODELAY) and measures
 *   bidir     both send `bytes` to each other at once (a sender thread and a
 *             receiving main thread in each): GB/s per direction, which is
 *             what a ring step of a collective does;
 *   unidir    one side sends, the other receives: GB/s;
 *   pingpong  half the round-trip time for messages of 4 B .. 64 KiB: the
 *             latency floor of one collective step.
 * Buffers are touched before timing. The best of --reps repetitions is
 * reported (a limit, not a typical value). Rows go to stdout and, as CSV
 * "limit,test,size_bytes,value,unit", to --csv.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "peer_common.h"

struct lo_opts {
    size_t bytes;
    size_t chunk;
    int reps;
    const char *csv;
};

struct lo_sender {
    int fd;
    const char *buf; /* (chunk,) */
    size_t chunk;
    size_t bytes;
    int err;
};

static void lo_die(const char *what)
{
    perror(what);
    exit(1);
}

static void lo_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) {
            lo_die("tcp_loopback: write");
        }
        c += w;
        n -= (size_t)w;
    }
}

static void lo_read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = read(fd, c, n);
        if (r <= 0) {
            lo_die("tcp_loopback: read");
        }
        c += r;
        n -= (size_t)r;
    }
}

static void *lo_send_thread(void *arg)
{
    struct lo_sender *s = arg;
    for (size_t done = 0; done < s->bytes;) {
        size_t n = s->bytes - done < s->chunk ? s->bytes - done : s->chunk;
        lo_write_all(s->fd, s->buf, n);
        done += n;
    }
    return NULL;
}

static void lo_recv_bytes(int fd, char *buf, size_t chunk, size_t bytes)
{
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < chunk ? bytes - done : chunk;
        lo_read_all(fd, buf, n);
        done += n;
    }
}

/* One byte each way: both sides start the next test together. */
static void lo_sync(int fd)
{
    char b = 0;
    lo_write_all(fd, &b, 1);
    lo_read_all(fd, &b, 1);
}

/* Returns seconds for both directions to complete (as this side sees it). */
static double lo_bidir(int fd, char *sbuf, char *rbuf, size_t chunk, size_t bytes)
{
    struct lo_sender s = {.fd = fd, .buf = sbuf, .chunk = chunk, .bytes = bytes};
    pthread_t t;
    lo_sync(fd);
    double t0 = peer_now();
    if (pthread_create(&t, NULL, lo_send_thread, &s) != 0) {
        lo_die("tcp_loopback: pthread_create");
    }
    lo_recv_bytes(fd, rbuf, chunk, bytes);
    pthread_join(t, NULL);
    double dt = peer_now() - t0;
    lo_sync(fd); /* the peer finished too */
    return dt;
}

static double lo_unidir(int fd, int sender, char *sbuf, char *rbuf, size_t chunk, size_t bytes)
{
    lo_sync(fd);
    double t0 = peer_now();
    if (sender) {
        struct lo_sender s = {.fd = fd, .buf = sbuf, .chunk = chunk, .bytes = bytes};
        lo_send_thread(&s);
        char ack;
        lo_read_all(fd, &ack, 1); /* the receiver has everything */
    } else {
        lo_recv_bytes(fd, rbuf, chunk, bytes);
        char ack = 1;
        lo_write_all(fd, &ack, 1);
    }
    return peer_now() - t0;
}

static double lo_pingpong(int fd, int first, char *buf, size_t n, int iters)
{
    lo_sync(fd);
    double t0 = peer_now();
    for (int i = 0; i < iters; i++) {
        if (first) {
            lo_write_all(fd, buf, n);
            lo_read_all(fd, buf, n);
        } else {
            lo_read_all(fd, buf, n);
            lo_write_all(fd, buf, n);
        }
    }
    return (peer_now() - t0) / iters / 2;
}

static void lo_row(FILE *csv, const char *test, size_t bytes, double value, const char *unit)
{
    printf("  %-9s %12zu %10.3f %s\n", test, bytes, value, unit);
    fflush(stdout);
    if (csv) {
        fprintf(csv, "tcp-loopback,%s,%zu,%.4f,%s\n", test, bytes, value, unit);
    }
}

/* Both processes run this; side 0 reports. */
static void lo_run(int fd, int side, const struct lo_opts *o, FILE *csv)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char *sbuf = malloc(o->chunk);
    char *rbuf = malloc(o->chunk);
    if (!sbuf || !rbuf) {
        lo_die("tcp_loopback: malloc");
    }
    memset(sbuf, side + 1, o->chunk);
    memset(rbuf, 0, o->chunk);

    double best = 1e30;
    for (int r = 0; r < o->reps; r++) {
        double t = lo_bidir(fd, sbuf, rbuf, o->chunk, o->bytes);
        best = t < best ? t : best;
    }
    if (side == 0) {
        lo_row(csv, "bidir", o->bytes, (double)o->bytes / best * 1e-9, "GB/s per direction");
    }
    best = 1e30;
    for (int r = 0; r < o->reps; r++) {
        double t = lo_unidir(fd, side == 0, sbuf, rbuf, o->chunk, o->bytes);
        best = t < best ? t : best;
    }
    if (side == 0) {
        lo_row(csv, "unidir", o->bytes, (double)o->bytes / best * 1e-9, "GB/s");
    }
    for (size_t n = 4; n <= 65536 && n <= o->chunk; n *= 4) {
        best = 1e30;
        for (int r = 0; r < o->reps; r++) {
            double t = lo_pingpong(fd, side == 0, sbuf, n, 1000);
            best = t < best ? t : best;
        }
        if (side == 0) {
            lo_row(csv, "pingpong", n, best * 1e6, "us half round trip");
        }
    }
    free(sbuf);
    free(rbuf);
}

int main(int argc, char **argv)
{
    struct lo_opts o = {.bytes = (size_t)256 << 20, .chunk = (size_t)1 << 20, .reps = 3};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--bytes") == 0) {
            o.bytes = peer_parse_size(argv[i + 1]);
        } else if (strcmp(argv[i], "--chunk") == 0) {
            o.chunk = peer_parse_size(argv[i + 1]);
        } else if (strcmp(argv[i], "--reps") == 0) {
            o.reps = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--csv") == 0) {
            o.csv = argv[i + 1];
        } else {
            break;
        }
    }
    if (argc % 2 == 0 || !o.bytes || !o.chunk || o.reps < 1) {
        fprintf(stderr, "usage: tcp_loopback [--bytes 256M] [--chunk 1M] [--reps 3] [--csv F]\n");
        return 2;
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(lfd, 1) < 0 ||
        getsockname(lfd, (struct sockaddr *)&addr, &len) < 0) {
        lo_die("tcp_loopback: listen");
    }
    pid_t pid = fork();
    if (pid < 0) {
        lo_die("tcp_loopback: fork");
    }
    if (pid == 0) {
        close(lfd);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
            lo_die("tcp_loopback: connect");
        }
        lo_run(fd, 1, &o, NULL);
        close(fd);
        _exit(0);
    }
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) {
        kill(pid, SIGTERM);
        lo_die("tcp_loopback: accept");
    }
    close(lfd);
    FILE *csv = NULL;
    if (o.csv) {
        csv = fopen(o.csv, "w");
        if (!csv) {
            kill(pid, SIGTERM);
            lo_die(o.csv);
        }
        fprintf(csv, "limit,test,size_bytes,value,unit\n");
    }
    printf("# loopback TCP between two processes, best of %d, %zu bytes in %zu-byte writes\n",
           o.reps, o.bytes, o.chunk);
    lo_run(fd, 0, &o, csv);
    close(fd);
    if (csv) {
        fclose(csv);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
