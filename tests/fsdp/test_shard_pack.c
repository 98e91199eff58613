/*
 * test_shard_pack.c - the sharding engine's in-place packing: for shard
 * groups of 2..5 ranks (rows split unevenly, parameters with fewer rows than
 * ranks), every unit of a tied and an untied model packed within its own
 * buffer equals a packing into a separate buffer computed from the row
 * layout alone (padding zero), in f32, bf16 and f16, and unpacking it again
 * in place gives the unit back. The packing scratch is what the memory
 * accounting says: a unit less its largest parameter, the largest such.
 */
#include "config.h"
#include "parallel/fsdp_impl.h"
#include "model/gpt2_spec.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Reference: block r of S holds rank r's rows of each parameter in turn. */
static void ref_pack(const struct fsdp_shard_engine *se, int u, const float *unit, float *out)
{
    const struct fsdp_unit *un = &se->units[u];
    memset(out, 0, (size_t)se->Rs * un->S * sizeof(float));
    for (int r = 0; r < se->Rs; r++) {
        size_t off = (size_t)r * un->S;
        for (size_t i = un->first; i < un->first + un->nparam; i++) {
            const struct fsdp_param_spec *p = &se->spec->params[i];
            size_t row0, rows;
            fsdp_shard_rows(p, se->Rs, r, &row0, &rows);
            for (size_t k = 0; k < rows * p->shape[1]; k++) {
                out[off++] = unit[p->offset + row0 * p->shape[1] + k];
            }
        }
    }
}

static uint16_t to16(enum fsdp_dtype t, float x)
{
    return t == FSDP_BF16 ? fsdp_f32_to_bf16(x) : fsdp_f32_to_f16(x);
}

/* Returns the number of mismatches over every unit and dtype. */
static size_t check_model(int tied, int Rs, size_t *scratch_want, size_t *scratch_got)
{
    struct fsdp_gpt2_config cfg = {.vocab_size = 37, .context = 11, .n_layer = 2, .n_head = 2,
                                   .n_embd = 6, .ln_eps = 1e-5f, .tied = tied};
    struct fsdp_shard_engine *se = calloc(1, sizeof(*se));
    struct fsdp_model_spec *spec = NULL;
    size_t bad = 0;
    if (!se || fsdp_gpt2_spec_create(&cfg, &spec) < 0) {
        free(se);
        return 1;
    }
    se->spec = spec;
    if (fsdp_device_create("cpu", 0, &se->dev) < 0) {
        fsdp_model_spec_destroy(spec);
        free(se);
        return 1;
    }
    se->Rs = Rs;
    se->rs = Rs - 1;
    if (fsdp_shard_layout_create(se) < 0) {
        fsdp_shard_teardown(se);
        fsdp_device_destroy(se->dev);
        fsdp_model_spec_destroy(spec);
        free(se);
        return 1;
    }
    *scratch_want = 0;
    for (int u = 0; u < se->n_units; u++) {
        const struct fsdp_unit *un = &se->units[u];
        size_t most = 0;
        for (size_t i = un->first; i < un->first + un->nparam; i++) {
            most = se->spec->params[i].numel > most ? se->spec->params[i].numel : most;
        }
        *scratch_want = un->numel - most > *scratch_want ? un->numel - most : *scratch_want;
    }
    *scratch_got = se->scratch_floats;
    const enum fsdp_dtype types[] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    for (int u = 0; u < se->n_units; u++) {
        const struct fsdp_unit *un = &se->units[u];
        size_t packed = (size_t)Rs * un->S, cap = packed > un->numel ? packed : un->numel;
        float *unit = malloc(un->numel * sizeof(float)), *want = malloc(packed * sizeof(float));
        float *buf = malloc(cap * sizeof(float));
        /* small integers: exact in bf16 and f16, so every cast is lossless */
        for (size_t i = 0; i < un->numel; i++) unit[i] = (float)(i % 200) + 1.0f;
        ref_pack(se, u, unit, want);
        for (int k = 0; k < 3; k++) {
            enum fsdp_dtype t = types[k];
            for (size_t i = 0; i < cap; i++) buf[i] = NAN; /* nothing stale may survive */
            memcpy(buf, unit, un->numel * sizeof(float));
            fsdp_shard_pack_inplace(se, u, buf, t);
            const uint16_t *h = (const uint16_t *)(const void *)buf;
            for (size_t i = 0; i < packed; i++) {
                if (t == FSDP_F32) {
                    bad += memcmp(&buf[i], &want[i], sizeof(float)) != 0;
                } else {
                    bad += h[i] != to16(t, want[i]);
                }
            }
            fsdp_shard_unpack_inplace(se, u, buf, t); /* stays in t */
            for (size_t i = 0; i < un->numel; i++) {
                if (t == FSDP_F32) {
                    bad += memcmp(&buf[i], &unit[i], sizeof(float)) != 0;
                } else {
                    bad += h[i] != to16(t, unit[i]);
                }
            }
        }
        free(unit), free(want), free(buf);
    }
    fsdp_shard_teardown(se);
    fsdp_device_destroy(se->dev);
    fsdp_model_spec_destroy(spec);
    free(se);
    return bad;
}

int main(void)
{
    for (int tied = 1; tied >= 0; tied--) {
        for (int Rs = 2; Rs <= 5; Rs++) {
            size_t want = 0, got = 0;
            size_t bad = check_model(tied, Rs, &want, &got);
            tap_ok(bad == 0,
                   "%s model over %d ranks: packing in place equals the row layout and "
                   "unpacking restores every unit in its dtype, f32/bf16/f16 (%zu mismatches)",
                   tied ? "tied" : "untied", Rs, bad);
            tap_ok(got == want, "%s model over %d ranks: scratch %zu floats (want %zu)",
                   tied ? "tied" : "untied", Rs, got, want);
        }
    }
    return tap_done();
}
