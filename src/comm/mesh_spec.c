/*
 * mesh_spec.c - parsing mesh specs ("rdp=2,dp=2") and the entries of
 * comma-separated "NAME=VALUE" lists that --backend shares with them.
 *
 * Kept apart from mesh.c, which creates groups and so reaches the backends
 * and MPI: a tool that only reads a spec (fsdpc-ckpt reshard) links this
 * file alone. Nothing here knows ranks; mesh.c checks the world size and
 * agreement across ranks.
 */
#include "config.h"
#include "comm/mesh_spec.h"
#include "core/error.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fsdp_mesh_spec_entry(const char *p, char *tok, size_t len, char **name, char **value)
{
    const char *end = strchr(p, ',');
    const char *next = end ? end + 1 : NULL;
    if (!end) {
        end = p + strlen(p);
    }
    while (p < end && isspace((unsigned char)*p)) {
        p++;
    }
    while (end > p && isspace((unsigned char)end[-1])) {
        end--;
    }
    size_t n = (size_t)(end - p) < len - 1 ? (size_t)(end - p) : len - 1;
    memcpy(tok, p, n);
    tok[n] = '\0';

    *name = tok;
    *value = NULL;
    char *eq = strchr(tok, '=');
    if (eq) {
        /* tok has no leading blanks: only the name's tail and the value's
         * head can hold any */
        char *name_end = eq;
        while (name_end > tok && isspace((unsigned char)name_end[-1])) {
            name_end--;
        }
        *name_end = '\0';
        *value = eq + 1;
        while (isspace((unsigned char)**value)) {
            (*value)++;
        }
    }
    return next;
}

static int mesh_name_ok(const char *s)
{
    if (!(*s >= 'a' && *s <= 'z') || strlen(s) >= FSDP_MESH_NAME_MAX) {
        return 0;
    }
    for (; *s; s++) {
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_')) {
            return 0;
        }
    }
    return 1;
}

/* Appends dimension name=value (entry pos of spec) to out after checking it. */
static int mesh_add_dim(const char *spec, int pos, const char *tok, const char *name,
                        const char *value, struct fsdp_mesh_dims *out)
{
    if (!value && !tok[0]) {
        return fsdp_err(FSDP_ERR_INVALID, "mesh '%s': dimension %d is empty (want NAME=SIZE)",
                        spec, pos);
    }
    if (!value) {
        return fsdp_err(FSDP_ERR_INVALID, "mesh '%s': '%s' is not NAME=SIZE (e.g. dp=4,tp=2)",
                        spec, tok);
    }
    if (!mesh_name_ok(name)) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "mesh '%s': dimension name '%s' must match [a-z][a-z0-9_]* and be at "
                        "most %d characters",
                        spec, name, FSDP_MESH_NAME_MAX - 1);
    }
    char *stop;
    errno = 0;
    long size = strtol(value, &stop, 10);
    if (errno || stop == value || *stop || size < 1 || size > (1L << 24)) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "mesh '%s': size '%s' of dimension '%s' is not a positive integer", spec,
                        value, name);
    }
    for (int i = 0; i < out->ndims; i++) {
        if (strcmp(out->name[i], name) == 0) {
            return fsdp_err(FSDP_ERR_INVALID, "mesh '%s': dimension '%s' appears twice", spec,
                            name);
        }
    }
    if (out->ndims == FSDP_MESH_MAX_DIMS) {
        return fsdp_err(FSDP_ERR_INVALID, "mesh '%s': more than %d dimensions", spec,
                        FSDP_MESH_MAX_DIMS);
    }
    int d = out->ndims++;
    snprintf(out->name[d], sizeof(out->name[d]), "%s", name);
    out->size[d] = (int)size;
    out->nranks *= size;
    if (out->nranks > (1LL << 30)) {
        return fsdp_err(FSDP_ERR_INVALID, "mesh '%s': more than 2^30 ranks", spec);
    }
    size_t used = strlen(out->spec);
    snprintf(out->spec + used, sizeof(out->spec) - used, "%s%s=%d", used ? "," : "",
             out->name[d], out->size[d]);
    return 0;
}

int fsdp_mesh_parse(const char *spec, struct fsdp_mesh_dims *out)
{
    if (!spec || !out) {
        return fsdp_err(FSDP_ERR_INVALID, "fsdp_mesh_parse: NULL argument");
    }
    memset(out, 0, sizeof(*out));
    out->nranks = 1;
    const char *p = spec;
    for (int pos = 1; p; pos++) {
        char tok[64], *name, *value;
        p = fsdp_mesh_spec_entry(p, tok, sizeof(tok), &name, &value);
        FSDP_CHECK(mesh_add_dim(spec, pos, tok, name, value, out));
    }
    return 0;
}

int fsdp_mesh_check_world(const char *spec, const struct fsdp_mesh_dims *dims, int world_size)
{
    if (dims->nranks == world_size) {
        return 0;
    }
    char sizes[96] = "";
    for (int i = 0; i < dims->ndims; i++) {
        size_t used = strlen(sizes);
        snprintf(sizes + used, sizeof(sizes) - used, "%s%d", i ? " x " : "", dims->size[i]);
    }
    return fsdp_err(FSDP_ERR_INVALID, "mesh '%s' has %lld ranks (%s) but the world has %d", spec,
                    dims->nranks, sizes, world_size);
}
