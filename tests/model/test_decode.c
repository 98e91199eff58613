/*
 * test_decode.c - incremental decoding (model.h, struct fsdp_decoder)
 * against the full forward: for GPT-2 (tied and untied) and the Llama
 * family (GQA and MQA, q/k/v biases, each RoPE scaling), the decoder's
 * logits at every position of a random sequence equal the logits the
 * forward computes for that position over the whole prefix (rel 1e-5), a
 * restarted decoder (pos = 0) gives the same again, and bad input (a full
 * cache, a token out of the vocabulary, too long a cache) is refused.
 */
#include "config.h"
#include "model/model.h"
#include "model/gpt2_spec.h"
#include "model/llama_spec.h"
#include "core/error.h"
#include "core/util.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double max_rel(const float *a, const float *b, size_t n)
{
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        m = e > m ? e : m;
        s = fabs((double)b[i]) > s ? fabs((double)b[i]) : s;
    }
    return m / (s > 0 ? s : 1);
}

static void check(const char *what, const struct fsdp_arch *arch, const void *cfg, int T)
{
    struct fsdp_model_spec *spec = NULL;
    struct fsdp_model *m = NULL;
    struct fsdp_decoder *d = NULL;
    if (arch->spec_create(cfg, &spec) < 0) {
        tap_ok(0, "%s: spec: %s", what, fsdp_err_msg());
        return;
    }
    int V = spec->vocab_size;
    float *params = malloc(spec->total_numel * sizeof(float));
    float **units = calloc((size_t)spec->n_units, sizeof(*units));
    size_t off = 0;
    for (int u = 0; u < spec->n_units; u++) {
        units[u] = params + off;
        off += spec->unit_numel[u];
    }
    fsdp_model_init_params(spec, 7, units);
    /* move the norms and biases off their init, so that every path counts */
    for (size_t i = 0; i < spec->total_numel; i++) {
        params[i] += 0.01f * (float)((i * 2654435761u) % 97) / 97.0f;
    }
    struct fsdp_model_opts mo = {.max_B = 1, .max_T = T};
    int ok = fsdp_model_create(spec, &mo, &m) == 0;
    for (int u = 0; ok && u < spec->n_units; u++) {
        ok = m->ops->set_unit(m, u, units[u], FSDP_F32, NULL) == 0;
    }
    int32_t *tok = malloc((size_t)T * sizeof(*tok));
    for (int t = 0; t < T; t++) {
        tok[t] = (int32_t)((t * 7919 + 13) % V);
    }
    float *full = malloc((size_t)T * (size_t)V * sizeof(float));
    float *step = malloc((size_t)V * sizeof(float));
    ok = ok && fsdp_model_forward(m, tok, NULL, 1, T, NULL) == 0 &&
         m->ops->logits(m, 0, (size_t)T, full) == 0;
    ok = ok && m->ops->decoder_create && m->ops->decoder_create(m, T, &d) == 0;
    double worst = 0;
    for (int round = 0; ok && round < 2; round++) {
        d->pos = 0; /* the second round: a restarted cache */
        for (int t = 0; ok && t < T; t++) {
            ok = d->ops->step(d, tok[t], step) == 0;
            double e = max_rel(step, full + (size_t)t * (size_t)V, (size_t)V);
            worst = e > worst ? e : worst;
        }
    }
    if (!ok) {
        tap_diag("%s: %s", what, fsdp_err_msg());
    }
    tap_ok(ok && worst < 1e-5, "%s: decoder logits at each of %d positions = the forward's "
           "(worst rel %.2g), twice (restarted cache)", what, T, worst);
    if (d) {
        int full_rc = d->ops->step(d, tok[0], step);
        int bad_tok = (d->pos = 0, d->ops->step(d, V, step));
        fsdp_err_clear();
        struct fsdp_decoder *d2 = NULL;
        int too_long = m->ops->decoder_create(m, spec->context + 1, &d2);
        fsdp_err_clear();
        tap_ok(full_rc == FSDP_ERR_INVALID && bad_tok == FSDP_ERR_INVALID &&
               too_long == FSDP_ERR_INVALID, "%s: a full cache, a token out of the vocabulary "
               "and a cache beyond the context are refused", what);
        d->ops->destroy(d);
    }
    fsdp_model_destroy(m);
    fsdp_model_spec_destroy(spec);
    free(params), free(units), free(tok), free(full), free(step);
}

int main(void)
{
    fsdp_model_registry_init();
    const struct fsdp_arch *gpt2 = fsdp_arch_find("gpt2"), *llama = fsdp_arch_find("llama");
    struct fsdp_gpt2_config g = {61, 40, 2, 3, 24, 1e-5f, 1};
    check("gpt2 tied", gpt2, &g, 37);
    g.tied = 0;
    check("gpt2 untied", gpt2, &g, 40);
    struct fsdp_llama_config l;
    fsdp_llama_preset("llama-tiny", &l);
    l.vocab_size = 67;
    l.context = 48;
    check("llama-tiny (GQA 4/2, tied)", llama, &l, 45);
    l.n_kv_head = 1;
    l.tied = 0;
    l.attn_bias = 1;
    l.rope_scaling = FSDP_LLAMA_ROPE_LINEAR;
    l.rope_factor = 2.0f;
    check("llama MQA, q/k/v biases, linear RoPE scaling, untied", llama, &l, 48);
    l.n_kv_head = 4;
    l.rope_scaling = FSDP_LLAMA_ROPE_LLAMA3;
    l.rope_factor = 8.0f;
    l.rope_low_freq = 1.0f;
    l.rope_high_freq = 4.0f;
    l.rope_original = 16;
    check("llama MHA, llama3 RoPE scaling", llama, &l, 33);
    return tap_done();
}
