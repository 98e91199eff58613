/*
 * optim.c - AdamW over ranges of a unit split by parameter (on the device,
 * or on the host for offloaded shards), and the f16 loss scaler (optim.h).
 */
#include "config.h"
#include "optim/optim.h"
#include "compute/device.h"
#include "compute/kernels.h"
#include "core/error.h"

void fsdp_adamw_init(struct fsdp_optimizer *o, const struct fsdp_optim_config *oc,
                     const struct fsdp_model_spec *spec, struct fsdp_device *dev)
{
    dev = dev ? dev : fsdp_cpu_device();
    *o = (struct fsdp_optimizer){.oc = *oc,
                                 .spec = spec,
                                 .dev = dev,
                                 .k = dev->k,
                                 .n_state = 2,
                                 .state_names = {"exp_avg", "exp_avg_sq"}};
}

void fsdp_optimizer_begin(struct fsdp_optimizer *o, double lr)
{
    o->step++;
    o->lr = lr;
}

/* host: the CPU AdamW on host memory, else the device's kernel. */
static int optim_update(const struct fsdp_optimizer *o, int u, size_t start, size_t count,
                        float *param, const float *grad, float *const *state, float grad_scale,
                        int host)
{
    const struct fsdp_model_spec *s = o->spec;
    struct fsdp_adamw_params hp = {
        .lr = (float)o->lr,
        .beta1 = o->oc.beta1,
        .beta2 = o->oc.beta2,
        .eps = o->oc.eps,
        .weight_decay = o->oc.weight_decay,
        .step = o->step,
        .threads = o->oc.threads,
    };
    FSDP_CHECK(fsdp_model_spec_range_check(s, u, start, count));
    for (size_t i = s->unit_first[u]; i < s->n_params && s->params[i].unit == u; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        size_t lo, hi;
        if (fsdp_param_piece(p, start, count, &lo, &hi)) {
            size_t k = lo - start;
            if (host) {
                fsdp_cpu_adamw_update(param + k, grad + k, state[0] + k, state[1] + k, hi - lo, &hp,
                                      p->decay, grad_scale);
            } else {
                o->k->adamw_update(o->dev, param + k, grad + k, state[0] + k, state[1] + k, hi - lo,
                                   &hp, p->decay, grad_scale);
            }
        }
    }
    return 0;
}

int fsdp_optimizer_update(const struct fsdp_optimizer *o, int u, size_t start, size_t count,
                          float *param, const float *grad, float *const *state, float grad_scale)
{
    return optim_update(o, u, start, count, param, grad, state, grad_scale, 0);
}

int fsdp_optimizer_update_host(const struct fsdp_optimizer *o, int u, size_t start, size_t count,
                               float *param, const float *grad, float *const *state,
                               float grad_scale)
{
    return optim_update(o, u, start, count, param, grad, state, grad_scale, 1);
}

void fsdp_loss_scaler_init(struct fsdp_loss_scaler *ls, int dynamic, double scale)
{
    *ls = (struct fsdp_loss_scaler){.dynamic = dynamic, .on = dynamic || scale > 0.0,
                                    .scale = scale > 0.0 ? (float)scale : 1.0f};
}

int fsdp_loss_scaler_update(struct fsdp_loss_scaler *ls, int finite)
{
    if (!finite) {
        if (ls->dynamic) {
            ls->scale *= FSDP_SCALE_BACKOFF;
            ls->good_steps = 0;
            ls->skipped++;
        }
        return 0;
    }
    if (ls->dynamic && ++ls->good_steps >= FSDP_SCALE_GROWTH_INTERVAL) {
        ls->scale *= FSDP_SCALE_GROWTH;
        ls->good_steps = 0;
    }
    return 1;
}
