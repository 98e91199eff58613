/*
 * st_tool.c - fsdpc-ckpt export-safetensors / import-safetensors: a model's
 * tensors <-> one Hugging Face safetensors file under the names and layouts
 * of its architecture's Hugging Face map (core/hf_map.h; for GPT-2:
 * doc/formats.md, "Mapping to Hugging Face GPT-2"), the tied head left out.
 * The config travels as metadata (fsdpc_architecture and fsdpc_<attribute>);
 * a file without it is read by the first registered architecture that can
 * tell its config from the shapes (config_infer).
 * Streamed tensor by tensor through two buffers of the largest tensor.
 * Names and metadata from a file are printed only through fsdp_str_printable.
 */
#include "config.h"
#include "programs/ckpt_tool.h"
#include "programs/hf_map.h"
#include "io/ckpt/ckpt.h"
#include "io/h5/model_file.h"
#include "io/hf/safetensors.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F(field) offsetof(struct fsdp_ckpt_args, field)
#define S(field) sizeof(((struct fsdp_ckpt_args *)0)->field)
#define N_OPTS(t) (sizeof(t) / sizeof(t[0]))

// ----------------------------------------------------------------------------
// export

#define ST_META_MAX 32 /* pairs: format, architecture and the attributes */

/* The metadata an export writes: format pt, fsdpc_architecture and
 * fsdpc_<attribute> for every attribute of the config, as key, value pairs. */
struct st_meta {
    const char *kv[2 * ST_META_MAX];
    char keys[ST_META_MAX][FSDP_ST_NAME_MAX];
    char vals[ST_META_MAX][32];
    size_t n;
};

static void st_meta_of(const struct fsdp_model_spec *s, struct st_meta *m)
{
    const struct fsdp_arch *a = s->arch;
    m->kv[0] = "format";
    m->kv[1] = "pt";
    m->kv[2] = "fsdpc_architecture";
    m->kv[3] = a->name;
    m->n = 2;
    for (size_t i = 0; i < a->n_attrs && m->n < ST_META_MAX; i++, m->n++) {
        const struct fsdp_attr_desc *d = &a->attrs[i];
        double v = fsdp_attr_get(d, s->cfg);
        snprintf(m->keys[m->n], sizeof(m->keys[0]), "fsdpc_%s", d->name);
        if (d->type == FSDP_ATTR_FLOAT) {
            snprintf(m->vals[m->n], sizeof(m->vals[0]), "%.9g", v);
        } else {
            snprintf(m->vals[m->n], sizeof(m->vals[0]), "%.0f", v);
        }
        m->kv[2 * m->n] = m->keys[m->n];
        m->kv[2 * m->n + 1] = m->vals[m->n];
    }
}

static const struct fsdp_opt export_opts[] = {
    {"dtype", FSDP_OPT_DTYPE, F(dtype), 0, 0, 0, "f32|bf16|f16", "T", 0, "stored dtype", 0},
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "F", 0,
     "the file to write (via F.tmp and rename)", 'o'},
};
static const struct fsdp_cli_cmd export_cmd = {
    "PATH -o FILE.safetensors [--dtype T]",
    "Writes the weights of a model file or checkpoint as a Hugging Face\n"
    "safetensors file under the names its architecture has in transformers\n"
    "(GPT-2: transformer.h.0.attn.c_attn.weight etc., Conv1D weights transposed\n"
    "to (in, out)), the tied lm_head left out. The architecture and its config\n"
    "(fsdpc_architecture, fsdpc_n_head, ...) go to __metadata__ for\n"
    "import-safetensors, with the XXH3-64 checksum of every tensor\n"
    "(fsdpc.xxh3_64.<name>).",
    export_opts, N_OPTS(export_opts)};

/* Every parameter of s from src: read as f32 into a, transposed
 * through b where the map says, converted through h, written to w. */
static int st_export_tensors(const struct fsdp_ckpt_source *src, const struct fsdp_model_spec *s,
                             enum fsdp_dtype dtype, struct fsdp_st_writer *w, float *a, float *b,
                             uint16_t *h)
{
    const struct fsdp_hf_map *m = fsdp_arch_hf(s->arch);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        const void *v;
        FSDP_CHECK(fsdp_ckpt_source_read(src, i, p, a));
        FSDP_CHECK(fsdp_hf_param_export(m, p, a, dtype, b, h, &v));
        rc = fsdp_st_writer_put(w, i, v);
    }
    return rc;
}

int fsdp_ckpt_cmd_export_st(int argc, char **argv)
{
    struct fsdp_ckpt_args args = {.dtype = FSDP_F32};
    const char *in, *out = args.out;
    if (fsdp_ckpt_tool_parse_io(&export_cmd, &args, argc, argv, &in, "input", "FILE")) {
        return 0;
    }
    enum fsdp_dtype dtype = args.dtype;
    int rc;
    struct fsdp_ckpt_source src;
    const struct fsdp_model_spec *s =
        fsdp_ckpt_source_open("fsdpc-ckpt export-safetensors", in, &src);
    const struct fsdp_hf_map *m = fsdp_arch_hf(s->arch);
    if (!m) {
        char names[128];
        fsdp_hf_arch_names(names, sizeof(names));
        fsdp_fatal("fsdpc-ckpt export-safetensors: %s is a %s model; the Hugging Face names are "
                   "known for %s", in, s->arch->name, names);
    }
    struct fsdp_st_entry *e = calloc(s->n_params, sizeof(*e));
    char (*names)[FSDP_ST_NAME_MAX] = calloc(s->n_params, sizeof(*names));
    size_t big = fsdp_model_spec_largest(s);
    float *a = fsdp_alloc(big * sizeof(float)), *b = fsdp_alloc(big * sizeof(float));
    uint16_t *h = fsdp_alloc(big * sizeof(uint16_t));
    if (!e || !names || !a || !b || !h) {
        fsdp_fatal("fsdpc-ckpt export-safetensors: out of memory for one tensor");
    }
    fsdp_hf_st_entries(s, dtype, e, names);
    struct st_meta meta;
    st_meta_of(s, &meta);
    struct fsdp_st_writer *w = NULL;
    rc = fsdp_st_writer_create(out, e, s->n_params, meta.kv, meta.n, &w);
    if (rc == 0) {
        rc = st_export_tensors(&src, s, dtype, w, a, b, h);
    }
    if (rc == 0) {
        rc = fsdp_st_writer_commit(w);
    }
    fsdp_st_writer_destroy(w);
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-ckpt export-safetensors", NULL);
    }
    printf("%s: %zu tensors written to %s as %s\n", in, s->n_params, out, fsdp_dtype_name(dtype));
    fsdp_free(a);
    fsdp_free(b);
    fsdp_free(h);
    free(e);
    free(names);
    fsdp_ckpt_source_close(&src);
    return 0;
}

// ----------------------------------------------------------------------------
// import

static const struct fsdp_opt import_opts[] = {
    {"heads", FSDP_OPT_INT, F(heads), 0, 1, 65536, NULL, "N", 0,
     "n_head, over the metadata's (GPT-2 small: 12)", 0},
    {"ln-eps", FSDP_OPT_FLOAT, F(ln_eps), 0, 0, 1, NULL, "X", FSDP_OPT_MIN_OPEN | FSDP_OPT_MAX_OPEN,
     "layer-norm epsilon, over the metadata's (default 1e-5)", 0},
    {"dtype", FSDP_OPT_DTYPE, F(dtype), 0, 0, 0, "f32|bf16|f16", "T", 0,
     "stored dtype of the model file", 0},
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "F", 0, "the model file to write", 'o'},
};
static const struct fsdp_cli_cmd import_cmd = {
    "FILE.safetensors -o MODEL.h5 [--heads N]\n"
    "                 [--ln-eps X] [--dtype T]",
    "Reads a Hugging Face safetensors file (names with or without their prefix,\n"
    "such as GPT-2's 'transformer.'; transposed weights turned back; buffers\n"
    "such as attention masks ignored) into a model file. The architecture and\n"
    "its config come from the metadata export-safetensors writes; without it,\n"
    "from the shapes (GPT-2), and n_head, which shapes do not give, from --heads.\n"
    "An lm_head.weight equal to the embedding (or absent) makes a tied model.\n"
    "Tensors with a checksum in the metadata (fsdpc.xxh3_64.<name>, written by\n"
    "export-safetensors) are checked as they are read; a mismatch is an error.",
    import_opts, N_OPTS(import_opts)};
#undef F
#undef S
#undef N_OPTS

/* A tensor name from the file, fit to print. */
#define ST_SHOW 80

/* The file being imported, the map of the architecture tried or chosen,
 * and the values the command line puts over the file's metadata. */
struct st_in {
    struct fsdp_safetensors *st;
    const struct fsdp_hf_map *m;
    const char *heads; /* --heads: fsdpc_n_head */
    const char *eps;   /* --ln-eps: fsdpc_ln_eps */
};

/* Tensor index of parameter name: prefix + name, or the bare name. */
static long st_lookup(const struct st_in *in, const char *name)
{
    const char *prefix = in->m->prefix ? in->m->prefix : "";
    if (prefix[0] && !(in->m->head && strcmp(name, in->m->head) == 0)) {
        char buf[FSDP_ST_NAME_MAX + 32];
        snprintf(buf, sizeof(buf), "%s%s", prefix, name);
        long i = fsdp_safetensors_find(in->st, buf);
        if (i >= 0) {
            return i;
        }
    }
    return fsdp_safetensors_find(in->st, name);
}

static int st_shape(void *ctx, const char *name, size_t shape[2])
{
    const struct st_in *in = ctx;
    long k = st_lookup(in, name);
    if (k < 0) {
        return -1;
    }
    const struct fsdp_st_tensor *t = &in->st->t[k];
    shape[0] = t->ndim > 0 ? t->shape[0] : 1;
    shape[1] = t->ndim > 1 ? t->shape[1] : 1;
    return t->ndim;
}

static const char *st_meta(void *ctx, const char *key)
{
    const struct st_in *in = ctx;
    if (in->heads && strcmp(key, "fsdpc_n_head") == 0) {
        return in->heads;
    }
    if (in->eps && strcmp(key, "fsdpc_ln_eps") == 0) {
        return in->eps;
    }
    return fsdp_safetensors_meta(in->st, key);
}

/*
 * Each tensor once: a file holding both prefix + X and X names one tensor
 * twice, and the lookups below would take one spelling for some purposes
 * (the head: import) and the other for others (validation).
 */
static int st_check_aliases(const struct st_in *in)
{
    const struct fsdp_safetensors *st = in->st;
    size_t pl = in->m->prefix ? strlen(in->m->prefix) : 0;
    char a[ST_SHOW], b[ST_SHOW];
    for (size_t i = 0; pl && i < st->n; i++) {
        const char *n = st->t[i].name;
        if (strncmp(n, in->m->prefix, pl) == 0 && fsdp_safetensors_find(st, n + pl) >= 0) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: both '%s' and '%s' are present: one tensor "
                            "under two names (keep one spelling)", st->path,
                            fsdp_str_printable(a, sizeof(a), n, 0),
                            fsdp_str_printable(b, sizeof(b), n + pl, 0));
        }
    }
    return 0;
}

static int st_to_f32(const struct fsdp_safetensors *st, const struct fsdp_st_tensor *t,
                     const void *raw, float *dst, size_t n)
{
    char show[ST_SHOW];
    if (!fsdp_dtype_is_float(t->dtype)) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' has integer dtype; parameters must be "
                        "F32, F16 or BF16", st->path, fsdp_str_printable(show, sizeof(show),
                                                                         t->name, 0));
    }
    return fsdp_convert(dst, FSDP_F32, raw, t->dtype, n);
}

/* Tied when the head is absent or equal, byte for byte, to the embedding. */
static int st_tied(const struct st_in *in, void *x, void *y, int *tied)
{
    struct fsdp_safetensors *st = in->st;
    const char *emb = FSDP_HF_HAS(in->m, embedding) ? in->m->embedding : NULL;
    long lh = in->m->head ? fsdp_safetensors_find(st, in->m->head) : -1;
    long e = emb ? st_lookup(in, emb) : -1;
    *tied = 1;
    if (lh < 0) {
        return 0;
    }
    *tied = 0;
    if (e < 0) {
        return 0;
    }
    const struct fsdp_st_tensor *a = &st->t[lh], *b = &st->t[e];
    if (a->dtype != b->dtype || a->ndim != 2 || b->ndim != 2 || a->shape[0] != b->shape[0] ||
        a->shape[1] != b->shape[1]) {
        return 0;
    }
    FSDP_CHECK(fsdp_safetensors_read(st, (size_t)lh, x));
    FSDP_CHECK(fsdp_safetensors_read(st, (size_t)e, y));
    *tied = memcmp(x, y, a->end - a->begin) == 0;
    return 0;
}

/* The config from the metadata's fsdpc_<attribute> values, every one present. */
static int st_config_from_meta(struct st_in *in, const struct fsdp_arch *a, void *cfg)
{
    for (size_t i = 0; i < a->n_attrs; i++) {
        char key[FSDP_ST_NAME_MAX], show[ST_SHOW];
        snprintf(key, sizeof(key), "fsdpc_%s", a->attrs[i].name);
        const char *v = st_meta(in, key);
        char *end = NULL;
        double x = v ? strtod(v, &end) : 0.0;
        if (!v || end == v || *end) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: metadata %s is %s%s%s: a %s model's config "
                            "is written by export-safetensors", in->st->path, key, v ? "'" : "missing",
                            v ? fsdp_str_printable(show, sizeof(show), v, 0) : "", v ? "'" : "",
                            a->name);
        }
        FSDP_CHECK(fsdp_attr_set(&a->attrs[i], cfg, x));
    }
    return 0;
}

/* Architecture a's config of the file into *cfg (malloc'd): from the
 * shapes where a can tell it from them, else (when the metadata names a)
 * from the metadata; 1 when the tensors are not a's. */
static int st_try(struct st_in *in, const struct fsdp_arch *a, int named, void *x, void *y,
                  void **cfg)
{
    struct fsdp_hf_tensors view = {.file = in->st->path, .ctx = in, .shape = st_shape,
                                   .meta = st_meta};
    int tied, rc;
    if (!(in->m = fsdp_arch_hf(a)) || (!named && !FSDP_HF_HAS(in->m, config_infer))) {
        return 1;
    }
    FSDP_CHECK(st_check_aliases(in));
    if (!(*cfg = calloc(1, a->cfg_size))) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: config", in->st->path);
    }
    rc = st_tied(in, x, y, &tied);
    if (rc == 0 && FSDP_HF_HAS(in->m, config_infer)) {
        rc = in->m->config_infer(&view, tied, *cfg);
    } else if (rc == 0) {
        rc = st_config_from_meta(in, a, *cfg);
    }
    if (rc != 0) {
        free(*cfg);
        *cfg = NULL;
    }
    return rc;
}

/* The architecture the metadata names, else the first registered one that
 * tells its config from the shapes, and its config. */
static int st_config(struct st_in *in, void *x, void *y, const struct fsdp_arch **arch, void **cfg)
{
    const char *name = fsdp_safetensors_meta(in->st, "fsdpc_architecture");
    const struct fsdp_arch *a = name ? fsdp_arch_find(name) : NULL;
    int rc = 1;
    if (name) {
        rc = a ? st_try(in, a, 1, x, y, cfg) : 1;
    }
    for (int i = 0; !name && rc == 1 && (a = fsdp_arch_at(i)) != NULL; i++) {
        rc = st_try(in, a, 0, x, y, cfg);
    }
    if (rc == 1) {
        char show[ST_SHOW], names[128];
        fsdp_hf_arch_names(names, sizeof(names));
        return fsdp_err(FSDP_ERR_FORMAT, "%s: %s%s%s: the tensors are no registered "
                        "architecture's (those with Hugging Face names: %s)", in->st->path,
                        name ? "metadata names '" : "no fsdpc_architecture in the metadata",
                        name ? fsdp_str_printable(show, sizeof(show), name, 0) : "",
                        name ? "'" : "", names);
    }
    *arch = a;
    return rc;
}

/* Every parameter of s present with its shape, and nothing else but the
 * buffers and the head; linear in the file's tensors (a mark per tensor
 * found), whatever their number. */
static int st_check_tensors(const struct st_in *in, const struct fsdp_model_spec *s)
{
    const struct fsdp_safetensors *st = in->st;
    char show[ST_SHOW], hf[FSDP_ST_NAME_MAX + 32];
    unsigned char *used = calloc(st->n ? st->n : 1, 1);
    int rc = 0;
    if (!used) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: tensor marks", st->path);
    }
    for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        long k = st_lookup(in, p->name);
        if (k < 0) {
            fsdp_hf_param_name(in->m, p, hf, sizeof(hf));
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: tensor %s is missing", st->path, hf);
            break;
        }
        const struct fsdp_st_tensor *t = &st->t[k];
        size_t sh[2];
        int tr = fsdp_hf_param_transposed(in->m, p);
        fsdp_hf_param_shape(in->m, p, sh);
        used[k] = 1;
        if (t->ndim != p->ndim || t->shape[0] != sh[0] || (p->ndim == 2 && t->shape[1] != sh[1])) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' has %d dims (%zu, %zu) but the "
                          "model needs (%zu, %zu)%s", st->path,
                          fsdp_str_printable(show, sizeof(show), t->name, 0), t->ndim,
                          t->shape[0], t->ndim > 1 ? t->shape[1] : 1, sh[0],
                          p->ndim > 1 ? sh[1] : 1, tr ? " (Conv1D layout: in, out)" : "");
        }
    }
    for (size_t i = 0; rc == 0 && i < st->n; i++) {
        const char *n = st->t[i].name;
        int head = in->m->head && strcmp(n, in->m->head) == 0;
        if (!used[i] && !fsdp_hf_is_buffer(in->m, n) && !head) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: unexpected tensor '%s' (not a %s parameter)",
                          st->path, fsdp_str_printable(show, sizeof(show), n, 0),
                          s->arch->name);
        }
    }
    free(used);
    return rc;
}

/* Every parameter from the file into a model file at out. */
static int st_import_write(const struct st_in *in, const struct fsdp_model_spec *s,
                           const char *out, enum fsdp_dtype dtype, void *raw, float *a, float *b)
{
    char created_by[256];
    snprintf(created_by, sizeof(created_by), "fsdpc-ckpt import-safetensors %s", in->st->path);
    struct fsdp_model_write_opts wo = {.created_by = created_by, .dtype = dtype};
    struct fsdp_model_writer *w = NULL;
    int rc = fsdp_model_writer_create(out, s, &wo, &w);
    for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        size_t k = (size_t)st_lookup(in, p->name), n = p->shape[0] * p->shape[1];
        int tr = fsdp_hf_param_transposed(in->m, p);
        rc = fsdp_safetensors_read(in->st, k, raw);
        if (rc == 0) {
            rc = st_to_f32(in->st, &in->st->t[k], raw, a, n);
        }
        if (rc == 0 && tr) {
            fsdp_hf_transpose(b, a, p->shape[0], p->shape[1]);
        }
        if (rc == 0) {
            rc = fsdp_model_writer_put(w, i, tr ? b : a);
        }
    }
    if (rc == 0) {
        rc = fsdp_model_writer_commit(w);
    }
    fsdp_model_writer_destroy(w);
    return rc;
}

/* --heads and --ln-eps as the metadata values they replace. */
struct st_overrides {
    char heads[32], eps[32];
};

/* The file, opened, with the command line's values over its metadata. */
static void st_import_open(const struct fsdp_ckpt_args *args, const char *path,
                           struct st_overrides *ov, struct st_in *in)
{
    int rc;
    if (args->heads > 0) {
        snprintf(ov->heads, sizeof(ov->heads), "%ld", args->heads);
        in->heads = ov->heads;
    }
    if (args->ln_eps > 0) {
        snprintf(ov->eps, sizeof(ov->eps), "%.17g", args->ln_eps);
        in->eps = ov->eps;
    }
    if ((rc = fsdp_safetensors_open(path, &in->st)) < 0) {
        fsdp_die(rc, "fsdpc-ckpt import-safetensors", NULL);
    }
}

int fsdp_ckpt_cmd_import_st(int argc, char **argv)
{
    struct fsdp_ckpt_args args = {.dtype = FSDP_F32};
    const char *path, *out = args.out, *what = "fsdpc-ckpt import-safetensors";
    struct st_overrides ov;
    struct st_in in = {0};
    int rc;
    if (fsdp_ckpt_tool_parse_io(&import_cmd, &args, argc, argv, &path, "file", "MODEL.h5")) {
        return 0;
    }
    enum fsdp_dtype dtype = args.dtype;
    st_import_open(&args, path, &ov, &in);
    size_t big = 1;
    for (size_t i = 0; i < in.st->n; i++) {
        size_t n = (in.st->t[i].end - in.st->t[i].begin) / fsdp_dtype_size(in.st->t[i].dtype);
        big = n > big ? n : big;
    }
    /* each buffer holds the largest tensor in the widest dtype */
    void *raw = fsdp_alloc(big * sizeof(double));
    float *a = fsdp_alloc(big * sizeof(double)), *b = fsdp_alloc(big * sizeof(double));
    if (!raw || !a || !b) {
        fsdp_fatal("%s: out of memory for one tensor", what);
    }
    const struct fsdp_arch *arch = NULL;
    void *cfg = NULL;
    struct fsdp_model_spec *s = NULL;
    if ((rc = st_config(&in, a, b, &arch, &cfg)) < 0 || (rc = arch->spec_create(cfg, &s)) < 0 ||
        (rc = st_check_tensors(&in, s)) < 0 || (rc = st_import_write(&in, s, out, dtype, raw, a, b)) < 0) {
        fsdp_die(rc, what, NULL);
    }
    char desc[256];
    fsdp_arch_describe(arch, cfg, desc, sizeof(desc));
    printf("%s: %s %s written to %s\n", path, arch->name, desc, out);
    free(cfg);
    fsdp_free(raw);
    fsdp_free(a);
    fsdp_free(b);
    fsdp_model_spec_destroy(s);
    fsdp_safetensors_close(in.st);
    return 0;
}
