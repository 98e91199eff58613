/*
 * safetensors.c - the safetensors reader and writer (see safetensors.h):
 * a strict parser for the header's JSON subset (objects, arrays, strings,
 * non-negative integers), the layout checks, and a streaming writer. The
 * reader keeps the header and points into it (names, metadata), so a
 * header costs about twice its size in memory, and finds names through a
 * sorted index, so a header of any number of names opens in O(n log n).
 * Checksums (XXH3-64 per tensor, in __metadata__) are hashed by the writer
 * as tensors are written and patched into the header at commit, and
 * checked by the reader as each tensor is read.
 */
#include "config.h"
#include "io/hf/safetensors.h"
#include "io/util/fileutil.h"
#include "core/error.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define ST_SUM_DIGITS 16 /* a checksum's hex digits */

static const struct {
    const char *name;
    enum fsdp_dtype t;
} st_dtypes[] = {
    {"F32", FSDP_F32}, {"F16", FSDP_F16}, {"BF16", FSDP_BF16},
    {"I32", FSDP_I32}, {"I64", FSDP_I64}, {"U8", FSDP_U8},
};

static const char *st_dtype_name(enum fsdp_dtype t)
{
    for (size_t i = 0; i < sizeof(st_dtypes) / sizeof(st_dtypes[0]); i++) {
        if (st_dtypes[i].t == t) {
            return st_dtypes[i].name;
        }
    }
    return "?";
}

// ----------------------------------------------------------------------------
// header JSON

/* Names from the file quoted in messages are cut to this (with "..."). */
#define ST_SHOW 80

struct st_parser {
    const char *path;
    char *s, *p, *end; /* the header; strings are unescaped in place */
};

static int st_bad(struct st_parser *ps, const char *what)
{
    return fsdp_err(FSDP_ERR_FORMAT, "%s: header JSON: %s at byte %zu", ps->path, what,
                    (size_t)(ps->p - ps->s) + 8);
}

static void st_ws(struct st_parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) {
        ps->p++;
    }
}

static int st_expect(struct st_parser *ps, char c)
{
    st_ws(ps);
    if (ps->p >= ps->end || *ps->p != c) {
        char msg[32];
        snprintf(msg, sizeof(msg), "expected '%c'", c);
        return st_bad(ps, msg);
    }
    ps->p++;
    return 0;
}

/* One escape after the backslash at ps->p; the byte it stands for. */
static int st_escape(struct st_parser *ps, char *c)
{
    static const char map[] = "\"\"\\\\//b\bf\fn\nr\rt\t";
    char e = *ps->p++;
    const char *m = e ? strchr(map, e) : NULL;
    if (e == 'u') {
        unsigned v = 0;
        for (int k = 0; k < 4; k++) {
            char h = ps->p < ps->end ? *ps->p++ : 'x';
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) {
                return st_bad(ps, "bad \\u escape");
            }
            v = v * 16 + (unsigned)d;
        }
        if (v == 0 || v >= 0x80) {
            return st_bad(ps, "\\u escape outside ASCII");
        }
        *c = (char)v;
        return 0;
    }
    if (m && ((m - map) % 2) == 0) {
        *c = m[1];
        return 0;
    }
    return st_bad(ps, "bad escape");
}

/*
 * A string, unescaped in place (an escape is never shorter than the byte it
 * stands for) and NUL-terminated where it began: *out points into the
 * header, so names cost no copy. Longer than max bytes (0: no limit) is an
 * error. ASCII escapes only; other bytes are kept as they are.
 */
static int st_string(struct st_parser *ps, char **out, size_t max)
{
    FSDP_CHECK(st_expect(ps, '"'));
    char *w = ps->p, *start = ps->p;
    while (ps->p < ps->end && *ps->p != '"') {
        char c = *ps->p++;
        if ((unsigned char)c < 0x20) {
            return st_bad(ps, "control character in a string");
        }
        if (c == '\\') {
            if (ps->p >= ps->end) {
                break;
            }
            FSDP_CHECK(st_escape(ps, &c));
        }
        *w++ = c;
    }
    if (ps->p >= ps->end) {
        return st_bad(ps, "unterminated string");
    }
    if (max && (size_t)(w - start) > max) {
        return st_bad(ps, "string too long");
    }
    ps->p++;
    *w = '\0'; /* at or before the closing quote, which is consumed */
    *out = start;
    return 0;
}

static int st_uint(struct st_parser *ps, size_t *v)
{
    st_ws(ps);
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') {
        return st_bad(ps, "expected a non-negative integer");
    }
    uint64_t x = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        if (x > (UINT64_MAX - 9) / 10) {
            return st_bad(ps, "integer too large");
        }
        x = x * 10 + (uint64_t)(*ps->p++ - '0');
    }
    if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E')) {
        return st_bad(ps, "expected an integer");
    }
    *v = (size_t)x;
    return 0;
}

/* ',' then more, or the closing bracket: 1 more, 0 done. */
static int st_next(struct st_parser *ps, char close, int *more)
{
    st_ws(ps);
    if (ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        *more = 1;
        return 0;
    }
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        *more = 0;
        return 0;
    }
    return st_bad(ps, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
}

static int st_empty(struct st_parser *ps, char close)
{
    st_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 1;
    }
    return 0;
}

/* Room for one more of *n elements of size sz in *arr (capacity *cap):
 * doubling keeps a header of a million entries linear. */
static int st_grow(void **arr, size_t *cap, size_t n, size_t sz)
{
    if (n < *cap) {
        return 0;
    }
    size_t c = *cap ? 2 * *cap : 64;
    void *a = c <= SIZE_MAX / sz ? realloc(*arr, c * sz) : NULL;
    if (!a) {
        return -1;
    }
    *arr = a;
    *cap = c;
    return 0;
}

static int st_parse_meta(struct fsdp_safetensors *st, struct st_parser *ps, size_t *cap)
{
    int more = 1;
    FSDP_CHECK(st_expect(ps, '{'));
    if (st_empty(ps, '}')) {
        return 0;
    }
    while (more) {
        if (st_grow((void **)&st->meta, cap, st->n_meta, sizeof(*st->meta)) < 0) {
            return fsdp_err(FSDP_ERR_NOMEM, "%s: metadata", st->path);
        }
        char *key, *value;
        FSDP_CHECK(st_string(ps, &key, FSDP_ST_KEY_MAX - 1));
        FSDP_CHECK(st_expect(ps, ':'));
        /* free-form values (licences, notes) may be long; they cost no copy */
        FSDP_CHECK(st_string(ps, &value, 0));
        st->meta[st->n_meta++] = (struct fsdp_st_meta){key, value};
        FSDP_CHECK(st_next(ps, '}', &more));
    }
    return 0;
}

static int st_parse_tensor(struct fsdp_safetensors *st, struct st_parser *ps,
                           struct fsdp_st_tensor *t)
{
    char show[ST_SHOW], show2[ST_SHOW];
    char *key, *dt;
    int more = 1, have = 0;
    FSDP_CHECK(st_expect(ps, '{'));
    while (more) {
        FSDP_CHECK(st_string(ps, &key, 0));
        FSDP_CHECK(st_expect(ps, ':'));
        if (strcmp(key, "dtype") == 0 && !(have & 1)) {
            FSDP_CHECK(st_string(ps, &dt, 0));
            size_t i = 0;
            while (i < sizeof(st_dtypes) / sizeof(st_dtypes[0]) && strcmp(st_dtypes[i].name, dt)) {
                i++;
            }
            if (i == sizeof(st_dtypes) / sizeof(st_dtypes[0])) {
                return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype '%s' (supported: "
                                "F32, F16, BF16, I32, I64, U8)", st->path,
                                fsdp_str_printable(show, sizeof(show), t->name, 0),
                                fsdp_str_printable(show2, sizeof(show2), dt, 0));
            }
            t->dtype = st_dtypes[i].t;
            have |= 1;
        } else if (strcmp(key, "shape") == 0 && !(have & 2)) {
            int m2 = 1;
            FSDP_CHECK(st_expect(ps, '['));
            t->ndim = 0;
            if (!st_empty(ps, ']')) {
                while (m2) {
                    if (t->ndim == FSDP_ST_RANK_MAX) {
                        return st_bad(ps, "shape has too many dimensions");
                    }
                    FSDP_CHECK(st_uint(ps, &t->shape[t->ndim++]));
                    FSDP_CHECK(st_next(ps, ']', &m2));
                }
            }
            have |= 2;
        } else if (strcmp(key, "data_offsets") == 0 && !(have & 4)) {
            FSDP_CHECK(st_expect(ps, '['));
            FSDP_CHECK(st_uint(ps, &t->begin));
            FSDP_CHECK(st_expect(ps, ','));
            FSDP_CHECK(st_uint(ps, &t->end));
            FSDP_CHECK(st_expect(ps, ']'));
            have |= 4;
        } else {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s': unexpected or repeated key '%s'",
                            st->path, fsdp_str_printable(show, sizeof(show), t->name, 0),
                            fsdp_str_printable(show2, sizeof(show2), key, 0));
        }
        FSDP_CHECK(st_next(ps, '}', &more));
    }
    if (have != 7) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' lacks %s", st->path,
                        fsdp_str_printable(show, sizeof(show), t->name, 0),
                        !(have & 1) ? "dtype" : !(have & 2) ? "shape" : "data_offsets");
    }
    return 0;
}

static int st_parse(struct fsdp_safetensors *st, char *hdr, size_t n)
{
    struct st_parser ps = {st->path, hdr, hdr, hdr + n};
    size_t cap = 0, meta_cap = 0;
    int more = 1, had_meta = 0;
    FSDP_CHECK(st_expect(&ps, '{'));
    if (st_empty(&ps, '}')) {
        more = 0;
    }
    while (more) {
        char *name;
        FSDP_CHECK(st_string(&ps, &name, FSDP_ST_NAME_MAX - 1));
        FSDP_CHECK(st_expect(&ps, ':'));
        if (strcmp(name, "__metadata__") == 0) {
            if (had_meta++) {
                return st_bad(&ps, "second __metadata__");
            }
            FSDP_CHECK(st_parse_meta(st, &ps, &meta_cap));
        } else {
            if (st_grow((void **)&st->t, &cap, st->n, sizeof(*st->t)) < 0) {
                return fsdp_err(FSDP_ERR_NOMEM, "%s: tensor table", st->path);
            }
            memset(&st->t[st->n], 0, sizeof(st->t[0]));
            st->t[st->n].name = name;
            FSDP_CHECK(st_parse_tensor(st, &ps, &st->t[st->n]));
            st->n++;
        }
        FSDP_CHECK(st_next(&ps, '}', &more));
    }
    st_ws(&ps);
    if (ps.p != ps.end) {
        return st_bad(&ps, "trailing bytes after the header object");
    }
    return 0;
}

// ----------------------------------------------------------------------------
// names and layout

static int st_cmp_name(const void *a, const void *b)
{
    const struct fsdp_st_tensor *x = *(const struct fsdp_st_tensor *const *)a;
    const struct fsdp_st_tensor *y = *(const struct fsdp_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* The tensors sorted by name, for lookups: O(n log n) whatever names a file
 * chooses (a hash table's worst case would be the file's to pick), and a
 * name that appears twice sits next to itself. */
static int st_index_names(struct fsdp_safetensors *st)
{
    char show[ST_SHOW];
    st->by_name = malloc((st->n ? st->n : 1) * sizeof(*st->by_name));
    if (!st->by_name) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: name index", st->path);
    }
    for (size_t i = 0; i < st->n; i++) {
        st->by_name[i] = &st->t[i];
    }
    qsort(st->by_name, st->n, sizeof(*st->by_name), st_cmp_name);
    for (size_t i = 1; i < st->n; i++) {
        if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' appears twice", st->path,
                            fsdp_str_printable(show, sizeof(show), st->by_name[i]->name, 0));
        }
    }
    return 0;
}

static int st_cmp_begin(const void *a, const void *b)
{
    const struct fsdp_st_tensor *x = *(const struct fsdp_st_tensor *const *)a;
    const struct fsdp_st_tensor *y = *(const struct fsdp_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int st_check_sizes(struct fsdp_safetensors *st, size_t data_bytes)
{
    char show[ST_SHOW];
    for (size_t i = 0; i < st->n; i++) {
        struct fsdp_st_tensor *t = &st->t[i];
        size_t bytes = fsdp_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] != 0 && bytes > SIZE_MAX / t->shape[d]) {
                return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s': shape overflows", st->path,
                                fsdp_str_printable(show, sizeof(show), t->name, 0));
            }
            bytes *= t->shape[d];
        }
        if (t->end < t->begin || t->end - t->begin != bytes) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s': data_offsets [%zu, %zu) hold %zu "
                            "bytes but its dtype and shape need %zu", st->path,
                            fsdp_str_printable(show, sizeof(show), t->name, 0), t->begin, t->end,
                            t->end >= t->begin ? t->end - t->begin : 0, bytes);
        }
        if (t->end > data_bytes) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s': data_offsets end %zu is beyond "
                            "the %zu data bytes of the file", st->path,
                            fsdp_str_printable(show, sizeof(show), t->name, 0), t->end,
                            data_bytes);
        }
    }
    return 0;
}

static int st_check_layout(struct fsdp_safetensors *st, size_t data_bytes)
{
    char show[ST_SHOW];
    FSDP_CHECK(st_check_sizes(st, data_bytes));
    struct fsdp_st_tensor **order = malloc((st->n ? st->n : 1) * sizeof(*order));
    if (!order) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: tensor order", st->path);
    }
    for (size_t i = 0; i < st->n; i++) {
        order[i] = &st->t[i];
    }
    qsort(order, st->n, sizeof(*order), st_cmp_begin);
    size_t at = 0;
    int rc = 0;
    for (size_t i = 0; i < st->n && rc == 0; i++) {
        if (order[i]->begin != at) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' starts at data byte %zu but the "
                          "previous one ends at %zu (%s)", st->path,
                          fsdp_str_printable(show, sizeof(show), order[i]->name, 0),
                          order[i]->begin, at, order[i]->begin < at ? "overlap" : "gap");
        }
        at = order[i]->end;
    }
    free(order);
    if (rc == 0 && at != data_bytes) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: tensors cover %zu data bytes but the file holds %zu",
                      st->path, at, data_bytes);
    }
    return rc;
}

// ----------------------------------------------------------------------------
// reader

/* The header bytes after the 8-byte length, read whole (it is capped). */
static int st_read_header(struct fsdp_safetensors *st, const struct stat *sb, size_t *len)
{
    unsigned char len8[8];
    if (sb->st_size < 8 || pread(st->fd, len8, 8, 0) != 8) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: %lld bytes: too short for a safetensors header",
                        st->path, (long long)sb->st_size);
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) {
        n = n << 8 | len8[i];
    }
    if (n < 2 || n > FSDP_ST_HEADER_MAX || n > (uint64_t)sb->st_size - 8) {
        /* the value is the file's first 8 bytes, whatever the file is: not quoted */
        return fsdp_err(FSDP_ERR_FORMAT, "%s: not a safetensors file: the header length in its "
                        "first 8 bytes is %s", st->path,
                        n > FSDP_ST_HEADER_MAX ? "above the 100 MiB cap"
                        : n < 2 ? "too small" : "beyond the end of the file");
    }
    if (!(st->hdr = malloc((size_t)n))) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: %llu header bytes", st->path, (unsigned long long)n);
    }
    if (pread(st->fd, st->hdr, (size_t)n, 8) != (ssize_t)n) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot read the header: %s", st->path, strerror(errno));
    }
    if (st->hdr[0] != '{') {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: header does not start with '{'", st->path);
    }
    *len = (size_t)n;
    return 0;
}

/*
 * The checksums in __metadata__ onto their tensors. A key naming no tensor
 * is left alone (a tool that dropped a tensor may have kept the metadata);
 * a value that is not 16 hex digits is an error.
 */
static int st_attach_sums(struct fsdp_safetensors *st)
{
    const size_t plen = strlen(FSDP_ST_SUM_PREFIX);
    for (size_t i = 0; i < st->n_meta; i++) {
        const char *key = st->meta[i].key, *v = st->meta[i].value;
        long k;
        if (strncmp(key, FSDP_ST_SUM_PREFIX, plen) != 0 ||
            (k = fsdp_safetensors_find(st, key + plen)) < 0) {
            continue;
        }
        uint64_t h = 0;
        size_t d = 0;
        for (; v[d] && d <= ST_SUM_DIGITS; d++) {
            int c = v[d];
            int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                   : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (x < 0) {
                break;
            }
            h = h << 4 | (uint64_t)x;
        }
        if (d != ST_SUM_DIGITS || v[d]) {
            char show[ST_SHOW], vs[ST_SHOW];
            return fsdp_err(FSDP_ERR_FORMAT, "%s: metadata '%s' is '%s', not %d hex digits",
                            st->path, fsdp_str_printable(show, sizeof(show), key, 0),
                            fsdp_str_printable(vs, sizeof(vs), v, 0), ST_SUM_DIGITS);
        }
        st->t[k].has_xxh3 = 1;
        st->t[k].xxh3 = h;
    }
    return 0;
}

int fsdp_safetensors_open(const char *path, struct fsdp_safetensors **out)
{
    struct stat sb;
    size_t n = 0;
    int rc;
    struct fsdp_safetensors *st = calloc(1, sizeof(*st));
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: safetensors handle", path);
    }
    /* O_NONBLOCK: a FIFO would otherwise block open() until a writer came */
    st->fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (st->fd < 0 || fstat(st->fd, &sb) != 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto err;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: not a regular file", path);
        goto err;
    }
    FSDP_CHECK_GOTO(st_read_header(st, &sb, &n), rc, err);
    FSDP_CHECK_GOTO(st_parse(st, st->hdr, n), rc, err);
    FSDP_CHECK_GOTO(st_index_names(st), rc, err);
    st->data_off = 8 + n;
    FSDP_CHECK_GOTO(st_check_layout(st, (size_t)sb.st_size - st->data_off), rc, err);
    FSDP_CHECK_GOTO(st_attach_sums(st), rc, err);
    *out = st;
    return 0;
err:
    fsdp_safetensors_close(st);
    return rc;
}

void fsdp_safetensors_close(struct fsdp_safetensors *st)
{
    if (!st) {
        return;
    }
    if (st->fd >= 0) {
        close(st->fd);
    }
    free(st->t);
    free(st->by_name);
    free(st->meta);
    free(st->hdr);
    free(st->path);
    free(st);
}

static int st_tensor_named(const void *name, const void *e)
{
    return strcmp(name, (*(const struct fsdp_st_tensor *const *)e)->name);
}

long fsdp_safetensors_find(const struct fsdp_safetensors *st, const char *name)
{
    struct fsdp_st_tensor *const *e =
        bsearch(name, st->by_name, st->n, sizeof(*st->by_name), st_tensor_named);
    return e ? (long)(*e - st->t) : -1;
}

const char *fsdp_safetensors_meta(const struct fsdp_safetensors *st, const char *key)
{
    for (size_t i = 0; i < st->n_meta; i++) {
        if (strcmp(st->meta[i].key, key) == 0) {
            return st->meta[i].value;
        }
    }
    return NULL;
}

int fsdp_safetensors_read(struct fsdp_safetensors *st, size_t i, void *dst)
{
    const struct fsdp_st_tensor *t = &st->t[i];
    size_t want = t->end - t->begin, got = 0;
    while (got < want) {
        ssize_t r = pread(st->fd, (char *)dst + got, want - got,
                          (off_t)(st->data_off + t->begin + got));
        if (r <= 0) {
            char show[ST_SHOW];
            return fsdp_err(FSDP_ERR_IO, "%s: reading tensor '%s' failed: %s", st->path,
                            fsdp_str_printable(show, sizeof(show), t->name, 0),
                            r < 0 ? strerror(errno) : "unexpected end of file");
        }
        got += (size_t)r;
    }
    uint64_t h = t->has_xxh3 ? XXH3_64bits(dst, want) : 0;
    if (h != t->xxh3) {
        char show[ST_SHOW];
        return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' checksum mismatch (stored 0x%016llx, "
                        "computed 0x%016llx): the file is damaged", st->path,
                        fsdp_str_printable(show, sizeof(show), t->name, 0),
                        (unsigned long long)t->xxh3, (unsigned long long)h);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// writer

struct fsdp_st_writer {
    char *path, *tmp;
    FILE *fp;
    size_t *bytes;    /* (n,) of each entry */
    size_t *sum_at;   /* (n,) header offset of each entry's checksum digits */
    uint64_t *sum;    /* (n,) each entry's checksum */
    size_t n, next;
    int committed;
};

static size_t st_entry_bytes(const struct fsdp_st_entry *e)
{
    return fsdp_dtype_size(e->dtype) * e->shape[0] * (e->ndim == 2 ? e->shape[1] : 1);
}

/* The header JSON into a malloc'd buffer, padded so that 8 + len is a
 * multiple of 8; sum_at (n,) gets where each entry's checksum digits go
 * (zeros until commit). */
static char *st_header(const struct fsdp_st_entry *e, size_t n, const char *const *meta,
                       size_t n_meta, size_t *sum_at, size_t *len)
{
    char *buf = NULL;
    size_t cap = 0;
    FILE *m = open_memstream(&buf, &cap);
    size_t off = 0;
    if (!m) {
        return NULL;
    }
    fputc('{', m);
    if (n_meta || n) {
        fputs("\"__metadata__\":{", m);
        for (size_t i = 0; i < n_meta; i++) {
            fprintf(m, "%s\"%s\":\"%s\"", i ? "," : "", meta[2 * i], meta[2 * i + 1]);
        }
        for (size_t i = 0; i < n; i++) {
            fprintf(m, "%s\"%s%s\":\"", i || n_meta ? "," : "", FSDP_ST_SUM_PREFIX, e[i].name);
            sum_at[i] = (size_t)ftell(m);
            fprintf(m, "%0*d\"", ST_SUM_DIGITS, 0);
        }
        fputc('}', m);
    }
    for (size_t i = 0; i < n; i++) {
        size_t b = st_entry_bytes(&e[i]);
        fprintf(m, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%zu", i || n_meta || n ? "," : "",
                e[i].name, st_dtype_name(e[i].dtype), e[i].shape[0]);
        if (e[i].ndim == 2) {
            fprintf(m, ",%zu", e[i].shape[1]);
        }
        fprintf(m, "],\"data_offsets\":[%zu,%zu]}", off, off + b);
        off += b;
    }
    fputc('}', m);
    long pos = ftell(m);
    while ((8 + pos) % 8 != 0) {
        fputc(' ', m);
        pos++;
    }
    if (fclose(m) != 0) {
        free(buf);
        return NULL;
    }
    *len = (size_t)pos;
    return buf;
}

int fsdp_st_writer_create(const char *path, const struct fsdp_st_entry *entries, size_t n,
                          const char *const *meta, size_t n_meta, struct fsdp_st_writer **out)
{
    int rc;
    size_t len = 0;
    struct fsdp_st_writer *w = calloc(1, sizeof(*w));
    size_t *sum_at = malloc((n ? n : 1) * sizeof(size_t));
    char *hdr = sum_at ? st_header(entries, n, meta, n_meta, sum_at, &len) : NULL;
    if (!w || !hdr || !(w->path = strdup(path)) ||
        !(w->bytes = malloc((n ? n : 1) * sizeof(*w->bytes))) ||
        !(w->sum = calloc(n ? n : 1, sizeof(*w->sum)))) {
        free(sum_at);
        free(hdr);
        fsdp_st_writer_destroy(w);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: safetensors writer", path);
    }
    w->n = n;
    w->sum_at = sum_at;
    for (size_t i = 0; i < n; i++) {
        w->bytes[i] = st_entry_bytes(&entries[i]);
    }
    int fd;
    FSDP_CHECK_GOTO(fsdp_file_tmp_create(path, &w->tmp, &fd), rc, err);
    w->fp = fdopen(fd, "wb");
    if (!w->fp) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
        close(fd);
        goto err;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) {
        len8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    }
    if (fwrite(len8, 1, 8, w->fp) != 8 || fwrite(hdr, 1, len, w->fp) != len) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
        goto err;
    }
    free(hdr);
    *out = w;
    return 0;
err:
    free(hdr);
    fsdp_st_writer_destroy(w);
    return rc;
}

int fsdp_st_writer_put(struct fsdp_st_writer *w, size_t i, const void *data)
{
    if (i != w->next || i >= w->n) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: tensor %zu written out of order (next is %zu)",
                        w->tmp, i, w->next);
    }
    if (fwrite(data, 1, w->bytes[i], w->fp) != w->bytes[i]) {
        return fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    }
    w->sum[i] = XXH3_64bits(data, w->bytes[i]);
    w->next++;
    return 0;
}

/* Every entry's checksum over the zeros the header holds for it. */
static int st_patch_sums(struct fsdp_st_writer *w)
{
    char digits[ST_SUM_DIGITS + 1];
    for (size_t i = 0; i < w->n; i++) {
        snprintf(digits, sizeof(digits), "%016llx", (unsigned long long)w->sum[i]);
        if (fseeko(w->fp, (off_t)(8 + w->sum_at[i]), SEEK_SET) != 0 ||
            fwrite(digits, 1, ST_SUM_DIGITS, w->fp) != ST_SUM_DIGITS) {
            return -1;
        }
    }
    return 0;
}

int fsdp_st_writer_commit(struct fsdp_st_writer *w)
{
    if (w->next != w->n) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: %zu of %zu tensors written", w->tmp, w->next, w->n);
    }
    int e = st_patch_sums(w) < 0;
    e |= fflush(w->fp) != 0 || ferror(w->fp);
    e |= fclose(w->fp) != 0;
    w->fp = NULL;
    if (e) {
        return fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    }
    FSDP_CHECK(fsdp_file_commit(w->tmp, w->path));
    w->committed = 1;
    return 0;
}

void fsdp_st_writer_destroy(struct fsdp_st_writer *w)
{
    if (!w) {
        return;
    }
    if (w->fp) {
        fclose(w->fp);
    }
    if (!w->committed && w->tmp) {
        unlink(w->tmp);
    }
    free(w->bytes);
    free(w->sum_at);
    free(w->sum);
    free(w->path);
    free(w->tmp);
    free(w);
}
