/*
 * hf_map.c - config.json in both directions for any registered
 * architecture with a Hugging Face map (core/hf_map.h): the architecture is
 * the one that reads the file's model_type; its own callbacks read and
 * write its members.
 */
#include "config.h"
#include "programs/hf_map.h"
#include "core/error.h"
#include "core/hf_map.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HF_SHOW 64

// ----------------------------------------------------------------------------
// config.json in

int fsdp_hf_config_read(const struct fsdp_json_obj *j, struct fsdp_hf_model *out)
{
    const char *type;
    FSDP_CHECK(fsdp_json_str(j, "model_type", NULL, &type));
    out->arch = fsdp_hf_arch_of(type, &out->model_type);
    if (!out->arch) {
        char show[HF_SHOW], types[256];
        fsdp_hf_model_types(types, sizeof(types));
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not one fsdpc reads "
                        "(%s)", j->file, fsdp_str_printable(show, sizeof(show), type, 0), types);
    }
    const struct fsdp_hf_map *m = fsdp_arch_hf(out->arch);
    out->cfg = calloc(1, out->arch->cfg_size);
    if (!out->cfg) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: config", j->file);
    }
    int rc = m->config_read(j, out->model_type, out->cfg);
    if (rc == 0 && (rc = out->arch->validate(out->cfg)) < 0) {
        /* the message names fsdpc's field; say where it came from */
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        rc = fsdp_err(rc, "%s: a model fsdpc cannot build: %s", j->file, msg);
    }
    if (rc < 0) {
        free(out->cfg);
        out->cfg = NULL;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// config.json out (members sorted by name, as transformers writes them)

static const char *hf_torch_dtype(enum fsdp_dtype t)
{
    return t == FSDP_BF16 ? "bfloat16" : t == FSDP_F16 ? "float16" : "float32";
}

int fsdp_hf_config_write(const struct fsdp_model_spec *s, enum fsdp_dtype dtype, char **text,
                         size_t *len)
{
    const struct fsdp_hf_map *m = fsdp_arch_hf(s->arch);
    struct fsdp_json_writer w;
    if (!m) {
        char names[128];
        fsdp_hf_arch_names(names, sizeof(names));
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "a %s model has no Hugging Face counterpart "
                        "(%s do)", s->arch->name, names);
    }
    FSDP_CHECK(fsdp_json_writer_init(&w));
    fsdp_json_begin_obj(&w, NULL);
    m->config_write(&w, s, hf_torch_dtype(dtype));
    fsdp_json_end(&w);
    return fsdp_json_writer_finish(&w, text, len);
}

void fsdp_hf_st_entries(const struct fsdp_model_spec *s, enum fsdp_dtype dtype,
                        struct fsdp_st_entry *e, char (*names)[FSDP_ST_NAME_MAX])
{
    const struct fsdp_hf_map *m = fsdp_arch_hf(s->arch);
    for (size_t i = 0; i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        fsdp_hf_param_name(m, p, names[i], FSDP_ST_NAME_MAX);
        e[i] = (struct fsdp_st_entry){.name = names[i], .dtype = dtype, .ndim = p->ndim};
        fsdp_hf_param_shape(m, p, e[i].shape);
    }
}
