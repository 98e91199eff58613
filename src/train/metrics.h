/*
 * metrics.h - what a training step reports: the step line on stdout
 * (llm.c / torchtitan style), the JSONL metrics file, peak memory, and the
 * sgemm probe that estimates peak FLOP/s for MFU when none is given.
 *
 *   step  10/200 | loss 3.4512 | norm 1.2300 | lr 3.00e-04 | 45.1 ms | 22690 tok/s | mfu 61.2% | mem 123 MiB | eta 8s
 *
 * JSONL lines (one object each, flushed as written). A run starts with a
 * start record, so that runs appended to one file stay apart:
 *   {"event":"start","run_id":"9f3c...","time":1733072000.5,
 *    "start":"2024-12-01T17:33:20Z","version":"0.1.0","world_size":2,
 *    "global_batch_seqs":16,"global_batch_tokens":2048,"steps":200,
 *    "resumed_from":null,"config":{"model":"tiny.h5","steps":200,...}}
 * ("resumed_from":108 and "resumed_dir" after a resume), then
 *   {"step":10,"loss":3.4512,"grad_norm":1.23,"lr":0.0003,"ms":45.1,
 *    "tokens_per_s":22690,"mfu":61.2,"mem_mib":123,"tokens":81920,"time":...}
 * With f16 loss scaling the record also has "loss_scale" (the scale the
 * step's backward used); a skipped step has "grad_norm":null.
 *   {"step":10,"val_loss":3.3011,"time":...}
 * time is seconds since the epoch; mfu is a percentage; a value that is not
 * finite is written as null.
 */
#ifndef FSDP_TRAIN_METRICS_H
#define FSDP_TRAIN_METRICS_H

#include <stddef.h>
#include <stdio.h>

#include "core/dtype.h"

struct fsdp_step_stats {
    long step;           /* 1-based */
    long steps;          /* planned total */
    double loss;         /* mean over every token of the global batch */
    double grad_norm;    /* global L2 norm before clipping */
    double lr;
    double ms;           /* wall time of the step */
    double tokens_per_s; /* global: all ranks */
    double mfu;          /* percent of peak; negative when unknown */
    double mem_mib;      /* peak resident memory of this process */
    double tokens;       /* global tokens consumed so far */
    double loss_scale;   /* scale the step's backward used; 0: no loss scaling */
    double eta_s;        /* seconds to the end at this run's pace; negative: unknown */
    double time;         /* when the step ended, seconds since the epoch */
};

/* The start record: who, when, what, from where. */
struct fsdp_run_start {
    const char *run_id;
    double time;               /* seconds since the epoch */
    const char *version;
    int world_size;
    long global_batch_seqs;    /* sequences per optimizer step, all ranks */
    long global_batch_tokens;
    long steps;                /* the run's planned length */
    long resumed_from;         /* step resumed from; -1: started from the model file */
    const char *resumed_dir;   /* its step directory */
    const char *config_json;   /* the resolved configuration, one JSON object */
};

struct fsdp_metrics;

/* path NULL or "": no file, step lines only. The file is appended to. */
int fsdp_metrics_open(const char *path, struct fsdp_metrics **out);
void fsdp_metrics_close(struct fsdp_metrics *m);

/* Writes the start record (nothing without a file). */
int fsdp_metrics_start(struct fsdp_metrics *m, const struct fsdp_run_start *s);

/* Formats the step line (no newline). */
void fsdp_metrics_format_step(const struct fsdp_step_stats *s, char *buf, size_t len);
/* Writes the JSONL record and, when print, the step line on stdout. */
int fsdp_metrics_step(struct fsdp_metrics *m, const struct fsdp_step_stats *s, int print);
/* Validation result: a line on stdout and a JSONL record stamped with time. */
int fsdp_metrics_val(struct fsdp_metrics *m, long step, long steps, double val_loss,
                     long batches, double time);

/* A JSON string literal of s (quotes and escapes included) into buf. */
void fsdp_json_string(const char *s, char *buf, size_t len);

/* Peak resident set size of this process, MiB (getrusage). */
double fsdp_peak_rss_mib(void);

/*
 * Estimates this rank's peak FLOP/s: the best of a few single-thread
 * sgemm runs on 1024^3 (after a warm-up), times threads. BLAS is left at
 * `threads` threads afterwards. method gets a one-line description.
 */
int fsdp_probe_peak_flops(int threads, double *flops, char *method, size_t method_len);

struct fsdp_device;
/*
 * This rank's peak FLOP/s for MFU on dev, whose matmul weights are dt: the
 * device's own figure where it has one (a GPU's data sheet), the host
 * probe above on the host; a device that computes apart from the host but
 * does not know its peak gets 0 (no MFU: a host figure would be wrong by
 * orders of magnitude), with method saying why and how to give one.
 */
int fsdp_peak_flops(struct fsdp_device *dev, enum fsdp_dtype dt, int threads, double *flops,
                    char *method, size_t method_len);

/*
 * MFU in percent of rate (FLOP/s per rank) against *peak (-1 when *peak is
 * 0). A probe can be beaten (it ran while the machine was busy): a rate
 * above a probed peak (given 0) raises *peak to it, so that MFU never reads
 * above 100%; a rate above a --peak-flops figure (given 1) is reported as
 * it is. Either is said once on rank 0 (*said), naming the step.
 */
double fsdp_mfu(double rate, double *peak, int given, long step, int *said);

#endif
