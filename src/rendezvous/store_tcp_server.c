/*
 * store_tcp_server.c - the TCP store server: one thread around poll(), run
 * by rank 0 (fsdp_store_tcp_serve / fsdp_store_tcp_server_stop).
 *
 * Non-blocking sockets, a read state machine and an output buffer per
 * connection, so one slow or silent client never delays another. get and
 * wait wait on the server side: the connection is parked until its keys
 * exist or its deadline passes, then answered, so a client's request/reply
 * stream never gets out of step. A connection that does not open with the
 * challenge-response of store_tcp.h (right magic and version, a MAC that
 * proves the job's key), or that sends garbage later, is refused and
 * closed; the server logs a warning and carries on.
 * Stopping wakes the thread through an eventfd, joins it and closes every
 * socket, whatever the clients are doing.
 *
 * Limits, so that no client, in or out of the job, can exhaust rank 0: at
 * most STCP_MAX_PENDING connections may be in their hello at once, at most
 * STCP_MAX_PENDING_PER_SOURCE of one source address, and of those at most
 * STCP_MAX_SILENT_PER_SOURCE that have sent nothing yet; a new one closes
 * the oldest (silent first) of its own source when that source is at its
 * limit, else, when all are taken, the oldest silent one, else the oldest
 * (so a flood from one host never closes the connections of ranks on
 * others, and a rank that says hello at once survives a flood from its own
 * host). A connection must send its first bytes within STCP_SILENT_S and
 * complete its hello within STCP_HELLO_TIMEOUT_S. Accepting takes at most
 * STCP_ACCEPT_BATCH connections a turn, cheaply (no name lookups), so that
 * the listen backlog drains at the rate a flood fills it and the hellos of
 * those accepted are read before the next batch can close them. A
 * connection's net stored bytes stay within a quota (FSDPC_STORE_QUOTA_MB,
 * 256 MiB) and the table, with the values still being received, within
 * four quotas, both checked against a value's announced length before
 * anything is allocated, and when descriptors run out accepting pauses
 * instead of spinning. Past a burst of 8, warnings from the server print at most once
 * a second, with a count of the ones held back.
 *
 * Owns: the listening socket, the accepted sockets, the server thread and
 * the key-value table.
 */
#include "config.h"
#include "rendezvous/store.h"
#include "rendezvous/store_impl.h"
#include "rendezvous/store_tcp.h"
#include "rendezvous/netaddr.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define STCP_READ_BUDGET (8u << 20) /* bytes read from one client per loop turn */
#define STCP_MAX_PENDING 256        /* connections still in their hello */
#define STCP_MAX_PENDING_PER_SOURCE 128 /* of them, from one address */
#define STCP_MAX_SILENT_PER_SOURCE 64 /* of those, that sent nothing yet */
#define STCP_SILENT_S 0.5           /* a connection sends its first bytes within this */
#define STCP_ACCEPT_BATCH 32        /* connections accepted per loop turn */
#define STCP_WAIT_LIST_MAX (1u << 20) /* bytes of keys in one WAIT */
#define STCP_ACCEPT_PAUSE_S 0.1     /* out of descriptors: accept again after this */
#define STCP_WARN_BURST 8.0         /* warning lines that may print at once */

struct fsdp_store_server;

struct stcp_conn {
    struct fsdp_store_server *srv;
    int fd;                  /* -1 once closed */
    int challenged;          /* said hello; its AUTH is due */
    int authed;              /* proved the key: requests are taken */
    unsigned char cchal[FSDP_AUTH_CHAL_BYTES]; /* the client's challenge */
    unsigned char schal[FSDP_AUTH_CHAL_BYTES]; /* ours to it */
    char who[80];            /* the client's description from its hello (printable) */
    int closing;             /* refused: close once the output is flushed */
    char peer[64];           /* "addr:port" */
    unsigned char src[FSDP_NETADDR_SRC_BYTES]; /* the peer's address */
    double accepted;         /* fsdp_now() at accept */
    double hello_deadline;
    unsigned char hbuf[STCP_HDR];
    size_t hgot;
    struct stcp_hdr hdr;     /* valid once hgot == STCP_HDR */
    char *key;               /* (klen + 1,) */
    unsigned char *val;      /* (vlen,) */
    size_t kgot, vgot;
    int parked;              /* a get/wait waiting for keys */
    double park_deadline;
    unsigned char *out;      /* (out_cap,) replies not yet written */
    size_t out_len, out_off, out_cap;
    int64_t stored;          /* net bytes of values this connection's sets added */
    int64_t incoming;        /* bytes of the value being received, reserved */
};

struct fsdp_store_server {
    pthread_t thread;
    int listen_fd;
    int wake_fd; /* eventfd: stop request */
    atomic_int stop;
    struct fsdp_auth_key key;
    int port;
    struct fsdp_kv kv;
    int kv_changed; /* a set/add happened this turn: re-check parked requests */
    struct stcp_conn **conns;
    size_t nconns, cap;
    struct pollfd *pfds;
    size_t pfd_cap;
    int64_t quota;           /* per connection, bytes */
    int64_t table_bytes;     /* bytes of every value held */
    int64_t incoming_bytes;  /* bytes of values being received (reserved) */
    double accept_paused_until;
    double last_warn;        /* fsdp_now() of the last warning asked for */
    double warn_tokens;      /* lines that may print now (refilled 1 a second) */
    long warns_held;         /* warnings not printed since the last printed one */
};

/* A server warning. A burst of STCP_WARN_BURST lines prints; beyond that at
 * most one line a second, so a flood of connections cannot flood the log:
 * the lines held back are counted and the count rides on the next one. */
static void srv_warn(struct fsdp_store_server *srv, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void srv_warn(struct fsdp_store_server *srv, const char *fmt, ...)
{
    double now = fsdp_now();
    srv->warn_tokens += now - srv->last_warn;
    srv->warn_tokens = srv->warn_tokens > STCP_WARN_BURST ? STCP_WARN_BURST : srv->warn_tokens;
    srv->last_warn = now;
    if (srv->warn_tokens < 1.0) {
        srv->warns_held++;
        return;
    }
    srv->warn_tokens -= 1.0;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (srv->warns_held) {
        FSDP_WARN(FSDP_SUB_DIST, "store server: %s (%ld similar warnings held back)", msg,
                  srv->warns_held);
    } else {
        FSDP_WARN(FSDP_SUB_DIST, "store server: %s", msg);
    }
    srv->warns_held = 0;
}

static void conn_reset_request(struct stcp_conn *c)
{
    c->srv->incoming_bytes -= c->incoming;
    c->incoming = 0;
    free(c->key);
    free(c->val);
    c->key = NULL;
    c->val = NULL;
    c->hgot = c->kgot = c->vgot = 0;
    c->parked = 0;
}

static void conn_close(struct stcp_conn *c)
{
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    conn_reset_request(c);
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = c->out_cap = 0;
}

/* Writes what the socket takes now; closes the connection on error. */
static void conn_flush(struct stcp_conn *c)
{
    while (c->fd >= 0 && c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        } else {
            FSDP_DEBUG(FSDP_SUB_DIST, "store server: client %s: send: %s", c->peer,
                       strerror(errno));
            conn_close(c);
            return;
        }
    }
    if (c->fd >= 0) {
        c->out_off = c->out_len = 0;
        if (c->out_cap > (1u << 20)) { /* do not keep a big reply's buffer */
            free(c->out);
            c->out = NULL;
            c->out_cap = 0;
        }
        if (c->closing) {
            conn_close(c);
        }
    }
}

static void conn_reply(struct stcp_conn *c, int type, int64_t arg, const void *key, size_t klen,
                       const void *val, size_t vlen)
{
    size_t need = c->out_len + STCP_HDR + klen + vlen;
    if (need > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 256;
        while (cap < need) {
            cap *= 2;
        }
        unsigned char *p = realloc(c->out, cap);
        if (!p) {
            srv_warn(c->srv, "out of memory replying to %s (%zu bytes); closing it", c->peer,
                     need);
            conn_close(c);
            return;
        }
        c->out = p;
        c->out_cap = cap;
    }
    unsigned char *o = c->out + c->out_len;
    stcp_pack(o, type, arg, klen, vlen);
    if (klen) {
        memcpy(o + STCP_HDR, key, klen);
    }
    if (vlen) {
        memcpy(o + STCP_HDR + klen, val, vlen);
    }
    c->out_len = need;
    conn_flush(c);
}

static void conn_refuse(struct stcp_conn *c, const char *why, int tell)
{
    srv_warn(c->srv, "refused connection from %s: %s", c->peer, why);
    if (tell) {
        c->closing = 1;
        conn_reply(c, STCP_R_ERR, FSDP_ERR_MISMATCH, NULL, 0, why, strlen(why));
    } else {
        conn_close(c);
    }
}

/* The first key of a WAIT request that does not exist yet, or NULL. */
static const char *srv_first_missing(const struct fsdp_store_server *srv, const struct stcp_conn *c)
{
    const char *p = (const char *)c->val;
    const char *end = p + c->hdr.vlen;
    while (p < end) {
        if (!fsdp_kv_find(&srv->kv, p)) {
            return p;
        }
        p += strlen(p) + 1;
    }
    return NULL;
}

/* Answers a parked get/wait if its keys exist or its deadline passed. */
static void srv_try_parked(struct fsdp_store_server *srv, struct stcp_conn *c, double now)
{
    if (c->hdr.type == STCP_GET) {
        struct fsdp_kv_entry *e = fsdp_kv_find(&srv->kv, c->key);
        if (e) {
            conn_reply(c, STCP_R_VALUE, 0, NULL, 0, e->val, e->len);
        } else if (now >= c->park_deadline) {
            conn_reply(c, STCP_R_TIMEOUT, 0, c->key, strlen(c->key), NULL, 0);
        } else {
            c->parked = 1;
            return;
        }
    } else {
        const char *missing = srv_first_missing(srv, c);
        if (!missing) {
            conn_reply(c, STCP_R_OK, 0, NULL, 0, NULL, 0);
        } else if (now >= c->park_deadline) {
            conn_reply(c, STCP_R_TIMEOUT, 0, missing, strlen(missing), NULL, 0);
        } else {
            c->parked = 1;
            return;
        }
    }
    conn_reset_request(c);
}

/* HELLO: the client's challenge in; our challenge and our MAC over both
 * out. The client checks the MAC (so it knows this server holds the key)
 * and answers with AUTH. */
static void srv_handle_hello(struct fsdp_store_server *srv, struct stcp_conn *c)
{
    unsigned char reply[FSDP_AUTH_CHAL_BYTES + FSDP_AUTH_MAC_BYTES];
    if (fsdp_auth_random(c->schal, sizeof(c->schal)) < 0) {
        fsdp_err_clear();
        conn_refuse(c, "no random bytes for a challenge", 1);
        return;
    }
    memcpy(c->cchal, c->val, sizeof(c->cchal));
    size_t n = 0;
    for (const char *p = c->key; *p && n + 1 < sizeof(c->who); p++) {
        c->who[n++] = *p >= 0x20 && *p < 0x7f ? *p : '?';
    }
    c->who[n] = '\0';
    memcpy(reply, c->schal, sizeof(c->schal));
    fsdp_auth_mac(&srv->key, STCP_LABEL_SERVER, c->cchal, sizeof(c->cchal), c->schal,
                  sizeof(c->schal), reply + FSDP_AUTH_CHAL_BYTES);
    c->challenged = 1;
    conn_reply(c, STCP_R_CHALLENGE, 0, NULL, 0, reply, sizeof(reply));
    conn_reset_request(c);
}

/* AUTH: the client's MAC over both challenges proves it holds the key. */
static void srv_handle_auth(struct fsdp_store_server *srv, struct stcp_conn *c)
{
    unsigned char want[FSDP_AUTH_MAC_BYTES];
    fsdp_auth_mac(&srv->key, STCP_LABEL_CLIENT, c->cchal, sizeof(c->cchal), c->schal,
                  sizeof(c->schal), want);
    if (!fsdp_auth_mac_equal(want, c->val)) {
        conn_refuse(c, "authentication failed: the client does not hold this job's secret "
                    "(another job, or a different FSDPC_SECRET)", 1);
        return;
    }
    c->authed = 1;
    FSDP_DEBUG(FSDP_SUB_DIST, "store server: client %s (%s) joined", c->peer, c->who);
    conn_reply(c, STCP_R_OK, 0, NULL, 0, NULL, 0);
    conn_reset_request(c);
}

/* A complete request is in c->hdr, c->key, c->val. */
static void srv_handle(struct fsdp_store_server *srv, struct stcp_conn *c)
{
    int64_t result;
    int rc;
    switch (c->hdr.type) {
    case STCP_HELLO:
        srv_handle_hello(srv, c);
        return;
    case STCP_AUTH:
        srv_handle_auth(srv, c);
        return;
    case STCP_SET:
        rc = FSDP_ERR_NOMEM;
        if (!c->val) {
            c->val = malloc(1); /* the table never holds NULL */
        }
        if (c->val) {
            const struct fsdp_kv_entry *old = fsdp_kv_find(&srv->kv, c->key);
            int64_t delta = (int64_t)c->hdr.vlen - (old ? (int64_t)old->len : 0);
            rc = fsdp_kv_set(&srv->kv, c->key, c->val, (size_t)c->hdr.vlen);
            c->val = NULL; /* the table owns it now */
            srv->kv_changed = 1;
            if (rc == 0) {
                c->stored += delta;
                srv->table_bytes += delta;
            }
        }
        if (rc < 0) {
            conn_reply(c, STCP_R_ERR, FSDP_ERR_NOMEM, NULL, 0, "out of memory", 13);
        } else {
            conn_reply(c, STCP_R_OK, 0, NULL, 0, NULL, 0);
        }
        break;
    case STCP_GET:
    case STCP_WAIT:
        c->park_deadline = fsdp_now() + (double)c->hdr.arg * 1e-3;
        srv_try_parked(srv, c, fsdp_now());
        return;
    case STCP_ADD:
        rc = fsdp_kv_add(&srv->kv, c->key, c->hdr.arg, &result);
        if (rc == 0) {
            srv->kv_changed = 1;
            conn_reply(c, STCP_R_VALUE, result, NULL, 0, NULL, 0);
        } else {
            const char *why = rc == FSDP_ERR_FORMAT ? "the key holds a value that is not an integer"
                              : rc == FSDP_ERR_INVALID ? "int64 overflow"
                                                       : "out of memory";
            conn_reply(c, STCP_R_ERR, rc, NULL, 0, why, strlen(why));
        }
        break;
    case STCP_CHECK:
        conn_reply(c, STCP_R_VALUE, fsdp_kv_find(&srv->kv, c->key) != NULL, NULL, 0, NULL, 0);
        break;
    default:
        break; /* rejected by srv_check_header */
    }
    conn_reset_request(c);
}

/* Whether the request announced in h would take more memory than the
 * connection's quota, the table's, or a wait list's limit allows, judged
 * before anything is allocated; why says which. */
static int srv_over_quota(const struct fsdp_store_server *srv, const struct stcp_conn *c,
                          const struct stcp_hdr *h, char *why, size_t len)
{
    if (h->type == STCP_WAIT && h->vlen > STCP_WAIT_LIST_MAX) {
        snprintf(why, len, "a wait list of %" PRIu64 " bytes (at most %u)", h->vlen,
                 STCP_WAIT_LIST_MAX);
        return 1;
    }
    if (h->type != STCP_SET) {
        return 0;
    }
    int64_t v = (int64_t)h->vlen; /* at most FSDP_STORE_MAX_VALUE: no overflow */
    if (c->stored + v > srv->quota) {
        snprintf(why, len, "a %" PRIu64 "-byte value would take this connection past its store "
                 "quota (%" PRId64 " of %" PRId64 " bytes held; FSDPC_STORE_QUOTA_MB)", h->vlen,
                 c->stored, srv->quota);
        return 1;
    }
    /* values still arriving count: they are allocated already */
    if (srv->table_bytes + srv->incoming_bytes + v > 4 * srv->quota) {
        snprintf(why, len, "a %" PRIu64 "-byte value would take the store past %" PRId64
                 " bytes", h->vlen, 4 * srv->quota);
        return 1;
    }
    return 0;
}

/* Validates a complete header and allocates the body. 0, or -1 when the
 * connection was refused or closed. */
static int srv_check_header(struct stcp_conn *c)
{
    struct stcp_hdr *h = &c->hdr;
    char why[160];
    stcp_unpack(c->hbuf, h);
    if (h->magic != STCP_MAGIC) {
        conn_refuse(c, "bad magic (the stream is out of step)", 0);
        return -1;
    }
    if (h->version != STCP_VERSION) {
        snprintf(why, sizeof(why), "store protocol version %u, this server speaks %d",
                 h->version, STCP_VERSION);
        conn_refuse(c, why, 1);
        return -1;
    }
    if (!c->challenged && (h->type != STCP_HELLO || h->vlen != FSDP_AUTH_CHAL_BYTES ||
                           h->klen > STCP_HELLO_KEY_MAX)) {
        conn_refuse(c, "the first message is not a valid hello", 1);
        return -1;
    }
    if (c->challenged && !c->authed &&
        (h->type != STCP_AUTH || h->vlen != FSDP_AUTH_MAC_BYTES || h->klen)) {
        conn_refuse(c, "the answer to the challenge is not a valid AUTH", 1);
        return -1;
    }
    int ok = h->reserved == 0 && h->klen <= FSDP_STORE_MAX_KEY && h->vlen <= FSDP_STORE_MAX_VALUE;
    switch (h->type) {
    case STCP_HELLO: ok = ok && !c->challenged; break;
    case STCP_AUTH: ok = ok && c->challenged && !c->authed; break;
    case STCP_SET: ok = ok && h->klen > 0; break;
    case STCP_GET: ok = ok && h->klen > 0 && h->vlen == 0 && h->arg >= 0; break;
    case STCP_ADD: ok = ok && h->klen > 0 && h->vlen == 0; break;
    case STCP_CHECK: ok = ok && h->klen > 0 && h->vlen == 0; break;
    case STCP_WAIT: ok = ok && h->klen == 0 && h->vlen > 0 && h->arg >= 0; break;
    default: ok = 0; break;
    }
    if (!ok) {
        snprintf(why, sizeof(why), "malformed request (type %u, key %u bytes, value %" PRIu64
                 " bytes)", h->type, h->klen, h->vlen);
        conn_refuse(c, why, 1);
        return -1;
    }
    if (srv_over_quota(c->srv, c, h, why, sizeof(why))) {
        conn_refuse(c, why, 1);
        return -1;
    }
    c->key = malloc((size_t)h->klen + 1);
    c->val = h->vlen ? malloc((size_t)h->vlen) : NULL;
    if (!c->key || (h->vlen && !c->val)) {
        srv_warn(c->srv, "out of memory for a %" PRIu64 "-byte value from %s; closing it",
                 h->vlen, c->peer);
        conn_close(c);
        return -1;
    }
    c->key[h->klen] = '\0';
    if (h->type == STCP_SET) {
        c->incoming = (int64_t)h->vlen;
        c->srv->incoming_bytes += c->incoming;
    }
    return 0;
}

/* Keys must not hold NUL; a WAIT list must be NUL-terminated keys. */
static int srv_check_body(struct stcp_conn *c)
{
    if (strlen(c->key) != c->hdr.klen) {
        conn_refuse(c, "key holds a NUL byte", 1);
        return -1;
    }
    if (c->hdr.type == STCP_WAIT) {
        const char *p = (const char *)c->val;
        size_t left = (size_t)c->hdr.vlen;
        if (p[left - 1] != '\0') {
            conn_refuse(c, "malformed wait list", 1);
            return -1;
        }
        while (left) {
            size_t n = strlen(p);
            if (n == 0 || n > FSDP_STORE_MAX_KEY) {
                conn_refuse(c, "malformed wait list", 1);
                return -1;
            }
            p += n + 1;
            left -= n + 1;
        }
    }
    return 0;
}

/* Reads into buf[*got..want); 1 when complete, 0 when the socket is drained,
 * -1 when the connection ended. */
static int conn_read_part(struct stcp_conn *c, void *buf, size_t want, size_t *got,
                          size_t *budget)
{
    while (*got < want) {
        size_t ask = want - *got;
        if (ask > *budget) {
            ask = *budget;
        }
        if (ask == 0) {
            return 0;
        }
        ssize_t n = recv(c->fd, (char *)buf + *got, ask, 0);
        if (n > 0) {
            *got += (size_t)n;
            *budget -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            return -1;
        }
    }
    return 1;
}

static void srv_read(struct fsdp_store_server *srv, struct stcp_conn *c)
{
    size_t budget = STCP_READ_BUDGET;
    while (c->fd >= 0 && !c->parked && !c->closing) {
        int r;
        if (c->hgot < STCP_HDR) {
            r = conn_read_part(c, c->hbuf, STCP_HDR, &c->hgot, &budget);
            if (!c->authed && c->hgot >= 4 && stcp_get_le(c->hbuf, 4) != STCP_MAGIC) {
                conn_refuse(c, "not an fsdpc store client (bad magic)", 0);
                return;
            }
            if (r == 1 && srv_check_header(c) < 0) {
                return;
            }
        } else if (c->kgot < c->hdr.klen) {
            r = conn_read_part(c, c->key, c->hdr.klen, &c->kgot, &budget);
        } else {
            r = conn_read_part(c, c->val, (size_t)c->hdr.vlen, &c->vgot, &budget);
        }
        if (r < 0) {
            if (c->authed) {
                FSDP_DEBUG(FSDP_SUB_DIST, "store server: client %s left", c->peer);
            } else if (c->hgot) {
                srv_warn(srv, "connection from %s closed during its hello", c->peer);
            }
            conn_close(c);
            return;
        }
        if (r == 0) {
            return;
        }
        if (c->hgot == STCP_HDR && c->kgot == c->hdr.klen && c->vgot == c->hdr.vlen) {
            if (srv_check_body(c) == 0) {
                srv_handle(srv, c);
            }
        }
    }
}

/* Room for more connections in srv->conns; 0 or -1 (out of memory). */
static int srv_grow(struct fsdp_store_server *srv)
{
    size_t cap = srv->cap ? 2 * srv->cap : 16;
    struct stcp_conn **p = realloc(srv->conns, cap * sizeof(*p));
    if (!p) {
        return -1;
    }
    srv->conns = p;
    srv->cap = cap;
    return 0;
}

/* Has sent nothing yet (a flood's connections, or a client a moment old). */
static int conn_silent(const struct stcp_conn *c)
{
    return !c->challenged && c->hgot == 0;
}

/* The connection to close so that a new one from src fits (the limits at
 * the head of this file), or NULL when it fits as things are. */
static struct stcp_conn *srv_victim(const struct fsdp_store_server *srv,
                                    const unsigned char *src)
{
    struct stcp_conn *own = NULL, *own_silent = NULL, *silent = NULL, *any = NULL;
    size_t pending = 0, n_own = 0, n_own_silent = 0;
    for (size_t i = 0; i < srv->nconns; i++) {
        struct stcp_conn *c = srv->conns[i];
        if (c->fd < 0 || c->authed) {
            continue;
        }
        int mine = memcmp(c->src, src, sizeof(c->src)) == 0, quiet = conn_silent(c);
        pending++;
        any = !any || c->accepted < any->accepted ? c : any;
        silent = quiet && (!silent || c->accepted < silent->accepted) ? c : silent;
        if (mine) {
            n_own++;
            own = !own || c->accepted < own->accepted ? c : own;
            n_own_silent += (size_t)quiet;
            own_silent = quiet && (!own_silent || c->accepted < own_silent->accepted)
                         ? c : own_silent;
        }
    }
    if (n_own_silent >= STCP_MAX_SILENT_PER_SOURCE) {
        return own_silent;
    }
    if (n_own >= STCP_MAX_PENDING_PER_SOURCE) {
        return own_silent ? own_silent : own;
    }
    return pending >= STCP_MAX_PENDING ? (silent ? silent : any) : NULL;
}

/* Takes one accepted connection in, closing another if the limits say so. */
static void srv_admit(struct fsdp_store_server *srv, int fd, const struct sockaddr_storage *ss)
{
    struct stcp_conn *c = calloc(1, sizeof(*c));
    if (!c || (srv->nconns == srv->cap && srv_grow(srv) < 0)) {
        free(c);
        close(fd);
        return;
    }
    fsdp_netaddr_peer(ss, c->peer, sizeof(c->peer), c->src);
    struct stcp_conn *victim = srv_victim(srv, c->src);
    if (victim) { /* a flood must keep connecting to keep others out */
        srv_warn(srv, "closed connection from %s: %s", victim->peer, conn_silent(victim)
                 ? "too many connections that sent nothing (this was the oldest)"
                 : "too many connections in their hello (this was the oldest)");
        conn_close(victim);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->srv = srv;
    c->fd = fd;
    c->accepted = fsdp_now();
    c->hello_deadline = c->accepted + STCP_HELLO_TIMEOUT_S;
    srv->conns[srv->nconns++] = c;
}

/* Accepts at most STCP_ACCEPT_BATCH connections: the loop then reads the
 * hellos of those, before a next batch could close them. */
static void srv_accept(struct fsdp_store_server *srv)
{
    for (int k = 0; k < STCP_ACCEPT_BATCH; k++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(srv->listen_fd, (struct sockaddr *)&ss, &sl,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                /* out of descriptors: the pending connection stays in the
                 * backlog; poll would report it at once, so look away a while */
                srv->accept_paused_until = fsdp_now() + STCP_ACCEPT_PAUSE_S;
                srv_warn(srv, "accept: %s; accepting again in %.1f s", strerror(errno),
                         STCP_ACCEPT_PAUSE_S);
            }
            return;
        }
        srv_admit(srv, fd, &ss);
    }
}

/* Deadlines: unanswered hellos and parked requests. Returns poll's timeout. */
static int srv_timers(struct fsdp_store_server *srv, double now)
{
    double next = now + 1.0;
    int changed = srv->kv_changed;
    srv->kv_changed = 0;
    for (size_t i = 0; i < srv->nconns; i++) {
        struct stcp_conn *c = srv->conns[i];
        if (c->fd < 0) {
            continue;
        }
        if (!c->authed && conn_silent(c) && now >= c->accepted + STCP_SILENT_S) {
            srv_warn(srv, "closed connection from %s: it sent nothing within %.0f ms", c->peer,
                     STCP_SILENT_S * 1e3);
            conn_close(c);
            continue;
        }
        if (!c->authed && now >= c->hello_deadline) {
            if (c->closing) {
                conn_close(c); /* refused, and does not even read the reason */
            } else {
                conn_refuse(c, "no hello within 10 s", 0);
            }
            continue;
        }
        if (c->parked && (changed || now >= c->park_deadline)) {
            srv_try_parked(srv, c, now);
            if (c->fd >= 0 && !c->parked) {
                srv_read(srv, c); /* a request may have queued behind it */
            }
        }
        if (c->fd >= 0 && !c->authed) {
            double d = conn_silent(c) ? c->accepted + STCP_SILENT_S : c->hello_deadline;
            next = d < next ? d : next;
        }
        if (c->fd >= 0 && c->parked && c->park_deadline < next) {
            next = c->park_deadline;
        }
    }
    if (srv->kv_changed) {
        return 0; /* requests read above changed keys: look at the parked again */
    }
    double ms = (next - now) * 1e3;
    return ms < 0 ? 0 : (int)ms + 1;
}

static void srv_compact(struct fsdp_store_server *srv)
{
    size_t j = 0;
    for (size_t i = 0; i < srv->nconns; i++) {
        if (srv->conns[i]->fd >= 0) {
            srv->conns[j++] = srv->conns[i];
        } else {
            free(srv->conns[i]);
        }
    }
    srv->nconns = j;
}

static void *srv_main(void *arg)
{
    struct fsdp_store_server *srv = arg;
    int timeout_ms = 1000;
    while (!atomic_load(&srv->stop)) {
        size_t n = srv->nconns + 2;
        if (n > srv->pfd_cap) {
            struct pollfd *p = realloc(srv->pfds, n * 2 * sizeof(*p));
            if (!p) {
                usleep(10000);
                continue;
            }
            srv->pfds = p;
            srv->pfd_cap = n * 2;
        }
        struct pollfd *pf = srv->pfds;
        pf[0] = (struct pollfd){.fd = srv->wake_fd, .events = POLLIN};
        double now = fsdp_now();
        int paused = now < srv->accept_paused_until;
        pf[1] = (struct pollfd){.fd = paused ? -1 : srv->listen_fd, .events = POLLIN};
        if (paused) {
            int ms = (int)((srv->accept_paused_until - now) * 1e3) + 1;
            timeout_ms = timeout_ms < ms ? timeout_ms : ms;
        }
        for (size_t i = 0; i < srv->nconns; i++) {
            struct stcp_conn *c = srv->conns[i];
            short ev = (c->parked || c->closing) ? POLLRDHUP : POLLIN;
            if (c->out_off < c->out_len) {
                ev |= POLLOUT;
            }
            pf[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
        }
        size_t npoll = srv->nconns;
        int r = poll(pf, npoll + 2, timeout_ms);
        if (r < 0 && errno != EINTR) {
            srv_warn(srv, "poll: %s", strerror(errno));
            usleep(10000);
        }
        if (atomic_load(&srv->stop)) {
            break;
        }
        for (size_t i = 0; r > 0 && i < npoll; i++) {
            struct stcp_conn *c = srv->conns[i];
            short re = pf[i + 2].revents;
            if (c->fd < 0 || !re) {
                continue;
            }
            if (re & POLLOUT) {
                conn_flush(c);
            }
            if (c->fd >= 0 && (re & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) &&
                (c->parked || c->closing || (re & (POLLERR | POLLNVAL)))) {
                FSDP_DEBUG(FSDP_SUB_DIST, "store server: client %s hung up", c->peer);
                conn_close(c);
                continue;
            }
            if (c->fd >= 0 && (re & (POLLIN | POLLHUP | POLLRDHUP))) {
                srv_read(srv, c);
            }
        }
        if (r > 0 && (pf[1].revents & POLLIN)) {
            srv_accept(srv);
        }
        timeout_ms = srv_timers(srv, fsdp_now());
        srv_compact(srv);
    }
    return NULL;
}

int fsdp_store_tcp_serve(const char *bind_host, int port, const struct fsdp_auth_key *key,
                         struct fsdp_store_server **out, int *bound_port)
{
    int rc;
    if (port < 0 || port > 65535) {
        return fsdp_err(FSDP_ERR_INVALID, "store server: port %d out of range", port);
    }
    struct fsdp_store_server *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        return fsdp_err(FSDP_ERR_NOMEM, "store server: out of memory");
    }
    srv->key = *key;
    srv->wake_fd = -1;
    long long mb = fsdp_env_int("FSDPC_STORE_QUOTA_MB", 256);
    if (mb < 1 || mb > (1LL << 20)) {
        free(srv);
        return fsdp_err(FSDP_ERR_INVALID, "FSDPC_STORE_QUOTA_MB=%lld: expected 1..1048576", mb);
    }
    srv->quota = (int64_t)mb << 20;
    srv->last_warn = fsdp_now();
    srv->warn_tokens = STCP_WARN_BURST;
    FSDP_CHECK_GOTO(fsdp_netaddr_listen(bind_host, port, "store server", &srv->listen_fd, &srv->port), rc, err_free);
    srv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (srv->wake_fd < 0) {
        rc = fsdp_err(FSDP_ERR_SYSTEM, "store server: eventfd: %s", strerror(errno));
        goto err_listen;
    }
    if (fsdp_kv_init(&srv->kv) < 0) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "store server: out of memory");
        goto err_wake;
    }
    int e = fsdp_thread_start(&srv->thread, srv_main, srv);
    if (e != 0) {
        rc = fsdp_err(FSDP_ERR_SYSTEM, "store server: cannot start its thread: %s", strerror(e));
        goto err_kv;
    }
    FSDP_DEBUG(FSDP_SUB_DIST, "store server listening on %s:%d",
               bind_host ? bind_host : "0.0.0.0", srv->port);
    if (bound_port) {
        *bound_port = srv->port;
    }
    *out = srv;
    return 0;

err_kv:
    fsdp_kv_free(&srv->kv);
err_wake:
    close(srv->wake_fd);
err_listen:
    close(srv->listen_fd);
err_free:
    free(srv);
    return rc;
}

void fsdp_store_tcp_server_stop(struct fsdp_store_server *srv)
{
    if (!srv) {
        return;
    }
    uint64_t one = 1;
    atomic_store(&srv->stop, 1);
    if (write(srv->wake_fd, &one, sizeof(one)) < 0) {
        FSDP_WARN(FSDP_SUB_DIST, "store server: wake-up write: %s", strerror(errno));
    }
    pthread_join(srv->thread, NULL);
    if (srv->warns_held) {
        FSDP_WARN(FSDP_SUB_DIST, "store server: %ld similar warnings held back before it stopped",
                  srv->warns_held);
    }
    for (size_t i = 0; i < srv->nconns; i++) {
        struct stcp_conn *c = srv->conns[i];
        conn_flush(c); /* last replies that the socket takes now; never waits */
        conn_close(c);
        free(c);
    }
    free(srv->conns);
    free(srv->pfds);
    fsdp_kv_free(&srv->kv);
    close(srv->listen_fd);
    close(srv->wake_fd);
    free(srv);
}
