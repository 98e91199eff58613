/*
 * flight_main.c - fsdpc-flight: reads the flight recorder dumps of a job
 * (DIR/flight_<rank>.json, see flight.h) and names the first collective
 * that some ranks entered and others did not.
 *
 *   fsdpc-flight merge DIR
 *
 * For every group it walks the sequence numbers that the dumped members
 * recorded and stops at the first one that not all of them completed (or
 * that they recorded as different calls); members without a dump (stopped,
 * killed before they could write one) are listed with the finding. Of those per-group candidates
 * the culprit is, in this order: a mismatch; a call waiting on members that did not all dump (one
 * waiting only on dumped members waits behind what they are stuck in); a receive waiting for data
 * over a send in flight; the one issued first. The others are usually its fallout. It also reports
 * members whose records for the same (group, seq) disagree on the call. A pair's point-to-point
 * messages are a group of their own ("dp[0]:0>1": the send on one side, the receive on the other,
 * numbered alike). Exit status: 0 when the dumps agree and nothing is pending, 1 when a stuck or
 * mismatched collective was found, 2 on bad input.
 */
#include "config.h"
#include "programs/cli.h"
#include "core/error.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MERGE_MAX_RANKS 65536
#define MERGE_MAX_GROUPS 256

struct merge_entry {
    unsigned long long seq;
    size_t count;
    int root;
    double t_issue;
    char group[64];
    char op[32];
    char dtype[16];
    char redop[16];
    char state[16];
    unsigned long tag; /* send and recv */
};

struct merge_rank {
    int present;
    char reason[512]; /* why it dumped */
    struct merge_entry *e; /* (n,) oldest first */
    size_t n;
};

struct merge_group {
    char name[64];
    int *ranks; /* (size,) world ranks */
    int size;
};

struct merge {
    int world_size;
    struct merge_rank *ranks; /* (world_size,) */
    struct merge_group groups[MERGE_MAX_GROUPS];
    int ngroups;
};

static int merge_add_group(struct merge *m, const char *line)
{
    char name[64];
    if (sscanf(line, "{\"name\":\"%63[^\"]\",\"ranks\":[", name) != 1) {
        return -1;
    }
    for (int i = 0; i < m->ngroups; i++) {
        if (!strcmp(m->groups[i].name, name)) {
            return 0;
        }
    }
    if (m->ngroups == MERGE_MAX_GROUPS) {
        return -1;
    }
    struct merge_group *g = &m->groups[m->ngroups];
    const char *p = strstr(line, "\",\"ranks\":["); /* past the name, which may hold '[' */
    if (!p) {
        return -1;
    }
    p += strlen("\",\"ranks\":");
    g->ranks = calloc((size_t)m->world_size, sizeof(int));
    if (!g->ranks) {
        return -1;
    }
    snprintf(g->name, sizeof(g->name), "%s", name);
    p++;
    while (*p && *p != ']' && g->size < m->world_size) {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p || r < 0 || r >= m->world_size) {
            return -1;
        }
        g->ranks[g->size++] = (int)r;
        p = *end == ',' ? end + 1 : end;
    }
    m->ngroups++;
    return 0;
}

static int merge_parse_entry(const char *line, struct merge_entry *e)
{
    unsigned long long id;
    double t_done;
    int n = sscanf(line,
                   "{\"id\":%llu,\"group\":\"%63[^\"]\",\"seq\":%llu,\"op\":\"%31[^\"]\","
                   "\"dtype\":\"%15[^\"]\",\"count\":%zu,\"root\":%d,\"redop\":\"%15[^\"]\","
                   "\"state\":\"%15[^\"]\",\"t_issue\":%lf,\"t_done\":%lf}",
                   &id, e->group, &e->seq, e->op, e->dtype, &e->count, &e->root, e->redop,
                   e->state, &e->t_issue, &t_done);
    const char *tag = strstr(line, "\"tag\":"); /* dumps of older builds have none */
    e->tag = tag ? strtoul(tag + 6, NULL, 10) : 0;
    return n == 11 ? 0 : -1;
}

/* A point-to-point channel's two sides record a send and a receive. */
static int merge_p2p(const char *op)
{
    return !strcmp(op, "send") || !strcmp(op, "recv");
}

/* Whether two records of the same (group, seq) are the same call. */
static int merge_same_call(const struct merge_entry *a, const struct merge_entry *b)
{
    int ops = merge_p2p(a->op) && merge_p2p(b->op) ? a->tag == b->tag : !strcmp(a->op, b->op);
    return ops && !strcmp(a->dtype, b->dtype) && a->count == b->count && a->root == b->root &&
           !strcmp(a->redop, b->redop);
}

/* The header's "reason" string, unescaped (\uXXXX shown as '?'). */
static void merge_reason(const char *line, char *out, size_t len)
{
    const char *p = strstr(line, "\"reason\":\"");
    size_t o = 0;
    if (p) {
        for (p += 10; *p && *p != '"' && o + 1 < len; p++) {
            if (*p == '\\' && p[1]) {
                p++;
                if (*p == 'u') {
                    for (int k = 0; k < 4 && p[1]; k++) {
                        p++;
                    }
                    out[o++] = '?';
                    continue;
                }
            }
            out[o++] = *p;
        }
    }
    out[o] = 0;
}

/* Reads one dump into m (world size from the first file read). */
static int merge_read(struct merge *m, const char *path)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "fsdpc-flight: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[4096];
    int rank = -1, world = -1, section = 0, lineno = 0, bad = 0;
    struct merge_rank *mr = NULL;
    size_t cap = 0;
    while (fgets(line, sizeof(line), fp)) {
        lineno++;
        if (lineno == 1) {
            const char *r = strstr(line, "\"rank\":"), *w = strstr(line, "\"world_size\":");
            if (!strstr(line, "\"format\":\"fsdpc-flight\"") || !r || !w ||
                sscanf(r, "\"rank\":%d", &rank) != 1 ||
                sscanf(w, "\"world_size\":%d", &world) != 1 || world < 1 ||
                world > MERGE_MAX_RANKS || rank < 0 || rank >= world) {
                bad = 1;
                break;
            }
            if (!m->ranks) {
                m->world_size = world;
                m->ranks = calloc((size_t)world, sizeof(*m->ranks));
                if (!m->ranks) {
                    bad = 1;
                    break;
                }
            } else if (world != m->world_size) {
                fprintf(stderr, "fsdpc-flight: %s: world size %d, but an earlier dump says %d\n",
                        path, world, m->world_size);
                fclose(fp);
                return -1;
            }
            mr = &m->ranks[rank];
            merge_reason(line, mr->reason, sizeof(mr->reason));
            if (mr->present) {
                fprintf(stderr, "fsdpc-flight: %s: a second dump of rank %d\n", path, rank);
                fclose(fp);
                return -1;
            }
            mr->present = 1;
            continue;
        }
        if (!strncmp(line, "\"groups\"", 8)) {
            section = 1;
        } else if (!strncmp(line, "\"entries\"", 9)) {
            section = 2;
        } else if (line[0] == '{' && section == 1) {
            if (merge_add_group(m, line) < 0) {
                bad = 1;
                break;
            }
        } else if (line[0] == '{' && section == 2) {
            if (mr->n == cap) {
                cap = cap ? 2 * cap : 256;
                struct merge_entry *ne = realloc(mr->e, cap * sizeof(*ne));
                if (!ne) {
                    bad = 1;
                    break;
                }
                mr->e = ne;
            }
            if (merge_parse_entry(line, &mr->e[mr->n]) < 0) {
                bad = 1;
                break;
            }
            mr->n++;
        }
    }
    fclose(fp);
    if (bad || rank < 0) {
        fprintf(stderr, "fsdpc-flight: %s: line %d is not what fsdpc writes (truncated dump?)\n",
                path, lineno);
        return -1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// analysis

/* Highest seq rank r recorded on group g (0: none) and the entry for seq. */
static const struct merge_entry *merge_find(const struct merge_rank *mr, const char *group,
                                            unsigned long long seq, unsigned long long *maxseq,
                                            unsigned long long *minseq)
{
    const struct merge_entry *hit = NULL;
    *maxseq = 0;
    *minseq = 0;
    for (size_t i = 0; i < mr->n; i++) {
        const struct merge_entry *e = &mr->e[i];
        if (strcmp(e->group, group) != 0) {
            continue;
        }
        if (e->seq > *maxseq) {
            *maxseq = e->seq;
        }
        if (!*minseq || e->seq < *minseq) {
            *minseq = e->seq;
        }
        if (e->seq == seq) {
            hit = e;
        }
    }
    return hit;
}

static void merge_call(const struct merge_entry *e, char *buf, size_t len)
{
    if (!strcmp(e->op, "barrier")) {
        snprintf(buf, len, "barrier()");
    } else if (merge_p2p(e->op)) {
        snprintf(buf, len, "%s(%s, %zu, tag %lu)", e->op, e->dtype, e->count, e->tag);
    } else if (!strcmp(e->op, "broadcast")) {
        snprintf(buf, len, "broadcast(%s, %zu, root %d)", e->dtype, e->count, e->root);
    } else if (strcmp(e->redop, "-") != 0) {
        snprintf(buf, len, "%s(%s, %zu, %s)", e->op, e->dtype, e->count, e->redop);
    } else {
        snprintf(buf, len, "%s(%s, %zu)", e->op, e->dtype, e->count);
    }
}

struct merge_finding {
    const struct merge_group *g;
    unsigned long long seq;
    const struct merge_entry *first; /* a record of the call */
    double t_issue;
    int mismatch;
    int behind;    /* every member it waits for dumped: they are stuck elsewhere */
    int recv_wait; /* a receiver waits for data (not only a send in flight) */
};

/* What finding f on g at seq s waits for: a receiver still waiting for
 * data, and whether every member that has not entered s dumped (then each
 * is stuck in some other call, which is nearer the cause than this one). */
static void merge_waits(const struct merge *m, const struct merge_group *g, unsigned long long s,
                        struct merge_finding *f)
{
    int absent = 0, not_entered = 0;
    for (int i = 0; i < g->size; i++) {
        const struct merge_rank *mr = &m->ranks[g->ranks[i]];
        unsigned long long mx, mn;
        if (!mr->present) {
            absent = 1;
            continue;
        }
        const struct merge_entry *e = merge_find(mr, g->name, s, &mx, &mn);
        if (!e) {
            not_entered |= s > mx;
        } else if (!strcmp(e->op, "recv") && strcmp(e->state, "completed") != 0) {
            f->recv_wait = 1;
        }
    }
    f->behind = not_entered && !absent;
}

/* Whether finding a is nearer the cause of a hang than b: a mismatch first,
 * then a call not waiting behind ranks stuck elsewhere, then a receiver
 * waiting for data over a send in flight (a send issued did its part), then
 * the earliest issued. */
static int merge_before(const struct merge_finding *a, const struct merge_finding *b)
{
    if (a->mismatch != b->mismatch) {
        return a->mismatch > b->mismatch;
    }
    if (a->behind != b->behind) {
        return a->behind < b->behind;
    }
    if (a->recv_wait != b->recv_wait) {
        return a->recv_wait > b->recv_wait;
    }
    return a->t_issue < b->t_issue;
}

/* The first seq of g not completed by every member, or 0. */
static int merge_group_scan(const struct merge *m, const struct merge_group *g,
                            struct merge_finding *out)
{
    unsigned long long lo = 0, hi = 0;
    for (int i = 0; i < g->size; i++) {
        const struct merge_rank *mr = &m->ranks[g->ranks[i]];
        unsigned long long mx, mn;
        if (!mr->present) {
            continue;
        }
        merge_find(mr, g->name, 0, &mx, &mn);
        if (mx > hi) {
            hi = mx;
        }
        if (mn && (!lo || mn < lo)) {
            lo = mn;
        }
    }
    for (unsigned long long s = lo ? lo : 1; s <= hi; s++) {
        const struct merge_entry *ref = NULL;
        int pending = 0, mismatch = 0, arrived = 0;
        double t = 0;
        for (int i = 0; i < g->size; i++) {
            const struct merge_rank *mr = &m->ranks[g->ranks[i]];
            unsigned long long mx, mn;
            if (!mr->present) {
                continue; /* unknown: reported with the finding */
            }
            const struct merge_entry *e = merge_find(mr, g->name, s, &mx, &mn);
            if (!e) {
                pending |= s > mx; /* older than the ring: assumed completed */
                continue;
            }
            if (!ref) {
                ref = e;
                t = e->t_issue;
            } else if (!merge_same_call(e, ref)) {
                mismatch = 1;
            }
            if (e->t_issue < t) {
                t = e->t_issue;
            }
            pending |= strcmp(e->state, "completed") != 0;
            /* a message the receiver has is complete, whether or not its
             * sender has waited for its send yet */
            arrived |= !strcmp(e->op, "recv") && !strcmp(e->state, "completed");
        }
        pending &= !arrived;
        if (ref && (pending || mismatch)) {
            *out = (struct merge_finding){g, s, ref, t, mismatch, 0, 0};
            merge_waits(m, g, s, out);
            return 1;
        }
    }
    return 0;
}

static void merge_report(const struct merge *m, const struct merge_finding *f)
{
    char call[160];
    merge_call(f->first, call, sizeof(call));
    const char *kind = merge_p2p(f->first->op) ? "message" : "collective";
    printf("%s %s: %s #%llu %s on group %s\n", f->mismatch ? "mismatched" : "first stuck", kind,
           kind, f->seq, call, f->g->name);
    char entered[1024] = "", missing[1024] = "", nodump[1024] = "";
    size_t oe = 0, om = 0, on = 0;
    for (int i = 0; i < f->g->size; i++) {
        int r = f->g->ranks[i];
        const struct merge_rank *mr = &m->ranks[r];
        unsigned long long mx, mn;
        if (!mr->present) {
            if (on + 16 < sizeof(nodump)) {
                on += (size_t)snprintf(nodump + on, sizeof(nodump) - on, "%s%d", on ? ", " : "", r);
            }
            continue;
        }
        const struct merge_entry *e = merge_find(mr, f->g->name, f->seq, &mx, &mn);
        if (e) {
            char c[160];
            merge_call(e, c, sizeof(c));
            if (oe + 200 < sizeof(entered)) {
                oe += (size_t)snprintf(entered + oe, sizeof(entered) - oe, "%s%d (%s%s%s)",
                                       oe ? ", " : "", r, e->state, f->mismatch ? ": " : "",
                                       f->mismatch ? c : "");
            }
        } else if (f->seq > mx && om + 48 < sizeof(missing)) {
            om += (size_t)snprintf(missing + om, sizeof(missing) - om, "%s%d (last #%llu)",
                                   om ? ", " : "", r, mx);
        }
    }
    printf("  entered by ranks: %s\n", oe ? entered : "none");
    if (om) {
        printf("  not entered by ranks: %s\n", missing);
    }
    if (on) {
        printf("  no dump from ranks: %s (stuck or stopped, or killed by the job's abort "
               "before dumping; SIGUSR2 a hung job before ending it)\n",
               nodump);
    }
}

static int merge_main(const char *dir)
{
    DIR *dp = opendir(dir);
    if (!dp) {
        fprintf(stderr, "fsdpc-flight: cannot open directory %s: %s\n", dir, strerror(errno));
        return 2;
    }
    struct merge m;
    memset(&m, 0, sizeof(m));
    struct dirent *de;
    int files = 0, rc = 0;
    while ((de = readdir(dp))) {
        size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, "flight_", 7) != 0 || len < 6 ||
            strcmp(de->d_name + len - 5, ".json") != 0) {
            continue;
        }
        char path[8192];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (merge_read(&m, path) < 0) {
            rc = 2;
            break;
        }
        files++;
    }
    closedir(dp);
    if (rc == 0 && !files) {
        fprintf(stderr, "fsdpc-flight: no flight_<rank>.json in %s\n", dir);
        rc = 2;
    }
    if (rc == 0) {
        printf("%d of %d ranks dumped, %d groups\n", files, m.world_size, m.ngroups);
        struct merge_finding best = {0}, f;
        int found = 0;
        for (int i = 0; i < m.ngroups; i++) {
            if (merge_group_scan(&m, &m.groups[i], &f)) {
                if (!found || merge_before(&f, &best)) {
                    best = f;
                }
                found++;
            }
        }
        for (int r = 0, shown = 0; r < m.world_size && shown < 8; r++) {
            if (m.ranks[r].present && m.ranks[r].reason[0]) {
                printf("rank %d dumped on: %s\n", r, m.ranks[r].reason);
                shown++;
            }
        }
        if (found) {
            merge_report(&m, &best);
            if (found > 1) {
                printf("  (%d other group%s pending too, most likely waiting behind this one)\n",
                       found - 1, found > 2 ? "s" : "");
            }
            rc = 1;
        } else {
            printf("every recorded collective completed on every member of its group\n");
        }
    }
    for (int r = 0; m.ranks && r < m.world_size; r++) {
        free(m.ranks[r].e);
    }
    free(m.ranks);
    for (int i = 0; i < m.ngroups; i++) {
        free(m.groups[i].ranks);
    }
    return rc;
}

static const struct fsdp_cli_cmd merge_cmd = {
    "DIR",
    "Reads DIR/flight_<rank>.json (FSDPC_FLIGHT_DIR of the job) and names the first\n"
    "collective that some ranks entered and others did not, with the ranks it\n"
    "waits for. Exit status: 0 when the dumps agree and nothing is pending, 1 when\n"
    "a stuck or mismatched collective was found, 2 on bad input.",
    NULL, 0};

static int cmd_merge(int argc, char **argv)
{
    struct fsdp_optset set;
    if (fsdp_cli_command("fsdpc-flight", &merge_cmd, NULL, argc, argv, &set) == 1) {
        return 0;
    }
    return merge_main(fsdp_cli_operand(&set, "dump directory"));
}

static const struct fsdp_cli_sub flight_cmds[] = {
    {"merge", "name the collective a job's ranks are stuck in, from their dumps", cmd_merge},
};

/* A usage error ends the program with 2, as other bad input does (1 is a finding). */
static void usage_exit(int exit_code, void *arg)
{
    (void)exit_code;
    (void)arg;
    _exit(2);
}

int main(int argc, char **argv)
{
    fsdp_set_abort_hook(usage_exit, NULL);
    static const struct fsdp_cli_program flight = {"fsdpc-flight", flight_cmds, 1, 6};
    return fsdp_cli_main(&flight, argc, argv);
}
