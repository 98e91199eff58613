/*
 * metrics.c - step lines, the JSONL metrics file, peak memory, and the
 * sgemm probe of peak FLOP/s. Rank 0 alone prints and writes; the numbers
 * are already global.
 */
#include "config.h"
#include "train/metrics.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "compute/device.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

struct fsdp_metrics {
    FILE *fp; /* JSONL file, or NULL */
    char path[1024];
};

int fsdp_metrics_open(const char *path, struct fsdp_metrics **out)
{
    struct fsdp_metrics *m = calloc(1, sizeof(*m));
    if (!m) {
        return fsdp_err(FSDP_ERR_NOMEM, "metrics");
    }
    if (path && path[0]) {
        snprintf(m->path, sizeof(m->path), "%s", path);
        m->fp = fopen(path, "a");
        if (!m->fp) {
            int e = errno;
            free(m);
            return fsdp_err(FSDP_ERR_IO, "metrics file %s: %s", path, strerror(e));
        }
    }
    *out = m;
    return 0;
}

void fsdp_metrics_close(struct fsdp_metrics *m)
{
    if (!m) {
        return;
    }
    if (m->fp) {
        fclose(m->fp);
    }
    free(m);
}

static int ndigits(long v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* "8s", "3m05s", "1h02m", "3d04h" */
static void format_eta(double s, char *buf, size_t len)
{
    long v = (long)(s + 0.5);
    if (v < 60) {
        snprintf(buf, len, "%lds", v);
    } else if (v < 3600) {
        snprintf(buf, len, "%ldm%02lds", v / 60, v % 60);
    } else if (v < 86400) {
        snprintf(buf, len, "%ldh%02ldm", v / 3600, v % 3600 / 60);
    } else {
        snprintf(buf, len, "%ldd%02ldh", v / 86400, v % 86400 / 3600);
    }
}

void fsdp_metrics_format_step(const struct fsdp_step_stats *s, char *buf, size_t len)
{
    char mfu[32], eta[48] = "";
    if (s->mfu >= 0.0 && isfinite(s->mfu)) {
        snprintf(mfu, sizeof(mfu), "%.1f%%", s->mfu);
    } else {
        snprintf(mfu, sizeof(mfu), "n/a");
    }
    if (s->eta_s >= 0.0 && isfinite(s->eta_s)) {
        char e[32];
        format_eta(s->eta_s, e, sizeof(e));
        snprintf(eta, sizeof(eta), " | eta %s", e);
    }
    snprintf(buf, len,
             "step %*ld/%ld | loss %.4f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | mfu %s | mem %.0f MiB%s",
             ndigits(s->steps), s->step, s->steps, s->loss, s->grad_norm, s->lr, s->ms,
             s->tokens_per_s, mfu, s->mem_mib, eta);
}

/* A JSON number, or null for NaN/Inf (JSON has no such numbers). */
static void json_num(FILE *fp, const char *key, double v, int first)
{
    if (isfinite(v)) {
        fprintf(fp, "%s\"%s\":%.9g", first ? "" : ",", key, v);
    } else {
        fprintf(fp, "%s\"%s\":null", first ? "" : ",", key);
    }
}

/* Seconds since the epoch to the millisecond: enough to order records. */
static void json_time(FILE *fp, double t)
{
    fprintf(fp, ",\"time\":%.3f", t);
}

void fsdp_json_string(const char *s, char *buf, size_t len)
{
    size_t o = 0;
    if (len < 3) {
        if (len) {
            buf[0] = '\0';
        }
        return;
    }
    buf[o++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 8 < len; p++) {
        if (*p == '"' || *p == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)*p;
        } else if (*p < 0x20) {
            o += (size_t)snprintf(buf + o, len - o, "\\u%04x", *p);
        } else {
            buf[o++] = (char)*p;
        }
    }
    buf[o++] = '"';
    buf[o] = '\0';
}

static int metrics_flush(struct fsdp_metrics *m)
{
    if (fflush(m->fp) != 0 || ferror(m->fp)) {
        return fsdp_err(FSDP_ERR_IO, "metrics file %s: write failed: %s", m->path,
                        strerror(errno));
    }
    return 0;
}

int fsdp_metrics_start(struct fsdp_metrics *m, const struct fsdp_run_start *s)
{
    if (!m->fp) {
        return 0;
    }
    char when[64], q[2100];
    time_t sec = (time_t)s->time;
    struct tm tm;
    gmtime_r(&sec, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    fsdp_json_string(s->run_id, q, sizeof(q));
    fprintf(m->fp, "{\"event\":\"start\",\"run_id\":%s", q);
    json_time(m->fp, s->time);
    fsdp_json_string(s->version, q, sizeof(q));
    fprintf(m->fp, ",\"start\":\"%s\",\"version\":%s,\"world_size\":%d,\"global_batch_seqs\":%ld,"
            "\"global_batch_tokens\":%ld,\"steps\":%ld", when, q, s->world_size,
            s->global_batch_seqs, s->global_batch_tokens, s->steps);
    if (s->resumed_from >= 0) {
        fsdp_json_string(s->resumed_dir ? s->resumed_dir : "", q, sizeof(q));
        fprintf(m->fp, ",\"resumed_from\":%ld,\"resumed_dir\":%s", s->resumed_from, q);
    } else {
        fprintf(m->fp, ",\"resumed_from\":null");
    }
    fprintf(m->fp, ",\"config\":%s}\n", s->config_json && s->config_json[0] ? s->config_json : "{}");
    return metrics_flush(m);
}

int fsdp_metrics_step(struct fsdp_metrics *m, const struct fsdp_step_stats *s, int print)
{
    if (print) {
        char line[320];
        fsdp_metrics_format_step(s, line, sizeof(line));
        printf("%s\n", line);
        fflush(stdout);
    }
    if (!m->fp) {
        return 0;
    }
    fprintf(m->fp, "{\"step\":%ld", s->step);
    json_num(m->fp, "loss", s->loss, 0);
    json_num(m->fp, "grad_norm", s->grad_norm, 0);
    json_num(m->fp, "lr", s->lr, 0);
    json_num(m->fp, "ms", s->ms, 0);
    json_num(m->fp, "tokens_per_s", s->tokens_per_s, 0);
    json_num(m->fp, "mfu", s->mfu >= 0.0 ? s->mfu : NAN, 0);
    json_num(m->fp, "mem_mib", s->mem_mib, 0);
    json_num(m->fp, "tokens", s->tokens, 0);
    if (s->loss_scale > 0.0) {
        json_num(m->fp, "loss_scale", s->loss_scale, 0);
    }
    if (s->eta_s >= 0.0) {
        json_num(m->fp, "eta_s", s->eta_s, 0);
    }
    json_time(m->fp, s->time);
    fprintf(m->fp, "}\n");
    return metrics_flush(m);
}

int fsdp_metrics_val(struct fsdp_metrics *m, long step, long steps, double val_loss, long batches,
                     double time)
{
    printf("val  %*ld/%ld | val loss %.4f | %ld batches\n", ndigits(steps), step, steps, val_loss,
           batches);
    fflush(stdout);
    if (!m->fp) {
        return 0;
    }
    fprintf(m->fp, "{\"step\":%ld", step);
    json_num(m->fp, "val_loss", val_loss, 0);
    json_time(m->fp, time);
    fprintf(m->fp, "}\n");
    return metrics_flush(m);
}

double fsdp_peak_rss_mib(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        return NAN;
    }
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

// ----------------------------------------------------------------------------
// peak FLOP/s probe
//
// What BLAS reaches on a large square product with one thread, scaled by the
// thread count: an upper bound that the model's smaller, skinnier matmuls
// approach but rarely reach, which is what MFU should be measured against.

#define PROBE_N 1024
#define PROBE_MIN_REPS 3
#define PROBE_MAX_REPS 50
/* keep timing until this much time has passed: a few 20 ms products are too
 * short to see past a frequency ramp or a neighbour's burst on a VM */
#define PROBE_MIN_SECONDS 0.3

int fsdp_probe_peak_flops(int threads, double *flops, char *method, size_t method_len)
{
    const size_t n = PROBE_N, bytes = n * n * sizeof(float);
    float *a = fsdp_alloc(bytes), *b = fsdp_alloc(bytes), *c = fsdp_alloc(bytes);
    int rc = 0;
    if (!a || !b || !c) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "sgemm probe: %zu bytes", 3 * bytes);
        goto out;
    }
    for (size_t i = 0; i < n * n; i++) {
        /* small values in [-0.5, 0.5): no denormals, no overflow */
        a[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        b[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
    }
    openblas_set_num_threads(1);
    double best = 1e30, start = fsdp_now();
    int reps = 0;
    for (int r = 0; r <= PROBE_MAX_REPS; r++) { /* r == 0 warms up */
        if (r > PROBE_MIN_REPS && fsdp_now() - start > PROBE_MIN_SECONDS) {
            break;
        }
        double t0 = fsdp_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)n, 1.0f, a,
                    (int)n, b, (int)n, 0.0f, c, (int)n);
        double dt = fsdp_now() - t0;
        if (r > 0) {
            reps++;
            best = dt < best ? dt : best;
        }
    }
    openblas_set_num_threads(threads);
    *flops = 2.0 * (double)n * (double)n * (double)n / best * (double)threads;
    snprintf(method, method_len, "sgemm %zu^3 probe, best of %d, 1 thread x %d; raised to a step "
             "that beats it", n, reps, threads);
out:
    fsdp_free(a);
    fsdp_free(b);
    fsdp_free(c);
    return rc;
}

int fsdp_peak_flops(struct fsdp_device *dev, enum fsdp_dtype dt, int threads, double *flops,
                    char *method, size_t method_len)
{
    const struct fsdp_device_ops *ops = dev->ops;
    int has = ops->size >= offsetof(struct fsdp_device_ops, peak_flops) + sizeof(ops->peak_flops) &&
              ops->peak_flops;
    if (has) {
        FSDP_CHECK(ops->peak_flops(dev, dt, flops, method, method_len));
        if (*flops > 0) {
            return 0;
        }
    }
    if (dev->mem != FSDP_MEM_HOST && dev->mem != FSDP_MEM_GUARDED) {
        if (!has) {
            snprintf(method, method_len, "device %s knows no peak: give --peak-flops for MFU",
                     ops->name);
        }
        *flops = 0;
        if (fsdp_log_rank() <= 0) {
            FSDP_WARN(FSDP_SUB_TRAIN, "no MFU: %s", method);
        }
        return 0;
    }
    return fsdp_probe_peak_flops(threads, flops, method, method_len);
}

double fsdp_mfu(double rate, double *peak, int given, long step, int *said)
{
    if (!(*peak > 0.0)) {
        return -1.0;
    }
    if (rate > *peak && !*said && fsdp_log_rank() <= 0) {
        *said = 1;
        if (given) {
            FSDP_WARN(FSDP_SUB_TRAIN, "step %ld ran at %.1f GFLOP/s per rank, above --peak-flops "
                      "(%.1f GFLOP/s): MFU reads above 100%%, so the figure given is below "
                      "what this machine does", step, rate / 1e9, *peak / 1e9);
        } else {
            FSDP_WARN(FSDP_SUB_TRAIN, "step %ld ran at %.1f GFLOP/s per rank, above the peak "
                      "probed at start (%.1f GFLOP/s: the probe ran while the cores were busy); "
                      "MFU is against the fastest rate seen from here on (--peak-flops sets a "
                      "fixed figure)", step, rate / 1e9, *peak / 1e9);
        }
    }
    if (rate > *peak && !given) {
        *peak = rate;
    }
    return 100.0 * rate / *peak;
}
