/*
 * flight.c - the flight recorder's ring, its group table, the per-op totals
 * and the JSON dump.
 *
 * One lock guards the ring; it is held for a few stores per record, so the
 * hot path stays a clock read and an uncontended lock. The dump copies the
 * ring under the lock into a buffer allocated at create, then writes
 * without it, so a slow file system never stalls the collectives. Times are
 * monotonic in the ring and converted to Unix time in the dump so that the
 * merge tool can order events of ranks on different hosts (to the precision
 * of their clocks).
 */
#include "config.h"
#include "comm/flight.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "core/tmpfile.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct flight_totals {
    uint64_t count;
    uint64_t bytes;
    double seconds;
};

struct flight_group {
    char name[64];
    int size;
    int *world_ranks; /* (size,) */
    struct flight_totals totals[FSDP_COLL_OP_COUNT];
};

struct fsdp_flight {
    pthread_mutex_t mu;
    pthread_mutex_t dump_mu;
    struct fsdp_flight_entry *ring; /* (n,) slot = (id - 1) % n */
    struct fsdp_flight_entry *copy; /* (n,) the dump's snapshot */
    size_t n;
    uint64_t next_id;
    int rank;
    int world_size;
    char host[256];
    int ngroups;
    struct flight_group groups[FSDP_FLIGHT_MAX_GROUPS];
};

static const char *const flight_op_names[FSDP_COLL_OP_COUNT] = {
    "allreduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "send", "recv",
};

static const char *const flight_state_names[] = {"?", "issued", "completed", "failed",
                                                 "abandoned"};

const char *fsdp_coll_op_name(enum fsdp_coll_op op)
{
    return (unsigned)op < FSDP_COLL_OP_COUNT ? flight_op_names[op] : "?";
}

// ----------------------------------------------------------------------------
// create / destroy, groups

int fsdp_flight_create(size_t n, int rank, int world_size, const char *host,
                       struct fsdp_flight **out)
{
    if (n < 1 || n > ((size_t)1 << 24)) {
        return fsdp_err(FSDP_ERR_INVALID, "flight recorder: %zu entries outside 1..%d", n,
                        1 << 24);
    }
    struct fsdp_flight *f = calloc(1, sizeof(*f));
    if (!f) {
        return fsdp_err(FSDP_ERR_NOMEM, "flight recorder: out of memory");
    }
    f->ring = fsdp_calloc(n * sizeof(*f->ring));
    f->copy = fsdp_calloc(n * sizeof(*f->copy));
    if (!f->ring || !f->copy) {
        fsdp_free(f->ring);
        fsdp_free(f->copy);
        free(f);
        return fsdp_err(FSDP_ERR_NOMEM, "flight recorder: out of memory for %zu entries", n);
    }
    pthread_mutex_init(&f->mu, NULL);
    pthread_mutex_init(&f->dump_mu, NULL);
    f->n = n;
    f->next_id = 1;
    f->rank = rank;
    f->world_size = world_size;
    snprintf(f->host, sizeof(f->host), "%s", host ? host : "?");
    *out = f;
    return 0;
}

void fsdp_flight_destroy(struct fsdp_flight *f)
{
    if (!f) {
        return;
    }
    for (int i = 0; i < f->ngroups; i++) {
        free(f->groups[i].world_ranks);
    }
    pthread_mutex_destroy(&f->mu);
    pthread_mutex_destroy(&f->dump_mu);
    fsdp_free(f->ring);
    fsdp_free(f->copy);
    free(f);
}

int fsdp_flight_add_group(struct fsdp_flight *f, const char *name, const int *world_ranks,
                          int size)
{
    int *ranks = malloc((size_t)size * sizeof(int));
    if (!ranks) {
        return fsdp_err(FSDP_ERR_NOMEM, "flight recorder: out of memory");
    }
    memcpy(ranks, world_ranks, (size_t)size * sizeof(int));
    pthread_mutex_lock(&f->mu);
    if (f->ngroups == FSDP_FLIGHT_MAX_GROUPS) {
        pthread_mutex_unlock(&f->mu);
        free(ranks);
        return fsdp_err(FSDP_ERR_INVALID, "flight recorder: more than %d groups",
                        FSDP_FLIGHT_MAX_GROUPS);
    }
    int k = f->ngroups++;
    struct flight_group *fg = &f->groups[k];
    snprintf(fg->name, sizeof(fg->name), "%s", name);
    fg->size = size;
    fg->world_ranks = ranks;
    pthread_mutex_unlock(&f->mu);
    return k;
}

const char *fsdp_flight_group_name(const struct fsdp_flight *f, int group)
{
    return group >= 0 && group < f->ngroups ? f->groups[group].name : "?";
}

// ----------------------------------------------------------------------------
// recording

uint64_t fsdp_flight_issue(struct fsdp_flight *f, struct fsdp_flight_entry *e)
{
    e->state = FSDP_FLIGHT_ISSUED;
    e->t_done = 0;
    pthread_mutex_lock(&f->mu);
    e->id = f->next_id++;
    f->ring[(e->id - 1) % f->n] = *e;
    pthread_mutex_unlock(&f->mu);
    return e->id;
}

void fsdp_flight_finish(struct fsdp_flight *f, uint64_t id, int state)
{
    if (!id) {
        return;
    }
    double now = fsdp_now();
    pthread_mutex_lock(&f->mu);
    struct fsdp_flight_entry *e = &f->ring[(id - 1) % f->n];
    if (e->id == id && e->state == FSDP_FLIGHT_ISSUED) {
        e->state = (uint8_t)state;
        e->t_done = now;
        if (state == FSDP_FLIGHT_COMPLETED && e->group >= 0 && e->group < f->ngroups) {
            struct flight_totals *t = &f->groups[e->group].totals[e->op];
            t->count++;
            t->bytes += e->count * fsdp_dtype_size((enum fsdp_dtype)e->dtype);
            t->seconds += now - e->t_issue;
        }
    }
    pthread_mutex_unlock(&f->mu);
}

int fsdp_flight_get(struct fsdp_flight *f, uint64_t id, struct fsdp_flight_entry *out)
{
    int found = 0;
    pthread_mutex_lock(&f->mu);
    const struct fsdp_flight_entry *e = &f->ring[(id - 1) % f->n];
    if (id && e->id == id) {
        *out = *e;
        found = 1;
    }
    pthread_mutex_unlock(&f->mu);
    return found;
}

int fsdp_flight_overdue(struct fsdp_flight *f, double now, double since, double grace_s,
                        struct fsdp_flight_entry *out)
{
    int found = 0;
    pthread_mutex_lock(&f->mu);
    uint64_t last = f->next_id - 1;
    uint64_t first = last > f->n ? last - f->n + 1 : 1;
    for (uint64_t id = first; id <= last; id++) {
        const struct fsdp_flight_entry *e = &f->ring[(id - 1) % f->n];
        if (e->state == FSDP_FLIGHT_ISSUED && e->deadline_s > 0 && e->t_issue > since &&
            now - e->t_issue > e->deadline_s + grace_s) {
            *out = *e;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return found;
}

// ----------------------------------------------------------------------------
// dump

/* Writes s as a JSON string body (quotes and control characters escaped). */
static void flight_json_str(FILE *fp, const char *s)
{
    fputc('"', fp);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fprintf(fp, "\\%c", c);
        } else if (c < 0x20) {
            fprintf(fp, "\\u%04x", c);
        } else {
            fputc(c, fp);
        }
    }
    fputc('"', fp);
}

static void flight_write_entry(FILE *fp, const struct fsdp_flight *f,
                               const struct fsdp_flight_entry *e, double to_unix, int last)
{
    const char *group = fsdp_flight_group_name(f, e->group);
    const char *redop =
        e->redop == FSDP_FLIGHT_NO_REDOP ? "-" : fsdp_redop_name((enum fsdp_redop)e->redop);
    const char *state = e->state < sizeof(flight_state_names) / sizeof(flight_state_names[0])
                            ? flight_state_names[e->state]
                            : "?";
    /* the merge tool reads these lines with a fixed key order */
    fprintf(fp,
            "{\"id\":%" PRIu64 ",\"group\":\"%s\",\"seq\":%" PRIu64 ",\"op\":\"%s\","
            "\"dtype\":\"%s\",\"count\":%zu,\"root\":%d,\"redop\":\"%s\",\"state\":\"%s\","
            "\"t_issue\":%.6f,\"t_done\":%.6f,\"tag\":%" PRIu32 "}%s\n",
            e->id, group, e->seq, fsdp_coll_op_name((enum fsdp_coll_op)e->op),
            fsdp_dtype_name((enum fsdp_dtype)e->dtype), e->count, e->root, redop, state,
            e->t_issue + to_unix, e->t_done > 0 ? e->t_done + to_unix : 0.0, e->tag,
            last ? "" : ",");
}

static int flight_mkdir(const char *dir)
{
    struct stat st;
    if (mkdir(dir, 0777) < 0 && errno != EEXIST) {
        return fsdp_err(FSDP_ERR_IO, "flight recorder: cannot create directory %s: %s", dir,
                        strerror(errno));
    }
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        return fsdp_err(FSDP_ERR_IO, "flight recorder: %s is not a directory (set "
                        "FSDPC_FLIGHT_DIR)", dir);
    }
    return 0;
}

int fsdp_flight_dump(struct fsdp_flight *f, const char *dir, const char *reason)
{
    FSDP_CHECK(flight_mkdir(dir));
    pthread_mutex_lock(&f->dump_mu);
    pthread_mutex_lock(&f->mu);
    uint64_t last = f->next_id - 1;
    uint64_t first = last > f->n ? last - f->n + 1 : 1;
    size_t m = 0;
    for (uint64_t id = first; id <= last; id++) {
        f->copy[m++] = f->ring[(id - 1) % f->n];
    }
    pthread_mutex_unlock(&f->mu);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double to_unix = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - fsdp_now();
    char path[4096];
    char *tmp = NULL;
    int fd = -1;
    snprintf(path, sizeof(path), "%s/flight_%d.json", dir, f->rank);
    /* a fresh, exclusively created name beside the target (never a link
     * someone planted), renamed over it when complete */
    FILE *fp = NULL;
    if (fsdp_file_tmp_create(path, &tmp, &fd) == 0) {
        fp = fdopen(fd, "w");
        if (!fp) {
            close(fd);
            unlink(tmp);
        }
    }
    if (!fp) {
        pthread_mutex_unlock(&f->dump_mu);
        int rc = fsdp_err(FSDP_ERR_IO, "flight recorder: cannot write beside %s: %s", path,
                          fsdp_err_msg()[0] ? fsdp_err_msg() : strerror(errno));
        free(tmp);
        return rc;
    }
    fprintf(fp, "{\"format\":\"fsdpc-flight\",\"version\":1,\"rank\":%d,\"world_size\":%d,"
                "\"host\":",
            f->rank, f->world_size);
    flight_json_str(fp, f->host);
    fprintf(fp, ",\"pid\":%d,\"time\":%.6f,\"capacity\":%zu,\"reason\":", (int)getpid(),
            fsdp_now() + to_unix, f->n);
    flight_json_str(fp, reason ? reason : "");
    fprintf(fp, ",\n\"groups\":[\n");
    for (int g = 0; g < f->ngroups; g++) {
        fprintf(fp, "{\"name\":\"%s\",\"ranks\":[", f->groups[g].name);
        for (int i = 0; i < f->groups[g].size; i++) {
            fprintf(fp, "%s%d", i ? "," : "", f->groups[g].world_ranks[i]);
        }
        fprintf(fp, "]}%s\n", g + 1 < f->ngroups ? "," : "");
    }
    fprintf(fp, "],\n\"entries\":[\n");
    for (size_t i = 0; i < m; i++) {
        flight_write_entry(fp, f, &f->copy[i], to_unix, i + 1 == m);
    }
    fprintf(fp, "]}\n");
    int bad = ferror(fp);
    bad |= fclose(fp) != 0;
    if (bad || rename(tmp, path) < 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        pthread_mutex_unlock(&f->dump_mu);
        return fsdp_err(FSDP_ERR_IO, "flight recorder: writing %s failed: %s", path,
                        strerror(e));
    }
    free(tmp);
    pthread_mutex_unlock(&f->dump_mu);
    FSDP_WARN(FSDP_SUB_DIST, "flight recorder: %zu collectives written to %s (%s)", m, path,
              reason ? reason : "");
    return 0;
}

void fsdp_flight_log_summary(struct fsdp_flight *f)
{
    pthread_mutex_lock(&f->mu);
    for (int g = 0; g < f->ngroups; g++) {
        for (int op = 0; op < FSDP_COLL_OP_COUNT; op++) {
            const struct flight_totals *t = &f->groups[g].totals[op];
            if (!t->count) {
                continue;
            }
            FSDP_INFO(FSDP_SUB_DIST,
                      "collectives on %-8s %-14s calls %8" PRIu64 "  bytes %12" PRIu64
                      "  time %9.3f s  mean %8.1f us",
                      f->groups[g].name, flight_op_names[op], t->count, t->bytes, t->seconds,
                      1e6 * t->seconds / (double)t->count);
        }
    }
    pthread_mutex_unlock(&f->mu);
}
