/*
 * spec.c - parameter tables, attribute tables and the architecture table
 * (spec.h). The architecture table is the process's one registry: filled
 * by src/model at start, read by io and the programs.
 */
#include "config.h"
#include "core/spec.h"
#include "core/error.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// parameter tables

int fsdp_model_spec_alloc(const struct fsdp_arch *arch, int n_units, size_t max_params,
                          struct fsdp_model_spec **out)
{
    struct fsdp_model_spec *s = calloc(1, sizeof(*s));
    if (!s || n_units < 1) {
        free(s);
        return n_units < 1 ? fsdp_err(FSDP_ERR_INVALID, "spec: %d units", n_units)
                           : fsdp_err(FSDP_ERR_NOMEM, "spec");
    }
    s->arch = arch;
    s->n_units = n_units;
    s->bos_token_id = s->eos_token_id = -1;
    s->cfg = calloc(1, arch && arch->cfg_size ? arch->cfg_size : 1);
    s->params = calloc(max_params ? max_params : 1, sizeof(*s->params));
    s->unit_numel = calloc((size_t)n_units, sizeof(size_t));
    s->unit_first = calloc((size_t)n_units, sizeof(size_t));
    if (!s->cfg || !s->params || !s->unit_numel || !s->unit_first) {
        fsdp_model_spec_destroy(s);
        return fsdp_err(FSDP_ERR_NOMEM, "spec: %zu parameters", max_params);
    }
    s->params_cap = max_params;
    *out = s;
    return 0;
}

int fsdp_model_spec_add(struct fsdp_model_spec *s, int unit, const char *name, size_t rows,
                        size_t cols, int ndim, enum fsdp_init_kind init, float std, int decay,
                        enum fsdp_tp_place tp)
{
    if (unit < 0 || unit >= s->n_units || (s->n_params > 0 && unit < s->params[s->n_params - 1].unit)) {
        return fsdp_err(FSDP_ERR_INTERNAL, "spec: parameter %s in unit %d out of order", name,
                        unit);
    }
    if (s->n_params == s->params_cap) {
        return fsdp_err(FSDP_ERR_INTERNAL, "spec: more than %zu parameters", s->params_cap);
    }
    if (strlen(name) >= FSDP_PARAM_NAME_MAX) {
        return fsdp_err(FSDP_ERR_INTERNAL, "spec: parameter name %s is too long", name);
    }
    struct fsdp_param_spec *p = &s->params[s->n_params];
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->unit = unit;
    p->ndim = ndim;
    p->shape[0] = rows;
    p->shape[1] = ndim == 2 ? cols : 1;
    p->numel = rows * p->shape[1];
    p->offset = s->unit_numel[unit];
    p->init = init;
    p->std = std;
    p->decay = decay;
    p->tp = tp;
    if (s->unit_numel[unit] == 0) {
        s->unit_first[unit] = s->n_params;
    }
    s->unit_numel[unit] += p->numel;
    s->total_numel += p->numel;
    s->n_params++;
    return 0;
}

int fsdp_model_spec_tie(struct fsdp_model_spec *s, int user, const char *name)
{
    long i = fsdp_model_spec_find(s, name);
    if (i < 0 || s->n_ties == FSDP_MAX_TIES || user < 0 || user >= s->n_units ||
        s->params[i].unit == user) {
        return fsdp_err(FSDP_ERR_INTERNAL, "spec: cannot tie %s to unit %d", name, user);
    }
    s->ties[s->n_ties++] = (struct fsdp_tie){.user = user, .owner = s->params[i].unit,
                                             .param = (size_t)i};
    return 0;
}

int fsdp_model_spec_add_head(struct fsdp_model_spec *s, int unit, int tied, const char *embedding,
                             size_t vocab, size_t n_embd, float std)
{
    if (tied) {
        return fsdp_model_spec_tie(s, unit, embedding);
    }
    return fsdp_model_spec_add(s, unit, "lm_head.weight", vocab, n_embd, 2, FSDP_INIT_NORMAL, std,
                               1, FSDP_TP_VOCAB);
}

int fsdp_model_spec_finish(struct fsdp_model_spec *s, int rc, struct fsdp_model_spec **out)
{
    if (rc != 0) {
        fsdp_model_spec_destroy(s);
        return FSDP_ERR_INTERNAL;
    }
    *out = s;
    return 0;
}

void fsdp_model_spec_destroy(struct fsdp_model_spec *s)
{
    if (!s) {
        return;
    }
    free(s->cfg);
    free(s->params);
    free(s->unit_numel);
    free(s->unit_first);
    free(s);
}

size_t fsdp_model_spec_largest(const struct fsdp_model_spec *s)
{
    size_t n = 1;
    for (size_t i = 0; i < s->n_params; i++) {
        n = s->params[i].numel > n ? s->params[i].numel : n;
    }
    return n;
}

long fsdp_model_spec_find(const struct fsdp_model_spec *s, const char *name)
{
    for (size_t i = 0; i < s->n_params; i++) {
        if (strcmp(s->params[i].name, name) == 0) {
            return (long)i;
        }
    }
    return -1;
}

int fsdp_model_spec_range_check(const struct fsdp_model_spec *s, int u, size_t start,
                                size_t count)
{
    if (u < 0 || u >= s->n_units) {
        return fsdp_err(FSDP_ERR_INVALID, "unit %d out of range [0, %d)", u, s->n_units);
    }
    if (start > s->unit_numel[u] || count > s->unit_numel[u] - start) {
        return fsdp_err(FSDP_ERR_INVALID, "range [%zu, %zu + %zu) outside unit %d's %zu elements",
                        start, start, count, u, s->unit_numel[u]);
    }
    return 0;
}

const struct fsdp_tie *fsdp_model_spec_tie_of(const struct fsdp_model_spec *s, int user)
{
    for (int i = 0; i < s->n_ties; i++) {
        if (s->ties[i].user == user) {
            return &s->ties[i];
        }
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// attributes

double fsdp_attr_get(const struct fsdp_attr_desc *a, const void *cfg)
{
    const char *p = (const char *)cfg + a->offset;
    if (a->type == FSDP_ATTR_FLOAT) {
        float f;
        memcpy(&f, p, sizeof(f));
        return f;
    }
    int i;
    memcpy(&i, p, sizeof(i));
    return i;
}

int fsdp_attr_set(const struct fsdp_attr_desc *a, void *cfg, double v)
{
    char *p = (char *)cfg + a->offset;
    if (a->type == FSDP_ATTR_FLOAT) {
        if (!isfinite(v) || fabs(v) > 3.4e38) {
            return fsdp_err(FSDP_ERR_FORMAT, "attribute '%s' = %g is not a finite float", a->name,
                            v);
        }
        float f = (float)v;
        memcpy(p, &f, sizeof(f));
        return 0;
    }
    if (v != floor(v) || v < INT_MIN || v > INT_MAX) {
        return fsdp_err(FSDP_ERR_FORMAT, "attribute '%s' = %g is out of range", a->name, v);
    }
    if (a->type == FSDP_ATTR_BOOL && v != 0 && v != 1) {
        return fsdp_err(FSDP_ERR_FORMAT, "attribute '%s' must be 0 or 1, not %g", a->name, v);
    }
    int i = (int)v;
    memcpy(p, &i, sizeof(i));
    return 0;
}

void fsdp_attrs_format(const struct fsdp_arch *arch, const void *cfg, char *buf, size_t len)
{
    size_t o = 0;
    if (len) {
        buf[0] = '\0';
    }
    for (size_t i = 0; i < arch->n_attrs && o < len; i++) {
        const struct fsdp_attr_desc *a = &arch->attrs[i];
        int n = a->type == FSDP_ATTR_FLOAT
                    ? snprintf(buf + o, len - o, "%s%s %g", i ? ", " : "", a->name,
                               fsdp_attr_get(a, cfg))
                    : snprintf(buf + o, len - o, "%s%s %.0f", i ? ", " : "", a->name,
                               fsdp_attr_get(a, cfg));
        o += n > 0 ? (size_t)n : 0;
    }
}

void fsdp_arch_describe(const struct fsdp_arch *arch, const void *cfg, char *buf, size_t len)
{
    if (arch->describe) {
        arch->describe(cfg, buf, len);
    } else {
        fsdp_attrs_format(arch, cfg, buf, len);
    }
}

int fsdp_attrs_diff(const struct fsdp_arch *arch, const void *a, const void *b)
{
    for (size_t i = 0; i < arch->n_attrs; i++) {
        if (fsdp_attr_get(&arch->attrs[i], a) != fsdp_attr_get(&arch->attrs[i], b)) {
            return (int)i;
        }
    }
    return -1;
}

// ----------------------------------------------------------------------------
// the architecture table

const struct fsdp_arch *fsdp_arch_set_find(const struct fsdp_arch_set *set, const char *name)
{
    for (size_t i = 0; i < set->n; i++) {
        if (strcmp(set->arch[i]->name, name) == 0) {
            return set->arch[i];
        }
    }
    return NULL;
}

void fsdp_arch_set_names(const struct fsdp_arch_set *set, char *buf, size_t len)
{
    size_t o = 0;
    if (len) {
        buf[0] = '\0';
    }
    for (size_t i = 0; i < set->n && o < len; i++) {
        int n = snprintf(buf + o, len - o, "%s%s", i ? ", " : "", set->arch[i]->name);
        o += n > 0 ? (size_t)n : 0;
    }
}

#define ARCH_MAX 16

static struct {
    pthread_mutex_t mu;
    const struct fsdp_arch *arch[ARCH_MAX];
    struct fsdp_arch_set set; /* over arch; entries are only ever appended */
} archs = {.mu = PTHREAD_MUTEX_INITIALIZER, .set = {.arch = archs.arch}};

int fsdp_arch_register(const struct fsdp_arch *arch)
{
    int rc = 0;
    pthread_mutex_lock(&archs.mu);
    const struct fsdp_arch *had = fsdp_arch_set_find(&archs.set, arch->name);
    if (had) {
        rc = had == arch ? 1 : -1; /* the same one again is a no-op */
    } else if (archs.set.n == ARCH_MAX) {
        rc = -2;
    } else {
        archs.arch[archs.set.n++] = arch;
    }
    pthread_mutex_unlock(&archs.mu);
    if (rc == -1) {
        return fsdp_err(FSDP_ERR_INVALID, "architecture '%s' is registered already", arch->name);
    }
    if (rc == -2) {
        return fsdp_err(FSDP_ERR_INVALID, "more than %d architectures", ARCH_MAX);
    }
    return 0;
}

const struct fsdp_arch_set *fsdp_arch_registered(void)
{
    return &archs.set;
}

const struct fsdp_arch *fsdp_arch_find(const char *name)
{
    pthread_mutex_lock(&archs.mu);
    const struct fsdp_arch *a = fsdp_arch_set_find(&archs.set, name);
    pthread_mutex_unlock(&archs.mu);
    return a;
}

const struct fsdp_arch *fsdp_arch_at(int i)
{
    const struct fsdp_arch *a;
    pthread_mutex_lock(&archs.mu);
    a = i >= 0 && (size_t)i < archs.set.n ? archs.arch[i] : NULL;
    pthread_mutex_unlock(&archs.mu);
    return a;
}

void fsdp_arch_names(char *buf, size_t len)
{
    pthread_mutex_lock(&archs.mu);
    fsdp_arch_set_names(&archs.set, buf, len);
    pthread_mutex_unlock(&archs.mu);
}

int fsdp_arch_preset(const char *name, const struct fsdp_arch **arch, void **cfg)
{
    char names[256], tried[1024] = "";
    size_t used = 0;
    *arch = NULL;
    *cfg = NULL;
    fsdp_arch_names(names, sizeof(names));
    for (char *save = NULL, *a = strtok_r(names, ", ", &save); a; a = strtok_r(NULL, ", ", &save)) {
        const struct fsdp_arch *ar = fsdp_arch_find(a);
        if (!ar || !ar->preset) {
            continue;
        }
        void *c = calloc(1, ar->cfg_size);
        if (!c) {
            return fsdp_err(FSDP_ERR_NOMEM, "a %s config", ar->name);
        }
        if (ar->preset(name, c) == 0) {
            fsdp_err_clear();
            *arch = ar;
            *cfg = c;
            return 0;
        }
        free(c);
        /* its presets: the parenthesised list of its message, or the whole message */
        const char *msg = fsdp_err_msg(), *open = strchr(msg, '(');
        size_t len = strlen(msg);
        int whole = !open || len < 2 || msg[len - 1] != ')';
        int n = snprintf(tried + used, sizeof(tried) - used, "%s%s: %.*s", used ? "; " : "",
                         ar->name, whole ? (int)len : (int)(msg + len - 1 - (open + 1)),
                         whole ? msg : open + 1);
        used += n > 0 && (size_t)n < sizeof(tried) - used ? (size_t)n : 0;
        fsdp_err_clear();
    }
    return fsdp_err(FSDP_ERR_INVALID, "unknown preset '%s' (%s)", name, tried);
}
