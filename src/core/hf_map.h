/*
 * hf_map.h - how an architecture appears in Hugging Face transformers, as
 * data its own description carries (struct fsdp_arch's hf member): the
 * state-dict name of every parameter, which weights are stored transposed,
 * which tensors a file holds beside the parameters, and config.json read
 * into the architecture's config and written from one.
 *
 * The architecture fills it (GPT-2 and Llama in their spec files in src/model, the
 * test architectures under tests/); the programs' import-hf, export-hf and
 * safetensors commands read it and never name an architecture. Config
 * readers and writers are callbacks over io's JSON objects, which this
 * layer sees only as opaque types: core includes nothing of io.
 *
 * Size-versioned as struct fsdp_arch: members are only ever added at the
 * end, and readers check size before they use one.
 */
#ifndef FSDP_CORE_HF_MAP_H
#define FSDP_CORE_HF_MAP_H

#include <stddef.h>

#include "core/dtype.h"
#include "core/spec.h"

struct fsdp_json_obj;    /* io/util/json.h: a parsed JSON object */
struct fsdp_json_writer; /* io/util/json.h: a JSON text being written */

/*
 * A state dict seen through its tensor names and shapes, for an
 * architecture that can tell its config from them (a bare safetensors file
 * has no config.json). Filled by the program that opened the file.
 */
struct fsdp_hf_tensors {
    const char *file; /* for messages */
    void *ctx;
    /* The tensor holding parameter `name` (the map's prefix tried first):
     * its number of dims, its shape into shape[0..1]; -1 when absent. */
    int (*shape)(void *ctx, const char *name, size_t shape[2]);
    /* A metadata value ("fsdpc_n_head") or NULL; values the user gave on
     * the command line come before the file's. */
    const char *(*meta)(void *ctx, const char *key);
};

struct fsdp_hf_map {
    size_t size;                     /* sizeof(struct fsdp_hf_map) of the architecture */
    /* config.json model_type values it reads, NULL-terminated; the first is
     * what a reader with no other clue assumes ("llama", "mistral", ...) */
    const char *const *model_types;
    /* Prepended to every parameter name but the head's ("transformer.") */
    const char *prefix;
    /* The LM head's name, never prefixed ("lm_head.weight"); a tied model's
     * file may hold it too, equal to the parameter it is tied to. */
    const char *head;
    /* Name endings of the 2-D weights the state dict holds transposed,
     * (in, out) as GPT-2's Conv1D does (".c_attn.weight"); NULL-terminated,
     * NULL: none. */
    const char *const *transposed;
    /* Name endings (after the prefix) of tensors a file may hold that are
     * buffers, not parameters, which an import skips (".attn.bias");
     * NULL-terminated, NULL: none. */
    const char *const *buffers;
    /* config.json (j, whose model_type is one of model_types) into cfg
     * (arch->cfg_size bytes, zeroed), with transformers' defaults for
     * optional members; a member that would make transformers compute
     * another function is an error naming it. validate() runs after. */
    int (*config_read)(const struct fsdp_json_obj *j, const char *model_type, void *cfg);
    /* The architecture's members of config.json for s, in name order, with
     * architectures, model_type and torch_dtype ("float32"); the caller has
     * opened the object and closes it. */
    void (*config_write)(struct fsdp_json_writer *w, const struct fsdp_model_spec *s,
                         const char *torch_dtype);
    /* Optional (NULL: none): the config from a state dict's shapes and
     * metadata into cfg, tied when tied; 1 when the tensors are not this
     * architecture's (nothing recorded), else 0 or an error. */
    int (*config_infer)(const struct fsdp_hf_tensors *t, int tied, void *cfg);
    /* The parameter a tied head is ("wte.weight"), for files without a
     * config; NULL: none. */
    const char *embedding;
};

/* Nonzero when map m is new enough to have the optional member and sets it. */
#define FSDP_HF_HAS(m, member) \
    ((m)->size >= offsetof(struct fsdp_hf_map, member) + sizeof((m)->member) && (m)->member)

/* a's map when it has one (and a registrant new enough to know it), else NULL. */
const struct fsdp_hf_map *fsdp_arch_hf(const struct fsdp_arch *a);
/* The registered architecture that reads config.json's model_type, or
 * NULL (no error recorded); *name (when not NULL) the map's own spelling
 * of model_type, which outlives the caller's string. */
const struct fsdp_arch *fsdp_hf_arch_of(const char *model_type, const char **name);
/* Every model_type the registered architectures read ("gpt2, llama, ...")
 * and the names of those that have a map ("gpt2 and llama"), for messages. */
void fsdp_hf_model_types(char *buf, size_t len);
void fsdp_hf_arch_names(char *buf, size_t len);

/* p's name in the state dict: the prefix + its name (the head bare). */
void fsdp_hf_param_name(const struct fsdp_hf_map *m, const struct fsdp_param_spec *p, char *buf,
                        size_t len);
/* 1 when the state dict holds p transposed. */
int fsdp_hf_param_transposed(const struct fsdp_hf_map *m, const struct fsdp_param_spec *p);
/* dst (rows, cols) = transpose of src (cols, rows): a weight between its
 * layout here and the state dict's transposed one. */
void fsdp_hf_transpose(float *dst, const float *src, size_t rows, size_t cols);
/* p's f32 values a as the state dict holds them, in dtype: *out is a itself,
 * or a transposed into tr (p->numel floats, used only when the state dict
 * holds p transposed), converted into h (p->numel elements of dtype, used
 * only when dtype is not f32). 0 or a negative error code. */
int fsdp_hf_param_export(const struct fsdp_hf_map *m, const struct fsdp_param_spec *p,
                         const float *a, enum fsdp_dtype dtype, float *tr, void *h,
                         const void **out);
/* p's shape as the state dict holds it. */
void fsdp_hf_param_shape(const struct fsdp_hf_map *m, const struct fsdp_param_spec *p,
                         size_t shape[2]);
/* 1 when name (with or without the prefix) is one of the buffers. */
int fsdp_hf_is_buffer(const struct fsdp_hf_map *m, const char *name);
/* name without the prefix (name itself when it has none). */
const char *fsdp_hf_bare(const struct fsdp_hf_map *m, const char *name);

#endif
