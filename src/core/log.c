/*
 * log.c - the logger: the one piece of global state the project keeps.
 * The environment is read once (pthread_once); printing is a single
 * fprintf per line so lines from threads do not interleave.
 */
#include "config.h"
#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static const char *const sub_names[FSDP_SUB_COUNT] = {
    "core", "dist", "mpi", "tcp", "nccl", "model", "fsdp", "train", "io", "sample",
};
static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int sub_level[FSDP_SUB_COUNT];
static int log_rank = -1;
static int all_ranks;        /* FSDPC_LOG_RANKS=all */
static char rank_list[256];  /* FSDPC_LOG_RANKS=1,3 */
static FILE *log_fp;
static char log_path[512];

static int parse_level(const char *s, size_t n)
{
    for (int i = 0; i <= FSDP_LOG_TRACE; i++) {
        if (strlen(level_names[i]) == n && strncasecmp(level_names[i], s, n) == 0) {
            return i;
        }
    }
    if (n == 7 && strncasecmp(s, "warning", 7) == 0) {
        return FSDP_LOG_WARN;
    }
    return -1;
}

static void log_init(void)
{
    const char *spec = getenv("FSDPC_LOG");
    for (int i = 0; i < FSDP_SUB_COUNT; i++) {
        sub_level[i] = FSDP_LOG_INFO;
    }
    while (spec && *spec) {
        size_t n = strcspn(spec, ",");
        const char *eq = memchr(spec, '=', n);
        if (!eq) {
            int lv = parse_level(spec, n);
            if (lv >= 0) {
                for (int i = 0; i < FSDP_SUB_COUNT; i++) {
                    sub_level[i] = lv;
                }
            } else {
                fprintf(stderr, "fsdpc: FSDPC_LOG: unknown level '%.*s' (error warn info debug trace)\n",
                        (int)n, spec);
            }
        } else {
            size_t kn = (size_t)(eq - spec);
            int lv = parse_level(eq + 1, n - kn - 1);
            int found = 0;
            for (int i = 0; i < FSDP_SUB_COUNT; i++) {
                if (strlen(sub_names[i]) == kn && strncasecmp(sub_names[i], spec, kn) == 0) {
                    found = 1;
                    if (lv >= 0) {
                        sub_level[i] = lv;
                    }
                }
            }
            if (!found || lv < 0) {
                fprintf(stderr, "fsdpc: FSDPC_LOG: cannot parse '%.*s'\n", (int)n, spec);
            }
        }
        spec += n;
        if (*spec == ',') {
            spec++;
        }
    }
    const char *ranks = getenv("FSDPC_LOG_RANKS");
    if (ranks && strcasecmp(ranks, "all") == 0) {
        all_ranks = 1;
    } else {
        snprintf(rank_list, sizeof(rank_list), ",%s,", ranks && *ranks ? ranks : "0");
    }
    const char *path = getenv("FSDPC_LOG_FILE");
    if (path && *path) {
        snprintf(log_path, sizeof(log_path), "%s", path);
    }
}

void fsdp_log_quiet(void)
{
    pthread_once(&log_once, log_init);
    if (getenv("FSDPC_LOG")) {
        return; /* asked for: kept */
    }
    for (int i = 0; i < FSDP_SUB_COUNT; i++) {
        sub_level[i] = sub_level[i] > FSDP_LOG_WARN ? FSDP_LOG_WARN : sub_level[i];
    }
}

void fsdp_log_set_rank(int rank)
{
    log_rank = rank;
}

int fsdp_log_rank(void)
{
    return log_rank;
}

static int rank_selected(void)
{
    if (all_ranks || log_rank < 0) {
        return 1;
    }
    char key[32];
    snprintf(key, sizeof(key), ",%d,", log_rank);
    return strstr(rank_list, key) != NULL;
}

int fsdp_log_enabled(enum fsdp_log_level level, enum fsdp_log_sub sub)
{
    pthread_once(&log_once, log_init);
    if ((int)sub < 0 || sub >= FSDP_SUB_COUNT || (int)level > sub_level[sub]) {
        return 0;
    }
    return level <= FSDP_LOG_WARN || rank_selected();
}

static FILE *log_stream(void)
{
    if (!log_path[0]) {
        return stderr;
    }
    if (!log_fp && log_rank >= 0) {
        char p[600];
        snprintf(p, sizeof(p), "%s.%d", log_path, log_rank);
        log_fp = fopen(p, "a");
    }
    return log_fp ? log_fp : stderr;
}

void fsdp_log_at(enum fsdp_log_level level, enum fsdp_log_sub sub, const char *file, int line,
                 const char *fmt, ...)
{
    pthread_once(&log_once, log_init);
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    FILE *fp = log_stream();
    if (level >= FSDP_LOG_DEBUG) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        fprintf(fp, "[fsdpc r%d %s %s %ld.%06ld %s:%d] %s\n", log_rank, level_names[level],
                sub_names[sub], (long)ts.tv_sec, ts.tv_nsec / 1000, base, line, msg);
    } else {
        fprintf(fp, "[fsdpc r%d %s %s] %s\n", log_rank, level_names[level], sub_names[sub], msg);
    }
    fflush(fp);
}
