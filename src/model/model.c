/*
 * model.c - the registry of architectures, conveniences over the model ops,
 * and the deterministic init that serves every architecture (model.h).
 */
#include "config.h"
#include "model/model.h"
#include "model/gpt2_spec.h"
#include "model/llama_spec.h"
#include "core/error.h"
#include "core/util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

// ----------------------------------------------------------------------------
// registry

int fsdp_model_registry_init(void)
{
    FSDP_CHECK(fsdp_arch_register(&fsdp_gpt2_arch));
    return fsdp_arch_register(&fsdp_llama_arch);
}

int fsdp_model_register(const struct fsdp_arch *arch)
{
    if (!arch || arch->size < sizeof(struct fsdp_arch) || !arch->name || !arch->spec_create ||
        !arch->validate || !arch->ops) {
        return fsdp_err(FSDP_ERR_INVALID, "model registry: incomplete architecture %s",
                        arch && arch->name ? arch->name : "(unnamed)");
    }
    const struct fsdp_model_ops *ops = arch->ops;
    if (ops->size < sizeof(struct fsdp_model_ops) || !ops->create || !ops->forward_unit ||
        !ops->backward_unit) {
        return fsdp_err(FSDP_ERR_INVALID, "model registry: architecture %s has incomplete ops",
                        arch->name);
    }
    return fsdp_arch_register(arch);
}

int fsdp_model_arch(const char *name, const struct fsdp_arch **out)
{
    FSDP_CHECK(fsdp_model_registry_init());
    *out = fsdp_arch_find(name);
    if (!*out) {
        char known[256];
        fsdp_arch_names(known, sizeof(known));
        return fsdp_err(FSDP_ERR_INVALID, "architecture '%s' is not one of: %s", name, known);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// conveniences

int fsdp_model_create(const struct fsdp_model_spec *spec, const struct fsdp_model_opts *opts,
                      struct fsdp_model **out)
{
    if (!spec->arch || !spec->arch->ops) {
        return fsdp_err(FSDP_ERR_INVALID, "model: the spec has no architecture ops");
    }
    return fsdp_model_ops_of(spec)->create(spec, opts, out);
}

fsdp_tp_cut_fn fsdp_model_tp_cut_of(const struct fsdp_model_spec *spec)
{
    const struct fsdp_model_ops *ops = spec->arch ? fsdp_model_ops_of(spec) : NULL;
    if (!ops || ops->size < offsetof(struct fsdp_model_ops, tp_cut) + sizeof(ops->tp_cut)) {
        return NULL;
    }
    return ops->tp_cut;
}

void fsdp_model_destroy(struct fsdp_model *m)
{
    if (m) {
        m->ops->destroy(m);
    }
}

int fsdp_model_share_workspace(struct fsdp_model *m, struct fsdp_model *donor)
{
    const struct fsdp_model_ops *ops = m->ops;
    if (ops->size <
            offsetof(struct fsdp_model_ops, share_workspace) + sizeof(ops->share_workspace) ||
        !ops->share_workspace) {
        return 0;
    }
    FSDP_CHECK(ops->share_workspace(m, donor));
    return 1;
}

int fsdp_model_forward(struct fsdp_model *m, const int32_t *tokens, const int32_t *targets, int B,
                       int T, float *loss)
{
    FSDP_CHECK(m->ops->set_batch(m, tokens, targets, B, T));
    for (int u = 0; u < m->spec->n_units; u++) {
        FSDP_CHECK(m->ops->forward_unit(m, u));
    }
    if (loss) {
        *loss = m->ops->loss(m);
    }
    return 0;
}

int fsdp_model_backward(struct fsdp_model *m)
{
    for (int u = m->spec->n_units - 1; u >= 0; u--) {
        FSDP_CHECK(m->ops->backward_unit(m, u));
    }
    return 0;
}

// ----------------------------------------------------------------------------
// initialisation

/* Output j of SplitMix64 seeded with key (its state after j + 1 steps). */
static uint64_t init_splitmix_at(uint64_t key, uint64_t j)
{
    uint64_t z = key + (j + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void init_param(const struct fsdp_param_spec *p, uint64_t seed, size_t first, size_t count,
                       float *dst)
{
    if (p->init == FSDP_INIT_ZEROS || p->init == FSDP_INIT_ONES) {
        float v = p->init == FSDP_INIT_ONES ? 1.0f : 0.0f;
        for (size_t i = 0; i < count; i++) {
            dst[i] = v;
        }
        return;
    }
    uint64_t key = fsdp_hash64(p->name, strlen(p->name), seed);
    for (size_t k = 0; k < count; k++) {
        uint64_t i = first + k;
        double u1 = (double)((init_splitmix_at(key, 2 * i) >> 11) + 1) * 0x1p-53;
        double u2 = (double)(init_splitmix_at(key, 2 * i + 1) >> 11) * 0x1p-53;
        dst[k] = (float)((double)p->std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
}

int fsdp_model_init_range(const struct fsdp_model_spec *s, uint64_t seed, int u, size_t start,
                          size_t count, float *dst)
{
    FSDP_CHECK(fsdp_model_spec_range_check(s, u, start, count));
    for (size_t i = s->unit_first[u]; i < s->n_params && s->params[i].unit == u; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        size_t lo, hi;
        if (fsdp_param_piece(p, start, count, &lo, &hi)) {
            init_param(p, seed, lo - p->offset, hi - lo, dst + (lo - start));
        }
    }
    return 0;
}

int fsdp_model_init_params(const struct fsdp_model_spec *s, uint64_t seed, float *const *bufs)
{
    for (int u = 0; u < s->n_units; u++) {
        FSDP_CHECK(fsdp_model_init_range(s, seed, u, 0, s->unit_numel[u], bufs[u]));
    }
    return 0;
}
