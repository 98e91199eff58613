/*
 * hf_json.h - what every architecture's config.json reader and writer
 * (struct fsdp_hf_map's config_read and config_write, core/hf_map.h)
 * shares: members that must hold the one value fsdpc computes with, and
 * the special-token ids every config.json carries.
 */
#ifndef FSDP_MODEL_HF_JSON_H
#define FSDP_MODEL_HF_JSON_H

#include "core/hf_map.h"
#include "core/spec.h"
#include "io/util/json.h"

/* Member key of j (dflt when absent) must be want1 or want2 (NULL: only
 * want1); else one error naming the member and why (what fsdpc computes). */
int fsdp_hf_require_str(const struct fsdp_json_obj *j, const char *key, const char *dflt,
                        const char *want1, const char *want2, const char *why);
/* Member key (want when absent) must be want. */
int fsdp_hf_require_bool(const struct fsdp_json_obj *j, const char *key, int want,
                         const char *why);
/* bos_token_id and eos_token_id members for s's known ids. */
void fsdp_hf_tokens_put(struct fsdp_json_writer *w, const struct fsdp_model_spec *s);

#endif
