/*
 * store.c - the store front end: argument checks around the ops, the
 * prefixed view that gives each group its own namespace, the store barrier,
 * the in-process (mem) store, and the key-value table that the mem store and
 * the TCP store server keep their data in.
 *
 * Owns no sockets or files; the TCP and file stores live in store_tcp.c and
 * store_file.c.
 */
#include "config.h"
#include "rendezvous/store.h"
#include "rendezvous/store_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// shared helpers

int fsdp_store_check_key(const char *key)
{
    if (!key || !key[0]) {
        return fsdp_err(FSDP_ERR_INVALID, "store: empty key");
    }
    size_t n = strnlen(key, FSDP_STORE_MAX_KEY + 1);
    if (n > FSDP_STORE_MAX_KEY) {
        return fsdp_err(FSDP_ERR_INVALID, "store: key '%.40s...' longer than %d bytes", key,
                        FSDP_STORE_MAX_KEY);
    }
    return 0;
}

int fsdp_store_parse_int(const void *val, size_t len, int64_t *out)
{
    char buf[FSDP_STORE_INT_CHARS];
    if (len == 0 || len >= sizeof(buf)) {
        return -1;
    }
    memcpy(buf, val, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || end == buf || *end) {
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

void fsdp_store_job_id(char *buf, size_t len)
{
    const char *j = getenv("FSDPC_JOB_ID");
    const char *slurm = getenv("SLURM_JOB_ID");
    const char *step = getenv("SLURM_STEP_ID");
    const char *te = getenv("TORCHELASTIC_RUN_ID");
    if (j && j[0]) {
        snprintf(buf, len, "%s", j);
    } else if (slurm && slurm[0]) {
        /* steps of one allocation are different jobs */
        snprintf(buf, len, "%s.%s", slurm, step ? step : "");
    } else if (te && te[0]) {
        snprintf(buf, len, "%s", te);
    } else if (len) {
        buf[0] = '\0';
    }
}

uint64_t fsdp_store_random64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) == (ssize_t)sizeof(v)) {
        return v;
    }
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, &v, sizeof(v));
        close(fd);
        if (n == (ssize_t)sizeof(v)) {
            return v;
        }
    }
    /* no kernel entropy source: mix what differs between jobs */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t mix[3] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid()};
    return fsdp_hash64(mix, sizeof(mix), (uint64_t)(uintptr_t)&v);
}

// ----------------------------------------------------------------------------
// key-value table (chained hash, doubles when the load passes 1)

static uint64_t kv_hash(const char *key)
{
    return fsdp_hash64(key, strlen(key), 0);
}

int fsdp_kv_init(struct fsdp_kv *kv)
{
    kv->nbuckets = 64;
    kv->count = 0;
    kv->buckets = calloc(kv->nbuckets, sizeof(*kv->buckets));
    return kv->buckets ? 0 : FSDP_ERR_NOMEM;
}

void fsdp_kv_free(struct fsdp_kv *kv)
{
    if (!kv->buckets) {
        return;
    }
    for (size_t b = 0; b < kv->nbuckets; b++) {
        struct fsdp_kv_entry *e = kv->buckets[b];
        while (e) {
            struct fsdp_kv_entry *next = e->next;
            free(e->val);
            free(e);
            e = next;
        }
    }
    free(kv->buckets);
    kv->buckets = NULL;
    kv->count = 0;
}

struct fsdp_kv_entry *fsdp_kv_find(const struct fsdp_kv *kv, const char *key)
{
    uint64_t h = kv_hash(key);
    for (struct fsdp_kv_entry *e = kv->buckets[h & (kv->nbuckets - 1)]; e; e = e->next) {
        if (e->hash == h && strcmp(e->key, key) == 0) {
            return e;
        }
    }
    return NULL;
}

static void kv_grow(struct fsdp_kv *kv)
{
    size_t n = kv->nbuckets * 2;
    struct fsdp_kv_entry **b = calloc(n, sizeof(*b));
    if (!b) {
        return; /* longer chains, still correct */
    }
    for (size_t i = 0; i < kv->nbuckets; i++) {
        struct fsdp_kv_entry *e = kv->buckets[i];
        while (e) {
            struct fsdp_kv_entry *next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
            e = next;
        }
    }
    free(kv->buckets);
    kv->buckets = b;
    kv->nbuckets = n;
}

int fsdp_kv_set(struct fsdp_kv *kv, const char *key, void *val, size_t len)
{
    struct fsdp_kv_entry *e = fsdp_kv_find(kv, key);
    if (e) {
        free(e->val);
        e->val = val;
        e->len = len;
        return 0;
    }
    size_t klen = strlen(key);
    e = malloc(sizeof(*e) + klen + 1);
    if (!e) {
        free(val);
        return FSDP_ERR_NOMEM;
    }
    memcpy(e->key, key, klen + 1);
    e->hash = kv_hash(key);
    e->val = val;
    e->len = len;
    size_t b = e->hash & (kv->nbuckets - 1);
    e->next = kv->buckets[b];
    kv->buckets[b] = e;
    if (++kv->count > kv->nbuckets) {
        kv_grow(kv);
    }
    return 0;
}

int fsdp_kv_add(struct fsdp_kv *kv, const char *key, int64_t delta, int64_t *result)
{
    int64_t cur = 0;
    struct fsdp_kv_entry *e = fsdp_kv_find(kv, key);
    if (e && fsdp_store_parse_int(e->val, e->len, &cur) < 0) {
        return FSDP_ERR_FORMAT;
    }
    int64_t sum;
    if (__builtin_add_overflow(cur, delta, &sum)) {
        return FSDP_ERR_INVALID;
    }
    char *txt = malloc(FSDP_STORE_INT_CHARS);
    if (!txt) {
        return FSDP_ERR_NOMEM;
    }
    int n = snprintf(txt, FSDP_STORE_INT_CHARS, "%" PRId64, sum);
    if (e) {
        free(e->val);
        e->val = txt;
        e->len = (size_t)n;
    } else if (fsdp_kv_set(kv, key, txt, (size_t)n) < 0) {
        return FSDP_ERR_NOMEM;
    }
    *result = sum;
    return 0;
}

// ----------------------------------------------------------------------------
// front end

static int store_check(const struct fsdp_store *s)
{
    if (!s || !s->ops) {
        return fsdp_err(FSDP_ERR_INVALID, "store: NULL store");
    }
    return 0;
}

int fsdp_store_set(struct fsdp_store *s, const char *key, const void *val, size_t len)
{
    FSDP_CHECK(store_check(s));
    FSDP_CHECK(fsdp_store_check_key(key));
    if (!val && len) {
        return fsdp_err(FSDP_ERR_INVALID, "store: set '%s': NULL value of %zu bytes", key, len);
    }
    FSDP_CHECK(s->ops->set(s, key, val, len));
    return 0;
}

int fsdp_store_get(struct fsdp_store *s, const char *key, void **val, size_t *len, double timeout_s)
{
    FSDP_CHECK(store_check(s));
    FSDP_CHECK(fsdp_store_check_key(key));
    if (!val || !len) {
        return fsdp_err(FSDP_ERR_INVALID, "store: get '%s': NULL output", key);
    }
    *val = NULL;
    *len = 0;
    FSDP_CHECK(s->ops->get(s, key, val, len, timeout_s));
    return 0;
}

int fsdp_store_add(struct fsdp_store *s, const char *key, int64_t delta, int64_t *result)
{
    int64_t dummy;
    FSDP_CHECK(store_check(s));
    FSDP_CHECK(fsdp_store_check_key(key));
    FSDP_CHECK(s->ops->add(s, key, delta, result ? result : &dummy));
    return 0;
}

int fsdp_store_wait(struct fsdp_store *s, const char *const *keys, size_t n, double timeout_s)
{
    FSDP_CHECK(store_check(s));
    if (n && !keys) {
        return fsdp_err(FSDP_ERR_INVALID, "store: wait: NULL key list");
    }
    for (size_t i = 0; i < n; i++) {
        FSDP_CHECK(fsdp_store_check_key(keys[i]));
    }
    if (n == 0) {
        return 0;
    }
    FSDP_CHECK(s->ops->wait(s, keys, n, timeout_s));
    return 0;
}

int fsdp_store_check(struct fsdp_store *s, const char *key, int *exists)
{
    FSDP_CHECK(store_check(s));
    FSDP_CHECK(fsdp_store_check_key(key));
    if (!exists) {
        return fsdp_err(FSDP_ERR_INVALID, "store: check '%s': NULL output", key);
    }
    FSDP_CHECK(s->ops->check(s, key, exists));
    return 0;
}

void fsdp_store_destroy(struct fsdp_store *s)
{
    if (s && s->ops && s->ops->destroy) {
        s->ops->destroy(s);
    }
}

int fsdp_store_barrier(struct fsdp_store *s, const char *key, int size, double timeout_s)
{
    char ckey[FSDP_STORE_MAX_KEY + 1];
    char dkey[FSDP_STORE_MAX_KEY + 1];
    int64_t n;
    FSDP_CHECK(store_check(s));
    FSDP_CHECK(fsdp_store_check_key(key));
    if (size < 1) {
        return fsdp_err(FSDP_ERR_INVALID, "store barrier '%s': size %d", key, size);
    }
    if ((size_t)snprintf(ckey, sizeof(ckey), "%s/arrived", key) >= sizeof(ckey)) {
        return fsdp_err(FSDP_ERR_INVALID, "store barrier: key '%.40s...' too long", key);
    }
    FSDP_CHECK(fsdp_store_add(s, ckey, 1, &n));
    /* the counter only grows: arrival n belongs to generation (n-1)/size, and
     * the last arrival of a generation releases it */
    int64_t gen = (n - 1) / size;
    snprintf(dkey, sizeof(dkey), "%s/done/%" PRId64, key, gen);
    if (n % size == 0) {
        FSDP_CHECK(fsdp_store_set(s, dkey, "1", 1));
        return 0;
    }
    const char *keys[1] = {dkey};
    double t0 = fsdp_now();
    int rc = fsdp_store_wait(s, keys, 1, timeout_s);
    if (rc == FSDP_ERR_TIMEOUT) {
        int64_t now = n;
        fsdp_err_clear();
        if (fsdp_store_add(s, ckey, 0, &now) < 0) {
            fsdp_err_clear();
        }
        int64_t arrived = now - gen * size;
        if (arrived > size) {
            arrived = size;
        }
        return fsdp_err(FSDP_ERR_TIMEOUT, "store barrier '%s': %" PRId64 " of %d ranks arrived "
                        "within %.1f s", key, arrived, size, fsdp_now() - t0);
    }
    FSDP_CHECK(rc);
    return 0;
}

// ----------------------------------------------------------------------------
// prefixed view

struct store_prefix {
    struct fsdp_store base;
    struct fsdp_store *inner;
    size_t plen;
    char prefix[]; /* "name/" */
};

static int prefix_key(const struct store_prefix *p, const char *key, char *buf)
{
    size_t klen = strlen(key);
    if (p->plen + klen > FSDP_STORE_MAX_KEY) {
        return fsdp_err(FSDP_ERR_INVALID, "store: key '%s%.40s' longer than %d bytes", p->prefix,
                        key, FSDP_STORE_MAX_KEY);
    }
    memcpy(buf, p->prefix, p->plen);
    memcpy(buf + p->plen, key, klen + 1);
    return 0;
}

static int prefix_set(struct fsdp_store *s, const char *key, const void *val, size_t len)
{
    struct store_prefix *p = (struct store_prefix *)s;
    char k[FSDP_STORE_MAX_KEY + 1];
    FSDP_CHECK(prefix_key(p, key, k));
    return p->inner->ops->set(p->inner, k, val, len);
}

static int prefix_get(struct fsdp_store *s, const char *key, void **val, size_t *len,
                      double timeout_s)
{
    struct store_prefix *p = (struct store_prefix *)s;
    char k[FSDP_STORE_MAX_KEY + 1];
    FSDP_CHECK(prefix_key(p, key, k));
    return p->inner->ops->get(p->inner, k, val, len, timeout_s);
}

static int prefix_add(struct fsdp_store *s, const char *key, int64_t delta, int64_t *result)
{
    struct store_prefix *p = (struct store_prefix *)s;
    char k[FSDP_STORE_MAX_KEY + 1];
    FSDP_CHECK(prefix_key(p, key, k));
    return p->inner->ops->add(p->inner, k, delta, result);
}

static int prefix_wait(struct fsdp_store *s, const char *const *keys, size_t n, double timeout_s)
{
    struct store_prefix *p = (struct store_prefix *)s;
    char **full = calloc(n, sizeof(*full));
    int rc = 0;
    if (!full) {
        return fsdp_err(FSDP_ERR_NOMEM, "store: wait on %zu keys: out of memory", n);
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        full[i] = malloc(FSDP_STORE_MAX_KEY + 1);
        if (!full[i]) {
            rc = fsdp_err(FSDP_ERR_NOMEM, "store: wait on %zu keys: out of memory", n);
        } else {
            rc = prefix_key(p, keys[i], full[i]);
        }
    }
    if (rc == 0) {
        rc = p->inner->ops->wait(p->inner, (const char *const *)full, n, timeout_s);
    }
    for (size_t i = 0; i < n; i++) {
        free(full[i]);
    }
    free(full);
    return rc;
}

static int prefix_check(struct fsdp_store *s, const char *key, int *exists)
{
    struct store_prefix *p = (struct store_prefix *)s;
    char k[FSDP_STORE_MAX_KEY + 1];
    FSDP_CHECK(prefix_key(p, key, k));
    return p->inner->ops->check(p->inner, k, exists);
}

static void prefix_destroy(struct fsdp_store *s)
{
    free(s);
}

static const struct fsdp_store_ops prefix_ops = {
    .size = sizeof(struct fsdp_store_ops),
    .name = "prefix",
    .set = prefix_set,
    .get = prefix_get,
    .add = prefix_add,
    .wait = prefix_wait,
    .check = prefix_check,
    .destroy = prefix_destroy,
};

int fsdp_store_prefix(struct fsdp_store *base, const char *prefix, struct fsdp_store **out)
{
    FSDP_CHECK(store_check(base));
    FSDP_CHECK(fsdp_store_check_key(prefix));
    size_t plen = strlen(prefix) + 1;
    if (plen >= FSDP_STORE_MAX_KEY) {
        return fsdp_err(FSDP_ERR_INVALID, "store: prefix '%.40s...' too long", prefix);
    }
    struct store_prefix *p = calloc(1, sizeof(*p) + plen + 1);
    if (!p) {
        return fsdp_err(FSDP_ERR_NOMEM, "store: prefix '%s': out of memory", prefix);
    }
    p->base.ops = &prefix_ops;
    p->inner = base;
    p->plen = plen;
    snprintf(p->prefix, plen + 1, "%s/", prefix);
    *out = &p->base;
    return 0;
}

// ----------------------------------------------------------------------------
// in-process store

struct store_mem {
    struct fsdp_store base;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast on every set/add */
    struct fsdp_kv kv;
    double timeout_s;
};

static void mem_deadline(const struct store_mem *m, double timeout_s, struct timespec *ts)
{
    double t = timeout_s < 0 ? m->timeout_s : timeout_s;
    clock_gettime(CLOCK_MONOTONIC, ts);
    double sec = (double)ts->tv_sec + (double)ts->tv_nsec * 1e-9 + t;
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)((sec - (double)ts->tv_sec) * 1e9);
}

static int mem_set(struct fsdp_store *s, const char *key, const void *val, size_t len)
{
    struct store_mem *m = (struct store_mem *)s;
    void *copy = malloc(len ? len : 1);
    if (!copy) {
        return fsdp_err(FSDP_ERR_NOMEM, "store: set '%s' (%zu bytes): out of memory", key, len);
    }
    if (len) {
        memcpy(copy, val, len);
    }
    pthread_mutex_lock(&m->mu);
    int rc = fsdp_kv_set(&m->kv, key, copy, len);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (rc < 0) {
        return fsdp_err(rc, "store: set '%s': out of memory", key);
    }
    return 0;
}

/* Waits (mutex held) until every key exists; returns the first missing key
 * on timeout. */
static const char *mem_wait_locked(struct store_mem *m, const char *const *keys, size_t n,
                                   const struct timespec *deadline)
{
    size_t i = 0;
    while (i < n) {
        if (fsdp_kv_find(&m->kv, keys[i])) {
            i++;
            continue;
        }
        if (pthread_cond_timedwait(&m->cv, &m->mu, deadline) == ETIMEDOUT &&
            !fsdp_kv_find(&m->kv, keys[i])) {
            return keys[i];
        }
    }
    return NULL;
}

static int mem_get(struct fsdp_store *s, const char *key, void **val, size_t *len,
                   double timeout_s)
{
    struct store_mem *m = (struct store_mem *)s;
    struct timespec deadline;
    double t0 = fsdp_now();
    mem_deadline(m, timeout_s, &deadline);
    pthread_mutex_lock(&m->mu);
    if (mem_wait_locked(m, &key, 1, &deadline)) {
        pthread_mutex_unlock(&m->mu);
        return fsdp_err(FSDP_ERR_TIMEOUT, "store mem: key '%s' not set within %.1f s", key,
                        fsdp_now() - t0);
    }
    struct fsdp_kv_entry *e = fsdp_kv_find(&m->kv, key);
    void *copy = malloc(e->len ? e->len : 1);
    if (copy) {
        memcpy(copy, e->val, e->len);
        *len = e->len;
    }
    pthread_mutex_unlock(&m->mu);
    if (!copy) {
        return fsdp_err(FSDP_ERR_NOMEM, "store: get '%s': out of memory", key);
    }
    *val = copy;
    return 0;
}

static int mem_add(struct fsdp_store *s, const char *key, int64_t delta, int64_t *result)
{
    struct store_mem *m = (struct store_mem *)s;
    pthread_mutex_lock(&m->mu);
    int rc = fsdp_kv_add(&m->kv, key, delta, result);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (rc == FSDP_ERR_FORMAT) {
        return fsdp_err(rc, "store: add '%s': the key holds a value that is not an integer", key);
    } else if (rc == FSDP_ERR_INVALID) {
        return fsdp_err(rc, "store: add '%s' %+" PRId64 ": int64 overflow", key, delta);
    } else if (rc < 0) {
        return fsdp_err(rc, "store: add '%s': out of memory", key);
    }
    return 0;
}

static int mem_wait(struct fsdp_store *s, const char *const *keys, size_t n, double timeout_s)
{
    struct store_mem *m = (struct store_mem *)s;
    struct timespec deadline;
    double t0 = fsdp_now();
    mem_deadline(m, timeout_s, &deadline);
    pthread_mutex_lock(&m->mu);
    const char *missing = mem_wait_locked(m, keys, n, &deadline);
    pthread_mutex_unlock(&m->mu);
    if (missing) {
        return fsdp_err(FSDP_ERR_TIMEOUT, "store mem: key '%s' not set within %.1f s", missing,
                        fsdp_now() - t0);
    }
    return 0;
}

static int mem_check(struct fsdp_store *s, const char *key, int *exists)
{
    struct store_mem *m = (struct store_mem *)s;
    pthread_mutex_lock(&m->mu);
    *exists = fsdp_kv_find(&m->kv, key) != NULL;
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static void mem_destroy(struct fsdp_store *s)
{
    struct store_mem *m = (struct store_mem *)s;
    fsdp_kv_free(&m->kv);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static const struct fsdp_store_ops mem_ops = {
    .size = sizeof(struct fsdp_store_ops),
    .name = "mem",
    .set = mem_set,
    .get = mem_get,
    .add = mem_add,
    .wait = mem_wait,
    .check = mem_check,
    .destroy = mem_destroy,
};

int fsdp_store_mem_create(double timeout_s, struct fsdp_store **out)
{
    struct store_mem *m = calloc(1, sizeof(*m));
    pthread_condattr_t ca;
    if (!m || fsdp_kv_init(&m->kv) < 0) {
        free(m);
        return fsdp_err(FSDP_ERR_NOMEM, "store mem: out of memory");
    }
    pthread_mutex_init(&m->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    m->base.ops = &mem_ops;
    m->timeout_s = timeout_s;
    *out = &m->base;
    return 0;
}
