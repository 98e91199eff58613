/*
 * hf_map.h - config.json read into the config of the registered
 * architecture that reads its model_type, and written from a model's
 * (doc/formats.md, "Hugging Face directories"), and the special-token ids
 * of a directory. The names, layouts and config members are each
 * architecture's own (struct fsdp_hf_map, core/hf_map.h); nothing here
 * knows one.
 *
 * Shared by import/export-safetensors (st_tool.c) and import/export-hf
 * (hf_tool.c), so that both speak one mapping.
 */
#ifndef FSDP_PROGRAMS_HF_MAP_H
#define FSDP_PROGRAMS_HF_MAP_H

#include <stddef.h>

#include "core/dtype.h"
#include "core/hf_map.h"
#include "core/spec.h"
#include "io/hf/safetensors.h"
#include "io/util/json.h"

/* What config.json describes. */
struct fsdp_hf_model {
    const struct fsdp_arch *arch;
    void *cfg;              /* (arch->cfg_size) malloc'd, the caller frees it */
    const char *model_type; /* "gpt2", "llama", "mistral", "qwen2" */
};

/*
 * Reads model_type and the architecture's members of config.json (j), with
 * transformers' defaults for the optional ones, and refuses a member that
 * would make transformers compute another function than fsdpc (a sliding
 * window shorter than the context, another activation, biases fsdpc's model
 * lacks, an unknown rope_scaling type): one error naming the member.
 */
int fsdp_hf_config_read(const struct fsdp_json_obj *j, struct fsdp_hf_model *out);

/* config.json for spec stored as dtype (f32, bf16, f16): architectures,
 * model_type, torch_dtype and the architecture's members; malloc'd text. */
int fsdp_hf_config_write(const struct fsdp_model_spec *s, enum fsdp_dtype dtype, char **text,
                         size_t *len);

/* The state-dict entries of s stored as dtype, in parameter order: each
 * parameter's name (kept in names) and shape in its architecture's map. */
void fsdp_hf_st_entries(const struct fsdp_model_spec *s, enum fsdp_dtype dtype,
                        struct fsdp_st_entry *e, char (*names)[FSDP_ST_NAME_MAX]);

// ----------------------------------------------------------------------------
// special tokens (hf_tokens.c)

/* The bos_token_id and eos_token_id of directory dir (config its
 * config.json): generation_config.json's where it has them (generate()
 * reads that file), else config.json's; -1 where neither says. A value
 * that is not an integer (or a list of them) is an error naming the file
 * and key; an id outside [0, vocab) is left out and of a list the first
 * is kept, each with a warning. */
int fsdp_hf_tokens_read(const char *dir, const struct fsdp_json_obj *config, long vocab,
                        long *bos, long *eos);
/* The ids of a tokenizer.json: bos the first token its post-processor puts
 * before a text, else the first present of <|begin_of_text|>, <s>,
 * <|endoftext|>, <bos>; eos the first present of <|end_of_text|>, </s>,
 * <|endoftext|>, <eos>; -1 when none is. desc says which were taken. */
int fsdp_hf_tokens_from_tokenizer(const char *path, long *bos, long *eos, char *desc, size_t len);
/* generation_config.json for s's ids (malloc'd text). */
int fsdp_hf_generation_config_write(const struct fsdp_model_spec *s, char **text, size_t *len);

#endif
