/*
 * schedule.c - learning-rate schedules (formulas in schedule.h).
 */
#include "config.h"
#include "train/schedule.h"

#include <math.h>

void fsdp_lr_schedule_init(struct fsdp_lr_schedule *s, const struct fsdp_train_config *c)
{
    s->kind = (enum fsdp_lr_kind)c->lr_schedule;
    s->lr = c->lr;
    s->min_lr = c->min_lr;
    s->warmup = c->warmup;
    s->steps = c->steps;
}

double fsdp_lr_at(const struct fsdp_lr_schedule *s, long step)
{
    if (step < s->warmup) {
        return s->lr * (double)(step + 1) / (double)s->warmup;
    }
    if (s->kind == FSDP_LR_CONSTANT || s->steps <= s->warmup) {
        return s->lr;
    }
    double p = (double)(step - s->warmup) / (double)(s->steps - s->warmup);
    if (p > 1.0) {
        p = 1.0; /* steps past the planned end stay at the floor */
    }
    double frac = s->kind == FSDP_LR_COSINE ? 0.5 * (1.0 + cos(M_PI * p)) : 1.0 - p;
    return s->min_lr + (s->lr - s->min_lr) * frac;
}

const char *fsdp_lr_kind_name(enum fsdp_lr_kind kind)
{
    switch (kind) {
    case FSDP_LR_COSINE: return "cosine";
    case FSDP_LR_LINEAR: return "linear";
    case FSDP_LR_CONSTANT: return "constant";
    }
    return "?";
}
