/*
 * tcp_conn.c - connection setup of the tcp backend: settings from the
 * environment, the advertised address, the listening socket, and the full
 * mesh of connections built through the group's rendezvous store.
 *
 * Every rank listens on an ephemeral port and publishes "ip:port" under
 * tcp/<generation>/addr/<rank> in the group's store; each rank dials every
 * higher rank and accepts the lower ones. Both ends of a new connection
 * exchange a hello (magic, protocol version, job nonce, group hash, ranks,
 * algorithm settings, address, a fresh random challenge) and prove that
 * they hold the job key (auth.h):
 *     dialer   -> acceptor  hello_D
 *     acceptor -> dialer    hello_A, HMAC(key, "acceptor", hello_D hello_A)
 *     dialer   -> acceptor  HMAC(key, "dialer", hello_D hello_A)
 * Each MAC covers both hellos, so both challenges: a replayed or relayed
 * handshake fails, and neither side trusts the other before its MAC checks.
 * A connection that does not complete this for this job and group within a
 * few seconds is refused, closed and logged; setup carries on waiting for
 * the real peer. Everything runs in one
 * poll loop, so no rank waits on another's accept order, and the whole setup
 * is bounded by the group's timeout.
 */
#include "config.h"
#include "backends/tcp/tcp.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "rendezvous/netaddr.h"
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

_Static_assert(sizeof(struct tcp_hello) == 144, "hello is 144 bytes on the wire");

#define TCP_LABEL_ACCEPTOR "fsdpc tcp acceptor"
#define TCP_LABEL_DIALER "fsdpc tcp dialer"
#define TCP_HS_MAX (sizeof(struct tcp_hello) + FSDP_AUTH_MAC_BYTES) /* largest message */

#define TCP_HELLO_TIMEOUT_S 5.0  /* an accepted connection must say hello by then */
#define TCP_MAX_STRANGERS 32     /* unknown connections in setup at once */
#define TCP_ACCEPT_BATCH 8       /* accepted per turn: their hellos are read before more come */
#define TCP_WARN_REFUSED 8       /* refusals logged one by one; the rest are counted */

// ----------------------------------------------------------------------------
// settings

static int tcp_env_size(const char *name, size_t dflt, size_t lo, size_t hi, size_t *out)
{
    const char *s = getenv(name);
    size_t v;
    if (!s || !*s) {
        *out = dflt;
        return 0;
    }
    if (fsdp_parse_size(s, &v) < 0 || v < lo || v > hi) {
        fsdp_err_clear();
        return fsdp_err(FSDP_ERR_INVALID, "%s='%s': expected a size from %zu to %zu bytes "
                        "(suffixes K, M, G)", name, s, lo, hi);
    }
    *out = v;
    return 0;
}

int fsdp_tcp_config_read(struct tcp_config *cfg)
{
    size_t direct = 0;
    FSDP_CHECK(tcp_env_size("FSDPC_TCP_SMALL_BYTES", (size_t)64 << 10, 0, (size_t)1 << 30,
                            &cfg->small_bytes));
    FSDP_CHECK(tcp_env_size("FSDPC_TCP_CHUNK_BYTES", (size_t)512 << 10, (size_t)4 << 10,
                            (size_t)256 << 20, &cfg->chunk_bytes));
    FSDP_CHECK(tcp_env_size("FSDPC_TCP_SOCKBUF", 0, 0, (size_t)1 << 30, &cfg->sockbuf));
    FSDP_CHECK(tcp_env_size("FSDPC_TCP_DIRECT_MAX", 8, 1, 4096, &direct));
    cfg->direct_max = (int)direct;
    const char *a = getenv("FSDPC_TCP_ALGO");
    if (!a || !*a || strcmp(a, "auto") == 0) {
        cfg->algo = TCP_ALGO_AUTO;
    } else if (strcmp(a, "ring") == 0) {
        cfg->algo = TCP_ALGO_RING;
    } else if (strcmp(a, "small") == 0) {
        cfg->algo = TCP_ALGO_SMALL;
    } else {
        return fsdp_err(FSDP_ERR_INVALID, "FSDPC_TCP_ALGO='%s': expected auto, ring or small", a);
    }
    return 0;
}

/* "ip:port" or "[ip6]:port" -> sockaddr. 0 or -1. */
static int tcp_conn_parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *sl)
{
    char ip[TCP_ADDR_MAX];
    const char *colon = strrchr(s, ':');
    const char *a = s, *b = colon;
    if (!colon) {
        return -1;
    }
    if (s[0] == '[') { /* [v6]:port */
        a = s + 1;
        b = colon - 1;
        if (b < a || *b != ']') {
            return -1;
        }
    }
    if ((size_t)(b - a) >= sizeof(ip)) {
        return -1;
    }
    memcpy(ip, a, (size_t)(b - a));
    ip[b - a] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535) {
        return -1;
    }
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, ip, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        *sl = sizeof(*s4);
        return 0;
    }
    if (inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        *sl = sizeof(*s6);
        return 0;
    }
    return -1;
}

/* "ip:port" of a socket address, IPv6 in brackets. */
static void tcp_conn_addr_str(const struct sockaddr_storage *ss, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
        port = ntohs(s6->sin6_port);
    } else if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
        port = ntohs(s4->sin_port);
    }
    fsdp_netaddr_format(ip, port, buf, len);
}

static void tcp_conn_sockopts(const struct tcp_backend *be, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (be->cfg.sockbuf > 0) {
        int b = be->cfg.sockbuf > (size_t)1 << 30 ? 1 << 30 : (int)be->cfg.sockbuf;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
    }
}

// ----------------------------------------------------------------------------
// hello

static int tcp_hello_fill(const struct tcp_backend *be, struct tcp_hello *h)
{
    memset(h, 0, sizeof(*h));
    h->magic = TCP_HELLO_MAGIC;
    h->version = TCP_PROTO_VERSION;
    h->nonce = be->nonce;
    h->group_hash = be->group_hash;
    h->rank = be->rank;
    h->size = be->size;
    h->world_rank = be->world_rank;
    h->direct_max = be->cfg.direct_max;
    h->small_bytes = be->cfg.small_bytes;
    h->chunk_bytes = be->cfg.chunk_bytes;
    h->algo = be->cfg.algo;
    snprintf(h->addr, sizeof(h->addr), "%s", be->peers[be->rank].addr);
    return fsdp_auth_random(h->challenge, sizeof(h->challenge));
}

/* The MAC of one side over both hellos (dialer's first). */
static void tcp_hello_mac(const struct tcp_backend *be, const char *label,
                          const struct tcp_hello *dialer, const struct tcp_hello *acceptor,
                          unsigned char mac[FSDP_AUTH_MAC_BYTES])
{
    fsdp_auth_mac(&be->key, label, dialer, sizeof(*dialer), acceptor, sizeof(*acceptor), mac);
}

/*
 * Checks a received hello. Returns 0 when it is the peer `expect` (or, with
 * expect < 0, any lower rank not yet connected); 1 when the connection is to
 * be refused (why says it); a negative error when a genuine peer of this job
 * cannot work with this rank.
 */
static int tcp_hello_check(const struct tcp_backend *be, const struct tcp_hello *h, int expect,
                           char *why, size_t wlen)
{
    if (h->magic != TCP_HELLO_MAGIC) {
        snprintf(why, wlen, "not an fsdpc tcp peer (hello magic 0x%08x)", h->magic);
        return 1;
    }
    if (h->nonce != be->nonce) {
        snprintf(why, wlen, "wrong job nonce (a process of another or an earlier job)");
        return 1;
    }
    if (h->version != TCP_PROTO_VERSION) {
        return fsdp_err(FSDP_ERR_MISMATCH, "group %s: rank %d speaks tcp protocol version %u, "
                        "this rank speaks %u: run the same fsdpc build on every rank", be->name,
                        h->rank, h->version, TCP_PROTO_VERSION);
    }
    if (h->group_hash != be->group_hash || h->size != be->size) {
        snprintf(why, wlen, "hello for another group (hash 0x%016" PRIx64 ", size %d)",
                 h->group_hash, h->size);
        return 1;
    }
    int ok_rank = expect >= 0 ? h->rank == expect : h->rank >= 0 && h->rank < be->rank;
    if (!ok_rank || memchr(h->addr, '\0', sizeof(h->addr)) == NULL ||
        h->world_rank != be->world_ranks[h->rank]) {
        snprintf(why, wlen, "hello claims rank %d (world rank %d), which does not dial rank %d",
                 h->rank, h->world_rank, be->rank);
        return 1;
    }
    if (expect < 0 && be->peers[h->rank].fd != -1) {
        snprintf(why, wlen, "hello claims rank %d, which is already connected", h->rank);
        return 1;
    }
    if (h->small_bytes != be->cfg.small_bytes || h->chunk_bytes != be->cfg.chunk_bytes ||
        h->direct_max != be->cfg.direct_max || h->algo != be->cfg.algo) {
        return fsdp_err(FSDP_ERR_MISMATCH,
                        "group %s: rank %d (%s) runs with FSDPC_TCP_SMALL_BYTES=%" PRIu64
                        " FSDPC_TCP_CHUNK_BYTES=%" PRIu64 " FSDPC_TCP_DIRECT_MAX=%d "
                        "FSDPC_TCP_ALGO=%d, this rank with %zu %zu %d %d: set the same "
                        "FSDPC_TCP_* values on every rank",
                        be->name, h->rank, h->addr, h->small_bytes, h->chunk_bytes, h->direct_max,
                        h->algo, be->cfg.small_bytes, be->cfg.chunk_bytes, be->cfg.direct_max,
                        be->cfg.algo);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the setup loop

enum tcp_pend_state { PEND_RETRY, PEND_CONNECTING, PEND_SENDING, PEND_RECEIVING };

/* A connection being set up. Handshake steps (see the top of the file):
 * dialer: 0 send hello_D, 1 receive hello_A + MAC, 2 send MAC, adopt;
 * acceptor: 0 receive hello_D, 1 send hello_A + MAC, 2 receive MAC, adopt. */
struct tcp_pend {
    int fd;
    int peer;     /* outgoing: the rank dialled; incoming: -1 */
    int outgoing;
    int state;
    int step;     /* of the handshake, above */
    struct tcp_hello mine, theirs;
    unsigned char txb[TCP_HS_MAX], rxb[TCP_HS_MAX];
    size_t tx_len, tx_off, rx_len, rx_off;
    int fatal;    /* acceptor: the error its hello would cause, raised once its MAC checks */
    char fatal_msg[512];
    double deadline; /* PEND_RETRY: when to dial again; incoming: hello deadline */
    double backoff;
    int last_errno;  /* of the last failed dial */
    struct sockaddr_storage sa; /* outgoing: where to dial */
    socklen_t salen;
    char from[TCP_ADDR_MAX];
};

struct tcp_setup {
    struct tcp_backend *be;
    int lfd;
    struct tcp_pend *pend; /* (cap,) dials to higher ranks, then accepted connections */
    struct pollfd *pfd;    /* (cap + 1,) */
    int cap;               /* size - 1 + TCP_MAX_STRANGERS */
    int npend;
    int connected;
    long refused;          /* incoming connections refused so far */
};

static void tcp_pend_drop(struct tcp_setup *st, int i)
{
    struct tcp_pend *pd = &st->pend[i];
    if (pd->fd >= 0) {
        close(pd->fd);
    }
    st->pend[i] = st->pend[--st->npend];
}

/* Logs a refused connection: the first few one by one, then only counted
 * (a flood of strangers must not flood the log). */
static void tcp_setup_log_refusal(struct tcp_setup *st, const char *from, const char *why)
{
    if (++st->refused <= TCP_WARN_REFUSED) {
        FSDP_WARN(FSDP_SUB_TCP, "group %s: refused a connection from %s: %s%s", st->be->name,
                  from, why, st->refused == TCP_WARN_REFUSED ? " (further refusals are "
                  "counted at the end of setup)" : "");
    }
}

static void tcp_pend_refuse(struct tcp_setup *st, int i, const char *why)
{
    tcp_setup_log_refusal(st, st->pend[i].from, why);
    tcp_pend_drop(st, i);
}

/* The incoming connection to close when setup is full: the oldest that
 * has sent nothing, else the oldest still in its hello; -1 when every one
 * has sent a hello that checked (peers, most likely). */
static int tcp_setup_victim(const struct tcp_setup *st)
{
    int silent = -1, hello = -1;
    for (int i = 0; i < st->npend; i++) {
        const struct tcp_pend *pd = &st->pend[i];
        if (pd->outgoing || pd->step != 0) {
            continue;
        }
        if (pd->rx_off == 0 && (silent < 0 || pd->deadline < st->pend[silent].deadline)) {
            silent = i;
        }
        if (hello < 0 || pd->deadline < st->pend[hello].deadline) {
            hello = i;
        }
    }
    return silent >= 0 ? silent : hello;
}

static void tcp_pend_dial(struct tcp_setup *st, struct tcp_pend *pd, double now)
{
    pd->fd = socket(pd->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (pd->fd >= 0) {
        tcp_conn_sockopts(st->be, pd->fd);
        if (connect(pd->fd, (struct sockaddr *)&pd->sa, pd->salen) == 0 ||
            errno == EINPROGRESS) {
            pd->state = PEND_CONNECTING;
            return;
        }
    }
    pd->last_errno = errno;
    if (pd->fd >= 0) {
        close(pd->fd);
        pd->fd = -1;
    }
    pd->state = PEND_RETRY;
    pd->deadline = now + pd->backoff;
    pd->backoff = pd->backoff * 2 > 1.0 ? 1.0 : pd->backoff * 2;
}

/* The connection is established and both hellos checked: it is the peer's. */
static void tcp_pend_adopt(struct tcp_setup *st, int i)
{
    struct tcp_pend *pd = &st->pend[i];
    struct tcp_peer *p = &st->be->peers[pd->theirs.rank];
    p->fd = pd->fd;
    snprintf(p->addr, sizeof(p->addr), "%s", pd->theirs.addr);
    pd->fd = -1;
    st->connected++;
    FSDP_DEBUG(FSDP_SUB_TCP, "group %s: connected to rank %d (%s)", st->be->name, p->rank,
               p->addr);
    tcp_pend_drop(st, i);
}

/* Accepts a few connections (their hellos are read before the next ones
 * come). When setup is full the oldest stranger goes, so that idle
 * connections cannot keep a peer out: they must keep connecting. */
static void tcp_setup_accept(struct tcp_setup *st, double now)
{
    for (int k = 0; k < TCP_ACCEPT_BATCH; k++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(st->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            return; /* EAGAIN, or a connection that vanished before accept */
        }
        char from[TCP_ADDR_MAX];
        tcp_conn_addr_str(&sa, from, sizeof(from));
        if (st->npend == st->cap) {
            int v = tcp_setup_victim(st);
            if (v < 0) {
                tcp_setup_log_refusal(st, from, "too many connections in setup");
                close(fd);
                continue;
            }
            tcp_pend_refuse(st, v, "too many connections in setup; this one had waited "
                            "longest without a hello");
        }
        struct tcp_pend *pd = &st->pend[st->npend++];
        memset(pd, 0, sizeof(*pd));
        pd->fd = fd;
        pd->peer = -1;
        pd->state = PEND_RECEIVING;
        pd->step = 0;
        pd->rx_len = sizeof(struct tcp_hello);
        pd->deadline = now + TCP_HELLO_TIMEOUT_S;
        snprintf(pd->from, sizeof(pd->from), "%s", from);
        tcp_conn_sockopts(st->be, fd);
    }
}

/* A dial failed (err): close it and dial again after the backoff. */
static void tcp_pend_redial(struct tcp_pend *pd, double now, int err)
{
    close(pd->fd);
    pd->fd = -1;
    pd->last_errno = err;
    pd->state = PEND_RETRY;
    pd->deadline = now + pd->backoff;
    pd->backoff = pd->backoff * 2 > 1.0 ? 1.0 : pd->backoff * 2;
}

/* A dial finished (poll said writable): 1 when connected, 0 when it failed
 * and will be retried, or is still in progress. */
static int tcp_setup_connected(struct tcp_pend *pd, double now)
{
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(pd->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err == EINPROGRESS || err == EALREADY) {
        return 0;
    }
    if (err != 0) {
        tcp_pend_redial(pd, now, err);
        return 0;
    }
    return 1;
}

/* Writes the rest of this step's message; at its end moves to the next
 * step. 0, 1 when the entry is gone (adopted or dropped), or a negative
 * error. */
static int tcp_setup_send(struct tcp_setup *st, int i)
{
    struct tcp_pend *pd = &st->pend[i];
    ssize_t n = send(pd->fd, pd->txb + pd->tx_off, pd->tx_len - pd->tx_off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return 0;
    }
    if (n < 0) {
        if (!pd->outgoing) {
            tcp_pend_drop(st, i);
            return 1;
        }
        if (pd->step == 0) { /* closed before our hello was out: as above */
            tcp_pend_redial(pd, fsdp_now(), errno);
            return 0;
        }
        return fsdp_err(FSDP_ERR_PEER, "group %s: sending the hello to rank %d at %s failed: %s",
                        st->be->name, pd->peer, pd->from, strerror(errno));
    }
    pd->tx_off += (size_t)n;
    if (pd->tx_off < pd->tx_len) {
        return 0;
    }
    if (pd->outgoing && pd->step == 2) {
        tcp_pend_adopt(st, i); /* the acceptor checks our MAC; it closes if it fails */
        return 1;
    }
    /* dialer after hello_D: hello_A and its MAC are next; acceptor after
     * hello_A: the dialer's MAC */
    pd->step++;
    pd->state = PEND_RECEIVING;
    pd->rx_off = 0;
    pd->rx_len = pd->outgoing ? TCP_HS_MAX : FSDP_AUTH_MAC_BYTES;
    return 0;
}

/* Queues msg (len bytes) as this step's output and starts sending it. */
static int tcp_setup_reply(struct tcp_setup *st, int i, const void *msg, size_t len)
{
    struct tcp_pend *pd = &st->pend[i];
    memcpy(pd->txb, msg, len);
    pd->tx_len = len;
    pd->tx_off = 0;
    pd->state = PEND_SENDING;
    return tcp_setup_send(st, i);
}

/* A refusal: an incoming connection is closed and logged; an outgoing one
 * (to the address a peer published) is an error. */
static int tcp_setup_refuse(struct tcp_setup *st, int i, const char *why)
{
    struct tcp_pend *pd = &st->pend[i];
    if (pd->outgoing) {
        return fsdp_err(FSDP_ERR_PEER, "group %s: the address %s published for rank %d "
                        "answered as something else: %s", st->be->name, pd->from, pd->peer, why);
    }
    tcp_pend_refuse(st, i, why);
    return 1;
}

/* A complete message of this step is in rxb: judge it and answer. */
static int tcp_setup_judge(struct tcp_setup *st, int i)
{
    struct tcp_backend *be = st->be;
    struct tcp_pend *pd = &st->pend[i];
    unsigned char mac[FSDP_AUTH_MAC_BYTES];
    unsigned char msg[TCP_HS_MAX];
    char why[160];
    if (!pd->outgoing && pd->step == 0) {
        /* hello_D: its claims are checked now but believed only once its
         * MAC checks; an error it would cause (settings that differ) is
         * kept until then, so that a stranger cannot end the job */
        memcpy(&pd->theirs, pd->rxb, sizeof(pd->theirs));
        int rc = tcp_hello_check(be, &pd->theirs, -1, why, sizeof(why));
        if (rc < 0) {
            pd->fatal = rc;
            fsdp_err_take(pd->fatal_msg, sizeof(pd->fatal_msg));
        } else if (rc) {
            return tcp_setup_refuse(st, i, why);
        }
        FSDP_CHECK(tcp_hello_fill(be, &pd->mine));
        memcpy(msg, &pd->mine, sizeof(pd->mine));
        tcp_hello_mac(be, TCP_LABEL_ACCEPTOR, &pd->theirs, &pd->mine, msg + sizeof(pd->mine));
        pd->step = 1;
        return tcp_setup_reply(st, i, msg, TCP_HS_MAX);
    }
    if (pd->outgoing) {
        /* hello_A + the acceptor's MAC: proof first, then the claims */
        memcpy(&pd->theirs, pd->rxb, sizeof(pd->theirs));
        tcp_hello_mac(be, TCP_LABEL_ACCEPTOR, &pd->mine, &pd->theirs, mac);
        if (pd->theirs.magic == TCP_HELLO_MAGIC && pd->theirs.version == TCP_PROTO_VERSION &&
            !fsdp_auth_mac_equal(mac, pd->rxb + sizeof(pd->theirs))) {
            return fsdp_err(FSDP_ERR_AUTH, "group %s: the process at %s, published for rank %d, "
                            "failed to prove that it holds this job's secret (an impostor, or "
                            "ranks started with different FSDPC_SECRET)", be->name, pd->from,
                            pd->peer);
        }
        int rc = tcp_hello_check(be, &pd->theirs, pd->peer, why, sizeof(why));
        if (rc < 0) {
            return rc;
        }
        if (rc) {
            return tcp_setup_refuse(st, i, why);
        }
        tcp_hello_mac(be, TCP_LABEL_DIALER, &pd->mine, &pd->theirs, mac);
        pd->step = 2;
        return tcp_setup_reply(st, i, mac, sizeof(mac));
    }
    /* the dialer's MAC */
    tcp_hello_mac(be, TCP_LABEL_DIALER, &pd->theirs, &pd->mine, mac);
    if (!fsdp_auth_mac_equal(mac, pd->rxb)) {
        return tcp_setup_refuse(st, i, "authentication failed: it does not hold this job's "
                                "secret");
    }
    if (pd->fatal) {
        return fsdp_err(pd->fatal, "%s", pd->fatal_msg);
    }
    if (be->peers[pd->theirs.rank].fd != -1) {
        return tcp_setup_refuse(st, i, "a second connection for a rank already connected");
    }
    tcp_pend_adopt(st, i);
    return 1;
}

/* Reads more of this step's message and judges it once complete (a bad
 * magic as soon as it shows). 0, 1 when the entry is gone, or an error. */
static int tcp_setup_recv(struct tcp_setup *st, int i)
{
    struct tcp_backend *be = st->be;
    struct tcp_pend *pd = &st->pend[i];
    char why[160];
    ssize_t n = recv(pd->fd, pd->rxb + pd->rx_off, pd->rx_len - pd->rx_off, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return 0;
    }
    if (n <= 0) {
        if (!pd->outgoing) {
            tcp_pend_refuse(st, i, n == 0 ? "closed before a complete hello" : strerror(errno));
            return 1;
        }
        if (pd->rx_off == 0) {
            /* closed before it answered: the acceptor may have had too many
             * strangers at once; dial again until the deadline */
            tcp_pend_redial(pd, fsdp_now(), n == 0 ? ECONNRESET : errno);
            return 0;
        }
        return fsdp_err(FSDP_ERR_PEER, "group %s: rank %d at %s closed the connection during "
                        "the hello (it refused this rank or failed; see its log)", be->name,
                        pd->peer, pd->from);
    }
    pd->rx_off += (size_t)n;
    int hello = pd->outgoing ? pd->step == 1 : pd->step == 0;
    uint32_t magic;
    memcpy(&magic, pd->rxb, sizeof(magic));
    if (hello && pd->rx_off >= sizeof(magic) && magic != TCP_HELLO_MAGIC) {
        snprintf(why, sizeof(why), "not an fsdpc tcp peer (hello magic 0x%08x)", magic);
        return tcp_setup_refuse(st, i, why);
    }
    if (pd->rx_off < pd->rx_len) {
        return 0;
    }
    return tcp_setup_judge(st, i);
}

/* Moves pend[i] on after poll said its socket is ready. 0, 1 when the entry
 * is gone (adopted or refused), or a negative error. */
static int tcp_setup_step(struct tcp_setup *st, int i, double now)
{
    struct tcp_pend *pd = &st->pend[i];
    if (pd->state == PEND_CONNECTING) {
        if (!tcp_setup_connected(pd, now)) {
            return 0;
        }
        FSDP_CHECK(tcp_hello_fill(st->be, &pd->mine));
        pd->step = 0;
        pd->tx_len = sizeof(pd->mine);
        pd->tx_off = 0;
        memcpy(pd->txb, &pd->mine, sizeof(pd->mine));
        pd->state = PEND_SENDING;
    }
    if (pd->state == PEND_SENDING) {
        int rc = tcp_setup_send(st, i);
        if (rc != 0 || pd->state == PEND_SENDING) {
            return rc;
        }
    }
    return tcp_setup_recv(st, i);
}

static int tcp_setup_timeout(struct tcp_setup *st, double waited)
{
    struct tcp_backend *be = st->be;
    char list[384];
    size_t used = 0;
    list[0] = '\0';
    for (int q = 0; q < be->size && used < sizeof(list); q++) {
        if (q == be->rank || be->peers[q].fd >= 0) {
            continue;
        }
        const char *why = "";
        char buf[96] = "";
        for (int i = 0; i < st->npend; i++) {
            if (st->pend[i].outgoing && st->pend[i].peer == q && st->pend[i].last_errno) {
                snprintf(buf, sizeof(buf), ": %s", strerror(st->pend[i].last_errno));
                why = buf;
            }
        }
        used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%d (world rank %d%s%s)%s",
                                 used ? ", " : "", q, be->world_ranks[q],
                                 be->peers[q].addr[0] ? ", " : "", be->peers[q].addr, why);
    }
    return fsdp_err(FSDP_ERR_TIMEOUT, "group %s: tcp connection setup timed out after %.1f s; "
                    "not connected to rank %s (this rank listens on %s, chosen by %s; on "
                    "several hosts, FSDPC_SOCKET_IFNAME or FSDPC_TCP_ADDR name an address "
                    "the other hosts can reach)", be->name, waited, list,
                    be->peers[be->rank].addr, be->local_how);
}

static int tcp_setup_loop(struct tcp_setup *st, double t0)
{
    struct tcp_backend *be = st->be;
    struct pollfd *pfd = st->pfd;
    double deadline = t0 + be->timeout_s;
    while (st->connected < be->size - 1) {
        double now = fsdp_now(), wake = deadline;
        if (now >= deadline) {
            return tcp_setup_timeout(st, now - t0);
        }
        for (int i = 0; i < st->npend; i++) {
            struct tcp_pend *pd = &st->pend[i];
            if (pd->state == PEND_RETRY && now >= pd->deadline) {
                tcp_pend_dial(st, pd, now);
            }
            if (!pd->outgoing && now >= pd->deadline) {
                tcp_pend_refuse(st, i--, "no complete hello within 5 s");
                continue;
            }
            if ((pd->state == PEND_RETRY || !pd->outgoing) && pd->deadline < wake) {
                wake = pd->deadline;
            }
        }
        int np = 0;
        pfd[np].fd = st->lfd;
        pfd[np++].events = POLLIN;
        for (int i = 0; i < st->npend; i++) {
            struct tcp_pend *pd = &st->pend[i];
            pfd[np].fd = pd->fd;
            pfd[np].events = (short)(pd->state == PEND_RECEIVING ? POLLIN : POLLOUT);
            if (pd->state == PEND_RETRY) {
                pfd[np].fd = -1; /* poll ignores it */
            }
            np++;
        }
        double wait_ms = (wake - now) * 1e3;
        int ms = wait_ms > 1000.0 ? 1000 : (int)wait_ms + 1;
        if (poll(pfd, (nfds_t)np, ms) < 0 && errno != EINTR) {
            return fsdp_err(FSDP_ERR_SYSTEM, "group %s: poll during tcp setup: %s", be->name,
                            strerror(errno));
        }
        now = fsdp_now();
        /* walk from the end: steps may remove entries (the last moves in) */
        for (int i = st->npend - 1; i >= 0; i--) {
            if (pfd[i + 1].fd >= 0 && pfd[i + 1].revents) {
                FSDP_CHECK(tcp_setup_step(st, i, now));
            }
        }
        if (pfd[0].revents & POLLIN) {
            tcp_setup_accept(st, now);
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------

static int tcp_conn_listen(struct tcp_backend *be, int *lfd_out)
{
    struct sockaddr_storage sa;
    socklen_t sl;
    char probe[TCP_ADDR_MAX];
    fsdp_netaddr_format(be->local_ip, 1, probe, sizeof(probe));
    if (tcp_conn_parse_addr(probe, &sa, &sl) < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "group %s: '%s' (%s) is not a numeric address to "
                        "listen on", be->name, be->local_ip, be->local_how);
    }
    if (sa.ss_family == AF_INET) {
        ((struct sockaddr_in *)&sa)->sin_port = 0;
    } else {
        ((struct sockaddr_in6 *)&sa)->sin6_port = 0;
    }
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return fsdp_err(FSDP_ERR_SYSTEM, "group %s: socket: %s", be->name, strerror(errno));
    }
    tcp_conn_sockopts(be, fd); /* accepted sockets inherit the buffer sizes */
    if (bind(fd, (struct sockaddr *)&sa, sl) < 0 || listen(fd, be->size + 16) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
        int e = errno;
        close(fd);
        return fsdp_err(FSDP_ERR_SYSTEM, "group %s: cannot listen on %s (%s): %s", be->name,
                        be->local_ip, be->local_how, strerror(e));
    }
    tcp_conn_addr_str(&sa, be->peers[be->rank].addr, TCP_ADDR_MAX);
    *lfd_out = fd;
    return 0;
}

/* Publishes this rank's address and prepares a dial to every higher rank. */
static int tcp_conn_rendezvous(struct tcp_setup *st, struct fsdp_store *store, double t0)
{
    struct tcp_backend *be = st->be;
    char key[96];
    int64_t ticket;
    /* a group created again under the same store prefix gets fresh keys */
    FSDP_CHECK(fsdp_store_add(store, "tcp/gen", 1, &ticket));
    int64_t gen = (ticket - 1) / be->size;
    const char *mine = be->peers[be->rank].addr;
    snprintf(key, sizeof(key), "tcp/%" PRId64 "/addr/%d", gen, be->rank);
    FSDP_CHECK(fsdp_store_set(store, key, mine, strlen(mine)));
    for (int q = be->rank + 1; q < be->size; q++) {
        void *val;
        size_t len;
        double left = t0 + be->timeout_s - fsdp_now();
        snprintf(key, sizeof(key), "tcp/%" PRId64 "/addr/%d", gen, q);
        FSDP_CHECK(fsdp_store_get(store, key, &val, &len, left > 0 ? left : 0));
        struct tcp_pend *pd = &st->pend[st->npend++];
        memset(pd, 0, sizeof(*pd));
        snprintf(pd->from, sizeof(pd->from), "%.*s", (int)(len < TCP_ADDR_MAX ? len : 0),
                 (const char *)val);
        free(val);
        if (len >= TCP_ADDR_MAX || tcp_conn_parse_addr(pd->from, &pd->sa, &pd->salen) < 0) {
            return fsdp_err(FSDP_ERR_FORMAT, "group %s: store key '%s' holds no ip:port "
                            "address", be->name, key);
        }
        snprintf(be->peers[q].addr, TCP_ADDR_MAX, "%s", pd->from);
        pd->fd = -1;
        pd->peer = q;
        pd->outgoing = 1;
        pd->state = PEND_RETRY;
        pd->backoff = 0.02;
    }
    return 0;
}

/* Closes whatever setup still holds (the listener, connections that never
 * said hello) and frees it. */
static void tcp_setup_free(struct tcp_setup *st)
{
    if (!st) {
        return;
    }
    while (st->npend > 0) {
        tcp_pend_drop(st, st->npend - 1);
    }
    if (st->lfd >= 0) {
        close(st->lfd);
    }
    free(st->pfd);
    free(st->pend);
    free(st);
}

int fsdp_tcp_conn_mesh(struct tcp_backend *be, struct fsdp_store *store)
{
    int rc;
    double t0 = fsdp_now();
    struct tcp_setup *st = calloc(1, sizeof(*st));
    if (st) {
        st->be = be;
        st->lfd = -1;
        st->cap = be->size - 1 + TCP_MAX_STRANGERS;
        st->pend = calloc((size_t)st->cap, sizeof(*st->pend));
        st->pfd = calloc((size_t)st->cap + 1, sizeof(*st->pfd));
    }
    if (!st || !st->pend || !st->pfd) {
        tcp_setup_free(st);
        return fsdp_err(FSDP_ERR_NOMEM, "group %s: out of memory", be->name);
    }
    FSDP_CHECK_GOTO(tcp_conn_listen(be, &st->lfd), rc, err_0);
    FSDP_CHECK_GOTO(tcp_conn_rendezvous(st, store, t0), rc, err_0);
    FSDP_CHECK_GOTO(tcp_setup_loop(st, t0), rc, err_1);
    if (st->refused > TCP_WARN_REFUSED) {
        FSDP_WARN(FSDP_SUB_TCP, "group %s: %ld connections refused during setup in all",
                  be->name, st->refused);
    }
    tcp_setup_free(st);
    FSDP_DEBUG(FSDP_SUB_TCP, "group %s: mesh of %d ranks ready in %.3f s", be->name, be->size,
               fsdp_now() - t0);
    return 0;

err_1:
    fsdp_tcp_conn_close(be);
err_0:
    tcp_setup_free(st);
    return rc;
}

void fsdp_tcp_conn_close(struct tcp_backend *be)
{
    char sink[4096];
    for (int q = 0; q < be->size; q++) {
        struct tcp_peer *p = &be->peers[q];
        if (p->fd < 0) {
            p->fd = -1; /* also clears a claim made during setup */
            continue;
        }
        /* unread bytes would turn the close into a reset that can destroy
         * data the peer has not read yet: discard them first (bounded) */
        for (int i = 0; i < 64 && recv(p->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++) {
        }
        close(p->fd);
        p->fd = -1;
    }
}
