/*
 * mesh.c - the N-dimensional device mesh: its dimensions from "--mesh"
 * (parsed by mesh_spec.c) and the world size, a backend per dimension from
 * "--backend", the cross-rank agreement check, and one process group per
 * dimension.
 *
 * Ranks are laid out row-major like torch's init_device_mesh: the last
 * dimension varies fastest, so with dp=2,tp=2 the tp groups are {0,1} {2,3}
 * and the dp groups {0,2} {1,3}. The group of dimension d holds the ranks
 * that share this rank's coordinates in every other dimension; it is named
 * "<d>[<slice>]", slices numbered row-major over the other dimensions.
 *
 * Agreement comes before any group is created, so that a rank launched with
 * another mesh or backend fails every rank with one clear message instead of
 * hanging them in a backend's connection setup. Each rank reads rank 0's
 * normalized specs from the store (O(1) per rank); a rank that differs adds
 * itself to a counter, the first one publishes its specs, and after a store
 * barrier every rank reads the counter and, when it is not zero, the first
 * disagreeing rank's specs.
 */
#include "config.h"
#include "comm/mesh.h"
#include "core/error.h"
#include "core/log.h"
#include "rendezvous/dist.h"
#include "rendezvous/store.h"

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Meshes created by this process so far: names this creation's store keys. */
static unsigned mesh_created;

// ----------------------------------------------------------------------------
// parsing (the syntax is mesh_spec.c's)

/* The dimensions of mesh_spec, which must cover the world exactly. */
static int mesh_parse_dims(const char *spec, int world_size, struct fsdp_mesh *m)
{
    struct fsdp_mesh_dims dims;
    FSDP_CHECK(fsdp_mesh_parse(spec, &dims));
    FSDP_CHECK(fsdp_mesh_check_world(spec, &dims, world_size));
    m->ndims = dims.ndims;
    for (int i = 0; i < dims.ndims; i++) {
        snprintf(m->dims[i].name, sizeof(m->dims[i].name), "%s", dims.name[i]);
        m->dims[i].size = dims.size[i];
    }
    snprintf(m->spec, sizeof(m->spec), "%s", dims.spec);
    return 0;
}

static const struct fsdp_backend_ops *mesh_find_backend(const char *spec, const char *name,
                                                        int *rc)
{
    const struct fsdp_backend_ops *ops = fsdp_backend_find(name);
    if (!ops) {
        *rc = fsdp_err(FSDP_ERR_INVALID, "backend '%s' (in --backend '%s') is unknown; this build "
                                         "has: %s",
                       name, spec, fsdp_backend_names());
    }
    return ops;
}

/*
 * "tcp" (every dimension), "dp=tcp,tp=mpi" (per dimension; the others get
 * dflt) or "tcp,tp=mpi" (a default and overrides). Fills dims[].ops and the
 * normalized m->backends: one name when all dimensions agree, else a list.
 */
static int mesh_parse_backends(const char *spec, const struct fsdp_backend_ops *dflt,
                               struct fsdp_mesh *m)
{
    const struct fsdp_backend_ops *chosen[FSDP_MESH_MAX_DIMS] = {NULL};
    int have_default = 0, rc = 0;
    const char *p = spec;
    for (int pos = 1; p; pos++) {
        char tok[64], *name, *value;
        p = fsdp_mesh_spec_entry(p, tok, sizeof(tok), &name, &value);
        if (!value && !tok[0]) {
            return fsdp_err(FSDP_ERR_INVALID, "--backend '%s': entry %d is empty", spec, pos);
        }
        if (!value) {
            if (have_default++) {
                return fsdp_err(FSDP_ERR_INVALID,
                                "--backend '%s': two defaults; name dimensions as DIM=BACKEND",
                                spec);
            }
            if (!(dflt = mesh_find_backend(spec, tok, &rc))) {
                return rc;
            }
        } else {
            int d = fsdp_mesh_dim_index(m, name);
            if (d < 0) {
                return fsdp_err(FSDP_ERR_INVALID,
                                "--backend '%s' names dimension '%s', which mesh %s does not have",
                                spec, name, m->spec);
            }
            if (chosen[d]) {
                return fsdp_err(FSDP_ERR_INVALID, "--backend '%s' names dimension '%s' twice",
                                spec, name);
            }
            if (!(chosen[d] = mesh_find_backend(spec, value, &rc))) {
                return rc;
            }
        }
    }
    int uniform = 1;
    for (int i = 0; i < m->ndims; i++) {
        m->dims[i].ops = chosen[i] ? chosen[i] : dflt;
        uniform &= m->dims[i].ops == m->dims[0].ops;
    }
    m->backends[0] = '\0';
    if (uniform) {
        snprintf(m->backends, sizeof(m->backends), "%s", m->dims[0].ops->name);
        return 0;
    }
    for (int i = 0; i < m->ndims; i++) {
        size_t used = strlen(m->backends);
        snprintf(m->backends + used, sizeof(m->backends) - used, "%s%s=%s", i ? "," : "",
                 m->dims[i].name, m->dims[i].ops->name);
    }
    return 0;
}

int fsdp_mesh_dim_index(const struct fsdp_mesh *m, const char *name)
{
    for (int i = 0; m && name && i < m->ndims; i++) {
        if (strcmp(m->dims[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

struct fsdp_group *fsdp_mesh_group(struct fsdp_mesh *m, const char *name)
{
    int i = fsdp_mesh_dim_index(m, name);
    return i < 0 ? NULL : m->dims[i].group;
}

// ----------------------------------------------------------------------------
// agreement across ranks

/* "<mesh>\n<backend>", each half with control characters made visible, so
 * that the two split cleanly on every rank. */
static void mesh_record(char *out, size_t len, const char *mesh, const char *backends)
{
    size_t n = 0;
    for (int half = 0; half < 2; half++) {
        for (const char *c = half ? backends : mesh; *c && n + 2 < len; c++) {
            out[n++] = iscntrl((unsigned char)*c) ? '?' : *c;
        }
        if (half == 0) {
            out[n++] = '\n';
        }
    }
    out[n] = '\0';
}

/* Splits a record (or "<rank>\n<record>") for a message. */
static void mesh_record_parts(char *rec, const char **mesh, const char **backends)
{
    char *nl = strchr(rec, '\n');
    *mesh = rec;
    *backends = "?";
    if (nl) {
        *nl = '\0';
        *backends = nl + 1;
    }
}

static int mesh_store_get_str(struct fsdp_store *s, const char *key, double timeout_s, char *out,
                              size_t len)
{
    void *val;
    size_t n;
    FSDP_CHECK(fsdp_store_get(s, key, &val, &n, timeout_s));
    n = n < len - 1 ? n : len - 1;
    memcpy(out, val, n);
    out[n] = '\0';
    free(val);
    return 0;
}

/*
 * Every rank learns whether all ranks hold the same record as rank 0. On a
 * disagreement every rank returns FSDP_ERR_MISMATCH with the same message.
 */
static int mesh_agree(struct fsdp_dist *d, unsigned k, const char *mine)
{
    struct fsdp_store *s = d->store;
    double t = d->timeout_s;
    char key[64], theirs[512];
    snprintf(key, sizeof(key), "mesh%u/rank0", k);
    if (d->rank == 0) {
        FSDP_CHECK(fsdp_store_set(s, key, mine, strlen(mine)));
    } else {
        FSDP_CHECK(mesh_store_get_str(s, key, t, theirs, sizeof(theirs)));
        if (strcmp(theirs, mine) != 0) {
            int64_t nth;
            snprintf(key, sizeof(key), "mesh%u/disagree", k);
            FSDP_CHECK(fsdp_store_add(s, key, 1, &nth));
            if (nth == 1) {
                char first[600];
                snprintf(first, sizeof(first), "%d\n%s", d->rank, mine);
                snprintf(key, sizeof(key), "mesh%u/first", k);
                FSDP_CHECK(fsdp_store_set(s, key, first, strlen(first)));
            }
        }
    }
    snprintf(key, sizeof(key), "mesh%u/checked", k);
    FSDP_CHECK(fsdp_store_barrier(s, key, d->world_size, t));

    int64_t ndis;
    snprintf(key, sizeof(key), "mesh%u/disagree", k);
    FSDP_CHECK(fsdp_store_add(s, key, 0, &ndis));
    if (ndis == 0) {
        return 0;
    }
    char first[600], zero[512];
    snprintf(key, sizeof(key), "mesh%u/first", k);
    FSDP_CHECK(mesh_store_get_str(s, key, t, first, sizeof(first)));
    snprintf(key, sizeof(key), "mesh%u/rank0", k);
    FSDP_CHECK(mesh_store_get_str(s, key, t, zero, sizeof(zero)));
    char *rec = strchr(first, '\n');
    const char *bad_mesh, *bad_be, *zero_mesh, *zero_be;
    if (rec) {
        *rec++ = '\0';
    } else {
        rec = first;
    }
    mesh_record_parts(rec, &bad_mesh, &bad_be);
    mesh_record_parts(zero, &zero_mesh, &zero_be);
    char others[64] = "";
    if (ndis > 1) {
        snprintf(others, sizeof(others), "; %lld ranks in all differ from rank 0",
                 (long long)ndis);
    }
    return fsdp_err(FSDP_ERR_MISMATCH,
                    "ranks disagree on the mesh: rank %s has mesh %s (backend %s) but rank 0 has "
                    "%s (backend %s)%s; launch every rank with the same --mesh and --backend",
                    first, bad_mesh, bad_be, zero_mesh, zero_be, others);
}

// ----------------------------------------------------------------------------
// groups

/* The world ranks of this rank's slice along dimension dim (ascending) and
 * the slice's index among the dimension's slices. */
static void mesh_slice(const struct fsdp_mesh *m, int rank, int dim, int *ranks, int *slice)
{
    int stride[FSDP_MESH_MAX_DIMS] = {0};
    int s = 1;
    for (int i = m->ndims - 1; i >= 0; i--) {
        stride[i] = s;
        s *= m->dims[i].size;
    }
    int base = rank - m->dims[dim].coord * stride[dim];
    for (int j = 0; j < m->dims[dim].size; j++) {
        ranks[j] = base + j * stride[dim];
    }
    int idx = 0;
    for (int i = 0; i < m->ndims; i++) {
        if (i != dim) {
            idx = idx * m->dims[i].size + m->dims[i].coord;
        }
    }
    *slice = idx;
}

static int mesh_create_groups(struct fsdp_mesh *m)
{
    struct fsdp_dist *d = m->dist;
    int rem = d->rank;
    for (int i = m->ndims - 1; i >= 0; i--) {
        m->dims[i].coord = rem % m->dims[i].size;
        rem /= m->dims[i].size;
    }
    for (int i = 0; i < m->ndims; i++) {
        struct fsdp_mesh_dim *dim = &m->dims[i];
        int *ranks = malloc((size_t)dim->size * sizeof(int));
        if (!ranks) {
            return fsdp_err(FSDP_ERR_NOMEM, "mesh %s: out of memory", m->spec);
        }
        int slice;
        char name[64];
        mesh_slice(m, d->rank, i, ranks, &slice);
        snprintf(name, sizeof(name), "%s[%d]", dim->name, slice);
        int rc = fsdp_group_create(d, name, ranks, dim->size, dim->ops, &dim->group);
        free(ranks);
        FSDP_CHECK(rc);
        FSDP_INFO(FSDP_SUB_DIST, "dim %s: backend %s, %d group%s of %d", dim->name, dim->ops->name,
                  d->world_size / dim->size, d->world_size / dim->size == 1 ? "" : "s",
                  dim->size);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// create / destroy

static const char *mesh_mem_name(uint32_t caps)
{
    return caps & FSDP_CAP_MEM_CUDA ? (caps & FSDP_CAP_MEM_HOST ? "host or CUDA" : "CUDA device")
                                    : "host";
}

/* Every dimension's backend must take the memory the caller's buffers are in. */
static int mesh_check_mem(const struct fsdp_mesh *m, const char *backend_spec, uint32_t mem_cap)
{
    for (int i = 0; mem_cap && i < m->ndims; i++) {
        const struct fsdp_backend_ops *ops = m->dims[i].ops;
        uint32_t caps = ops->size >= offsetof(struct fsdp_backend_ops, mem_caps) +
                                         sizeof(ops->mem_caps)
                            ? ops->mem_caps
                            : FSDP_CAP_MEM_HOST;
        if (!(caps & mem_cap)) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED,
                            "--backend %s: backend %s (dimension %s) takes %s memory only, and "
                            "this run's buffers are in %s memory: choose another backend for %s",
                            backend_spec, ops->name, m->dims[i].name, mesh_mem_name(caps),
                            mesh_mem_name(mem_cap), m->dims[i].name);
        }
    }
    return 0;
}

int fsdp_mesh_create(struct fsdp_dist *d, const char *mesh_spec, const char *backend_spec,
                     struct fsdp_mesh **out)
{
    return fsdp_mesh_create_for(d, mesh_spec, backend_spec, 0, out);
}

int fsdp_mesh_create_for(struct fsdp_dist *d, const char *mesh_spec, const char *backend_spec,
                         uint32_t mem_cap, struct fsdp_mesh **out)
{
    if (!d || !out) {
        return fsdp_err(FSDP_ERR_INVALID, "fsdp_mesh_create: NULL argument");
    }
    const char *dflt_name = fsdp_dist_mpi_available() ? "mpi" : "tcp";
    const struct fsdp_backend_ops *dflt = fsdp_backend_find(dflt_name);
    if (!dflt) {
        return fsdp_err(FSDP_ERR_INTERNAL, "mesh: default backend %s is not compiled in",
                        dflt_name);
    }
    char dflt_mesh[32];
    if (!mesh_spec) {
        snprintf(dflt_mesh, sizeof(dflt_mesh), "dp=%d", d->world_size);
        mesh_spec = dflt_mesh;
    }
    if (!backend_spec) {
        backend_spec = dflt->name;
    }
    struct fsdp_mesh *m = calloc(1, sizeof(*m));
    if (!m) {
        return fsdp_err(FSDP_ERR_NOMEM, "mesh: out of memory");
    }
    m->dist = d;

    /* A spec this rank cannot parse still takes part in the agreement (as
     * written), so that one bad rank fails all ranks instead of hanging them. */
    char err[512] = "", mine[512];
    int rc, parse_rc = mesh_parse_dims(mesh_spec, d->world_size, m);
    if (parse_rc == 0) {
        parse_rc = mesh_parse_backends(backend_spec, dflt, m);
    }
    if (parse_rc == 0) {
        parse_rc = mesh_check_mem(m, backend_spec, mem_cap);
    }
    if (parse_rc < 0) {
        fsdp_err_take(err, sizeof(err));
        mesh_record(mine, sizeof(mine), mesh_spec, backend_spec);
    } else {
        mesh_record(mine, sizeof(mine), m->spec, m->backends);
    }
    unsigned k = mesh_created++;
    if (d->world_size > 1) {
        FSDP_CHECK_GOTO(mesh_agree(d, k, mine), rc, err_free);
    }
    if (parse_rc < 0) {
        /* every rank holds the same spec, so every rank fails here alike */
        rc = fsdp_err(parse_rc, "%s", err);
        goto err_free;
    }
    FSDP_CHECK_GOTO(mesh_create_groups(m), rc, err_groups);
    *out = m;
    return 0;

err_groups:
    fsdp_mesh_destroy(m);
    return rc;
err_free:
    free(m);
    return rc;
}

void fsdp_mesh_destroy(struct fsdp_mesh *m)
{
    if (!m) {
        return;
    }
    for (int i = m->ndims - 1; i >= 0; i--) {
        fsdp_group_destroy(m->dims[i].group);
        m->dims[i].group = NULL;
    }
    free(m);
}
