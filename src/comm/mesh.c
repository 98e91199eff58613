/*
 * mesh.c - the N-dimensional device mesh: parsing "--mesh" and "--backend",
 * the cross-rank agreement check, and one process group per dimension.
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
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Meshes created by this process so far: names this creation's store keys. */
static unsigned mesh_created;

// ----------------------------------------------------------------------------
// parsing

/* Copies the token [b, e) without surrounding blanks into out. */
static void mesh_token(const char *b, const char *e, char *out, size_t len)
{
    while (b < e && isspace((unsigned char)*b)) {
        b++;
    }
    while (e > b && isspace((unsigned char)e[-1])) {
        e--;
    }
    size_t n = (size_t)(e - b) < len - 1 ? (size_t)(e - b) : len - 1;
    memcpy(out, b, n);
    out[n] = '\0';
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

/* Splits "name=value" in place; 0 when there is no '='. */
static int mesh_split(char *tok, char **name, char **value)
{
    char *eq = strchr(tok, '=');
    if (!eq) {
        return 0;
    }
    *eq = '\0';
    char tmp[64];
    mesh_token(tok, eq, tmp, sizeof(tmp));
    memmove(tok, tmp, strlen(tmp) + 1);
    *name = tok;
    *value = eq + 1;
    while (isspace((unsigned char)**value)) {
        (*value)++;
    }
    return 1;
}

int fsdp_mesh_parse(const char *spec, int world_size, struct fsdp_mesh *m)
{
    if (!spec || !m) {
        return fsdp_err(FSDP_ERR_INVALID, "fsdp_mesh_parse: NULL argument");
    }
    memset(m->dims, 0, sizeof(m->dims));
    m->ndims = 0;
    m->spec[0] = '\0';
    long long product = 1;
    const char *p = spec;
    for (int pos = 1;; pos++) {
        const char *end = strchr(p, ',');
        if (!end) {
            end = p + strlen(p);
        }
        char tok[64], *name, *value;
        mesh_token(p, end, tok, sizeof(tok));
        if (!tok[0]) {
            return fsdp_err(FSDP_ERR_INVALID, "mesh '%s': dimension %d is empty (want NAME=SIZE)",
                            spec, pos);
        }
        if (!mesh_split(tok, &name, &value)) {
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
        for (int i = 0; i < m->ndims; i++) {
            if (strcmp(m->dims[i].name, name) == 0) {
                return fsdp_err(FSDP_ERR_INVALID, "mesh '%s': dimension '%s' appears twice", spec,
                                name);
            }
        }
        if (m->ndims == FSDP_MESH_MAX_DIMS) {
            return fsdp_err(FSDP_ERR_INVALID, "mesh '%s': more than %d dimensions", spec,
                            FSDP_MESH_MAX_DIMS);
        }
        struct fsdp_mesh_dim *dim = &m->dims[m->ndims++];
        snprintf(dim->name, sizeof(dim->name), "%s", name);
        dim->size = (int)size;
        product *= size;
        if (product > (1LL << 30)) {
            return fsdp_err(FSDP_ERR_INVALID, "mesh '%s': more than 2^30 ranks", spec);
        }
        size_t used = strlen(m->spec);
        snprintf(m->spec + used, sizeof(m->spec) - used, "%s%s=%d", used ? "," : "", dim->name,
                 dim->size);
        if (!*end) {
            break;
        }
        p = end + 1;
    }
    if (world_size > 0 && product != world_size) {
        char sizes[96] = "";
        for (int i = 0; i < m->ndims; i++) {
            size_t used = strlen(sizes);
            snprintf(sizes + used, sizeof(sizes) - used, "%s%d", i ? " x " : "", m->dims[i].size);
        }
        return fsdp_err(FSDP_ERR_INVALID, "mesh '%s' has %lld ranks (%s) but the world has %d",
                        spec, product, sizes, world_size);
    }
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
    for (int pos = 1;; pos++) {
        const char *end = strchr(p, ',');
        if (!end) {
            end = p + strlen(p);
        }
        char tok[64], *name, *value;
        mesh_token(p, end, tok, sizeof(tok));
        if (!tok[0]) {
            return fsdp_err(FSDP_ERR_INVALID, "--backend '%s': entry %d is empty", spec, pos);
        }
        if (!mesh_split(tok, &name, &value)) {
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
        if (!*end) {
            break;
        }
        p = end + 1;
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

int fsdp_mesh_create(struct fsdp_dist *d, const char *mesh_spec, const char *backend_spec,
                     struct fsdp_mesh **out)
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
    int rc, parse_rc = fsdp_mesh_parse(mesh_spec, d->world_size, m);
    if (parse_rc == 0) {
        parse_rc = mesh_parse_backends(backend_spec, dflt, m);
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
