/*
 * hf_map.c - reading an architecture's Hugging Face map (hf_map.h): names,
 * layouts and the lookup of an architecture by model_type over the
 * registered ones. Knows no architecture.
 */
#include "config.h"
#include "core/hf_map.h"
#include "core/error.h"

#include <stdio.h>
#include <string.h>

const struct fsdp_hf_map *fsdp_arch_hf(const struct fsdp_arch *a)
{
    size_t need = offsetof(struct fsdp_arch, hf) + sizeof(a->hf);
    if (!a || a->size < need || !a->hf) {
        return NULL;
    }
    /* the members every map has (size, through config_write) */
    size_t base = offsetof(struct fsdp_hf_map, config_write) + sizeof(a->hf->config_write);
    return a->hf->size >= base ? a->hf : NULL;
}

const struct fsdp_arch *fsdp_hf_arch_of(const char *model_type, const char **name)
{
    const struct fsdp_arch *a;
    for (int i = 0; (a = fsdp_arch_at(i)) != NULL; i++) {
        const struct fsdp_hf_map *m = fsdp_arch_hf(a);
        for (size_t k = 0; m && m->model_types && m->model_types[k]; k++) {
            if (strcmp(m->model_types[k], model_type) == 0) {
                if (name) {
                    *name = m->model_types[k];
                }
                return a;
            }
        }
    }
    return NULL;
}

/* Appends s to buf[*o..len) after sep. */
static void hf_append(char *buf, size_t len, size_t *o, const char *sep, const char *s)
{
    if (*o < len) {
        int n = snprintf(buf + *o, len - *o, "%s%s", sep, s);
        *o += n > 0 ? (size_t)n : 0;
    }
}

void fsdp_hf_model_types(char *buf, size_t len)
{
    const struct fsdp_arch *a;
    size_t o = 0;
    if (len) {
        buf[0] = '\0';
    }
    for (int i = 0; (a = fsdp_arch_at(i)) != NULL; i++) {
        const struct fsdp_hf_map *m = fsdp_arch_hf(a);
        for (size_t k = 0; m && m->model_types && m->model_types[k]; k++) {
            hf_append(buf, len, &o, o ? ", " : "", m->model_types[k]);
        }
    }
}

void fsdp_hf_arch_names(char *buf, size_t len)
{
    const struct fsdp_arch *a, *with[16];
    int n = 0;
    size_t o = 0;
    if (len) {
        buf[0] = '\0';
    }
    for (int i = 0; (a = fsdp_arch_at(i)) != NULL && n < 16; i++) {
        if (fsdp_arch_hf(a)) {
            with[n++] = a;
        }
    }
    for (int i = 0; i < n; i++) {
        hf_append(buf, len, &o, i == 0 ? "" : i == n - 1 ? " and " : ", ", with[i]->name);
    }
}

static int hf_ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n > t && strcmp(s + n - t, tail) == 0;
}

static int hf_ends_with_any(const char *s, const char *const *tails)
{
    for (size_t k = 0; tails && tails[k]; k++) {
        if (hf_ends_with(s, tails[k])) {
            return 1;
        }
    }
    return 0;
}

void fsdp_hf_param_name(const struct fsdp_hf_map *m, const struct fsdp_param_spec *p, char *buf,
                        size_t len)
{
    int bare = !m->prefix || (m->head && strcmp(p->name, m->head) == 0);
    snprintf(buf, len, "%s%s", bare ? "" : m->prefix, p->name);
}

int fsdp_hf_param_transposed(const struct fsdp_hf_map *m, const struct fsdp_param_spec *p)
{
    return p->ndim == 2 && hf_ends_with_any(p->name, m->transposed);
}

/* In tiles, so that both sides stay in the cache (a Conv1D weight's rows
 * are kilobytes apart). */
void fsdp_hf_transpose(float *dst, const float *src, size_t rows, size_t cols)
{
    enum { TILE = 32 };
    for (size_t r0 = 0; r0 < rows; r0 += TILE) {
        size_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
        for (size_t c0 = 0; c0 < cols; c0 += TILE) {
            size_t c1 = c0 + TILE < cols ? c0 + TILE : cols;
            for (size_t r = r0; r < r1; r++) {
                for (size_t c = c0; c < c1; c++) {
                    dst[r * cols + c] = src[c * rows + r];
                }
            }
        }
    }
}

int fsdp_hf_param_export(const struct fsdp_hf_map *m, const struct fsdp_param_spec *p,
                         const float *a, enum fsdp_dtype dtype, float *tr, void *h,
                         const void **out)
{
    const float *f = a;
    if (fsdp_hf_param_transposed(m, p)) {
        fsdp_hf_transpose(tr, a, p->shape[1], p->shape[0]);
        f = tr;
    }
    if (dtype == FSDP_F32) {
        *out = f;
        return 0;
    }
    FSDP_CHECK(fsdp_convert(h, dtype, f, FSDP_F32, p->numel));
    *out = h;
    return 0;
}

void fsdp_hf_param_shape(const struct fsdp_hf_map *m, const struct fsdp_param_spec *p,
                         size_t shape[2])
{
    int tr = fsdp_hf_param_transposed(m, p);
    shape[0] = tr ? p->shape[1] : p->shape[0];
    shape[1] = tr ? p->shape[0] : p->shape[1];
}

const char *fsdp_hf_bare(const struct fsdp_hf_map *m, const char *name)
{
    size_t pl = m->prefix ? strlen(m->prefix) : 0;
    return pl && strncmp(name, m->prefix, pl) == 0 ? name + pl : name;
}

int fsdp_hf_is_buffer(const struct fsdp_hf_map *m, const char *name)
{
    return hf_ends_with_any(fsdp_hf_bare(m, name), m->buffers);
}
