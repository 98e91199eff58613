/*
 * json.c - typed members of JSON documents read with Jansson, and an
 * indented JSON writer (see json.h). Owns no file format: the callers say
 * which members a document must have.
 */
#include "config.h"
#include "io/util/json.h"
#include "core/error.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JSON_SHOW 64
#define JSON_READ_BLOCK ((size_t)1 << 20) /* bytes per read() of a JSON file */

// ----------------------------------------------------------------------------
// reading

/* The n bytes of fd into text, read in blocks (Jansson's own file reader
 * takes one byte per read() call); *got is short when the file was cut. */
static int json_read_all(const char *path, int fd, char *text, size_t n, size_t *got)
{
    *got = 0;
    while (*got < n) {
        size_t want = n - *got < JSON_READ_BLOCK ? n - *got : JSON_READ_BLOCK;
        ssize_t r = read(fd, text + *got, want);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        }
        if (r == 0) {
            break;
        }
        *got += (size_t)r;
    }
    return 0;
}

int fsdp_json_parse_file(const char *path, size_t max_bytes, struct json_t **doc)
{
    struct stat sb;
    json_error_t jerr;
    /* O_NONBLOCK: a FIFO would otherwise block open() until a writer came */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
        }
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode) || (size_t)sb.st_size > max_bytes) {
        close(fd);
        return fsdp_err(FSDP_ERR_FORMAT, "%s: not a regular file of at most %zu bytes", path,
                        max_bytes);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *text = malloc(n ? n : 1);
    int rc = text ? json_read_all(path, fd, text, n, &got)
                  : fsdp_err(FSDP_ERR_NOMEM, "%s: %zu bytes of JSON", path, n);
    close(fd);
    size_t i = 0;
    while (rc == 0 && i < got &&
           (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\n')) {
        i++;
    }
    if (rc == 0 && (i == got || (text[i] != '{' && text[i] != '['))) {
        /* another kind of file: its bytes are not quoted (Jansson's message would) */
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: not JSON: it does not start with '{' or '['", path);
    }
    json_t *j = rc == 0 ? json_loadb(text, got, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    free(text);
    if (rc < 0) {
        return rc;
    }
    if (!j) {
        char show[JSON_SHOW * 2];
        return fsdp_err(FSDP_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", path,
                        fsdp_str_printable(show, sizeof(show), jerr.text, 0), jerr.line,
                        jerr.column);
    }
    *doc = j;
    return 0;
}

int fsdp_json_load(const char *path, size_t max_bytes, struct json_t **doc,
                   struct fsdp_json_obj *root)
{
    json_t *j;
    FSDP_CHECK(fsdp_json_parse_file(path, max_bytes, &j));
    if (!json_is_object(j)) {
        json_decref(j);
        return fsdp_err(FSDP_ERR_FORMAT, "%s: the top level is not a JSON object", path);
    }
    *doc = j;
    root->file = path;
    root->where[0] = '\0';
    root->obj = j;
    return 0;
}

void fsdp_json_free(struct json_t *doc)
{
    if (doc) {
        json_decref(doc);
    }
}

/* A value as a message shows it: a string quoted and made printable,
 * numbers and literals as written, containers by kind. */
static const char *json_show(char *buf, size_t len, const json_t *v)
{
    char s[JSON_SHOW];
    switch (json_typeof(v)) {
    case JSON_STRING:
        snprintf(buf, len, "\"%s\" (a string)",
                 fsdp_str_printable(s, sizeof(s), json_string_value(v), 0));
        break;
    case JSON_INTEGER: snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: snprintf(buf, len, "%.17g", json_real_value(v)); break;
    case JSON_TRUE: snprintf(buf, len, "true"); break;
    case JSON_FALSE: snprintf(buf, len, "false"); break;
    case JSON_NULL: snprintf(buf, len, "null"); break;
    case JSON_OBJECT: snprintf(buf, len, "an object"); break;
    default: snprintf(buf, len, "an array"); break;
    }
    return buf;
}

/* key's value, NULL when absent or null (*present says which). */
static json_t *json_member(const struct fsdp_json_obj *o, const char *key, int *present)
{
    json_t *v = json_object_get(o->obj, key);
    *present = v != NULL;
    return v && !json_is_null(v) ? v : NULL;
}

/* The error for a required member that is absent or null. */
static int json_missing(const struct fsdp_json_obj *o, const char *key, int present,
                        const char *want)
{
    if (present) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: '%s%s' is null; expected %s", o->file, o->where,
                        key, want);
    }
    return fsdp_err(FSDP_ERR_FORMAT, "%s: '%s%s' is missing (%s)", o->file, o->where, key,
                    want);
}

static int json_wrong(const struct fsdp_json_obj *o, const char *key, const json_t *v,
                      const char *want)
{
    char show[JSON_SHOW * 2];
    return fsdp_err(FSDP_ERR_FORMAT, "%s: '%s%s' is %s; expected %s", o->file, o->where, key,
                    json_show(show, sizeof(show), v), want);
}

/* The JSON types a getter takes, as a mask of bits (1 << json_type). */
#define JSON_TYPES_NUMBER ((1u << JSON_INTEGER) | (1u << JSON_REAL))
#define JSON_TYPES_BOOL ((1u << JSON_TRUE) | (1u << JSON_FALSE))
#define JSON_TYPES_STRING (1u << JSON_STRING)

/* key's value into *v when it has one of the types; NULL when absent or
 * null and the caller has a default; otherwise an error naming what was
 * wanted. */
static int json_need(const struct fsdp_json_obj *o, const char *key, int has_dflt, unsigned types,
                     const char *want, json_t **v)
{
    int present;
    *v = json_member(o, key, &present);
    if (!*v) {
        return has_dflt ? 0 : json_missing(o, key, present, want);
    }
    if (!(types & (1u << json_typeof(*v)))) {
        return json_wrong(o, key, *v, want);
    }
    return 0;
}

int fsdp_json_has(const struct fsdp_json_obj *o, const char *key)
{
    return json_object_get(o->obj, key) != NULL;
}

int fsdp_json_is_null(const struct fsdp_json_obj *o, const char *key)
{
    const json_t *v = json_object_get(o->obj, key);
    return v && json_is_null(v);
}

int fsdp_json_int(const struct fsdp_json_obj *o, const char *key, long long lo, long long hi,
                  const long long *dflt, long long *out)
{
    char want[96];
    json_t *v;
    snprintf(want, sizeof(want), "an integer in [%lld, %lld]", lo, hi);
    FSDP_CHECK(json_need(o, key, dflt != NULL, JSON_TYPES_NUMBER, want, &v));
    if (!v) {
        *out = *dflt;
        return 0;
    }
    long long x;
    if (json_is_integer(v)) {
        x = (long long)json_integer_value(v);
    } else if (json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15) {
        x = (long long)json_real_value(v); /* 4096.0: a whole number written as a float */
    } else {
        return json_wrong(o, key, v, want);
    }
    if (x < lo || x > hi) {
        return json_wrong(o, key, v, want);
    }
    *out = x;
    return 0;
}

int fsdp_json_int_list(const struct fsdp_json_obj *o, const char *key, long long lo, long long hi,
                       long long *out, size_t max, size_t *n)
{
    char want[112];
    int present;
    json_t *v = json_member(o, key, &present);
    *n = 0;
    if (!v || !json_is_array(v)) {
        long long x;
        int rc = v ? fsdp_json_int(o, key, lo, hi, NULL, &x) : 0;
        if (v && rc == 0) {
            *n = 1;
            if (max) {
                out[0] = x;
            }
        }
        return rc;
    }
    snprintf(want, sizeof(want), "an integer in [%lld, %lld] or a list of them", lo, hi);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < lo || json_integer_value(e) > hi) {
            return json_wrong(o, key, v, want);
        }
        if (i < max) {
            out[i] = (long long)json_integer_value(e);
        }
    }
    *n = json_array_size(v);
    return 0;
}

int fsdp_json_num(const struct fsdp_json_obj *o, const char *key, const double *dflt,
                  double *out)
{
    json_t *v;
    FSDP_CHECK(json_need(o, key, dflt != NULL, JSON_TYPES_NUMBER, "a number", &v));
    *out = v ? json_number_value(v) : *dflt;
    return 0;
}

int fsdp_json_bool(const struct fsdp_json_obj *o, const char *key, const int *dflt, int *out)
{
    json_t *v;
    FSDP_CHECK(json_need(o, key, dflt != NULL, JSON_TYPES_BOOL, "true or false", &v));
    *out = v ? json_is_true(v) : *dflt;
    return 0;
}

int fsdp_json_str(const struct fsdp_json_obj *o, const char *key, const char *dflt,
                  const char **out)
{
    json_t *v;
    FSDP_CHECK(json_need(o, key, dflt != NULL, JSON_TYPES_STRING, "a string", &v));
    *out = v ? json_string_value(v) : dflt;
    return 0;
}

int fsdp_json_obj(const struct fsdp_json_obj *o, const char *key, struct fsdp_json_obj *sub)
{
    int present;
    json_t *v = json_member(o, key, &present);
    if (!v) {
        return 1;
    }
    if (!json_is_object(v)) {
        return json_wrong(o, key, v, "an object");
    }
    sub->file = o->file;
    sub->obj = v;
    int n = snprintf(sub->where, sizeof(sub->where), "%s%s.", o->where, key);
    if (n < 0 || (size_t)n >= sizeof(sub->where)) {
        snprintf(sub->where, sizeof(sub->where), "...%s.", key);
    }
    return 0;
}

int fsdp_json_each_str(const struct fsdp_json_obj *o,
                       int (*fn)(const char *key, const char *value, void *arg), void *arg)
{
    const char *key;
    json_t *v;
    json_object_foreach(o->obj, key, v) {
        if (!json_is_string(v)) {
            char show[JSON_SHOW];
            return json_wrong(o, fsdp_str_printable(show, sizeof(show), key, 0), v, "a string");
        }
        int rc = fn(key, json_string_value(v), arg);
        if (rc < 0) {
            return rc;
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// writing

int fsdp_json_writer_init(struct fsdp_json_writer *w)
{
    memset(w, 0, sizeof(*w));
    w->depth = -1;
    w->m = open_memstream(&w->buf, &w->len);
    return w->m ? 0 : fsdp_err(FSDP_ERR_NOMEM, "JSON writer");
}

/* A newline and two spaces per level. */
static void json_newline(struct fsdp_json_writer *w, int depth)
{
    fputc('\n', w->m);
    for (int i = 0; i < depth; i++) {
        fputs("  ", w->m);
    }
}

static void json_put_string(FILE *m, const char *s)
{
    fputc('"', m);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", m); break;
        case '\\': fputs("\\\\", m); break;
        case '\n': fputs("\\n", m); break;
        case '\r': fputs("\\r", m); break;
        case '\t': fputs("\\t", m); break;
        default:
            if (*p < 0x20) {
                fprintf(m, "\\u%04x", *p);
            } else {
                fputc(*p, m);
            }
        }
    }
    fputc('"', m);
}

/* The separator, indentation and key that precede a value; key must be
 * given inside an object and only there. */
static void json_prefix(struct fsdp_json_writer *w, const char *key)
{
    if (w->depth < 0) {
        w->bad |= key != NULL || w->top;
        w->top = 1;
        return;
    }
    int in_obj = w->close[w->depth] == '}';
    w->bad |= in_obj != (key != NULL);
    if (w->count[w->depth]++ > 0) {
        fputc(',', w->m);
    }
    json_newline(w, w->depth + 1);
    if (key) {
        json_put_string(w->m, key);
        fputs(": ", w->m);
    }
}

static void json_begin(struct fsdp_json_writer *w, const char *key, char open, char close)
{
    json_prefix(w, key);
    fputc(open, w->m);
    if (w->depth + 1 >= FSDP_JSON_DEPTH_MAX) {
        w->bad = 1;
        return;
    }
    w->depth++;
    w->count[w->depth] = 0;
    w->close[w->depth] = close;
}

void fsdp_json_begin_obj(struct fsdp_json_writer *w, const char *key)
{
    json_begin(w, key, '{', '}');
}

void fsdp_json_begin_arr(struct fsdp_json_writer *w, const char *key)
{
    json_begin(w, key, '[', ']');
}

void fsdp_json_end(struct fsdp_json_writer *w)
{
    if (w->depth < 0) {
        w->bad = 1;
        return;
    }
    if (w->count[w->depth] > 0) {
        json_newline(w, w->depth);
    }
    fputc(w->close[w->depth], w->m);
    w->depth--;
}

void fsdp_json_put_str(struct fsdp_json_writer *w, const char *key, const char *s)
{
    json_prefix(w, key);
    json_put_string(w->m, s);
}

void fsdp_json_put_int(struct fsdp_json_writer *w, const char *key, long long v)
{
    json_prefix(w, key);
    fprintf(w->m, "%lld", v);
}

void fsdp_json_put_f32(struct fsdp_json_writer *w, const char *key, float v)
{
    char buf[48];
    json_prefix(w, key);
    if (!isfinite(v)) {
        w->bad = 1; /* JSON has no NaN or infinity */
        fputs("null", w->m);
        return;
    }
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v) {
            break;
        }
    }
    const char *e = strchr(buf, 'e');
    if (e && atoi(e + 1) >= 0 && atoi(e + 1) < 16) {
        /* %g's 1e+04 is a whole number Python writes as 10000.0 */
        snprintf(buf, sizeof(buf), "%.0f", (double)v);
    }
    if (!strpbrk(buf, ".e")) {
        strcat(buf, ".0");
    }
    fputs(buf, w->m);
}

void fsdp_json_put_bool(struct fsdp_json_writer *w, const char *key, int v)
{
    json_prefix(w, key);
    fputs(v ? "true" : "false", w->m);
}

void fsdp_json_put_null(struct fsdp_json_writer *w, const char *key)
{
    json_prefix(w, key);
    fputs("null", w->m);
}

int fsdp_json_writer_finish(struct fsdp_json_writer *w, char **text, size_t *len)
{
    fputc('\n', w->m);
    int bad = w->bad || w->depth != -1, io = ferror(w->m) != 0;
    io |= fclose(w->m) != 0;
    w->m = NULL;
    if (bad || io) {
        free(w->buf);
        w->buf = NULL;
        return bad ? fsdp_err(FSDP_ERR_INTERNAL, "JSON writer: unbalanced nesting, a key out "
                              "of place or a non-finite number")
                   : fsdp_err(FSDP_ERR_NOMEM, "JSON writer");
    }
    *text = w->buf;
    *len = w->len;
    w->buf = NULL;
    return 0;
}

void fsdp_json_writer_free(struct fsdp_json_writer *w)
{
    if (w->m) {
        fclose(w->m);
        w->m = NULL;
    }
    free(w->buf);
    w->buf = NULL;
}
