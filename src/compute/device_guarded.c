/*
 * device_guarded.c - the guarded device: the CPU device (its kernels, bit
 * for bit) with memory the host cannot touch. Every device allocation is
 * carved from one reserved arena whose pages are inaccessible (PROT_NONE)
 * except while one of the device's own kernels or ops runs; a host read or
 * write of device memory anywhere else faults, and the fault handler names
 * the address, the buffer it falls in (its name, size and offset) and what
 * to use instead. Running the trainer on it proves that nothing above the
 * compute layer dereferences, memsets or memcpys device memory: what a
 * CUDA device needs, checked on a machine without a GPU.
 *
 * The arena is reserved once (FSDPC_GUARDED_BYTES, default 64 GiB of
 * address space, nothing committed until touched) and opened as a whole
 * around each kernel or op (two mprotect calls), so kernels see it as
 * plain memory. Blocks are 64-byte aligned; freed blocks are reused first
 * fit. The device counts what it hands out (struct fsdp_device_stats).
 *
 * It also checks the order of the streams, as a GPU would run them: each
 * stream has a vector clock (its own count of kernels and ops, and how far
 * it has waited for every other stream, through events or the host's
 * waits), each buffer remembers the stream and clock of its last writer,
 * and a kernel or copy on one stream that reads or writes a buffer another
 * stream last wrote, without having waited for that write, stops the
 * process naming both streams and the buffer. On the CPU everything runs
 * in issue order, so such a race gives right results here and wrong ones
 * on a GPU: this is where it is caught.
 *
 * What it cannot see: a host thread that touches device memory while a
 * kernel of the same device runs on another thread (the arena is open
 * then); reads racing a later write on another stream (only the last
 * writer is kept).
 */
#include "config.h"
#include "compute/device.h"
#include "compute/device_impl.h"
#include "core/error.h"
#include "core/log.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GUARD_ALIGN 64
#define GUARD_MAX_ARENAS 8
#define GUARD_STREAMS 8 /* stream 0 is the default (NULL) one */

struct guard_block {
    size_t off, bytes; /* bytes: the block's (64-byte rounded) size */
    size_t req;        /* the live allocation's requested bytes */
    int live;
    int writer;      /* the stream of the last write (when wclock > 0) */
    uint64_t wclock; /* that stream's clock at the write; 0: none since allocation */
    char name[56];
};

struct guard_stream {
    int id;
};

struct guard_event {
    uint64_t vc[GUARD_STREAMS]; /* the recording stream's clock vector */
};

struct guarded {
    unsigned char *base; /* (cap) reserved, PROT_NONE while closed */
    size_t cap;
    size_t top;  /* bytes carved so far */
    size_t open; /* bytes currently readable (top rounded to pages) when depth > 0 */
    size_t page;
    struct guard_block *blocks;
    size_t n_blocks, blocks_cap;
    int depth; /* kernels and ops running (nested: an op inside a kernel) */
    pthread_mutex_t mu;
    int n_streams; /* created so far, the default included */
    struct guard_stream streams[GUARD_STREAMS];
    uint64_t vc[GUARD_STREAMS][GUARD_STREAMS]; /* [s][t]: how far stream s is ordered after t */
    uint64_t host[GUARD_STREAMS];              /* how far the host has waited for each stream */
};

// ----------------------------------------------------------------------------
// the fault handler: a process-wide table of arenas, read in the handler

static struct guarded *arenas[GUARD_MAX_ARENAS];
static struct sigaction old_segv;
static pthread_once_t handler_once = PTHREAD_ONCE_INIT;

static const struct guard_block *guard_find(const struct guarded *g, size_t off)
{
    for (size_t i = 0; i < g->n_blocks; i++) {
        const struct guard_block *b = &g->blocks[i];
        if (off >= b->off && off < b->off + (b->bytes ? b->bytes : 1)) {
            return b;
        }
    }
    return NULL;
}

static void guard_report(const struct guarded *g, uintptr_t addr)
{
    char msg[640];
    size_t off = (size_t)(addr - (uintptr_t)g->base);
    const struct guard_block *b = guard_find(g, off);
    int n;
    if (b) {
        n = snprintf(msg, sizeof(msg),
                     "fsdpc: guarded device: the host touched device memory at %#lx: byte %zu of "
                     "%s buffer '%s' (%zu bytes)\n",
                     (unsigned long)addr, off - b->off, b->live ? "device" : "freed device",
                     b->name, b->bytes);
    } else {
        n = snprintf(msg, sizeof(msg),
                     "fsdpc: guarded device: the host touched device memory at %#lx (arena "
                     "offset %zu, in no buffer)\n",
                     (unsigned long)addr, off);
    }
    if (n > 0) {
        (void)!write(STDERR_FILENO, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
    }
    static const char hint[] =
        "fsdpc: hint: above the compute layer device memory is reached only through the "
        "device: a kernel of its table, fsdp_device_zero, or a copy into host memory "
        "(fsdp_device_read); the backtrace of this fault (gdb, or a core) shows the code\n";
    (void)!write(STDERR_FILENO, hint, sizeof(hint) - 1);
}

static void guard_on_segv(int sig, siginfo_t *si, void *uc)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_MAX_ARENAS; i++) {
        const struct guarded *g = arenas[i];
        if (g && a >= (uintptr_t)g->base && a < (uintptr_t)g->base + g->cap) {
            guard_report(g, a);
            break;
        }
    }
    /* the previous disposition takes the re-executed fault: a core, a
     * debugger's stop, or the next handler's report */
    (void)sig;
    (void)uc;
    sigaction(SIGSEGV, &old_segv, NULL);
}

static void guard_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = guard_on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
}

// ----------------------------------------------------------------------------
// the order of the streams

static int guard_sid(void *stream)
{
    return stream ? ((struct guard_stream *)stream)->id : 0;
}

static void guard_vmax(uint64_t *dst, const uint64_t *src)
{
    for (int i = 0; i < GUARD_STREAMS; i++) {
        dst[i] = src[i] > dst[i] ? src[i] : dst[i];
    }
}

/* An op issued on stream s: after what the host has waited for, and the
 * next tick of s's clock. Under g->mu. */
static void guard_tick(struct guarded *g, int s)
{
    guard_vmax(g->vc[s], g->host);
    g->vc[s][s]++;
}

static const char *guard_sname(int s, char *buf, size_t len)
{
    if (s == 0) {
        return "the default stream";
    }
    snprintf(buf, len, "stream %d", s);
    return buf;
}

/* p (NULL, or not in the arena: nothing to check) accessed by an op on
 * stream s; write marks it. A write another stream made that s has not
 * waited for is a race: reported, and the process stopped. Under g->mu. */
static void guard_access(struct guarded *g, int s, const void *p, int write, const char *what)
{
    const unsigned char *c = p;
    if (!c || c < g->base || c >= g->base + g->top) {
        return;
    }
    struct guard_block *b = (struct guard_block *)guard_find(g, (size_t)(c - g->base));
    if (!b) {
        return;
    }
    if (b->wclock > 0 && b->writer != s && g->vc[s][b->writer] < b->wclock) {
        char a[32], w[32];
        fprintf(stderr,
                "fsdpc: guarded device: a %s on %s %s buffer '%s' (%zu bytes), which %s wrote "
                "(its op %llu) and %s has not waited for\n"
                "fsdpc: hint: record an event on %s after the write and make %s wait on it "
                "(device.h event_record, stream_wait) before this %s\n",
                what, guard_sname(s, a, sizeof(a)), write ? "writes" : "reads", b->name, b->req,
                guard_sname(b->writer, w, sizeof(w)), (unsigned long long)b->wclock,
                guard_sname(s, a, sizeof(a)), guard_sname(b->writer, w, sizeof(w)),
                guard_sname(s, a, sizeof(a)), what);
        fflush(stderr);
        abort();
    }
    if (write) {
        b->writer = s;
        b->wclock = g->vc[s][s];
    }
}

// ----------------------------------------------------------------------------
// opening and closing the arena

static struct guarded *guard_of(struct fsdp_device *d)
{
    return d->impl;
}

/* Opens the arena (the first of nested kernels and ops). Under g->mu. */
static void guard_open(struct guarded *g)
{
    if (g->depth++ == 0) {
        g->open = (g->top + g->page - 1) / g->page * g->page;
        if (g->open > 0 && mprotect(g->base, g->open, PROT_READ | PROT_WRITE) != 0) {
            FSDP_ERROR(FSDP_SUB_CORE, "guarded device: mprotect open failed");
            abort();
        }
    }
}

static void guard_enter(struct fsdp_device *d)
{
    struct guarded *g = guard_of(d);
    pthread_mutex_lock(&g->mu);
    guard_open(g);
    pthread_mutex_unlock(&g->mu);
}

/* A kernel on the current stream: its buffers checked, its writes marked. */
static void guard_kernel_enter(struct fsdp_device *d, const void *const *p, int nw, int n)
{
    struct guarded *g = guard_of(d);
    int s = guard_sid(d->stream);
    pthread_mutex_lock(&g->mu);
    guard_tick(g, s);
    for (int i = 0; i < n; i++) {
        guard_access(g, s, p[i], 0, "kernel");
    }
    for (int i = 0; i < nw; i++) {
        guard_access(g, s, p[i], 1, "kernel");
    }
    guard_open(g);
    pthread_mutex_unlock(&g->mu);
}

static void guard_leave(struct fsdp_device *d)
{
    struct guarded *g = guard_of(d);
    pthread_mutex_lock(&g->mu);
    if (--g->depth == 0 && g->open > 0) {
        if (mprotect(g->base, g->open, PROT_NONE) != 0) {
            FSDP_ERROR(FSDP_SUB_CORE, "guarded device: mprotect close failed");
            abort();
        }
        g->open = 0;
    }
    pthread_mutex_unlock(&g->mu);
}

// ----------------------------------------------------------------------------
// ops: the CPU device's, inside the guard

/* A free block of at least bytes (first fit), else a new one at the top. */
static struct guard_block *guard_carve(struct guarded *g, size_t bytes)
{
    for (size_t i = 0; i < g->n_blocks; i++) {
        if (!g->blocks[i].live && g->blocks[i].bytes >= bytes) {
            return &g->blocks[i];
        }
    }
    size_t need = (bytes + GUARD_ALIGN - 1) / GUARD_ALIGN * GUARD_ALIGN;
    if (need == 0) {
        need = GUARD_ALIGN;
    }
    if (need > g->cap - g->top) {
        return NULL;
    }
    if (g->n_blocks == g->blocks_cap) {
        size_t nc = g->blocks_cap ? 2 * g->blocks_cap : 64;
        struct guard_block *nb = realloc(g->blocks, nc * sizeof(*nb));
        if (!nb) {
            return NULL;
        }
        g->blocks = nb;
        g->blocks_cap = nc;
    }
    struct guard_block *b = &g->blocks[g->n_blocks++];
    *b = (struct guard_block){.off = g->top, .bytes = need};
    g->top += need;
    return b;
}

static void *guard_alloc(struct fsdp_device *d, size_t bytes, const char *name)
{
    struct guarded *g = guard_of(d);
    pthread_mutex_lock(&g->mu);
    struct guard_block *b = guard_carve(g, bytes);
    if (b) {
        b->live = 1;
        b->req = bytes;
        b->wclock = 0;
        snprintf(b->name, sizeof(b->name), "%s", name ? name : "(unnamed)");
    }
    size_t off = b ? b->off : 0, held = b ? b->bytes : 0;
    pthread_mutex_unlock(&g->mu);
    if (!b) {
        return NULL;
    }
    void *p = g->base + off;
    guard_enter(d);
    memset(p, 0, held);
    guard_leave(d);
    fsdp_device_count_alloc(d, (long long)bytes);
    return p;
}

static void guard_free(struct fsdp_device *d, void *p)
{
    struct guarded *g = guard_of(d);
    if (!p) {
        return;
    }
    pthread_mutex_lock(&g->mu);
    size_t off = (size_t)((unsigned char *)p - g->base);
    for (size_t i = 0; i < g->n_blocks; i++) {
        if (g->blocks[i].off == off && g->blocks[i].live) {
            size_t req = g->blocks[i].req;
            g->blocks[i].live = 0;
            pthread_mutex_unlock(&g->mu);
            fsdp_device_count_alloc(d, -(long long)req);
            return;
        }
    }
    pthread_mutex_unlock(&g->mu);
    FSDP_ERROR(FSDP_SUB_CORE, "guarded device: free of %p, which it did not allocate", p);
    abort();
}

/* Whether p is in the arena (device memory), under g->mu. */
static int guard_owns(const struct guarded *g, const void *p)
{
    const unsigned char *c = p;
    return c >= g->base && c < g->base + g->top;
}

/* A copy's sides must be what its direction says, as a GPU's copy of that
 * kind requires: host memory passed as the device side (or the reverse)
 * works on the CPU and fails on a GPU, so it is stopped here. */
static void guard_check_sides(const struct guarded *g, const void *dst, const void *src,
                              size_t bytes, enum fsdp_copy_dir dir)
{
    static const char *const names[] = {"host-to-device", "device-to-host", "device-to-device"};
    const int src_dev = dir != FSDP_COPY_H2D, dst_dev = dir != FSDP_COPY_D2H;
    const char *bad = NULL;
    if (bytes == 0) {
        return;
    }
    if (guard_owns(g, src) != src_dev) {
        bad = src_dev ? "its source is host memory" : "its source is device memory";
    } else if (guard_owns(g, dst) != dst_dev) {
        bad = dst_dev ? "its destination is host memory" : "its destination is device memory";
    }
    if (bad) {
        fprintf(stderr,
                "fsdpc: guarded device: a %s copy of %zu bytes whose %s (a GPU's copy of this "
                "kind fails)\n"
                "fsdpc: hint: copy host memory on the host (memcpy), or give the copy the "
                "direction its two sides have\n",
                names[dir], bytes, bad + 4);
        fflush(stderr);
        abort();
    }
}

static int guard_copy(struct fsdp_device *d, void *dst, const void *src, size_t bytes,
                      enum fsdp_copy_dir dir, void *stream)
{
    struct guarded *g = guard_of(d);
    int s = guard_sid(stream);
    pthread_mutex_lock(&g->mu);
    guard_check_sides(g, dst, src, bytes, dir);
    guard_tick(g, s);
    if (dir != FSDP_COPY_H2D) {
        guard_access(g, s, src, 0, "copy");
    }
    if (dir != FSDP_COPY_D2H) {
        guard_access(g, s, dst, 1, "copy");
    }
    pthread_mutex_unlock(&g->mu);
    guard_enter(d);
    int rc = fsdp_cpu_device_ops.copy(d, dst, src, bytes, dir, stream);
    guard_leave(d);
    return rc;
}

static int guard_memset(struct fsdp_device *d, void *p, int value, size_t bytes, void *stream)
{
    struct guarded *g = guard_of(d);
    int s = guard_sid(stream);
    pthread_mutex_lock(&g->mu);
    guard_tick(g, s);
    guard_access(g, s, p, 1, "memset");
    pthread_mutex_unlock(&g->mu);
    guard_enter(d);
    int rc = fsdp_cpu_device_ops.memset(d, p, value, bytes, stream);
    guard_leave(d);
    return rc;
}

static int guard_mem_info(struct fsdp_device *d, size_t *free_bytes, size_t *total_bytes)
{
    struct guarded *g = guard_of(d);
    *total_bytes = g->cap;
    *free_bytes = g->cap - g->top;
    return 0;
}

/* A GPU's arena taken whole (ops->reserve): the address space is already
 * there, so only a plan larger than it is refused, as a GPU refuses one
 * larger than its memory. */
static int guard_reserve(struct fsdp_device *d, size_t bytes)
{
    struct guarded *g = guard_of(d);
    if (bytes > g->cap) {
        return fsdp_err(FSDP_ERR_NOMEM,
                        "out of memory on the guarded device: the memory plan reserves %zu bytes "
                        "of %zu (FSDPC_GUARDED_BYTES)",
                        bytes, g->cap);
    }
    return 0;
}

static int guard_stream_create(struct fsdp_device *d, void **stream)
{
    struct guarded *g = guard_of(d);
    pthread_mutex_lock(&g->mu);
    int id = g->n_streams < GUARD_STREAMS ? g->n_streams++ : -1;
    if (id >= 0) {
        g->streams[id].id = id;
    }
    pthread_mutex_unlock(&g->mu);
    if (id < 0) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "guarded device: at most %d streams",
                        GUARD_STREAMS - 1);
    }
    *stream = &g->streams[id];
    return 0;
}

static void guard_stream_destroy(struct fsdp_device *d, void *stream)
{
    (void)d;
    (void)stream; /* ids are not reused: a late op on it is still told apart */
}

/* The host waits for stream (NULL: every stream): later ops of any stream
 * come after what it had done. */
static int guard_synchronize(struct fsdp_device *d, void *stream)
{
    struct guarded *g = guard_of(d);
    pthread_mutex_lock(&g->mu);
    for (int s = 0; s < GUARD_STREAMS; s++) {
        if (!stream || s == guard_sid(stream)) {
            guard_vmax(g->host, g->vc[s]);
        }
    }
    pthread_mutex_unlock(&g->mu);
    d->stats.host_waits++;
    return 0;
}

static int guard_event_create(struct fsdp_device *d, void **ev)
{
    (void)d;
    *ev = calloc(1, sizeof(struct guard_event));
    return *ev ? 0 : fsdp_err(FSDP_ERR_NOMEM, "device event");
}

static void guard_event_destroy(struct fsdp_device *d, void *ev)
{
    (void)d;
    free(ev);
}

static int guard_event_record(struct fsdp_device *d, void *ev, void *stream)
{
    struct guarded *g = guard_of(d);
    int s = guard_sid(stream);
    pthread_mutex_lock(&g->mu);
    guard_vmax(g->vc[s], g->host);
    memcpy(((struct guard_event *)ev)->vc, g->vc[s], sizeof(g->vc[s]));
    pthread_mutex_unlock(&g->mu);
    return 0;
}

static int guard_stream_wait(struct fsdp_device *d, void *stream, void *ev)
{
    struct guarded *g = guard_of(d);
    pthread_mutex_lock(&g->mu);
    guard_vmax(g->vc[guard_sid(stream)], ((struct guard_event *)ev)->vc);
    pthread_mutex_unlock(&g->mu);
    return 0;
}

static int guard_event_synchronize(struct fsdp_device *d, void *ev)
{
    struct guarded *g = guard_of(d);
    pthread_mutex_lock(&g->mu);
    guard_vmax(g->host, ((struct guard_event *)ev)->vc);
    pthread_mutex_unlock(&g->mu);
    d->stats.host_waits++;
    return 0;
}

static size_t guard_buffers(struct fsdp_device *d, struct fsdp_device_buffer *out, size_t max)
{
    struct guarded *g = guard_of(d);
    size_t n = 0;
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->n_blocks; i++) {
        if (g->blocks[i].live) {
            if (n < max) {
                out[n] = (struct fsdp_device_buffer){g->blocks[i].name, g->blocks[i].req};
            }
            n++;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return n;
}

static struct fsdp_device_ops guard_ops;
static pthread_once_t ops_once = PTHREAD_ONCE_INIT;

/* The CPU device's streams, events and host memory; the guard's memory ops. */
static void guard_ops_make(void)
{
    guard_ops = fsdp_cpu_device_ops;
    guard_ops.name = "guarded";
    guard_ops.alloc = guard_alloc;
    guard_ops.free = guard_free;
    guard_ops.copy = guard_copy;
    guard_ops.memset = guard_memset;
    guard_ops.mem_info = guard_mem_info;
    guard_ops.reserve = guard_reserve;
    guard_ops.buffers = guard_buffers;
    guard_ops.stream_create = guard_stream_create;
    guard_ops.stream_destroy = guard_stream_destroy;
    guard_ops.synchronize = guard_synchronize;
    guard_ops.event_create = guard_event_create;
    guard_ops.event_destroy = guard_event_destroy;
    guard_ops.event_record = guard_event_record;
    guard_ops.stream_wait = guard_stream_wait;
    guard_ops.event_synchronize = guard_event_synchronize;
}

// ----------------------------------------------------------------------------
// lifetime

static size_t guard_reserve_bytes(void)
{
    const char *s = getenv("FSDPC_GUARDED_BYTES");
    char *end;
    unsigned long long v = s && *s ? strtoull(s, &end, 10) : 0;
    if (s && *s && (*end != '\0' || v < (1ull << 20))) {
        FSDP_WARN(FSDP_SUB_CORE,
                  "FSDPC_GUARDED_BYTES='%s' is not a byte count of at least 1 MiB: "
                  "using 64 GiB",
                  s);
        v = 0;
    }
    return v ? (size_t)v : (size_t)64 << 30;
}

int fsdp_guarded_device_init(struct fsdp_device *d, int index)
{
    struct guarded *g = calloc(1, sizeof(*g));
    if (!g) {
        return fsdp_err(FSDP_ERR_NOMEM, "guarded device");
    }
    g->page = (size_t)sysconf(_SC_PAGESIZE);
    g->cap = guard_reserve_bytes();
    g->base = mmap(NULL, g->cap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (g->base == MAP_FAILED) {
        free(g);
        return fsdp_err(FSDP_ERR_SYSTEM,
                        "guarded device: cannot reserve %zu bytes of address "
                        "space (set FSDPC_GUARDED_BYTES lower)",
                        (size_t)guard_reserve_bytes());
    }
    pthread_mutex_init(&g->mu, NULL);
    g->n_streams = 1; /* the default stream */
    int slot = -1;
    for (int i = 0; i < GUARD_MAX_ARENAS && slot < 0; i++) {
        if (!__atomic_load_n(&arenas[i], __ATOMIC_ACQUIRE)) {
            slot = i;
        }
    }
    if (slot < 0) {
        munmap(g->base, g->cap);
        free(g);
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "guarded device: at most %d per process",
                        GUARD_MAX_ARENAS);
    }
    pthread_once(&handler_once, guard_install);
    pthread_once(&ops_once, guard_ops_make);
    __atomic_store_n(&arenas[slot], g, __ATOMIC_RELEASE);
    FSDP_CHECK(fsdp_cpu_device_init(d, index));
    d->ops = &guard_ops;
    d->mem = FSDP_MEM_GUARDED;
    d->kernel_enter = guard_kernel_enter;
    d->kernel_leave = guard_leave;
    d->impl = g;
    return 0;
}

void fsdp_guarded_device_fini(struct fsdp_device *d)
{
    struct guarded *g = guard_of(d);
    if (!g) {
        return;
    }
    for (int i = 0; i < GUARD_MAX_ARENAS; i++) {
        if (arenas[i] == g) {
            __atomic_store_n(&arenas[i], NULL, __ATOMIC_RELEASE);
        }
    }
    munmap(g->base, g->cap);
    pthread_mutex_destroy(&g->mu);
    free(g->blocks);
    free(g);
    d->impl = NULL;
}
