/*
 * store_tcp.c - the TCP store client that every rank (rank 0 included) uses
 * to talk to the store server of rank 0 (store_tcp_server.c).
 *
 * connect() retries until its deadline, since rank 0 may start late, and
 * runs the challenge-response of store_tcp.h: a server that cannot prove it
 * holds the job's key, or a refusal, ends it at once. Requests are synchronous, one at a time under a
 * mutex; get and wait send their timeout along and the server answers at
 * the latest then, so the client only adds a grace period for the reply. A
 * transport error drops the connection for good and every later call says
 * so: the server (rank 0) is gone.
 *
 * Owns: one socket.
 */
#include "config.h"
#include "rendezvous/store.h"
#include "rendezvous/store_impl.h"
#include "rendezvous/store_tcp.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define STCP_REPLY_GRACE_S 10.0 /* beyond a get/wait deadline, for the reply */

struct stcp_client {
    struct fsdp_store base;
    pthread_mutex_t mu; /* one request at a time */
    int fd;             /* -1 once the connection is lost */
    double timeout_s;   /* default deadline */
    char addr[300];     /* "host:port" for messages */
};

/* Sends or receives exactly len bytes before deadline. 0, FSDP_ERR_TIMEOUT,
 * FSDP_ERR_PEER (closed) or FSDP_ERR_IO; records nothing. */
static int stcp_io(int fd, void *buf, size_t len, int sending, double deadline)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = sending ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL)
                            : recv(fd, (char *)buf + done, len - done, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0 && !sending) {
            return FSDP_ERR_PEER;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            return errno == ECONNRESET || errno == EPIPE ? FSDP_ERR_PEER : FSDP_ERR_IO;
        }
        double left = deadline - fsdp_now();
        if (left <= 0) {
            return FSDP_ERR_TIMEOUT;
        }
        struct pollfd p = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1e3) + 1;
        if (poll(&p, 1, ms) < 0 && errno != EINTR) {
            return FSDP_ERR_IO;
        }
    }
    return 0;
}

/* Sends a request. Header and key go in one segment. */
static int stcp_send(int fd, int type, int64_t arg, const char *key, const void *val,
                     size_t vlen, double deadline)
{
    unsigned char buf[STCP_HDR + FSDP_STORE_MAX_KEY + 512];
    size_t klen = key ? strlen(key) : 0;
    stcp_pack(buf, type, arg, klen, vlen);
    if (klen) {
        memcpy(buf + STCP_HDR, key, klen);
    }
    size_t n = STCP_HDR + klen;
    if (vlen <= 512) { /* small values ride along */
        if (vlen) {
            memcpy(buf + n, val, vlen);
        }
        return stcp_io(fd, buf, n + vlen, 1, deadline);
    }
    int rc = stcp_io(fd, buf, n, 1, deadline);
    return rc ? rc : stcp_io(fd, (void *)(uintptr_t)val, vlen, 1, deadline);
}

/* Receives a reply of at most vmax value bytes (judged on the header,
 * before anything is allocated). *key and *val are malloc'd
 * (NUL-terminated) or NULL. */
static int stcp_recv(int fd, struct stcp_hdr *h, char **key, void **val, uint64_t vmax,
                     double deadline)
{
    unsigned char b[STCP_HDR];
    *key = NULL;
    *val = NULL;
    int rc = stcp_io(fd, b, STCP_HDR, 0, deadline);
    if (rc) {
        return rc;
    }
    stcp_unpack(b, h);
    if (h->magic != STCP_MAGIC || h->version != STCP_VERSION || h->type < STCP_R_OK ||
        h->type > STCP_R_CHALLENGE || h->klen > FSDP_STORE_MAX_KEY ||
        h->vlen > vmax) {
        return FSDP_ERR_FORMAT;
    }
    *key = malloc((size_t)h->klen + 1);
    *val = malloc((size_t)h->vlen + 1);
    if (!*key || !*val) {
        free(*key);
        free(*val);
        *key = NULL;
        *val = NULL;
        return FSDP_ERR_NOMEM;
    }
    rc = stcp_io(fd, *key, h->klen, 0, deadline);
    if (!rc) {
        rc = stcp_io(fd, *val, (size_t)h->vlen, 0, deadline);
    }
    (*key)[h->klen] = '\0';
    ((char *)*val)[h->vlen] = '\0';
    if (rc) {
        free(*key);
        free(*val);
        *key = NULL;
        *val = NULL;
    }
    return rc;
}

/* One request and its reply; the mutex is held by the caller. On transport
 * failure the connection is dropped and the error recorded. */
static int stcp_call(struct stcp_client *cl, int type, int64_t arg, const char *key,
                     const void *val, size_t vlen, double deadline, struct stcp_hdr *rh,
                     char **rkey, void **rval)
{
    const char *what = key ? key : "(wait list)";
    if (cl->fd < 0) {
        return fsdp_err(FSDP_ERR_PEER, "store %s: connection lost earlier", cl->addr);
    }
    int rc = stcp_send(cl->fd, type, arg, key, val, vlen, deadline);
    if (!rc) {
        rc = stcp_recv(cl->fd, rh, rkey, rval, FSDP_STORE_MAX_VALUE, deadline);
    }
    if (rc == 0) {
        return 0;
    }
    close(cl->fd);
    cl->fd = -1;
    switch (rc) {
    case FSDP_ERR_TIMEOUT:
        return fsdp_err(FSDP_ERR_TIMEOUT, "store %s: no reply for key '%s' (server stuck?)",
                        cl->addr, what);
    case FSDP_ERR_PEER:
        return fsdp_err(FSDP_ERR_PEER, "store %s: connection lost (key '%s'): the store "
                        "server (rank 0) ended or closed it", cl->addr, what);
    case FSDP_ERR_FORMAT:
        return fsdp_err(FSDP_ERR_FORMAT, "store %s: malformed reply (key '%s')", cl->addr, what);
    case FSDP_ERR_NOMEM:
        return fsdp_err(FSDP_ERR_NOMEM, "store %s: out of memory for the reply to '%s'",
                        cl->addr, what);
    default:
        return fsdp_err(FSDP_ERR_IO, "store %s: I/O error on key '%s': %s", cl->addr, what,
                        strerror(errno));
    }
}

static int stcp_reply_error(const struct stcp_client *cl, const char *op, const char *key,
                            const struct stcp_hdr *h, const char *msg)
{
    if (h->type == STCP_R_ERR) {
        /* the server sends the error code along */
        int code = h->arg < 0 && h->arg >= FSDP_ERR_BACKEND ? (int)h->arg : FSDP_ERR_PEER;
        char why[512];
        fsdp_str_printable(why, sizeof(why), msg, 0);
        return fsdp_err(code, "store %s: %s '%s': %s", cl->addr, op, key, why);
    }
    return fsdp_err(FSDP_ERR_FORMAT, "store %s: unexpected reply type %u to %s '%s'", cl->addr,
                    h->type, op, key);
}

static double stcp_timeout(const struct stcp_client *cl, double timeout_s)
{
    return timeout_s < 0 ? cl->timeout_s : timeout_s;
}

static int64_t stcp_ms(double t)
{
    return t > 9e15 ? (int64_t)9e15 : (int64_t)(t * 1e3 + 0.5);
}

static int stcp_set(struct fsdp_store *s, const char *key, const void *val, size_t len)
{
    struct stcp_client *cl = (struct stcp_client *)s;
    struct stcp_hdr h;
    char *rk;
    void *rv;
    if ((uint64_t)len > FSDP_STORE_MAX_VALUE) {
        return fsdp_err(FSDP_ERR_INVALID, "store %s: value of '%s' is %zu bytes (limit %" PRIu64
                        ")", cl->addr, key, len, FSDP_STORE_MAX_VALUE);
    }
    pthread_mutex_lock(&cl->mu);
    int rc = stcp_call(cl, STCP_SET, 0, key, val, len, fsdp_now() + cl->timeout_s, &h, &rk, &rv);
    pthread_mutex_unlock(&cl->mu);
    if (rc == 0 && h.type != STCP_R_OK) {
        rc = stcp_reply_error(cl, "set", key, &h, rv);
    }
    if (rc == 0) {
        free(rk);
        free(rv);
    }
    return rc;
}

static int stcp_get(struct fsdp_store *s, const char *key, void **val, size_t *len,
                    double timeout_s)
{
    struct stcp_client *cl = (struct stcp_client *)s;
    struct stcp_hdr h;
    char *rk;
    void *rv;
    double t = stcp_timeout(cl, timeout_s);
    pthread_mutex_lock(&cl->mu);
    int rc = stcp_call(cl, STCP_GET, stcp_ms(t), key, NULL, 0,
                       fsdp_now() + t + STCP_REPLY_GRACE_S, &h, &rk, &rv);
    pthread_mutex_unlock(&cl->mu);
    if (rc) {
        return rc;
    }
    free(rk);
    if (h.type == STCP_R_VALUE) {
        *val = rv;
        *len = (size_t)h.vlen;
        return 0;
    }
    if (h.type == STCP_R_TIMEOUT) {
        rc = fsdp_err(FSDP_ERR_TIMEOUT, "store %s: key '%s' not set within %.1f s", cl->addr,
                      key, t);
    } else {
        rc = stcp_reply_error(cl, "get", key, &h, rv);
    }
    free(rv);
    return rc;
}

/* One request whose reply is a number (add's new value, check's answer). */
static int stcp_call_value(struct stcp_client *cl, int type, int64_t arg, const char *op,
                           const char *key, int64_t *value)
{
    struct stcp_hdr h;
    char *rk;
    void *rv;
    pthread_mutex_lock(&cl->mu);
    int rc = stcp_call(cl, type, arg, key, NULL, 0, fsdp_now() + cl->timeout_s, &h, &rk, &rv);
    pthread_mutex_unlock(&cl->mu);
    if (rc) {
        return rc;
    }
    if (h.type == STCP_R_VALUE) {
        *value = h.arg;
    } else {
        rc = stcp_reply_error(cl, op, key, &h, rv);
    }
    free(rk);
    free(rv);
    return rc;
}

static int stcp_add(struct fsdp_store *s, const char *key, int64_t delta, int64_t *result)
{
    return stcp_call_value((struct stcp_client *)s, STCP_ADD, delta, "add", key, result);
}

static int stcp_wait(struct fsdp_store *s, const char *const *keys, size_t n, double timeout_s)
{
    struct stcp_client *cl = (struct stcp_client *)s;
    struct stcp_hdr h;
    char *rk;
    void *rv;
    double t = stcp_timeout(cl, timeout_s);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        total += strlen(keys[i]) + 1;
    }
    char *list = malloc(total);
    if (!list) {
        return fsdp_err(FSDP_ERR_NOMEM, "store %s: wait on %zu keys: out of memory", cl->addr, n);
    }
    char *p = list;
    for (size_t i = 0; i < n; i++) {
        size_t k = strlen(keys[i]) + 1;
        memcpy(p, keys[i], k);
        p += k;
    }
    pthread_mutex_lock(&cl->mu);
    int rc = stcp_call(cl, STCP_WAIT, stcp_ms(t), NULL, list, total,
                       fsdp_now() + t + STCP_REPLY_GRACE_S, &h, &rk, &rv);
    pthread_mutex_unlock(&cl->mu);
    free(list);
    if (rc) {
        return rc;
    }
    if (h.type == STCP_R_TIMEOUT) {
        rc = fsdp_err(FSDP_ERR_TIMEOUT, "store %s: key '%s' not set within %.1f s", cl->addr,
                      rk, t);
    } else if (h.type != STCP_R_OK) {
        rc = stcp_reply_error(cl, "wait", keys[0], &h, rv);
    }
    free(rk);
    free(rv);
    return rc;
}

static int stcp_check(struct fsdp_store *s, const char *key, int *exists)
{
    int64_t v = 0;
    int rc = stcp_call_value((struct stcp_client *)s, STCP_CHECK, 0, "check", key, &v);
    if (rc == 0) {
        *exists = v != 0;
    }
    return rc;
}

static void stcp_destroy(struct fsdp_store *s)
{
    struct stcp_client *cl = (struct stcp_client *)s;
    if (cl->fd >= 0) {
        close(cl->fd);
    }
    pthread_mutex_destroy(&cl->mu);
    free(cl);
}

static const struct fsdp_store_ops stcp_ops = {
    .size = sizeof(struct fsdp_store_ops),
    .name = "tcp",
    .set = stcp_set,
    .get = stcp_get,
    .add = stcp_add,
    .wait = stcp_wait,
    .check = stcp_check,
    .destroy = stcp_destroy,
};

/* One connection attempt to one address: 0 with *fd connected, or an errno
 * (ETIMEDOUT after STCP_CONNECT_TRY_S). The wait is short because a SYN the
 * server's full backlog dropped (a connection flood) is resent by the
 * kernel only 1, 3, 7, 15 s later: a fresh attempt gets a free slot sooner. */
static int stcp_try_connect(const struct addrinfo *ai, double deadline, int *fd_out)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) {
        return errno;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        if (errno != EINPROGRESS) {
            int e = errno;
            close(fd);
            return e;
        }
        double left = deadline - fsdp_now();
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        left = left < STCP_CONNECT_TRY_S ? left : STCP_CONNECT_TRY_S;
        int ms = left > 0 ? (int)(left * 1e3) + 1 : 0;
        int r = poll(&p, 1, ms);
        int err = 0;
        socklen_t el = sizeof(err);
        if (r <= 0) {
            err = r == 0 ? ETIMEDOUT : errno;
        } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0) {
            err = errno;
        }
        if (err) {
            close(fd);
            return err;
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd_out = fd;
    return 0;
}

/* The handshake (store_tcp.h): our challenge out, the server's challenge
 * and MAC in and checked, our MAC out, OK in. 0, a refusal or a server
 * that failed the check (recorded, final), or -1 to retry. */
static int stcp_hello(struct stcp_client *cl, const struct fsdp_auth_key *key, double deadline)
{
    char who[STCP_HELLO_KEY_MAX];
    char host[128] = "?";
    unsigned char cchal[FSDP_AUTH_CHAL_BYTES], mac[FSDP_AUTH_MAC_BYTES];
    struct stcp_hdr h;
    char *rk = NULL;
    void *rv = NULL;
    FSDP_CHECK(fsdp_auth_random(cchal, sizeof(cchal)));
    gethostname(host, sizeof(host) - 1);
    snprintf(who, sizeof(who), "%s pid %d", host, (int)getpid());
    double d = fsdp_now() + STCP_HELLO_TIMEOUT_S;
    d = d < deadline ? d : deadline;
    int rc = stcp_send(cl->fd, STCP_HELLO, 0, who, cchal, sizeof(cchal), d);
    if (!rc) {
        rc = stcp_recv(cl->fd, &h, &rk, &rv, STCP_PREAUTH_REPLY_MAX, d);
    }
    if (rc) {
        return -1; /* not our server, or it went away: try again */
    }
    if (h.type == STCP_R_CHALLENGE && h.vlen == FSDP_AUTH_CHAL_BYTES + FSDP_AUTH_MAC_BYTES) {
        const unsigned char *schal = rv;
        fsdp_auth_mac(key, STCP_LABEL_SERVER, cchal, sizeof(cchal), schal, FSDP_AUTH_CHAL_BYTES,
                      mac);
        if (!fsdp_auth_mac_equal(mac, schal + FSDP_AUTH_CHAL_BYTES)) {
            free(rk);
            free(rv);
            return fsdp_err(FSDP_ERR_AUTH, "the store at %s failed to prove that it holds this "
                            "job's secret: it is another job's store, or the ranks were given "
                            "different secrets (FSDPC_SECRET / FSDPC_SECRET_FILE)", cl->addr);
        }
        fsdp_auth_mac(key, STCP_LABEL_CLIENT, cchal, sizeof(cchal), schal, FSDP_AUTH_CHAL_BYTES,
                      mac);
        free(rk);
        free(rv);
        rk = NULL;
        rv = NULL;
        rc = stcp_send(cl->fd, STCP_AUTH, 0, "", mac, sizeof(mac), d);
        if (!rc) {
            rc = stcp_recv(cl->fd, &h, &rk, &rv, STCP_PREAUTH_REPLY_MAX, d);
        }
        if (rc) {
            return -1;
        }
        if (h.type == STCP_R_OK) {
            free(rk);
            free(rv);
            return 0;
        }
    }
    /* before the proof, the reply may come from anyone: print it only as
     * plain text, so that no escape sequence reaches the terminal */
    char why[512];
    fsdp_str_printable(why, sizeof(why), h.type == STCP_R_ERR ? (char *)rv
                       : "unexpected reply to the hello", 0);
    rc = fsdp_err(h.type == STCP_R_ERR ? FSDP_ERR_AUTH : FSDP_ERR_MISMATCH,
                  "store %s refused this process: %s", cl->addr, why);
    free(rk);
    free(rv);
    return rc;
}

int fsdp_store_tcp_connect(const char *host, int port, const struct fsdp_auth_key *key,
                           double timeout_s, struct fsdp_store **out)
{
    if (!host || !host[0] || port <= 0 || port > 65535) {
        return fsdp_err(FSDP_ERR_INVALID, "store: bad address '%s:%d'", host ? host : "", port);
    }
    struct stcp_client *cl = calloc(1, sizeof(*cl));
    if (!cl) {
        return fsdp_err(FSDP_ERR_NOMEM, "store: out of memory");
    }
    cl->base.ops = &stcp_ops;
    cl->fd = -1;
    cl->timeout_s = timeout_s;
    pthread_mutex_init(&cl->mu, NULL);
    snprintf(cl->addr, sizeof(cl->addr), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);

    double t0 = fsdp_now(), deadline = t0 + timeout_s, backoff = 0.02;
    char last[200] = "no attempt";
    char ports[16];
    snprintf(ports, sizeof(ports), "%d", port);
    for (int attempt = 0;; attempt++) {
        struct addrinfo hints = {0}, *res = NULL;
        int waited = 0; /* an attempt timed out: try again at once */
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        int g = getaddrinfo(host, ports, &hints, &res);
        if (g != 0) {
            snprintf(last, sizeof(last), "cannot resolve '%s': %s", host, gai_strerror(g));
        }
        for (struct addrinfo *ai = res; g == 0 && ai && cl->fd < 0; ai = ai->ai_next) {
            int e = stcp_try_connect(ai, deadline, &cl->fd);
            if (e) {
                snprintf(last, sizeof(last), "%s", strerror(e));
                waited = waited || e == ETIMEDOUT;
                continue;
            }
            int rc = stcp_hello(cl, key, deadline);
            if (rc == 0) {
                break;
            }
            close(cl->fd);
            cl->fd = -1;
            if (rc < -1) {
                freeaddrinfo(res);
                stcp_destroy(&cl->base);
                return rc;
            }
            snprintf(last, sizeof(last), "connected, but no answer to the hello");
        }
        if (res) {
            freeaddrinfo(res);
        }
        if (cl->fd >= 0) {
            break;
        }
        double left = deadline - fsdp_now();
        if (left <= 0) {
            int rc = fsdp_err(FSDP_ERR_TIMEOUT, "cannot reach the store at %s within %.1f s "
                              "(%d attempts; last: %s)", cl->addr, fsdp_now() - t0,
                              attempt + 1, last);
            stcp_destroy(&cl->base);
            return rc;
        }
        if (attempt == 0 || attempt % 20 == 0) {
            FSDP_DEBUG(FSDP_SUB_DIST, "store %s not reachable yet (%s); retrying", cl->addr, last);
        }
        if (!waited) {
            usleep((useconds_t)((backoff < left ? backoff : left) * 1e6));
            backoff = backoff * 2 > 1.0 ? 1.0 : backoff * 2;
        }
    }
    FSDP_DEBUG(FSDP_SUB_DIST, "store %s: connected after %.2f s", cl->addr, fsdp_now() - t0);
    *out = &cl->base;
    return 0;
}
