/*
 * tcp_engine.c - the progress engine of the tcp backend: one thread per
 * instance runs the queued ops in issue order, so that they progress while
 * the caller computes and instances (groups) progress independently.
 *
 * An op is a sequence of phases (tcp_algo.c); a phase is a set of channels
 * that the poll loop below drives together: every socket with bytes to move
 * is polled, sends and receives to all peers of the phase overlap, and a
 * received chunk is reduced while the kernel keeps receiving the next one.
 * The thread blocks in poll() whenever no socket is ready; it never spins.
 *
 * Faults: every wait is bounded. When no data moves for 90% of timeout_s
 * the phase fails, blaming the peer it waits on that has gone silent (a
 * live peer that is itself waiting sends keepalives, which also say whom it
 * is stuck on). The first failure is sticky: it is recorded once, sent to
 * every peer in an error frame, the sockets are shut down, and every pending
 * and later op fails with it.
 */
#include "config.h"
#include "backends/tcp/tcp.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// sticky errors, scratch, wake-ups

int fsdp_tcp_engine_fail(struct tcp_backend *be, int code, const char *fmt, ...)
{
    char msg[TCP_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (atomic_load(&be->aborted) && code != FSDP_ERR_ABORTED) {
        /* abort() shut the sockets down: the errors that follow are its
         * echo, not the cause */
        code = FSDP_ERR_ABORTED;
        snprintf(msg, sizeof(msg), "aborted: %s", be->abort_why);
    }
    pthread_mutex_lock(&be->mu);
    int first = be->err == 0;
    if (first) {
        be->err = code;
        snprintf(be->errmsg, sizeof(be->errmsg), "%s", msg);
    }
    code = be->err;
    pthread_mutex_unlock(&be->mu);
    if (first) {
        FSDP_WARN(FSDP_SUB_TCP, "group %s: %s", be->name, msg);
        for (int q = 0; q < be->size; q++) {
            fsdp_tcp_xfer_notify_error(be, &be->peers[q], msg);
        }
    }
    return code;
}

char *fsdp_tcp_engine_scratch(struct tcp_backend *be, size_t bytes)
{
    if (bytes <= be->scratch_bytes) {
        return be->scratch;
    }
    /* round up (64 KiB steps below 1 MiB, 1 MiB steps above) so that
     * slightly larger ops reuse the same buffer */
    size_t step = bytes < ((size_t)1 << 20) ? (size_t)64 << 10 : (size_t)1 << 20;
    size_t want = (bytes + step - 1) & ~(step - 1);
    fsdp_free(be->scratch);
    be->scratch = fsdp_alloc(want);
    be->scratch_bytes = be->scratch ? want : 0;
    FSDP_DEBUG(FSDP_SUB_TCP, "group %s: scratch grown to %zu bytes", be->name, want);
    return be->scratch;
}

void fsdp_tcp_engine_wake(struct tcp_backend *be)
{
    uint64_t one = 1;
    if (be->wake_fd >= 0) {
        ssize_t n = write(be->wake_fd, &one, sizeof(one));
        (void)n; /* a full counter means a wake-up is already pending */
    }
}

static void tcp_engine_drain_wake(struct tcp_backend *be)
{
    uint64_t v;
    ssize_t n = read(be->wake_fd, &v, sizeof(v));
    (void)n;
}

/* Non-zero when the op must stop now: abort() or destroy(). */
static int tcp_engine_interrupted(struct tcp_backend *be)
{
    if (atomic_load(&be->aborted)) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_ABORTED, "aborted: %s", be->abort_why);
    }
    if (atomic_load(&be->stop)) {
        return fsdp_tcp_engine_fail(be, FSDP_ERR_ABORTED,
                                    "the backend of group %s was destroyed with operations pending",
                                    be->name);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// stalls

/* The phase waits on p: a ready channel needs bytes to move with it. */
static int tcp_waits_on(const struct tcp_peer *p)
{
    return (p->rx_wait && !p->rx_stashed) || p->rx_chan || p->rx_hdr_off > 0 ||
           (p->tx_chan && p->tx_blocked);
}

static const char *tcp_engine_label(const struct tcp_op *op, char *buf, size_t len)
{
    if (op->coll == TCP_COLL_SEND || op->coll == TCP_COLL_RECV) {
        snprintf(buf, len, "%s #%" PRIu64 " with rank %d", fsdp_tcp_coll_name(op->coll), op->seq,
                 op->peer);
    } else {
        snprintf(buf, len, "%s #%" PRIu64, fsdp_tcp_coll_name(op->coll), op->seq);
    }
    return buf;
}

/*
 * Finds whom the running phase is stuck on. A live peer that waits too
 * sends keepalives, so a peer this rank waits on that has been silent for
 * three keepalive periods is stopped, hung, or absent from this collective:
 * returns 1 and names it in culprit ("rank 1 (world rank 1, ip:port),
 * silent for 2.8 s"). Otherwise the culprit may be further away: returns 2
 * when a live peer reported whom it is stuck on (culprit holds its report),
 * else 0. live lists the live peers waited on.
 */
static int tcp_engine_culprit(const struct tcp_backend *be, double since, double now,
                              char *culprit, size_t clen, char *live, size_t llen, int *sending)
{
    char name[160];
    size_t used = 0;
    int found = 0;
    culprit[0] = live[0] = '\0';
    for (int q = 0; q < be->size; q++) {
        const struct tcp_peer *p = &be->peers[q];
        if (p->fd < 0 || !tcp_waits_on(p)) {
            continue;
        }
        double last = p->last_rx > since ? p->last_rx : since;
        if (now - last > 3.0 * be->ka_interval) {
            snprintf(culprit, clen, "%s, silent for %.1f s",
                     fsdp_tcp_peer_name(be, q, name, sizeof(name)), now - last);
            *sending = p->tx_chan && p->tx_blocked && !p->rx_chan && !p->rx_wait;
            return 1;
        }
        if (!found && p->note[0]) {
            snprintf(culprit, clen, "%s", p->note);
            found = 2;
        }
        if (used < llen) {
            used += (size_t)snprintf(live + used, llen - used, "%s%s", used ? ", " : "",
                                     fsdp_tcp_peer_name(be, q, name, sizeof(name)));
        }
    }
    return found;
}

/* What the running phase waits on, in words, for errors and the status. */
static void tcp_engine_diagnose(const struct tcp_backend *be, double since, double now, char *buf,
                                size_t len)
{
    char culprit[TCP_NOTE_MAX], live[128];
    int sending = 0;
    switch (tcp_engine_culprit(be, since, now, culprit, sizeof(culprit), live, sizeof(live),
                               &sending)) {
    case 1:
        snprintf(buf, len, "%s peer %s (stopped, hung, or not calling this collective)",
                 sending ? "sending to" : "waiting for data from", culprit);
        break;
    case 2:
        snprintf(buf, len, "waiting on live peers %s, themselves waiting on %s", live, culprit);
        break;
    default:
        snprintf(buf, len, "waiting on live peers %s, though no rank reported whom it waits on: "
                 "ranks may have issued collectives in different orders", live[0] ? live : "-");
        break;
    }
}

static int tcp_engine_stalled(struct tcp_backend *be, struct tcp_op *op, double idle,
                              double since)
{
    char label[64], why[400];
    tcp_engine_label(op, label, sizeof(label));
    tcp_engine_diagnose(be, since, fsdp_now(), why, sizeof(why));
    return fsdp_tcp_engine_fail(be, FSDP_ERR_TIMEOUT, "timed out after %.1f s in %s %s", idle,
                                label, why);
}

/* Lets a caller whose own wait runs out say what the op is stuck on. */
static void tcp_engine_publish(struct tcp_backend *be, const struct tcp_op *op, double since,
                               double now, double idle)
{
    char label[64], why[400];
    tcp_engine_label(op, label, sizeof(label));
    tcp_engine_diagnose(be, since, now, why, sizeof(why));
    pthread_mutex_lock(&be->mu);
    snprintf(be->status, sizeof(be->status), "%s has moved no data for %.1f s, %s", label, idle,
             why);
    pthread_mutex_unlock(&be->mu);
}

/* Tells peers that wait on this rank that it is alive, and whom it is stuck
 * on if it knows: so the rank at the far end of a chain of waits can still
 * name the culprit. */
static void tcp_engine_keepalives(struct tcp_backend *be, const struct tcp_chan *chans, int nch,
                                  double since, double now)
{
    char note[TCP_NOTE_MAX], live[128];
    int sending, have_note = 0;
    for (int i = 0; i < nch; i++) {
        struct tcp_peer *p = &be->peers[chans[i].peer];
        if (chans[i].done < chans[i].nmsg && now - p->last_tx >= be->ka_interval) {
            if (!have_note) {
                if (!tcp_engine_culprit(be, since, now, note, sizeof(note), live, sizeof(live),
                                        &sending)) {
                    note[0] = '\0';
                }
                have_note = 1;
            }
            fsdp_tcp_xfer_keepalive(be, p, note);
        }
    }
}

// ----------------------------------------------------------------------------
// the poll loop of one phase

static int tcp_engine_poll(struct tcp_backend *be, struct tcp_op *op, double wait_s)
{
    struct pollfd *pfds = be->pfds;
    int n = 0;
    pfds[n].fd = be->wake_fd;
    pfds[n].events = POLLIN;
    be->pfd_peer[n++] = -1;
    for (int q = 0; q < be->size; q++) {
        struct tcp_peer *p = &be->peers[q];
        short ev = (short)((fsdp_tcp_xfer_wants_write(p) ? POLLOUT : 0) |
                           (fsdp_tcp_xfer_wants_read(p) ? POLLIN : 0));
        if (ev) {
            pfds[n].fd = p->fd;
            pfds[n].events = ev;
            be->pfd_peer[n++] = q;
        }
    }
    int ms = (int)ceil(wait_s * 1e3);
    int rc = poll(pfds, (nfds_t)n, ms < 1 ? 1 : ms);
    if (rc < 0) {
        if (errno == EINTR) {
            return 0;
        }
        return fsdp_tcp_engine_fail(be, FSDP_ERR_SYSTEM, "poll in %s #%" PRIu64 " failed: %s",
                                    fsdp_tcp_coll_name(op->coll), op->seq, strerror(errno));
    }
    for (int i = 0; i < n && rc > 0; i++) {
        short re = pfds[i].revents;
        if (!re) {
            continue;
        }
        if (be->pfd_peer[i] < 0) {
            tcp_engine_drain_wake(be);
            continue;
        }
        struct tcp_peer *p = &be->peers[be->pfd_peer[i]];
        /* errors and hang-ups surface in the next send/recv with their errno */
        if (re & (POLLOUT | POLLERR | POLLHUP)) {
            p->tx_blocked = 0;
        }
        if (re & (POLLIN | POLLERR | POLLHUP)) {
            p->rx_blocked = 0;
        }
    }
    return 0;
}

static int tcp_engine_run_phase(struct tcp_backend *be, struct tcp_op *op, struct tcp_chan *chans,
                                int nch)
{
    double start = fsdp_now(), last_move = start;
    uint64_t moved = be->moved;
    for (int i = 0; i < nch; i++) {
        chans[i].done = 0;
        chans[i].active = 0;
        chans[i].off = 0;
    }
    for (int q = 0; q < be->size; q++) {
        be->peers[q].tx_blocked = 0;
        be->peers[q].rx_blocked = 0;
    }
    for (;;) {
        int progressed = 0, open = 0;
        FSDP_CHECK(tcp_engine_interrupted(be));
        for (int i = 0; i < nch; i++) {
            if (chans[i].done < chans[i].nmsg) {
                open++;
                FSDP_CHECK(fsdp_tcp_xfer_activate(be, op, chans, &chans[i], &progressed));
            }
        }
        if (!open) {
            return 0;
        }
        for (int q = 0; q < be->size; q++) {
            struct tcp_peer *p = &be->peers[q];
            if (fsdp_tcp_xfer_wants_write(p) && !p->tx_blocked) {
                FSDP_CHECK(fsdp_tcp_xfer_push(be, op, chans, p, &progressed));
            }
            if (fsdp_tcp_xfer_wants_read(p) && !p->rx_blocked) {
                FSDP_CHECK(fsdp_tcp_xfer_pull(be, op, chans, p, &progressed));
            }
        }
        if (progressed) {
            continue;
        }
        double now = fsdp_now();
        if (be->moved != moved) {
            moved = be->moved;
            last_move = now;
        }
        double idle = now - last_move;
        if (idle >= be->stall_s) {
            return tcp_engine_stalled(be, op, idle, start);
        }
        if (idle >= be->ka_interval) {
            tcp_engine_publish(be, op, start, now, idle);
        }
        tcp_engine_keepalives(be, chans, nch, start, now);
        double wait = be->stall_s - idle;
        if (wait > be->ka_interval / 2) {
            wait = be->ka_interval / 2;
        }
        FSDP_CHECK(tcp_engine_poll(be, op, wait));
    }
}

int fsdp_tcp_engine_run_op(struct tcp_backend *be, struct tcp_op *op)
{
    if (be->err) {
        return be->err;
    }
    FSDP_CHECK(tcp_engine_interrupted(be));
    op->esize = fsdp_dtype_size(op->dtype);
    fsdp_tcp_xfer_op_begin(be, op);
    op->algo = fsdp_tcp_algo_select(be, op);
    int rc = op->algo->start(be, op);
    if (rc < 0) {
        return fsdp_tcp_engine_fail(be, rc, "%s #%" PRIu64 ": %s", fsdp_tcp_coll_name(op->coll),
                                    op->seq, fsdp_err_msg());
    }
    for (int ph = 0; ph < op->nphases; ph++) {
        op->phase = ph;
        int nch = op->algo->phase(be, op, ph, be->chans);
        FSDP_CHECK(tcp_engine_run_phase(be, op, be->chans, nch));
        if (op->algo->phase_end) {
            op->algo->phase_end(be, op);
        }
    }
    if (op->algo->finish) {
        op->algo->finish(be, op);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the thread and its queue

/* Takes the head op off the queue with its result. Called with mu held. */
static void tcp_engine_complete(struct tcp_backend *be, struct tcp_work *w, int rc)
{
    be->head = w->next;
    if (!be->head) {
        be->tail = NULL;
    }
    w->next = NULL;
    w->rc = rc;
    if (rc < 0) {
        snprintf(w->msg, sizeof(w->msg), "%s",
                 be->errmsg[0] ? be->errmsg : fsdp_strerror(rc));
    }
    be->status[0] = '\0';
    if (w->orphaned) {
        free(w);
    } else {
        atomic_store(&w->done, 1);
    }
    pthread_cond_broadcast(&be->cv);
}

static void tcp_engine_sleep(struct tcp_backend *be)
{
    struct pollfd pfd = {.fd = be->wake_fd, .events = POLLIN};
    while (poll(&pfd, 1, -1) < 0 && errno == EINTR) {
    }
    tcp_engine_drain_wake(be);
}

static void *tcp_engine_main(void *arg)
{
    struct tcp_backend *be = arg;
    pthread_mutex_lock(&be->mu);
    for (;;) {
        while (!atomic_load(&be->stop) && !be->head) {
            pthread_mutex_unlock(&be->mu);
            tcp_engine_sleep(be);
            pthread_mutex_lock(&be->mu);
        }
        if (atomic_load(&be->stop)) {
            break;
        }
        struct tcp_work *w = be->head;
        pthread_mutex_unlock(&be->mu);
        int rc = fsdp_tcp_engine_run_op(be, &w->op);
        pthread_mutex_lock(&be->mu);
        tcp_engine_complete(be, w, rc);
    }
    pthread_mutex_unlock(&be->mu);
    /* destroy: everything still queued fails */
    if (be->head) {
        tcp_engine_interrupted(be);
    }
    pthread_mutex_lock(&be->mu);
    while (be->head) {
        tcp_engine_complete(be, be->head, be->err ? be->err : FSDP_ERR_ABORTED);
    }
    pthread_mutex_unlock(&be->mu);
    return NULL;
}

int fsdp_tcp_engine_start(struct tcp_backend *be)
{
    /* the progress thread takes no asynchronous signals: they belong to the
     * application's threads */
    int rc = fsdp_thread_start(&be->thread, tcp_engine_main, be);
    if (rc != 0) {
        return fsdp_err(FSDP_ERR_SYSTEM, "group %s: cannot start the tcp progress thread: %s",
                        be->name, strerror(rc));
    }
    be->thread_started = 1;
    return 0;
}

void fsdp_tcp_engine_stop(struct tcp_backend *be)
{
    if (!be->thread_started) {
        return;
    }
    atomic_store(&be->stop, 1);
    fsdp_tcp_engine_wake(be);
    pthread_join(be->thread, NULL);
    be->thread_started = 0;
}

int fsdp_tcp_engine_submit(struct tcp_backend *be, struct tcp_work *w)
{
    pthread_mutex_lock(&be->mu);
    if (be->err || atomic_load(&be->aborted) || atomic_load(&be->stop)) {
        int rc = be->err ? be->err : FSDP_ERR_ABORTED;
        char msg[TCP_ERRMSG_MAX];
        snprintf(msg, sizeof(msg), "%s", be->err ? be->errmsg : "the backend was aborted");
        pthread_mutex_unlock(&be->mu);
        return fsdp_err(rc, "group %s: %s", be->name, msg);
    }
    w->next = NULL;
    if (be->tail) {
        be->tail->next = w;
    } else {
        be->head = w;
    }
    be->tail = w;
    pthread_mutex_unlock(&be->mu);
    fsdp_tcp_engine_wake(be);
    return 0;
}
