/*
 * hf_json.c - config.json helpers the architectures' Hugging Face maps
 * share (hf_json.h).
 */
#include "config.h"
#include "model/hf_json.h"
#include "core/error.h"
#include "core/util.h"

#include <stdio.h>
#include <string.h>

#define HF_SHOW 64

int fsdp_hf_require_str(const struct fsdp_json_obj *j, const char *key, const char *dflt,
                        const char *want1, const char *want2, const char *why)
{
    const char *v;
    FSDP_CHECK(fsdp_json_str(j, key, dflt, &v));
    if (strcmp(v, want1) != 0 && (!want2 || strcmp(v, want2) != 0)) {
        char show[HF_SHOW], want[128];
        if (want2) {
            snprintf(want, sizeof(want), "\"%s\" or \"%s\"", want1, want2);
        } else {
            snprintf(want, sizeof(want), "\"%s\"", want1);
        }
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: '%s' is \"%s\"; fsdpc reads only %s (%s)",
                        j->file, key, fsdp_str_printable(show, sizeof(show), v, 0), want, why);
    }
    return 0;
}

int fsdp_hf_require_bool(const struct fsdp_json_obj *j, const char *key, int want,
                         const char *why)
{
    int v;
    FSDP_CHECK(fsdp_json_bool(j, key, &want, &v));
    if (v != want) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: '%s' is %s; fsdpc reads only %s (%s)",
                        j->file, key, v ? "true" : "false", want ? "true" : "false", why);
    }
    return 0;
}

void fsdp_hf_tokens_put(struct fsdp_json_writer *w, const struct fsdp_model_spec *s)
{
    if (s->bos_token_id >= 0) {
        fsdp_json_put_int(w, "bos_token_id", s->bos_token_id);
    }
    if (s->eos_token_id >= 0) {
        fsdp_json_put_int(w, "eos_token_id", s->eos_token_id);
    }
}
