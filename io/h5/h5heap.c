/*
 * h5heap.c - the global heap check every HDF5 reader runs before HDF5 opens
 * a file (model files, checkpoint indexes and shards).
 *
 * HDF5 1.10 trusts a global heap collection (where variable-length strings
 * and virtual-dataset mappings live) as it finds it: a free-space object
 * smaller than its header makes it loop forever, an object larger than its
 * collection makes it copy past its buffer. HDF5 loads a collection
 * wherever a variable-length value points, so every "GCOL" signature in the
 * file is walked as HDF5 would walk it.
 *
 * The cost is bounded by the file's size: HDF5 writes collections side by
 * side, so their walks together cover the file at most once. Collections
 * that claim the same bytes over and over (each walk would cover most of
 * the file: quadratic) are refused once the walks have done a few times the
 * work that the file's size allows. Reads go through the scan's own block
 * first and a small window beyond it, never a large re-read per walk.
 * Owns no state; reads the file with pread only (no mapping: a file cut
 * short under the scan must not raise SIGBUS).
 */
#include "config.h"
#include "io/h5/h5util.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define H5_SCAN_BLOCK ((size_t)1 << 22) /* the signature scan reads this much at a time */
#define H5_SCAN_WIN ((size_t)1 << 16)   /* a walk past the block reads this much ahead */
#define H5_SCAN_SLACK ((size_t)16 << 20) /* work allowed beyond 3 x the file's size */

struct h5_scan {
    int fd;
    size_t size;                 /* file bytes */
    const unsigned char *block;  /* (H5_SCAN_BLOCK,): file bytes [block_at, + block_len) */
    size_t block_at, block_len;
    unsigned char *win;          /* (H5_SCAN_WIN,): file bytes [win_at, + win_len) */
    size_t win_at, win_len;
    size_t work, budget;         /* bytes read plus object headers walked, and its bound */
    struct fsdp_h5_heap_stats st;
};

static int h5_scan_has(size_t at, size_t len, size_t off, size_t n)
{
    return off >= at && n <= len && off - at <= len - n;
}

static ssize_t h5_scan_read(struct h5_scan *s, unsigned char *buf, size_t n, size_t off)
{
    ssize_t r = pread(s->fd, buf, n, (off_t)off);
    if (r > 0) {
        s->work += (size_t)r;
        s->st.bytes_read += (size_t)r;
    }
    return r;
}

/* Points *p at n bytes from file offset off (n <= 64), or returns -1 past the end. */
static int h5_scan_get(struct h5_scan *s, size_t off, size_t n, const unsigned char **p)
{
    if (off > s->size || n > s->size - off) {
        return -1;
    }
    if (h5_scan_has(s->block_at, s->block_len, off, n)) {
        *p = s->block + (off - s->block_at);
        return 0;
    }
    if (!h5_scan_has(s->win_at, s->win_len, off, n)) {
        size_t want = s->size - off < H5_SCAN_WIN ? s->size - off : H5_SCAN_WIN;
        ssize_t r = h5_scan_read(s, s->win, want, off);
        if (r < (ssize_t)n) {
            return -1;
        }
        s->win_at = off;
        s->win_len = (size_t)r;
    }
    *p = s->win + (off - s->win_at);
    return 0;
}

static uint64_t h5_le(const unsigned char *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i > 0; i--) {
        v = v << 8 | p[i - 1];
    }
    return v;
}

/* Size of lengths (2, 4 or 8) from the superblock, or 0 when there is none
 * (HDF5 looks for it at 0 and at 512 * 2^k). */
static size_t h5_sizeof_lengths(struct h5_scan *s)
{
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    for (size_t off = 0; off < s->size; off = off ? off * 2 : 512) {
        const unsigned char *p;
        if (h5_scan_get(s, off, 16, &p) < 0) {
            return 0;
        }
        if (memcmp(p, sig, 8) == 0) {
            size_t n = p[8] < 2 ? p[14] : p[10];
            return n == 2 || n == 4 || n == 8 ? n : 0;
        }
    }
    return 0;
}

/*
 * The collection at off, walked as HDF5 1.10 walks it on load: 1 when it is
 * sound or is no collection HDF5 would load (a chance "GCOL" in tensor
 * bytes), 0 when HDF5 would loop forever on it (a free-space object smaller
 * than its own header) or copy past it (an object larger than what is left),
 * or when the walks so far exceed the scan's bound (overlapping collections).
 */
static int h5_heap_ok(struct h5_scan *s, size_t off, size_t L, char *why, size_t len)
{
    const unsigned char *p;
    const size_t hdr = 8 + L, objhdr = 8 + L;
    if (h5_scan_get(s, off, hdr, &p) < 0 || p[4] != 1) {
        return 1; /* HDF5 refuses other versions itself */
    }
    uint64_t size = h5_le(p + 8, L);
    if (size < hdr || size > s->size - off) {
        return 1; /* HDF5 cannot load it: past the end of the file */
    }
    s->st.collections++;
    size_t at = off + hdr, end = off + (size_t)size;
    while (end - at >= objhdr) {
        if (s->work > s->budget) {
            snprintf(why, len, "collections overlap far beyond what HDF5 writes (over %zu "
                     "bytes of heap walked in a %zu-byte file, at the collection at byte %zu)",
                     s->budget, s->size, off);
            return 0;
        }
        if (h5_scan_get(s, at, objhdr, &p) < 0) {
            return 1;
        }
        s->work += objhdr;
        s->st.objects++;
        unsigned idx = (unsigned)h5_le(p, 2);
        uint64_t osz = h5_le(p + 8, L);
        if (idx == 0 ? osz < objhdr || osz > end - at : osz > end - at - objhdr) {
            snprintf(why, len, "%s of %llu bytes at byte %zu does not fit its %llu-byte "
                     "collection at byte %zu", idx ? "an object" : "free space",
                     (unsigned long long)osz, at, (unsigned long long)size, off);
            return 0;
        }
        at += idx == 0 ? (size_t)osz : objhdr + (((size_t)osz + 7) & ~(size_t)7);
        if (at > end) {
            break; /* the last object's padding: HDF5 stops here too */
        }
    }
    return 1;
}

/* Every "GCOL" in the file, block by block: HDF5 loads a collection
 * wherever a variable-length value points, tensor bytes included. */
static int h5_scan_blocks(struct h5_scan *s, const char *path, unsigned char *block, size_t L)
{
    char why[200];
    for (size_t base = 0; base < s->size; base += H5_SCAN_BLOCK - 3) {
        ssize_t n = h5_scan_read(s, block, H5_SCAN_BLOCK, base);
        if (n < 4) {
            break;
        }
        s->block_at = base;
        s->block_len = (size_t)n;
        const unsigned char *p = block, *e = block + n;
        while ((p = memmem(p, (size_t)(e - p), "GCOL", 4)) != NULL) {
            s->st.signatures++;
            if (!h5_heap_ok(s, base + (size_t)(p - block), L, why, sizeof(why))) {
                return fsdp_err(FSDP_ERR_FORMAT, "%s: damaged HDF5 global heap: %s", path, why);
            }
            p++;
        }
        if ((size_t)n < H5_SCAN_BLOCK) {
            break;
        }
    }
    return 0;
}

int fsdp_h5_scan_heaps(const char *path, struct fsdp_h5_heap_stats *stats)
{
    struct stat st;
    struct h5_scan s = {.fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)};
    unsigned char *block = NULL;
    int rc = 0;
    if (s.fd < 0 || fstat(s.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = s.fd < 0 ? fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno))
                      : fsdp_err(FSDP_ERR_IO, "%s: not a regular file", path);
        goto out;
    }
    s.size = (size_t)st.st_size;
    s.budget = s.size > (SIZE_MAX - H5_SCAN_SLACK) / 3 ? SIZE_MAX : 3 * s.size + H5_SCAN_SLACK;
    block = malloc(H5_SCAN_BLOCK);
    s.win = malloc(H5_SCAN_WIN);
    s.block = block;
    if (!block || !s.win) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "%s: heap scan buffers", path);
        goto out;
    }
    size_t L = h5_sizeof_lengths(&s);
    rc = L ? h5_scan_blocks(&s, path, block, L) : 0;
out:
    free(block);
    free(s.win);
    if (s.fd >= 0) {
        close(s.fd);
    }
    if (stats) {
        *stats = s.st;
    }
    return rc;
}

int fsdp_h5_check_heaps(const char *path)
{
    return fsdp_h5_scan_heaps(path, NULL);
}
