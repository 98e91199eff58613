/*
 * tcp.h - private header of the tcp backend: Gloo-like collectives over a
 * full mesh of TCP connections, progressed by one thread per instance.
 *
 * Inside the backend, each file owns one concept and only calls downwards:
 *   tcp_ops.c     the vtable: create/destroy/abort, argument checks, issue,
 *                 work wait/test/free
 *   tcp_algo.c    the algorithms (ring, direct exchange, recursive doubling,
 *                 pipelined tree, dissemination), written as phases of
 *                 channels; they never touch a socket
 *   tcp_engine.c  the progress thread: op queue, the poll loop that runs a
 *                 phase, timeouts, keepalives, sticky errors
 *   tcp_xfer.c    the wire: frame headers, moving bytes of a channel's
 *                 messages through a peer's socket, control frames
 *   tcp_conn.c    connection setup through the rendezvous store: listen,
 *                 publish, connect, hello handshake, socket options
 *
 * File-local symbols carry the prefix tcp_; the calls below, shared between
 * the backend's files, carry fsdp_tcp_ and are FSDP_PRIVATE, so that only
 * fsdp_tcp_ops leaves the backend (tests/backends/test_symbols.sh).
 *
 * The wire format and the protocol are described in doc/backend-tcp.md.
 */
#ifndef FSDP_BACKENDS_TCP_H
#define FSDP_BACKENDS_TCP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "rendezvous/auth.h"
#include "core/dtype.h"
#include "core/util.h"

// ----------------------------------------------------------------------------
// wire format (host byte order; all supported hosts are little-endian)

#define TCP_FRAME_MAGIC 0x54445346u /* "FSDT" */
#define TCP_HELLO_MAGIC 0x4c484446u /* "FDHL" */
#define TCP_PROTO_VERSION 2
#define TCP_ADDR_MAX 64   /* "255.255.255.255:65535" with room to spare */
#define TCP_ERRMSG_MAX 512
#define TCP_NOTE_MAX 192  /* keepalive payload: "rank 1 (world rank 1, ip:port), silent for 2 s" */

enum tcp_frame_kind {
    TCP_FRAME_DATA = 1,      /* payload of a collective or point-to-point message */
    TCP_FRAME_KEEPALIVE = 2, /* "still here, waiting [on this rank]": resets the silence clock */
    TCP_FRAME_ERROR = 3,     /* the sender failed; payload is its error message */
};

/* What an op is; also carried in every data frame so that ranks that issued
 * different collectives are told so. */
enum tcp_coll {
    TCP_COLL_ALLREDUCE = 1,
    TCP_COLL_ALLGATHER,
    TCP_COLL_REDUCE_SCATTER,
    TCP_COLL_BROADCAST,
    TCP_COLL_BARRIER,
    TCP_COLL_SEND,
    TCP_COLL_RECV,
};

/* Header in front of every message. 32 bytes. */
struct tcp_frame {
    uint32_t magic;   /* TCP_FRAME_MAGIC */
    uint8_t version;  /* TCP_PROTO_VERSION */
    uint8_t kind;     /* enum tcp_frame_kind */
    uint8_t coll;     /* enum tcp_coll of the op (TCP_COLL_SEND for point-to-point) */
    uint8_t reserved;
    uint32_t group;   /* low 32 bits of the group hash */
    uint32_t step;    /* index of the frame among those sent to this peer in the op */
    uint64_t seq;     /* collective number (1, 2, ...), or point-to-point number of the pair */
    uint64_t len;     /* payload bytes that follow */
};

/* First bytes on every new connection, in both directions. 128 bytes. */
struct tcp_hello {
    uint32_t magic;      /* TCP_HELLO_MAGIC */
    uint16_t version;    /* TCP_PROTO_VERSION */
    uint16_t reserved;
    uint64_t nonce;      /* the job nonce: anything else is refused */
    uint64_t group_hash; /* hash of the group name and its members */
    int32_t rank;        /* sender's group rank */
    int32_t size;        /* sender's group size */
    int32_t world_rank;
    int32_t direct_max;  /* settings that change the algorithms must agree */
    uint64_t small_bytes;
    uint64_t chunk_bytes;
    int32_t algo;
    int32_t reserved2;
    char addr[TCP_ADDR_MAX]; /* sender's advertised "ip:port" */
    unsigned char challenge[16]; /* fresh random bytes: the other side's MAC covers them */
};

// ----------------------------------------------------------------------------
// settings, read from the environment at create

enum tcp_algo_choice {
    TCP_ALGO_AUTO = 0, /* by size: small-message algorithms below small_bytes */
    TCP_ALGO_RING,     /* always the pipelined ring / chain */
    TCP_ALGO_SMALL,    /* always the latency-optimised algorithms */
};

struct tcp_config {
    size_t small_bytes;  /* FSDPC_TCP_SMALL_BYTES: below, latency-optimised algorithms */
    size_t chunk_bytes;  /* FSDPC_TCP_CHUNK_BYTES: pipelining unit of ring and chain */
    size_t sockbuf;      /* FSDPC_TCP_SOCKBUF: SO_SNDBUF/SO_RCVBUF, 0 = kernel autotuning */
    int direct_max;      /* FSDPC_TCP_DIRECT_MAX: largest group for one-round direct exchange */
    int algo;            /* FSDPC_TCP_ALGO: enum tcp_algo_choice */
};

// ----------------------------------------------------------------------------
// channels: what algorithms hand to the engine

/* One message of a channel. A gate orders it after messages of another
 * channel: a send after the receive that produced its data, a receive after
 * the send that still reads the memory it lands in. Gates must not form a
 * cycle through the peers at the same message index (two partners each
 * receiving only after their own send completes deadlock as soon as the
 * messages exceed the socket buffers). */
struct tcp_msg {
    void *buf;          /* send: source; recv: destination (user buffer or scratch) */
    size_t len;         /* bytes */
    int gate_chan;      /* -1, or a channel of the same phase that must first have ... */
    uint32_t gate_done; /* ... completed this many messages before this one starts */
};

/* An ordered stream of messages to or from one peer within one phase. */
struct tcp_chan {
    int peer;       /* group rank */
    int send;       /* 1: to peer, 0: from peer */
    uint32_t nmsg;  /* messages in the phase */
    uint32_t done;  /* messages completed */
    int tag;        /* the algorithm's own index (block, slot, child) */
    /* progress of the current message (engine-owned) */
    int active;
    struct tcp_msg msg;
    struct tcp_frame hdr; /* send: header of the frame being written */
    size_t off;           /* send: bytes of header + payload written; recv: payload bytes read */
};

struct tcp_backend;
struct tcp_op;

/* An algorithm: a sequence of phases of channels, and local work between. */
struct tcp_algo {
    const char *name;
    /* Sizes scratch, makes local copies, sets op->nphases. 0 or error. */
    int (*start)(struct tcp_backend *be, struct tcp_op *op);
    /* Fills the channels of phase `phase` into ch; returns how many. */
    int (*phase)(struct tcp_backend *be, struct tcp_op *op, int phase, struct tcp_chan *ch);
    /* Describes message j of channel ch. */
    void (*msg)(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch, uint32_t j,
                struct tcp_msg *m);
    /* Consumes received message j (reductions); NULL when data lands in place. */
    void (*recv_done)(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                      uint32_t j, const struct tcp_msg *m);
    /* Local work once every channel of the phase is done; may be NULL. */
    void (*phase_end)(struct tcp_backend *be, struct tcp_op *op);
    /* Local work after the last phase; may be NULL. */
    void (*finish)(struct tcp_backend *be, struct tcp_op *op);
};

/* One queued operation, as the caller issued it plus the algorithm's state. */
struct tcp_op {
    enum tcp_coll coll;
    const void *sendbuf;
    void *recvbuf; /* broadcast, send and recv use recvbuf only */
    size_t count;  /* elements; per rank for allgather and reduce_scatter */
    enum fsdp_dtype dtype;
    enum fsdp_redop redop;
    int root; /* broadcast */
    int peer; /* send/recv: group rank */
    /* set when the op starts */
    size_t esize;
    uint64_t seq; /* collective number, or the pair's point-to-point number */
    const struct tcp_algo *algo;
    int nphases;
    int phase;      /* the phase running now */
    size_t nchunks; /* ring and tree: chunks per segment */
    char *slot;     /* scratch the algorithm carved out (receive slots) */
    char *acc;      /* scratch accumulators */
    int fanout;     /* tree broadcast */
    int pof2;       /* recursive doubling: largest power of two <= size */
};

// ----------------------------------------------------------------------------
// peers and the backend instance

struct tcp_peer {
    int fd;         /* -1 for this rank (-2 while setup reserves it) */
    int rank;       /* group rank */
    int world_rank;
    char addr[TCP_ADDR_MAX]; /* advertised "ip:port" */
    /* transmit side */
    struct tcp_chan *tx_chan; /* channel whose frame is being written, NULL at a boundary */
    int tx_blocked;           /* EAGAIN since the last poll */
    uint32_t tx_step;         /* data frames sent in the current op */
    uint64_t tx_p2p;          /* point-to-point messages sent so far */
    char tx_ctl[sizeof(struct tcp_frame) + TCP_ERRMSG_MAX]; /* pending control frame */
    size_t tx_ctl_len, tx_ctl_off;
    double last_tx;           /* last time bytes went to this peer */
    /* receive side */
    struct tcp_frame rx_hdr;  /* header being read, or read and stashed */
    size_t rx_hdr_off;
    int rx_stashed;           /* rx_hdr is a data header no channel has claimed yet */
    struct tcp_chan *rx_wait; /* active channel waiting for this peer's next header */
    struct tcp_chan *rx_chan; /* channel reading this peer's payload */
    int rx_blocked;
    int rx_eof;               /* the peer closed after its last frame to us */
    uint32_t rx_step;         /* data frames received in the current op */
    uint64_t rx_p2p;
    char rx_ctl[TCP_ERRMSG_MAX]; /* payload of a control frame being read */
    size_t rx_ctl_len, rx_ctl_off;
    int rx_ctl_kind;          /* TCP_FRAME_ERROR or _KEEPALIVE while reading one, else 0 */
    char note[TCP_NOTE_MAX];  /* the peer's last keepalive: whom it waits on, if stuck */
    double last_rx;           /* last time bytes came from this peer */
};

struct tcp_work {
    struct fsdp_work base; /* first: the vtable sees this */
    struct tcp_backend *be;
    struct tcp_op op;
    struct tcp_work *next; /* queue link */
    atomic_int done;
    int rc;
    int orphaned; /* freed by the caller while pending: the engine frees it */
    char msg[TCP_ERRMSG_MAX];
};

struct tcp_backend {
    /* identity (copied from fsdp_group_info) */
    char name[64];
    int rank;
    int size;
    int *world_ranks; /* (size,) */
    int world_rank;
    uint64_t nonce;
    struct fsdp_auth_key key; /* the job key: the handshake proves it (tcp_conn.c) */
    char local_ip[64];        /* where it listens (rendezvous/netaddr.h) */
    char local_how[96];       /* why that address */
    double timeout_s;
    uint64_t group_hash;
    struct tcp_config cfg;
    /* transport */
    struct tcp_peer *peers;  /* (size,) indexed by group rank */
    struct tcp_chan *chans;  /* (2*size + 2,) channels of the running phase */
    void *pfds;              /* (size + 1,) struct pollfd for the poll loop */
    int *pfd_peer;           /* (size + 1,) peer of each pollfd, -1 for the wake fd */
    char *scratch;           /* grown on first need, never shrunk */
    size_t scratch_bytes;
    uint64_t seq;            /* collectives started so far */
    uint64_t moved;          /* data bytes moved: the stall clock restarts when it grows */
    double ka_interval;      /* keepalive period while waiting on a peer */
    double stall_s;          /* a phase that moves no data this long fails */
    /* engine */
    int wake_fd; /* eventfd: new op, abort, destroy */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* an op completed */
    struct tcp_work *head;  /* queued ops, head is running */
    struct tcp_work *tail;
    atomic_int stop;        /* destroy asked the thread to exit */
    atomic_int aborted;
    char abort_why[256];
    int err;                /* sticky error, set once by the engine */
    char errmsg[TCP_ERRMSG_MAX];
    char status[TCP_ERRMSG_MAX]; /* what the running op waits on, once it stalls */
};

// ----------------------------------------------------------------------------
// tcp_conn.c

/* Reads FSDPC_TCP_* into cfg. 0 or FSDP_ERR_INVALID for malformed values. */
FSDP_PRIVATE int fsdp_tcp_config_read(struct tcp_config *cfg);
/* Builds the full mesh: listen, publish through be's store, connect, hello.
 * Fills be->peers[*].fd (non-blocking, TCP_NODELAY). */
FSDP_PRIVATE int fsdp_tcp_conn_mesh(struct tcp_backend *be, struct fsdp_store *store);
/* Closes every peer socket, discarding unread bytes without blocking. */
FSDP_PRIVATE void fsdp_tcp_conn_close(struct tcp_backend *be);

// ----------------------------------------------------------------------------
// tcp_xfer.c

/* "rank 2 (world rank 5, 10.0.0.3:40123)" */
FSDP_PRIVATE const char *fsdp_tcp_peer_name(const struct tcp_backend *be, int rank, char *buf,
                                             size_t len);
FSDP_PRIVATE const char *fsdp_tcp_coll_name(int coll);
/* Resets per-op frame counters before an op starts. */
FSDP_PRIVATE void fsdp_tcp_xfer_op_begin(struct tcp_backend *be, struct tcp_op *op);
/* Makes ch's next message current when its gate allows; *progressed set on change. */
FSDP_PRIVATE int fsdp_tcp_xfer_activate(struct tcp_backend *be, struct tcp_op *op,
                                        struct tcp_chan *chans, struct tcp_chan *ch,
                                        int *progressed);
/* Writes to peer p (control bytes, then the current frame) until EAGAIN. */
FSDP_PRIVATE int fsdp_tcp_xfer_push(struct tcp_backend *be, struct tcp_op *op,
                                    struct tcp_chan *chans, struct tcp_peer *p, int *progressed);
/* Reads from peer p until EAGAIN or one message completes. */
FSDP_PRIVATE int fsdp_tcp_xfer_pull(struct tcp_backend *be, struct tcp_op *op,
                                    struct tcp_chan *chans, struct tcp_peer *p, int *progressed);
/* 1 when p has bytes to write now / wants its socket read now. */
FSDP_PRIVATE int fsdp_tcp_xfer_wants_write(const struct tcp_peer *p);
FSDP_PRIVATE int fsdp_tcp_xfer_wants_read(const struct tcp_peer *p);
/* Queues a keepalive to p if nothing is being written to it; note (may be
 * empty) says whom this rank is stuck on. */
FSDP_PRIVATE void fsdp_tcp_xfer_keepalive(struct tcp_backend *be, struct tcp_peer *p,
                                          const char *note);
/* Best effort, never blocks: completes p's current frame with zeros, sends an
 * ERROR frame carrying msg, then shuts the socket down. */
FSDP_PRIVATE void fsdp_tcp_xfer_notify_error(struct tcp_backend *be, struct tcp_peer *p,
                                             const char *msg);

// ----------------------------------------------------------------------------
// tcp_engine.c

FSDP_PRIVATE int fsdp_tcp_engine_start(struct tcp_backend *be);
/* Asks the thread to stop, fails queued ops, joins. */
FSDP_PRIVATE void fsdp_tcp_engine_stop(struct tcp_backend *be);
/* Queues w (takes it over); wakes the thread. */
FSDP_PRIVATE int fsdp_tcp_engine_submit(struct tcp_backend *be, struct tcp_work *w);
/* Runs one op to completion on the calling thread (engine thread, or the
 * caller for a group of one). 0 or the op's error (sticky). */
FSDP_PRIVATE int fsdp_tcp_engine_run_op(struct tcp_backend *be, struct tcp_op *op);
/* Records the first sticky error (formatted) and returns code. Engine thread. */
FSDP_PRIVATE int fsdp_tcp_engine_fail(struct tcp_backend *be, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Returns scratch of at least bytes, growing it if needed (contents lost). */
FSDP_PRIVATE char *fsdp_tcp_engine_scratch(struct tcp_backend *be, size_t bytes);
/* Wakes the engine thread (async-signal-safe). */
FSDP_PRIVATE void fsdp_tcp_engine_wake(struct tcp_backend *be);

// ----------------------------------------------------------------------------
// tcp_algo.c

/* Chooses the algorithm for op from its size, the group size and cfg. */
FSDP_PRIVATE const struct tcp_algo *fsdp_tcp_algo_select(const struct tcp_backend *be,
                                                          const struct tcp_op *op);

#endif
