/*
 * tcp_xfer.c - the wire of the tcp backend: frame headers, and moving the
 * bytes of a channel's messages through one peer's socket.
 *
 * Every message travels as one frame: a 32-byte header (magic, version,
 * kind, collective, group, step, sequence number, length) and its payload.
 * A receiver reads a peer's next header at a frame boundary and checks it
 * against what the running op expects from that peer; any disagreement is an
 * error that names the peer and both sides' view. Keepalive and error frames
 * may arrive at any frame boundary; a data header that arrives before its
 * channel is ready is stashed until the channel claims it.
 *
 * Sockets are non-blocking; the functions here move bytes until the kernel
 * says EAGAIN and never wait. Waiting (poll), timeouts and the decision what
 * to move next belong to tcp_engine.c.
 */
#include "config.h"
#include "backends/tcp/tcp.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define TCP_HDR ((size_t)sizeof(struct tcp_frame))

_Static_assert(sizeof(struct tcp_frame) == 32, "frame header is 32 bytes on the wire");

const char *fsdp_tcp_coll_name(int coll)
{
    switch (coll) {
    case TCP_COLL_ALLREDUCE: return "allreduce";
    case TCP_COLL_ALLGATHER: return "allgather";
    case TCP_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case TCP_COLL_BROADCAST: return "broadcast";
    case TCP_COLL_BARRIER: return "barrier";
    case TCP_COLL_SEND: return "send";
    case TCP_COLL_RECV: return "recv";
    default: return "unknown operation";
    }
}

const char *fsdp_tcp_peer_name(const struct tcp_backend *be, int rank, char *buf, size_t len)
{
    const struct tcp_peer *p = &be->peers[rank];
    snprintf(buf, len, "rank %d (world rank %d, %s)", rank, p->world_rank,
             p->addr[0] ? p->addr : "address unknown");
    return buf;
}

/* Point-to-point frames carry TCP_COLL_SEND on the wire in both directions. */
static int tcp_wire_coll(const struct tcp_op *op)
{
    return op->coll == TCP_COLL_RECV ? TCP_COLL_SEND : (int)op->coll;
}

static int tcp_is_p2p(int coll)
{
    return coll == TCP_COLL_SEND || coll == TCP_COLL_RECV;
}

/* "allreduce #12" or "point-to-point message #3" */
static const char *tcp_op_label(int coll, uint64_t seq, char *buf, size_t len)
{
    if (tcp_is_p2p(coll)) {
        snprintf(buf, len, "point-to-point message #%" PRIu64, seq);
    } else {
        snprintf(buf, len, "%s #%" PRIu64, fsdp_tcp_coll_name(coll), seq);
    }
    return buf;
}

static void tcp_frame_fill(const struct tcp_backend *be, struct tcp_frame *f, int kind, int coll,
                           uint64_t seq, uint32_t step, uint64_t len)
{
    memset(f, 0, sizeof(*f));
    f->magic = TCP_FRAME_MAGIC;
    f->version = TCP_PROTO_VERSION;
    f->kind = (uint8_t)kind;
    f->coll = (uint8_t)coll;
    f->group = (uint32_t)be->group_hash;
    f->step = step;
    f->seq = seq;
    f->len = len;
}

void fsdp_tcp_xfer_op_begin(struct tcp_backend *be, struct tcp_op *op)
{
    for (int q = 0; q < be->size; q++) {
        be->peers[q].tx_step = 0;
        be->peers[q].rx_step = 0;
        be->peers[q].note[0] = '\0';
    }
    /* point-to-point messages are numbered per pair and direction, so that
     * ranks outside the pair keep the same collective numbers */
    if (op->coll == TCP_COLL_SEND) {
        op->seq = ++be->peers[op->peer].tx_p2p;
    } else if (op->coll == TCP_COLL_RECV) {
        op->seq = ++be->peers[op->peer].rx_p2p;
    } else {
        op->seq = ++be->seq;
    }
}

// ----------------------------------------------------------------------------
// errors naming the peer

/*
 * A peer that fails sends an error frame before it closes; but its close
 * can reach this rank's writes first (EPIPE, reset). Returns 1 and reports
 * the peer's own message when an error frame is waiting unread at a frame
 * boundary (behind keepalives, if any); 0 otherwise.
 */
static int tcp_peer_last_words(struct tcp_backend *be, struct tcp_peer *p)
{
    char buf[2048], name[160];
    if (p->rx_chan || p->rx_ctl_kind || p->rx_hdr_off || p->rx_stashed) {
        return 0;
    }
    ssize_t n = recv(p->fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    size_t off = 0;
    while (n > 0 && off + TCP_HDR <= (size_t)n) {
        struct tcp_frame f;
        memcpy(&f, buf + off, TCP_HDR);
        if (f.magic != TCP_FRAME_MAGIC || f.len >= TCP_ERRMSG_MAX ||
            (f.kind != TCP_FRAME_KEEPALIVE && f.kind != TCP_FRAME_ERROR)) {
            return 0;
        }
        if (off + TCP_HDR + f.len > (size_t)n) {
            return 0;
        }
        if (f.kind == TCP_FRAME_ERROR) {
            fsdp_tcp_engine_fail(be, FSDP_ERR_PEER, "peer %s failed: %.*s",
                                 fsdp_tcp_peer_name(be, p->rank, name, sizeof(name)), (int)f.len,
                                 buf + off + TCP_HDR);
            return 1;
        }
        off += TCP_HDR + (size_t)f.len;
    }
    return 0;
}

static int tcp_io_error(struct tcp_backend *be, struct tcp_op *op, struct tcp_peer *p, int err,
                        const char *what)
{
    char name[160], label[64];
    if (tcp_peer_last_words(be, p)) {
        return be->err;
    }
    fsdp_tcp_peer_name(be, p->rank, name, sizeof(name));
    tcp_op_label(op->coll, op->seq, label, sizeof(label));
    if (err == 0) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_PEER,
                                    "peer %s closed the connection during %s (the process exited "
                                    "or its backend failed; see its log)",
                                    name, label);
    }
    if (err == ECONNRESET || err == EPIPE) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_PEER,
                                    "connection to peer %s was reset during %s (the process died "
                                    "or aborted)",
                                    name, label);
    }
    return fsdp_tcp_engine_fail(be, FSDP_ERR_PEER, "%s peer %s failed during %s: %s", what, name,
                                label, strerror(err));
}

/* Checks what every frame must have, whatever its kind. */
static int tcp_check_frame(struct tcp_backend *be, struct tcp_op *op, struct tcp_peer *p,
                           const struct tcp_frame *f)
{
    char name[160], label[64];
    fsdp_tcp_peer_name(be, p->rank, name, sizeof(name));
    tcp_op_label(op->coll, op->seq, label, sizeof(label));
    if (f->magic != TCP_FRAME_MAGIC || f->version != TCP_PROTO_VERSION) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_PEER,
                                    "peer %s sent a corrupt frame header during %s (magic 0x%08x, "
                                    "version %u): the byte stream is out of step",
                                    name, label, f->magic, f->version);
    }
    if (f->group != (uint32_t)be->group_hash) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_PEER,
                                    "peer %s sent a frame of another group (hash 0x%08x, group %s "
                                    "has 0x%08x) during %s",
                                    name, f->group, be->name, (uint32_t)be->group_hash, label);
    }
    if (f->kind == TCP_FRAME_KEEPALIVE && f->len >= TCP_NOTE_MAX) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_PEER,
                                    "peer %s sent a keepalive frame with %" PRIu64
                                    " payload bytes during %s", name, f->len, label);
    }
    if (f->kind == TCP_FRAME_ERROR && f->len >= TCP_ERRMSG_MAX) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_PEER,
                                    "peer %s sent an error frame of %" PRIu64
                                    " bytes (at most %d) during %s", name, f->len,
                                    TCP_ERRMSG_MAX - 1, label);
    }
    if (f->kind != TCP_FRAME_DATA && f->kind != TCP_FRAME_KEEPALIVE &&
        f->kind != TCP_FRAME_ERROR) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_PEER,
                                    "peer %s sent a frame of unknown kind %u during %s", name,
                                    f->kind, label);
    }
    return 0;
}

/* Checks a data header against the message channel ch expects. */
static int tcp_check_data(struct tcp_backend *be, struct tcp_op *op, struct tcp_peer *p,
                          const struct tcp_chan *ch, const struct tcp_frame *f)
{
    char name[160], mine[64], theirs[64];
    int coll = tcp_wire_coll(op);
    fsdp_tcp_peer_name(be, p->rank, name, sizeof(name));
    tcp_op_label(op->coll, op->seq, mine, sizeof(mine));
    tcp_op_label(f->coll, f->seq, theirs, sizeof(theirs));
    if (tcp_is_p2p(f->coll) != tcp_is_p2p(coll)) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_MISMATCH,
                                    "peer %s sent a frame of %s while this rank runs %s: ranks "
                                    "issued operations in different orders",
                                    name, theirs, mine);
    }
    if (f->seq != op->seq) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_MISMATCH,
                                    "peer %s sent a frame for %s while this rank expects %s: ranks "
                                    "issued different numbers of operations",
                                    name, theirs, mine);
    }
    if (f->coll != coll) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_MISMATCH,
                                    "peer %s runs %s as its operation #%" PRIu64 " while this rank "
                                    "runs %s: ranks issued different collectives",
                                    name, fsdp_tcp_coll_name(f->coll), f->seq, mine);
    }
    if (f->step != p->rx_step) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_MISMATCH,
                                    "peer %s sent frame %u of %s while this rank expects frame %u: "
                                    "ranks chose different algorithms (counts, roots or "
                                    "FSDPC_TCP_* settings differ)",
                                    name, f->step, mine, p->rx_step);
    }
    if (f->len != ch->msg.len) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_MISMATCH,
                                    "peer %s sent %" PRIu64 " bytes in frame %u of %s while this "
                                    "rank expects %zu: counts, dtypes or roots differ across ranks",
                                    name, f->len, f->step, mine, ch->msg.len);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// channel messages

/* Hands the stashed header to the channel waiting on p. */
static int tcp_claim(struct tcp_backend *be, struct tcp_op *op, struct tcp_peer *p)
{
    struct tcp_chan *ch = p->rx_wait;
    FSDP_CHECK(tcp_check_data(be, op, p, ch, &p->rx_hdr));
    p->rx_stashed = 0;
    p->rx_wait = NULL;
    p->rx_chan = ch;
    ch->off = 0;
    return 0;
}

int fsdp_tcp_xfer_activate(struct tcp_backend *be, struct tcp_op *op, struct tcp_chan *chans,
                           struct tcp_chan *ch, int *progressed)
{
    struct tcp_msg m;
    if (ch->active || ch->done >= ch->nmsg) {
        return 0;
    }
    op->algo->msg(be, op, ch, ch->done, &m);
    if (m.gate_chan >= 0 && chans[m.gate_chan].done < m.gate_done) {
        return 0;
    }
    struct tcp_peer *p = &be->peers[ch->peer];
    ch->msg = m;
    ch->active = 1;
    ch->off = 0;
    *progressed = 1;
    if (ch->send) {
        tcp_frame_fill(be, &ch->hdr, TCP_FRAME_DATA, tcp_wire_coll(op), op->seq, p->tx_step,
                       m.len);
        p->tx_chan = ch;
        return 0;
    }
    p->rx_wait = ch;
    if (p->rx_stashed) {
        return tcp_claim(be, op, p);
    }
    if (p->rx_eof) {
        return tcp_io_error(be, op, p, 0, "reading from");
    }
    return 0;
}

int fsdp_tcp_xfer_wants_write(const struct tcp_peer *p)
{
    return p->fd >= 0 && (p->tx_ctl_off < p->tx_ctl_len || p->tx_chan != NULL);
}

int fsdp_tcp_xfer_wants_read(const struct tcp_peer *p)
{
    return p->fd >= 0 && !p->rx_eof && (p->rx_chan != NULL || p->rx_ctl_kind || !p->rx_stashed);
}

int fsdp_tcp_xfer_push(struct tcp_backend *be, struct tcp_op *op, struct tcp_chan *chans,
                       struct tcp_peer *p, int *progressed)
{
    while (!p->tx_blocked) {
        struct iovec iov[2];
        int niov = 0;
        struct tcp_chan *ch = NULL;
        if (p->tx_ctl_off < p->tx_ctl_len) {
            iov[0].iov_base = p->tx_ctl + p->tx_ctl_off;
            iov[0].iov_len = p->tx_ctl_len - p->tx_ctl_off;
            niov = 1;
        } else if (p->tx_chan) {
            ch = p->tx_chan;
            if (ch->off < TCP_HDR) {
                iov[niov].iov_base = (char *)&ch->hdr + ch->off;
                iov[niov].iov_len = TCP_HDR - ch->off;
                niov++;
            }
            size_t poff = ch->off > TCP_HDR ? ch->off - TCP_HDR : 0;
            if (poff < ch->msg.len) {
                iov[niov].iov_base = (char *)ch->msg.buf + poff;
                iov[niov].iov_len = ch->msg.len - poff;
                niov++;
            }
        } else {
            return 0;
        }
        ssize_t n = 0;
        if (niov > 0) {
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
            n = sendmsg(p->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    p->tx_blocked = 1;
                    return 0;
                }
                if (errno == EINTR) {
                    continue;
                }
                return tcp_io_error(be, op, p, errno, "sending to");
            }
            p->last_tx = fsdp_now();
            *progressed = 1;
        }
        if (!ch) {
            p->tx_ctl_off += (size_t)n;
            if (p->tx_ctl_off == p->tx_ctl_len) {
                p->tx_ctl_off = p->tx_ctl_len = 0;
            }
            continue;
        }
        be->moved += (uint64_t)n;
        ch->off += (size_t)n;
        if (ch->off == TCP_HDR + ch->msg.len) {
            ch->active = 0;
            ch->done++;
            p->tx_chan = NULL;
            p->tx_step++;
            FSDP_CHECK(fsdp_tcp_xfer_activate(be, op, chans, ch, progressed));
        }
    }
    return 0;
}

/* Reads into buf; returns bytes (> 0), 0 on EAGAIN (p->rx_blocked set) or a
 * negative error. EOF is reported at once when the frame is incomplete or a
 * channel waits on this peer; otherwise it is remembered: a peer that closed
 * after its last message to us is not a failure. */
static ssize_t tcp_read(struct tcp_backend *be, struct tcp_op *op, struct tcp_peer *p, void *buf,
                        size_t len)
{
    for (;;) {
        ssize_t n = recv(p->fd, buf, len, MSG_DONTWAIT);
        if (n > 0) {
            p->last_rx = fsdp_now();
            return n;
        }
        if (n == 0) {
            int waiting = p->rx_wait || p->rx_chan || p->rx_ctl_kind || p->rx_hdr_off > 0;
            if (waiting) {
                return tcp_io_error(be, op, p, 0, "reading from");
            }
            p->rx_eof = 1;
            return 0;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            p->rx_blocked = 1;
            return 0;
        }
        return tcp_io_error(be, op, p, errno, "reading from");
    }
}

/* A message of ch is complete: reduce it if needed, then start the next. */
static int tcp_recv_complete(struct tcp_backend *be, struct tcp_op *op, struct tcp_chan *chans,
                             struct tcp_peer *p, struct tcp_chan *ch, int *progressed)
{
    if (op->algo->recv_done) {
        op->algo->recv_done(be, op, ch, ch->done, &ch->msg);
    }
    ch->active = 0;
    ch->done++;
    p->rx_chan = NULL;
    p->rx_step++;
    *progressed = 1;
    return fsdp_tcp_xfer_activate(be, op, chans, ch, progressed);
}

/* The header in p->rx_hdr is complete: act on its kind. Returns 1 when the
 * caller should stop reading this peer for now. */
static int tcp_header_done(struct tcp_backend *be, struct tcp_op *op, struct tcp_peer *p)
{
    p->rx_hdr_off = 0;
    FSDP_CHECK(tcp_check_frame(be, op, p, &p->rx_hdr));
    switch (p->rx_hdr.kind) {
    case TCP_FRAME_KEEPALIVE:
    case TCP_FRAME_ERROR:
        p->rx_ctl_kind = p->rx_hdr.kind;
        p->rx_ctl_len = (size_t)p->rx_hdr.len;
        p->rx_ctl_off = 0;
        return 0;
    default:
        p->rx_stashed = 1;
        if (!p->rx_wait) {
            return 1; /* a later message: keep it until its channel is ready */
        }
        FSDP_CHECK(tcp_claim(be, op, p));
        return 0;
    }
}

int fsdp_tcp_xfer_pull(struct tcp_backend *be, struct tcp_op *op, struct tcp_chan *chans,
                       struct tcp_peer *p, int *progressed)
{
    while (!p->rx_blocked && !p->rx_eof) {
        ssize_t n;
        if (p->rx_ctl_kind) {
            if (p->rx_ctl_off < p->rx_ctl_len) {
                n = tcp_read(be, op, p, p->rx_ctl + p->rx_ctl_off, p->rx_ctl_len - p->rx_ctl_off);
                if (n <= 0) {
                    return (int)n;
                }
                p->rx_ctl_off += (size_t)n;
                *progressed = 1;
                continue;
            }
            p->rx_ctl[p->rx_ctl_len] = '\0';
            if (p->rx_ctl_kind == TCP_FRAME_KEEPALIVE) {
                memcpy(p->note, p->rx_ctl, p->rx_ctl_len + 1);
                p->rx_ctl_kind = 0;
                continue;
            }
            char name[160];
            p->rx_ctl_kind = 0;
            fsdp_tcp_peer_name(be, p->rank, name, sizeof(name));
            return fsdp_tcp_engine_fail(be, FSDP_ERR_PEER, "peer %s failed: %s", name, p->rx_ctl);
        }
        if (p->rx_chan) {
            struct tcp_chan *ch = p->rx_chan;
            if (ch->off < ch->msg.len) {
                n = tcp_read(be, op, p, (char *)ch->msg.buf + ch->off, ch->msg.len - ch->off);
                if (n <= 0) {
                    return (int)n;
                }
                ch->off += (size_t)n;
                be->moved += (uint64_t)n;
                *progressed = 1;
            }
            if (ch->off == ch->msg.len) {
                /* one message per call: the sends it unblocks go out first */
                return tcp_recv_complete(be, op, chans, p, ch, progressed);
            }
            continue;
        }
        if (p->rx_stashed) {
            return 0;
        }
        n = tcp_read(be, op, p, (char *)&p->rx_hdr + p->rx_hdr_off, TCP_HDR - p->rx_hdr_off);
        if (n <= 0) {
            return (int)n;
        }
        p->rx_hdr_off += (size_t)n;
        *progressed = 1;
        if (p->rx_hdr_off == TCP_HDR) {
            int rc = tcp_header_done(be, op, p);
            if (rc != 0) {
                return rc < 0 ? rc : 0;
            }
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// control frames

void fsdp_tcp_xfer_keepalive(struct tcp_backend *be, struct tcp_peer *p, const char *note)
{
    if (p->fd < 0 || p->tx_chan || p->tx_ctl_len) {
        return;
    }
    struct tcp_frame f;
    size_t len = strnlen(note, TCP_NOTE_MAX - 1);
    tcp_frame_fill(be, &f, TCP_FRAME_KEEPALIVE, 0, be->seq, 0, len);
    memcpy(p->tx_ctl, &f, sizeof(f));
    memcpy(p->tx_ctl + sizeof(f), note, len);
    p->tx_ctl_len = sizeof(f) + len;
    p->tx_ctl_off = 0;
    p->tx_blocked = 0; /* let the next push try it */
}

/* Sends len bytes without blocking; 0 when all went, -1 otherwise. */
static int tcp_send_now(int fd, const void *buf, size_t len)
{
    const char *c = buf;
    while (len > 0) {
        ssize_t n = send(fd, c, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return -1;
        }
        c += n;
        len -= (size_t)n;
    }
    return 0;
}

void fsdp_tcp_xfer_notify_error(struct tcp_backend *be, struct tcp_peer *p, const char *msg)
{
    static const char zeros[65536];
    if (p->fd < 0) {
        return;
    }
    int ok = tcp_send_now(p->fd, p->tx_ctl + p->tx_ctl_off, p->tx_ctl_len - p->tx_ctl_off) == 0;
    p->tx_ctl_off = p->tx_ctl_len = 0;
    struct tcp_chan *ch = p->tx_chan;
    if (ok && ch && ch->off > 0) {
        /* finish the frame in flight with zeros so that the error frame
         * lands on a boundary the peer can read */
        if (ch->off < TCP_HDR) {
            ok = tcp_send_now(p->fd, (char *)&ch->hdr + ch->off, TCP_HDR - ch->off) == 0;
            ch->off = TCP_HDR;
        }
        size_t left = TCP_HDR + ch->msg.len - ch->off;
        while (ok && left > 0) {
            size_t k = left < sizeof(zeros) ? left : sizeof(zeros);
            ok = tcp_send_now(p->fd, zeros, k) == 0;
            left -= k;
        }
    }
    p->tx_chan = NULL;
    if (ok) {
        char frame[sizeof(struct tcp_frame) + TCP_ERRMSG_MAX];
        size_t len = strnlen(msg, TCP_ERRMSG_MAX - 1);
        struct tcp_frame f;
        tcp_frame_fill(be, &f, TCP_FRAME_ERROR, 0, be->seq, 0, len);
        memcpy(frame, &f, sizeof(f));
        memcpy(frame + sizeof(f), msg, len);
        (void)tcp_send_now(p->fd, frame, sizeof(f) + len);
    }
    shutdown(p->fd, SHUT_RDWR);
}
