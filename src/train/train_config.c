/*
 * train_config.c - fsdpc-train's option table, defaults and cross-key checks.
 * Defaults follow the GPT-2/GPT-3 recipe used by nanoGPT and torchtitan
 * (AdamW betas 0.9/0.95, weight decay 0.1, clip 1.0).
 */
#include "config.h"
#include "train/train_config.h"
#include "compute/device.h"
#include "parallel/fsdp.h"
#include "optim/optim.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "train/metrics.h"
#include "train/mesh_check.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define BIG 1e15
#define F(field) offsetof(struct fsdp_train_config, field)
#define S(field) sizeof(((struct fsdp_train_config *)0)->field)

static const struct fsdp_opt train_opts[] = {
    {"model", FSDP_OPT_STR, F(model), S(model), 0, 0, NULL, "FILE", FSDP_OPT_REQUIRED,
     "HDF5 model file to train (fsdpc-ckpt init makes one)", 0},
    {"data", FSDP_OPT_STR, F(data), S(data), 0, 0, NULL, "FILE", FSDP_OPT_REQUIRED,
     "training token file (llm.c format); {rank} in FILE: one file per rank", 0},
    {"val-data", FSDP_OPT_STR, F(val_data), S(val_data), 0, 0, NULL, "FILE", 0,
     "validation token file ({rank}: one file per rank)", 0},
    {"steps", FSDP_OPT_INT, F(steps), 0, 0, BIG, NULL, "N", 0,
     "optimizer steps to run (with --epochs: at most N; 0: no cap)", 0},
    {"epochs", FSDP_OPT_INT, F(epochs), 0, 0, BIG, NULL, "N", 0,
     "train N passes over the data, ending at its end (0: --steps, wrapping around)", 0},
    {"uneven", FSDP_OPT_CHOICE, F(uneven), 0, 0, 0, "join|stop", "MODE", 0,
     "a rank out of batches in a pass: join (shadow the others) or stop (all)", 0},
    {"batch-size", FSDP_OPT_INT, F(batch_size), 0, 1, 1 << 20, NULL, "B", FSDP_OPT_REQUIRED,
     "sequences per data-parallel rank per micro-step", 0},
    {"seq-len", FSDP_OPT_INT, F(seq_len), 0, 1, 1 << 20, NULL, "T", FSDP_OPT_REQUIRED,
     "tokens per sequence (at most the model's context)", 0},
    {"grad-accum", FSDP_OPT_INT, F(grad_accum), 0, 1, 1 << 20, NULL, "K", 0,
     "micro-steps per optimizer step (loss averaged over them)", 0},
    {"lr", FSDP_OPT_FLOAT, F(lr), 0, 0, 1e3, NULL, "X", FSDP_OPT_REQUIRED, "peak learning rate", 0},
    {"warmup", FSDP_OPT_INT, F(warmup), 0, 0, BIG, NULL, "N", 0, "linear warm-up steps", 0},
    {"lr-schedule", FSDP_OPT_CHOICE, F(lr_schedule), 0, 0, 0, "cosine|linear|constant", "KIND", 0,
     "decay after warm-up: cosine|linear|constant", 0},
    {"min-lr", FSDP_OPT_FLOAT, F(min_lr), 0, 0, 1e3, NULL, "X", 0,
     "learning rate at the end of the decay", 0},
    {"weight-decay", FSDP_OPT_FLOAT, F(weight_decay), 0, 0, 1e3, NULL, "X", 0,
     "AdamW decoupled weight decay (matmul weights only)", 0},
    {"beta1", FSDP_OPT_FLOAT, F(beta1), 0, 0, 1, NULL, "X", 0, "AdamW beta1", 0},
    {"beta2", FSDP_OPT_FLOAT, F(beta2), 0, 0, 1, NULL, "X", 0, "AdamW beta2", 0},
    {"eps", FSDP_OPT_FLOAT, F(eps), 0, 0, 1, NULL, "X", 0, "AdamW epsilon", 0},
    {"clip", FSDP_OPT_FLOAT, F(clip), 0, 0, BIG, NULL, "X", 0,
     "clip the global gradient norm to X (0: off)", 0},
    {"seed", FSDP_OPT_INT, F(seed), 0, 0, 9.0e18, NULL, "S", 0,
     "random seed, recorded with the run (the loop itself draws none)", 0},
    {"log-every", FSDP_OPT_INT, F(log_every), 0, 1, BIG, NULL, "N", 0,
     "print a step line every N steps (and the first and last)", 0},
    {"val-every", FSDP_OPT_INT, F(val_every), 0, 0, BIG, NULL, "N", 0,
     "validate every N steps (0: at the end only)", 0},
    {"val-batches", FSDP_OPT_INT, F(val_batches), 0, 1, BIG, NULL, "N", 0,
     "micro-batches per validation", 0},
    {"out", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "FILE", 0,
     "write the trained model to FILE (HDF5 model file)", 0},
    {"metrics", FSDP_OPT_STR, F(metrics), S(metrics), 0, 0, NULL, "FILE", 0,
     "append one JSON object per step and validation to FILE", 0},
    {"config", FSDP_OPT_STR, F(config), S(config), 0, 0, NULL, "FILE", FSDP_OPT_ARGV_ONLY,
     "read 'key = value' lines first; flags override them", 0},
    {"peak-flops", FSDP_OPT_FLOAT, F(peak_flops), 0, 0, 1e21, NULL, "X", 0,
     "peak FLOP/s per rank for MFU (0: measure with an sgemm probe)", 0},
    {"threads", FSDP_OPT_INT, F(threads), 0, 1, 4096, NULL, "N", 0,
     "BLAS and AdamW threads per rank", 0},
    {"init", FSDP_OPT_STR, F(init), S(init), 0, 0, NULL, "METHOD", 0,
     "rendezvous: auto, mpi, env://, tcp://HOST:PORT, file:///PATH", 0},
    {"insecure", FSDP_OPT_FLAG, F(insecure), 0, 0, 0, NULL, "", 0, FSDP_DIST_INSECURE_HELP, 0},
    {"device", FSDP_OPT_STR, F(device), S(device), 0, 0, NULL, "NAME", 0,
     "compute device: cuda (a build with the CUDA kernels, one GPU per rank), cpu, or guarded "
     "(the CPU with device memory the host cannot touch: checks that nothing outside the device "
     "reads it; for tests and debugging); default cuda when the build has it and a GPU is "
     "visible, else cpu",
     0},
    {"timeout", FSDP_OPT_FLOAT, F(timeout), 0, 0, 1e6, NULL, "SEC", 0,
     "deadline of rendezvous and collectives (0: $FSDPC_TIMEOUT or 300)", 0},
    {"debug", FSDP_OPT_CHOICE, F(debug), 0, 0, 0, "env|off|info|detail", "LEVEL", 0,
     "distributed debug level (env: $FSDPC_DEBUG); detail checks every collective", 0},
    {"mesh", FSDP_OPT_STR, F(mesh), S(mesh), 0, 0, NULL, "SPEC", 0,
     "device mesh: dp=N (shard), rdp=R,dp=N (replicate x shard), with tp=T last (tensor "
     "parallel) and pp=P first (pipeline stages); default dp=<ranks>",
     0},
    {"backend", FSDP_OPT_STR, F(backend), S(backend), 0, 0, NULL, "NAME", 0,
     "collective backend: mpi, tcp, or per dimension (dp=tcp,rdp=mpi,tp=mpi)", 0},
    {"sharding", FSDP_OPT_CHOICE, F(sharding), 0, 0, 0, "full|grad-op|none", "KIND", 0,
     "full (FSDP), grad-op (params kept from forward to backward), none (DDP)", 0},
    {"reshard-after-forward", FSDP_OPT_BOOL, F(reshard_after_forward), 0, 0, 0, NULL, "X", 0,
     "on|off: free each unit's gathered parameters after its forward", 0},
    {"prefetch", FSDP_OPT_INT, F(prefetch), 0, 0, 64, NULL, "N", 0,
     "units all-gathered ahead of the one computing (0: no overlap)", 0},
    {"param-dtype", FSDP_OPT_CHOICE, F(param_dtype), 0, 0, 0, "f32|bf16|f16", "DTYPE", 0,
     "dtype of gathered parameters (master weights stay f32)", 0},
    {"reduce-dtype", FSDP_OPT_CHOICE, F(reduce_dtype), 0, 0, 0, "f32|bf16|f16", "DTYPE", 0,
     "dtype of the gradient reduce-scatter", 0},
    {"loss-scale", FSDP_OPT_STR, F(loss_scale), S(loss_scale), 0, 0, NULL, "dynamic|N", 0,
     "loss scaling for f16: off, dynamic, or a fixed scale N", 0},
    {"loss-scale-init", FSDP_OPT_FLOAT, F(loss_scale_init), 0, 1e-30, 1e38, NULL, "X",
     FSDP_OPT_HIDDEN, "initial dynamic loss scale", 0},
    {"offload", FSDP_OPT_CHOICE, F(offload), 0, 0, 0, "none|optim|params,optim", "WHAT", 0,
     "keep the AdamW moments (optim), and the f32 master (params,optim), in pinned host memory "
     "and run AdamW on the host (changes nothing on device cpu)",
     0},
    {"no-sync-accum", FSDP_OPT_FLAG, F(no_sync_accum), 0, 0, 0, NULL, "", 0,
     "keep unsharded gradients until the last micro-step (one reduction per step)", 0},
    {"activation-dtype", FSDP_OPT_CHOICE, F(activation_dtype), 0, 0, 0, "f32|bf16", "DTYPE", 0,
     "storage of the activations saved for the backward (gpt2 and llama, any mesh); bf16 "
     "halves them, while master weights, optimizer state, gradients, the loss, norm statistics and "
     "reductions stay f32",
     0},
    {"activation-checkpointing", FSDP_OPT_FLAG, F(activation_checkpointing), 0, 0, 0, NULL, "", 0,
     "recompute each block's activations in its backward", 0},
    {"sequence-parallel", FSDP_OPT_BOOL, F(sequence_parallel), 0, 0, 0, NULL, "X", 0,
     "on|off: with a tp dimension, norms and residuals hold 1/tp of the sequence", 0},
    {"print-memory", FSDP_OPT_FLAG, F(print_memory), 0, 0, 0, NULL, "", FSDP_OPT_ARGV_ONLY,
     "print each rank's memory for --model (a file or a preset such as llama-8b) on --mesh, "
     "allocating nothing, and exit; needs --batch-size and --seq-len only",
     0},
    {"lm-head-chunk", FSDP_OPT_INT, F(lm_head_chunk), 0, 0, 1 << 30, NULL, "ROWS", 0,
     "positions per LM-head chunk (0: as many as fit in 16 MiB of logits); smaller saves memory, "
     "costs a recompute",
     0},
    {"ckpt-dir", FSDP_OPT_STR, F(ckpt_dir), S(ckpt_dir), 0, 0, NULL, "DIR", 0,
     "write sharded checkpoints to DIR/step_<N>/ (and at the end of training)", 0},
    {"ckpt-every", FSDP_OPT_INT, F(ckpt_every), 0, 0, BIG, NULL, "N", 0,
     "checkpoint every N steps (0: at the end and on SIGUSR1/SIGTERM only)", 0},
    {"ckpt-keep", FSDP_OPT_INT, F(ckpt_keep), 0, 0, BIG, NULL, "K", 0,
     "keep only the newest K checkpoints (0: keep all)", 0},
    {"ckpt-keep-going", FSDP_OPT_FLAG, F(ckpt_keep_going), 0, 0, 0, NULL, "", 0,
     "log a failed checkpoint save and keep training (default: stop with the error)", 0},
    {"ckpt-async", FSDP_OPT_CHOICE, F(ckpt_async), 0, 0, 0, "auto|on|off", "WHEN", 0,
     "write checkpoint shards in the background from a snapshot of the state (auto: when the "
     "snapshot takes under half the host's available memory and there is no tp)",
     0},
    {"pp-schedule", FSDP_OPT_CHOICE, F(pp_schedule), 0, 0, 0, "gpipe|1f1b|interleaved", "KIND", 0,
     "with a pp dimension: the pipeline schedule (interleaved: --pp-virtual stages per rank)", 0},
    {"pp-microbatches", FSDP_OPT_INT, F(pp_microbatches), 0, 0, 1 << 20, NULL, "M", 0,
     "with a pp dimension: micro-batches per step (sets grad-accum: the global batch is "
     "batch-size x M x the data-parallel ranks, as without pp)",
     0},
    {"pp-virtual", FSDP_OPT_INT, F(pp_virtual), 0, 1, 64, NULL, "V", 0,
     "with a pp dimension: stages per rank (interleaved only)", 0},
    {"pp-layers", FSDP_OPT_STR, F(pp_layers), S(pp_layers), 0, 0, NULL, "N,N,...", 0,
     "with a pp dimension: transformer layers of each stage (default: balanced by parameters)", 0},
    /* a bare --resume (or "resume =" in a file) means latest */
    {"resume", FSDP_OPT_STR, F(resume), S(resume), 0, 0, "latest", "latest|required|PATH",
     FSDP_OPT_OPTIONAL_VALUE,
     "resume from ckpt-dir's latest checkpoint (also a bare --resume; required: there must be "
     "one) or from a step directory",
     0},
};

#undef F
#undef S

void fsdp_train_config_init(struct fsdp_train_config *c, struct fsdp_optset *set)
{
    memset(c, 0, sizeof(*c));
    c->grad_accum = 1;
    c->lr_schedule = FSDP_LR_COSINE;
    c->weight_decay = 0.1;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->clip = 1.0;
    c->seed = 1337;
    c->log_every = 1;
    c->val_batches = 10;
    c->threads = 1;
    snprintf(c->init, sizeof(c->init), "auto");
    snprintf(c->device, sizeof(c->device), "%s", fsdp_device_default_name());
    c->reshard_after_forward = 1;
    c->sequence_parallel = 1;
    c->prefetch = 1;
    snprintf(c->loss_scale, sizeof(c->loss_scale), "off");
    c->loss_scale_init = 65536.0;
    c->pp_schedule = 1; /* 1f1b */
    c->pp_virtual = 1;

    memset(set, 0, sizeof(*set));
    set->prog = "fsdpc-train";
    set->opts = train_opts;
    set->n = sizeof(train_opts) / sizeof(train_opts[0]);
    set->base = c;
}

/* --print-memory plans a run: the model and the batch are all it needs. */
static int config_validate_plan(const struct fsdp_train_config *c, const struct fsdp_optset *set)
{
    static const char *const need[] = {"model", "batch-size", "seq-len"};
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
        if (!fsdp_opt_given(set, need[i])) {
            return fsdp_err(FSDP_ERR_INVALID, "missing required option '%s' (--print-memory "
                            "needs --model, --batch-size and --seq-len)", need[i]);
        }
    }
    int dynamic;
    double scale;
    return fsdp_train_config_loss_scale(c, &dynamic, &scale);
}

/* The pipeline's settings against the rest: one micro-batch count (a
 * pipeline takes every other setting here; join: the whole pipeline
 * shadows). */
static int config_validate_pp(const struct fsdp_train_config *c, const struct fsdp_optset *set)
{
    if (c->pp_microbatches > 0 && fsdp_opt_given(set, "grad-accum") &&
        c->grad_accum != c->pp_microbatches) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "pp-microbatches %ld and grad-accum %ld differ: they "
                        "are one setting (the step's micro-batches); give one of them",
                        c->pp_microbatches, c->grad_accum);
    }
    return 0;
}

int fsdp_train_config_validate(const struct fsdp_train_config *c, const struct fsdp_optset *set)
{
    if (c->print_memory) {
        return config_validate_plan(c, set);
    }
    FSDP_CHECK(fsdp_opt_check_required(set));
    if (c->steps == 0 && c->epochs == 0) {
        return fsdp_err(FSDP_ERR_INVALID, "missing required option 'steps' (--steps N, or "
                        "--epochs N for whole passes over the data)");
    }
    if (c->uneven != FSDP_UNEVEN_JOIN && c->epochs == 0) {
        return fsdp_err(FSDP_ERR_INVALID, "uneven needs epochs N: with steps alone the data "
                        "wraps around and no rank runs out of batches");
    }
    if (c->beta1 >= 1.0 || c->beta2 >= 1.0) {
        return fsdp_err(FSDP_ERR_INVALID, "beta1 (%g) and beta2 (%g) must be below 1", c->beta1,
                        c->beta2);
    }
    if (c->min_lr > c->lr) {
        int rc = fsdp_err(FSDP_ERR_INVALID, "min-lr %g is above lr %g", c->min_lr, c->lr);
        fsdp_err_hint("--min-lr is the floor the schedule decays to: at most --lr");
        return rc;
    }
    if (c->steps > 0 && c->warmup > c->steps) {
        int rc = fsdp_err(FSDP_ERR_INVALID, "warmup %ld is longer than steps %ld", c->warmup,
                          c->steps);
        fsdp_err_hint("--warmup counts steps of the run: at most --steps (often 1-10%% of it)");
        return rc;
    }
    if ((c->ckpt_every > 0 || c->ckpt_keep > 0 || c->ckpt_keep_going) && !c->ckpt_dir[0]) {
        int rc = fsdp_err(FSDP_ERR_INVALID,
                          "ckpt-every, ckpt-keep and ckpt-keep-going need ckpt-dir DIR");
        fsdp_err_hint("add --ckpt-dir DIR, the directory the checkpoints go to");
        return rc;
    }
    if (fsdp_train_config_resume_latest(c) && !c->ckpt_dir[0]) {
        int rc = fsdp_err(FSDP_ERR_INVALID, "resume %s needs ckpt-dir DIR", c->resume);
        fsdp_err_hint("add --ckpt-dir DIR (the run's checkpoint directory), or give --resume "
                      "the path of a checkpoint");
        return rc;
    }
    if (c->val_every > 0 && !c->val_data[0]) {
        int rc = fsdp_err(FSDP_ERR_INVALID, "val-every %ld needs val-data FILE", c->val_every);
        fsdp_err_hint("add --val-data FILE ('fsdpc-data tokenize TEXT -o train.bin "
                      "--val-fraction 0.05 --val-out val.bin' makes one)");
        return rc;
    }
    if (c->mesh[0]) { /* names now; sizes against the world and the model in the trainer */
        struct fsdp_mesh_dims d;
        FSDP_CHECK(fsdp_mesh_parse(c->mesh, &d));
        FSDP_CHECK(fsdp_trainer_mesh_check(&d));
    }
    FSDP_CHECK(config_validate_pp(c, set));
    int dynamic;
    double scale;
    FSDP_CHECK(fsdp_train_config_loss_scale(c, &dynamic, &scale));
    if ((double)c->batch_size * (double)c->seq_len * (double)c->grad_accum > 1e12) {
        return fsdp_err(FSDP_ERR_INVALID, "grad-accum x batch-size x seq-len = %.3g tokens per step is too large",
                        (double)c->batch_size * (double)c->seq_len * (double)c->grad_accum);
    }
    return 0;
}

int fsdp_train_config_parse(struct fsdp_train_config *c, struct fsdp_optset *set, int argc,
                            char **argv)
{
    int rc = fsdp_opt_parse(set, argc, argv, "config");
    if (rc != 0) {
        return rc;
    }
    FSDP_CHECK(fsdp_train_config_validate(c, set));
    if (c->pp_microbatches > 0) {
        c->grad_accum = c->pp_microbatches;
    }
    return 0;
}

void fsdp_train_config_usage(const struct fsdp_optset *set, FILE *fp)
{
    fsdp_opt_usage(set, fp,
                   "--model FILE --data FILE --steps N|--epochs N --batch-size B --seq-len T --lr X "
                   "[options]");
    fprintf(fp,
            "\nA config file holds the same keys without dashes, one 'key = value' per line\n"
            "('#' starts a comment); flags given on the command line override it. The\n"
            "resolved configuration printed at start is itself a valid config file.\n");
}

size_t fsdp_train_config_step_tokens(const struct fsdp_train_config *c)
{
    return (size_t)c->grad_accum * (size_t)c->batch_size * (size_t)c->seq_len;
}

int fsdp_train_config_dtype(int choice)
{
    static const int dtypes[] = {FSDP_F32, FSDP_BF16, FSDP_F16}; /* "f32|bf16|f16" */
    return choice >= 0 && choice < 3 ? dtypes[choice] : FSDP_F32;
}

int fsdp_train_config_loss_scale(const struct fsdp_train_config *c, int *dynamic, double *scale)
{
    *dynamic = 0;
    *scale = 0.0;
    if (!c->loss_scale[0] || strcmp(c->loss_scale, "off") == 0) {
        return 0;
    }
    if (strcmp(c->loss_scale, "dynamic") == 0) {
        *dynamic = 1;
        *scale = c->loss_scale_init;
        return 0;
    }
    if (fsdp_parse_double(c->loss_scale, scale) < 0 || !(*scale > 0.0) || *scale > 1e38) {
        fsdp_err_clear();
        *scale = 0.0;
        return fsdp_err(FSDP_ERR_INVALID,
                        "loss-scale '%s' is not off, dynamic or a positive number", c->loss_scale);
    }
    return 0;
}

int fsdp_train_config_wants_fsdp(const struct fsdp_train_config *c)
{
    return c->mesh[0] || c->param_dtype != 0 || c->reduce_dtype != 0 ||
           strcmp(c->loss_scale, "off") != 0 || c->no_sync_accum || c->activation_checkpointing ||
           c->sharding != 0 || !c->reshard_after_forward || c->offload != 0 ||
           c->activation_dtype != 0;
}

void fsdp_train_config_optim(const struct fsdp_train_config *c, struct fsdp_optim_config *oc)
{
    *oc = (struct fsdp_optim_config){
        .beta1 = (float)c->beta1,
        .beta2 = (float)c->beta2,
        .eps = (float)c->eps,
        .weight_decay = (float)c->weight_decay,
        .clip = (float)c->clip,
        .threads = (int)c->threads, /* the host AdamW's; the CPU step runs between BLAS calls */
    };
}

int fsdp_train_config_shard(const struct fsdp_train_config *c, struct fsdp_shard_config *sc)
{
    fsdp_shard_config_init(sc);
    sc->B = (int)c->batch_size;
    sc->T = (int)c->seq_len;
    sc->sharding = (enum fsdp_sharding)c->sharding;
    sc->reshard_after_forward = c->reshard_after_forward != 0;
    sc->prefetch = (int)c->prefetch;
    sc->param_dtype = (enum fsdp_dtype)fsdp_train_config_dtype(c->param_dtype);
    sc->reduce_dtype = (enum fsdp_dtype)fsdp_train_config_dtype(c->reduce_dtype);
    int dynamic;
    FSDP_CHECK(fsdp_train_config_loss_scale(c, &dynamic, &sc->loss_scale));
    sc->loss_scale_dynamic = dynamic != 0;
    sc->no_sync_accum = c->no_sync_accum != 0;
    sc->activation_checkpointing = c->activation_checkpointing != 0;
    sc->sequence_parallel = c->sequence_parallel != 0;
    sc->lm_head_chunk = (int)c->lm_head_chunk;
    sc->offload = (enum fsdp_offload)c->offload; /* the choice's order is the enum's */
    sc->act_dtype = c->activation_dtype ? FSDP_BF16 : FSDP_F32;
    return 0;
}

int fsdp_train_config_resume_latest(const struct fsdp_train_config *c)
{
    return strcmp(c->resume, "latest") == 0 || strcmp(c->resume, "required") == 0;
}

void fsdp_train_config_json(const struct fsdp_train_config *c, char *buf, size_t len)
{
    /* the option table comes with a config to point at; c's values are read */
    struct fsdp_train_config *scratch = malloc(sizeof(*scratch));
    struct fsdp_optset set;
    char value[FSDP_TRAIN_PATH_MAX + 8], quoted[2 * FSDP_TRAIN_PATH_MAX + 16];
    size_t used = 0;
    if (len < 3 || !scratch) {
        snprintf(buf, len, "{}");
        free(scratch);
        return;
    }
    fsdp_train_config_init(scratch, &set);
    set.base = (void *)c;
    buf[used++] = '{';
    for (size_t i = 0; i < set.n; i++) {
        const struct fsdp_opt *o = &set.opts[i];
        if (o->flags & (FSDP_OPT_HIDDEN | FSDP_OPT_ARGV_ONLY)) {
            continue;
        }
        fsdp_opt_format_value(&set, i, value, sizeof(value));
        if (o->type == FSDP_OPT_STR) { /* the text itself, '""' being the printout's empty */
            const char *v = (const char *)c + o->offset;
            fsdp_json_string(v, quoted, sizeof(quoted));
        } else if (o->type == FSDP_OPT_INT || o->type == FSDP_OPT_FLOAT) {
            snprintf(quoted, sizeof(quoted), "%s", value);
        } else {
            fsdp_json_string(value, quoted, sizeof(quoted));
        }
        int n = snprintf(buf + used, len - used, "%s\"%s\":%s", used > 1 ? "," : "", o->name,
                         quoted);
        if (n < 0 || (size_t)n >= len - used - 1) {
            break; /* full: the object stays well formed without the rest */
        }
        used += (size_t)n;
    }
    buf[used++] = '}';
    buf[used] = '\0';
    free(scratch);
}
