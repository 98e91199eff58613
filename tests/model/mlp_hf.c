/*
 * mlp_hf.c - the test "mlp" architecture as a Hugging Face-style model
 * (mlp_model.h): its map is data, as GPT-2's and Llama's are, so that the
 * unchanged import-hf, export-hf and safetensors commands read and write
 * an architecture they were not written for.
 *
 *   model_type   "mlp_lm" (architectures: MlpLMForCausalLM)
 *   names        "model." + fsdpc's name, lm_head.weight bare
 *   layout       h.N.fc2.weight stored transposed, (H, C) as a Conv1D
 *   buffers      h.N.fc1.mask, which an import skips
 *   config.json  vocab_size, n_positions, hidden_size, intermediate_size,
 *                num_hidden_layers, tie_word_embeddings (default true),
 *                hidden_act (only "relu")
 */
#include "config.h"
#include "tests/model/mlp_model.h"
#include "model/hf_json.h"
#include "core/error.h"

#include <stddef.h>

static int mlp_hf_read(const struct fsdp_json_obj *j, const char *model_type, void *cfg)
{
    static const char *const keys[] = {"vocab_size", "n_positions", "hidden_size",
                                       "intermediate_size", "num_hidden_layers"};
    static const long long hi[] = {1 << 20, 1 << 16, 1 << 16, 1 << 18, 1024};
    long long v[5];
    int tied, yes = 1;
    (void)model_type;
    for (int k = 0; k < 5; k++) {
        FSDP_CHECK(fsdp_json_int(j, keys[k], 1, hi[k], NULL, &v[k]));
    }
    FSDP_CHECK(fsdp_json_bool(j, "tie_word_embeddings", &yes, &tied));
    FSDP_CHECK(fsdp_hf_require_str(j, "hidden_act", "relu", "relu", NULL,
                                   "the blocks' hidden layer is a ReLU"));
    *(struct fsdp_test_mlp_config *)cfg = (struct fsdp_test_mlp_config){
        .vocab_size = (int)v[0], .context = (int)v[1], .n_embd = (int)v[2],
        .n_hidden = (int)v[3], .n_layer = (int)v[4], .tied = tied};
    return 0;
}

static void mlp_hf_write(struct fsdp_json_writer *w, const struct fsdp_model_spec *s,
                         const char *torch_dtype)
{
    const struct fsdp_test_mlp_config *c = s->cfg;
    fsdp_json_begin_arr(w, "architectures");
    fsdp_json_put_str(w, NULL, "MlpLMForCausalLM");
    fsdp_json_end(w);
    fsdp_hf_tokens_put(w, s);
    fsdp_json_put_str(w, "hidden_act", "relu");
    fsdp_json_put_int(w, "hidden_size", c->n_embd);
    fsdp_json_put_int(w, "intermediate_size", c->n_hidden);
    fsdp_json_put_str(w, "model_type", "mlp_lm");
    fsdp_json_put_int(w, "n_positions", c->context);
    fsdp_json_put_int(w, "num_hidden_layers", c->n_layer);
    fsdp_json_put_bool(w, "tie_word_embeddings", c->tied);
    fsdp_json_put_str(w, "torch_dtype", torch_dtype);
    fsdp_json_put_int(w, "vocab_size", c->vocab_size);
}

static const char *const mlp_hf_types[] = {"mlp_lm", NULL};
static const char *const mlp_hf_transposed[] = {".fc2.weight", NULL};
static const char *const mlp_hf_buffers[] = {".fc1.mask", NULL};

const struct fsdp_hf_map fsdp_test_mlp_hf = {
    .size = sizeof(struct fsdp_hf_map),
    .model_types = mlp_hf_types,
    .prefix = "model.",
    .head = "lm_head.weight",
    .transposed = mlp_hf_transposed,
    .buffers = mlp_hf_buffers,
    .config_read = mlp_hf_read,
    .config_write = mlp_hf_write,
    .embedding = "wte.weight",
};
