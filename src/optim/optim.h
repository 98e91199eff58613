/*
 * optim.h - the optimizer and the loss scaler, apart from whoever holds
 * the state they act on.
 *
 * The optimizer (AdamW now) updates any contiguous range of a unit's flat
 * buffer: a whole unit on one rank, or a rank's shard of it, split by
 * parameter so that weight decay applies where the parameter table says.
 * Its per-element state is n_state buffers laid out like the parameters
 * (AdamW: the two moments), held by the caller, named for checkpoints.
 *
 * The loss scaler follows torch's GradScaler for f16: a step whose
 * gradients overflowed (the caller's global decision) is skipped and the
 * scale halves; after 2000 finite steps in a row it doubles.
 */
#ifndef FSDP_OPTIM_OPTIM_H
#define FSDP_OPTIM_OPTIM_H

#include <stddef.h>

#include "core/spec.h"

struct fsdp_device;

/* AdamW and clipping settings (the learning rate comes per step). */
struct fsdp_optim_config {
    float beta1, beta2, eps;
    float weight_decay; /* applied where the parameter table says decay */
    float clip;         /* max global gradient norm; 0: no clipping */
    /* host threads for one update where the shards are host memory (the CPU
     * device, or pinned host memory when the optimizer runs on the CPU);
     * 0 or 1: the calling thread. The result does not depend on it. */
    int threads;
};

#define FSDP_OPTIM_MAX_STATE 2

struct fsdp_kernels;

struct fsdp_optimizer {
    struct fsdp_optim_config oc;
    const struct fsdp_model_spec *spec;
    struct fsdp_device *dev;                    /* where the shards live */
    const struct fsdp_kernels *k;               /* dev's kernels (the update) */
    int n_state;                                /* state buffers per element */
    const char *state_names[FSDP_OPTIM_MAX_STATE]; /* "exp_avg", "exp_avg_sq" */
    long step;                                  /* updates taken (bias correction counts from 1) */
    double lr;                                  /* of the current update */
};

/* AdamW over spec's parameters, on device dev (NULL: the CPU). */
void fsdp_adamw_init(struct fsdp_optimizer *o, const struct fsdp_optim_config *oc,
                     const struct fsdp_model_spec *spec, struct fsdp_device *dev);
/* Starts an update at learning rate lr (counts the step). */
void fsdp_optimizer_begin(struct fsdp_optimizer *o, double lr);
/*
 * Updates elements [start, start + count) of unit u: param, grad and
 * state[k] point at element start of their buffers. The gradient is used
 * as grad * grad_scale (unscaling and clipping folded in).
 */
int fsdp_optimizer_update(const struct fsdp_optimizer *o, int u, size_t start, size_t count,
                          float *param, const float *grad, float *const *state,
                          float grad_scale);
/*
 * The same update with param, grad and state in host memory (the shards an
 * offloading engine keeps in pinned host memory): the CPU AdamW
 * (fsdp_cpu_adamw_update, oc.threads host threads) instead of the device's
 * kernel. The CPU device's kernel is that function, so the result is bit
 * for bit what fsdp_optimizer_update computes there.
 */
int fsdp_optimizer_update_host(const struct fsdp_optimizer *o, int u, size_t start, size_t count,
                               float *param, const float *grad, float *const *state,
                               float grad_scale);

// ----------------------------------------------------------------------------
// loss scaling

#define FSDP_SCALE_GROWTH_INTERVAL 2000
#define FSDP_SCALE_GROWTH 2.0f
#define FSDP_SCALE_BACKOFF 0.5f

struct fsdp_loss_scaler {
    int dynamic;      /* 1: back off on overflow, grow after a run of finite steps */
    int on;           /* 0: no loss scaling (scale stays 1) */
    float scale;      /* multiplies the loss seed; the gradient is divided by it */
    long good_steps;  /* finite steps since the last change of scale */
    long skipped;     /* steps skipped on overflow */
};

/* dynamic: start at scale; static (dynamic 0): scale > 0 fixed; scale 0: off. */
void fsdp_loss_scaler_init(struct fsdp_loss_scaler *ls, int dynamic, double scale);
/*
 * After a step whose global gradient was finite or not: returns 1 when the
 * update applies. A non-finite gradient with dynamic scaling skips the step
 * and halves the scale; without it, it is an error for the caller to report.
 */
int fsdp_loss_scaler_update(struct fsdp_loss_scaler *ls, int finite);

#endif
