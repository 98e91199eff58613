/*
 * train_config.h - the training configuration: every fsdpc-train option, its
 * default, its checks, and the resolved set printed at start (and later
 * stored in checkpoints). The option table in train_config.c is the single list
 * of keys; --help, the config file and the printout all come from it.
 */
#ifndef FSDP_TRAIN_TRAIN_CONFIG_H
#define FSDP_TRAIN_TRAIN_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "core/options.h"

#define FSDP_TRAIN_PATH_MAX 1024

enum fsdp_lr_kind {
    FSDP_LR_COSINE = 0, /* order matches the choice string "cosine|linear|constant" */
    FSDP_LR_LINEAR,
    FSDP_LR_CONSTANT,
};

enum fsdp_ckpt_async_mode {
    FSDP_CKPT_ASYNC_AUTO = 0, /* order matches the choice string "auto|on|off" */
    FSDP_CKPT_ASYNC_ON,
    FSDP_CKPT_ASYNC_OFF,
};

enum fsdp_uneven_kind {
    FSDP_UNEVEN_JOIN = 0, /* order matches the choice string "join|stop" */
    FSDP_UNEVEN_STOP,
};

/* The placeholder in data / val-data replaced by the data-parallel rank. */
#define FSDP_TRAIN_RANK_FIELD "{rank}"

struct fsdp_train_config {
    /* files */
    char model[FSDP_TRAIN_PATH_MAX];    /* HDF5 model file to start from */
    char data[FSDP_TRAIN_PATH_MAX];     /* training token file */
    char val_data[FSDP_TRAIN_PATH_MAX]; /* validation token file ("" : none) */
    char out[FSDP_TRAIN_PATH_MAX];      /* final model file ("" : not written) */
    char metrics[FSDP_TRAIN_PATH_MAX];  /* JSONL metrics file ("" : none) */
    char config[FSDP_TRAIN_PATH_MAX];   /* the config file that was read */
    char init[FSDP_TRAIN_PATH_MAX];     /* rendezvous method (see dist.h) */
    int insecure;                       /* allow a non-loopback store without a secret */
    char device[32];                    /* compute device: "cpu" (the only one built) */
    /* batch */
    long steps;      /* optimizer steps (with epochs: at most this many; 0: no cap) */
    long epochs;     /* passes over the data, no wrapping (0: run steps, wrapping) */
    int uneven;      /* enum fsdp_uneven_kind: ranks without a batch join or stop */
    long batch_size; /* B: sequences per data-parallel rank per micro-step */
    long seq_len;    /* T */
    long grad_accum; /* K: micro-steps per optimizer step */
    /* optimizer and schedule */
    double lr;
    long warmup;
    int lr_schedule; /* enum fsdp_lr_kind */
    double min_lr;
    double weight_decay;
    double beta1, beta2, eps;
    double clip; /* max global grad norm; 0: no clipping */
    /* run */
    long seed;
    long log_every;
    long val_every;   /* 0: validate once at the end (when val-data is given) */
    long val_batches;
    double peak_flops; /* per rank, FLOP/s; 0: measure with a GEMM probe */
    long threads;      /* BLAS threads per rank */
    double timeout;    /* seconds for rendezvous and collectives; 0: $FSDPC_TIMEOUT or 300 */
    int debug;         /* env|off|info|detail: 0 leaves $FSDPC_DEBUG alone (doc/debugging.md) */
    /* sharding (doc/sharding.md) */
    char mesh[128];          /* "dp=4", "rdp=2,dp=2"; "": dp=<world size> */
    char backend[128];       /* "mpi", "tcp", "dp=tcp,rdp=mpi"; "": the default */
    int sharding;            /* enum fsdp_sharding: full|grad-op|none */
    int reshard_after_forward; /* 1: free each unit's gathered parameters after its forward */
    long prefetch;           /* units gathered ahead */
    int param_dtype;         /* choice index into f32|bf16|f16 */
    int reduce_dtype;        /* choice index into f32|bf16|f16 */
    char loss_scale[32];     /* "off", "dynamic" or a number */
    double loss_scale_init;  /* initial dynamic scale */
    int no_sync_accum;       /* keep full gradients until the last micro-step */
    int activation_checkpointing;
    long lm_head_chunk;
    /* checkpoints (doc/user-guide.md, "Checkpoints") */
    char ckpt_dir[FSDP_TRAIN_PATH_MAX]; /* root of step_<N>/ directories ("": none) */
    long ckpt_every;         /* save every N steps (0: only at the end and on preemption) */
    long ckpt_keep;          /* keep the newest K checkpoints (0: keep all) */
    int ckpt_keep_going;     /* a failed save is logged and training continues */
    int ckpt_async;          /* enum fsdp_ckpt_async_mode: shards written in the background */
    char resume[FSDP_TRAIN_PATH_MAX]; /* "latest" (of ckpt-dir; also a bare --resume; none yet:
                                         start from the model, with a warning), "required"
                                         (latest, and none is an error), a checkpoint path,
                                         or "": none */
    int sequence_parallel;   /* with tp: norms and residuals hold 1/tp of the rows (default 1) */
    int print_memory;        /* print the per-rank memory plan and exit (memory_plan.h) */
    int offload;             /* choice index into none|optim|params,optim (enum fsdp_offload) */
    /* pipeline parallelism (a pp dimension in mesh; doc/user-guide.md) */
    int pp_schedule;      /* enum fsdp_pp_kind: gpipe|1f1b|interleaved (default 1f1b) */
    long pp_microbatches; /* M: micro-batches per step, the same setting as grad-accum;
                             0: grad-accum's */
    long pp_virtual;      /* V: stages per rank (interleaved) */
    char pp_layers[128];  /* "5,6,6,5": layers per stage; "": balanced */
    int activation_dtype;    /* choice index into f32|bf16 (saved activations' storage) */
};

/* The dtype behind a param-dtype / reduce-dtype choice index. */
int fsdp_train_config_dtype(int choice);
/* Loss scaling from the loss-scale keys: *dynamic, *scale (0: off). */
int fsdp_train_config_loss_scale(const struct fsdp_train_config *c, int *dynamic, double *scale);
/* The optimizer's settings (betas, eps, weight decay, clip) from c. */
struct fsdp_optim_config;
void fsdp_train_config_optim(const struct fsdp_train_config *c, struct fsdp_optim_config *oc);
/* The sharding engine's settings (parallel/fsdp.h) from c: batch, sharding,
 * precision, loss scaling, checkpointing, sequence parallelism. */
struct fsdp_shard_config;
int fsdp_train_config_shard(const struct fsdp_train_config *c, struct fsdp_shard_config *sc);
/* True when a one-rank run uses options only the sharding engine has (the
 * single-rank test oracle, oracle_ours --run, falls back to it then). */
int fsdp_train_config_wants_fsdp(const struct fsdp_train_config *c);

/* An option set bound to c, with every key at its default. */
void fsdp_train_config_init(struct fsdp_train_config *c, struct fsdp_optset *set);

/*
 * Fills c from argv (the --config file first, then flags) and checks
 * required keys and cross-key rules. Returns 1 for --help, else 0 or an
 * error whose message names the key.
 */
int fsdp_train_config_parse(struct fsdp_train_config *c, struct fsdp_optset *set, int argc,
                            char **argv);

/* Cross-key rules (the model- and data-dependent checks live in the trainer). */
int fsdp_train_config_validate(const struct fsdp_train_config *c,
                               const struct fsdp_optset *set);

/* Prints --help. */
void fsdp_train_config_usage(const struct fsdp_optset *set, FILE *fp);

/* Room for the resolved configuration as one JSON object. */
#define FSDP_TRAIN_JSON_MAX 16384

/* The resolved configuration as one JSON object: every visible key, numbers
 * as numbers, the rest as strings ("on", "cosine", paths). */
void fsdp_train_config_json(const struct fsdp_train_config *c, char *buf, size_t len);

/* Whether resume asks for ckpt-dir's latest checkpoint ("latest" or "required"). */
int fsdp_train_config_resume_latest(const struct fsdp_train_config *c);

/* Tokens one optimizer step consumes on one rank: K * B * T. */
size_t fsdp_train_config_step_tokens(const struct fsdp_train_config *c);

#endif
