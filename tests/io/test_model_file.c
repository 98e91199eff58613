/*
 * test_model_file.c - model files: bit-identical round trips (tied and
 * untied), row and block reads, f16/bf16/f64 storage converted on read,
 * config mismatches, and the writer's tmp + rename commit.
 * (Damaged files are covered by test_ckpt_tool.sh through fsdpc-ckpt inspect.)
 */
#include "config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/h5/model_file.h"
#include "model/gpt2_spec.h"
#include "model/model.h"
#include "tests/tap.h"

#include <hdf5.h>

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static const char *tpath(const char *name)
{
    static char buf[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

/* Entries of dir named "<name>.tmp..." (a writer's temporaries); the first
 * one's name into first. */
static int tmp_entries(const char *name, char *first, size_t len)
{
    char prefix[128];
    int n = 0;
    snprintf(prefix, sizeof(prefix), "%s.tmp", name);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && n++ == 0 && first) {
            snprintf(first, len, "%s", e->d_name);
        }
    }
    if (d) {
        closedir(d);
    }
    return n;
}

static uint64_t rng_state = 0x1234567;

static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* Random bit patterns (finite), plus signed zeros and subnormals. */
static float rnd_float(size_t i)
{
    if (i % 97 == 5) {
        return -0.0f;
    }
    if (i % 89 == 3) {
        return 1e-41f;
    }
    float f;
    uint32_t u;
    do {
        u = rnd() ^ (rnd() << 16);
        memcpy(&f, &u, 4);
    } while (!isfinite(f));
    return f;
}

struct model {
    struct fsdp_model_spec *spec;
    float **units; /* (n_units,) */
};

static void model_make(struct model *m, int tied)
{
    struct fsdp_gpt2_config c = {.vocab_size = 67, .context = 16, .n_layer = 2, .n_head = 2,
                                 .n_embd = 24, .ln_eps = 1e-5f, .tied = tied};
    if (fsdp_gpt2_spec_create(&c, &m->spec) < 0) {
        tap_diag("spec: %s", fsdp_err_msg());
        exit(1);
    }
    m->units = calloc((size_t)m->spec->n_units, sizeof(float *));
    for (int u = 0; u < m->spec->n_units; u++) {
        m->units[u] = malloc(m->spec->unit_numel[u] * sizeof(float));
        for (size_t i = 0; i < m->spec->unit_numel[u]; i++) {
            m->units[u][i] = rnd_float(i);
        }
    }
}

static float **units_like(const struct model *m)
{
    float **u = calloc((size_t)m->spec->n_units, sizeof(float *));
    for (int k = 0; k < m->spec->n_units; k++) {
        u[k] = malloc(m->spec->unit_numel[k] * sizeof(float));
        memset(u[k], 0xff, m->spec->unit_numel[k] * sizeof(float));
    }
    return u;
}

static void units_free(const struct model *m, float **u)
{
    for (int k = 0; k < m->spec->n_units; k++) {
        free(u[k]);
    }
    free(u);
}

/* Bitwise compare; diag names the first differing element. */
static int same_bits(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], 4) != 0) {
            tap_diag("%s: first difference at %zu: %a vs %a", what, i, (double)a[i],
                     (double)b[i]);
            return 0;
        }
    }
    return 1;
}

static int units_equal(const struct model *m, float **got)
{
    char what[32];
    for (int u = 0; u < m->spec->n_units; u++) {
        snprintf(what, sizeof(what), "unit %d", u);
        if (!same_bits(m->units[u], got[u], m->spec->unit_numel[u], what)) {
            return 0;
        }
    }
    return 1;
}

static void test_round_trip(int tied)
{
    struct model m;
    const char *path = tpath(tied ? "tied.h5" : "untied.h5");
    struct fsdp_model_write_opts o = {.created_by = "test_model_file", .dtype = FSDP_F32};
    model_make(&m, tied);
    int rc = fsdp_model_file_write(path, m.spec, (const float *const *)m.units, &o);
    tap_ok(rc == 0, "%s: write (%s)", tied ? "tied" : "untied", fsdp_err_msg());
    tap_ok(tmp_entries(tied ? "tied.h5" : "untied.h5", NULL, 0) == 0,
           "%s: no temporary left after commit", tied ? "tied" : "untied");

    /* io knows the architectures its caller hands it, and no others */
    struct fsdp_model_spec *rs = NULL;
    const struct fsdp_arch_set only = {&m.spec->arch, 1}, none = {NULL, 0};
    rc = fsdp_model_file_read_spec(path, &only, &rs);
    tap_ok(rc == 0 && rs->arch == m.spec->arch &&
               memcmp(rs->cfg, m.spec->cfg, sizeof(struct fsdp_gpt2_config)) == 0 &&
               rs->n_params == m.spec->n_params,
           "%s: read_spec", tied ? "tied" : "untied");
    fsdp_model_spec_destroy(rs);
    rs = NULL;
    rc = fsdp_model_file_read_spec(path, &none, &rs);
    tap_ok(rc == FSDP_ERR_FORMAT && !rs &&
               strstr(fsdp_err_msg(), "attribute 'architecture' is "
                                      "'gpt2'; supported architectures: "),
           "%s: an architecture the caller did not hand over is refused (%s)",
           tied ? "tied" : "untied", fsdp_err_msg());
    fsdp_err_clear();

    float **got = units_like(&m);
    rc = fsdp_model_file_read(path, fsdp_arch_registered(), m.spec, got);
    tap_ok(rc == 0 && units_equal(&m, got), "%s: read is bit-identical (%s)",
           tied ? "tied" : "untied", fsdp_err_msg());

    struct fsdp_model_file *mf;
    rc = fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    tap_ok(rc == 0, "%s: open", tied ? "tied" : "untied");
    if (rc < 0) {
        fsdp_err_clear();
        return;
    }
    const struct fsdp_model_spec *fs = fsdp_model_file_spec(mf);
    tap_ok(fs->n_params == m.spec->n_params && fs->total_numel == m.spec->total_numel &&
               (fsdp_model_spec_find(fs, "lm_head.weight") >= 0) == !tied,
           "%s: file spec has %zu tensors", tied ? "tied" : "untied", fs->n_params);
    tap_ok(strcmp(fsdp_model_file_created_by(mf), "test_model_file") == 0 &&
               strcmp(fsdp_model_file_tensor_dtype(mf, 0), "f32") == 0,
           "created_by and dtype");

    /* rows of a 2-D and a 1-D tensor, a column block, and bad ranges */
    long wi = fsdp_model_spec_find(fs, "h.1.mlp.c_fc.weight");
    const struct fsdp_param_spec *p = &fs->params[wi];
    const float *ref = m.units[p->unit] + p->offset;
    float buf[4096];
    rc = fsdp_model_file_read_rows(mf, p->name, 5, 7, buf);
    tap_ok(rc == 0 && same_bits(ref + 5 * p->shape[1], buf, 7 * p->shape[1], "rows"),
           "read_rows 2-D rows [5, 12)");
    long bi = fsdp_model_spec_find(fs, "h.0.attn.c_attn.bias");
    const struct fsdp_param_spec *pb = &fs->params[bi];
    rc = fsdp_model_file_read_rows(mf, pb->name, 10, pb->shape[0] - 10, buf);
    tap_ok(rc == 0 &&
               same_bits(m.units[pb->unit] + pb->offset + 10, buf, pb->shape[0] - 10, "bias"),
           "read_rows 1-D tail");
    rc = fsdp_model_file_read_block(mf, (size_t)wi, 3, 4, 6, 9, buf);
    int ok = rc == 0;
    for (size_t r = 0; ok && r < 4; r++) {
        ok = same_bits(ref + (3 + r) * p->shape[1] + 6, buf + r * 9, 9, "block");
    }
    tap_ok(ok, "read_block rows [3, 7) x cols [6, 15)");
    rc = fsdp_model_file_read_rows(mf, p->name, p->shape[0] - 1, 2, buf);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "outside h.1.mlp.c_fc.weight"),
           "rows past the end rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_model_file_read_rows(mf, "h.9.ln_1.weight", 0, 1, buf);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "no parameter named"),
           "unknown tensor rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_model_file_close(mf);

    /* a spec that disagrees with the file */
    struct fsdp_gpt2_config c2 = *fsdp_gpt2_cfg(m.spec);
    struct fsdp_model_spec *s2;
    c2.n_layer = 3;
    fsdp_gpt2_spec_create(&c2, &s2);
    rc = fsdp_model_file_read(path, fsdp_arch_registered(), s2, got);
    tap_ok(rc == FSDP_ERR_MISMATCH && strstr(fsdp_err_msg(), "n_layer is 2 in the file"),
           "config mismatch named: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_model_spec_destroy(s2);
    units_free(&m, got);
    units_free(&m, m.units);
    fsdp_model_spec_destroy(m.spec);
}

/* f16 / bf16 stored by our writer: reads give exactly the rounded values. */
static void test_half_storage(enum fsdp_dtype dt)
{
    struct model m;
    const char *path = tpath(dt == FSDP_F16 ? "f16.h5" : "bf16.h5");
    struct fsdp_model_write_opts o = {.created_by = NULL, .dtype = dt};
    model_make(&m, 0);
    for (int u = 0; u < m.spec->n_units; u++) {
        for (size_t i = 0; i < m.spec->unit_numel[u]; i++) {
            m.units[u][i] = (float)((int)(rnd() % 20001) - 10000) * 1e-3f;
        }
    }
    int rc = fsdp_model_file_write(path, m.spec, (const float *const *)m.units, &o);
    tap_ok(rc == 0, "%s: write", fsdp_dtype_name(dt));
    float **got = units_like(&m);
    rc = fsdp_model_file_read(path, fsdp_arch_registered(), m.spec, got);
    /* expected: f32 -> 16 bit (round to nearest even) -> f32 */
    for (int u = 0; u < m.spec->n_units; u++) {
        size_t n = m.spec->unit_numel[u];
        uint16_t *h = malloc(n * 2);
        fsdp_convert(h, dt, m.units[u], FSDP_F32, n);
        fsdp_convert(m.units[u], FSDP_F32, h, dt, n);
        free(h);
    }
    tap_ok(rc == 0 && units_equal(&m, got), "%s: read converts to the rounded f32 values",
           fsdp_dtype_name(dt));
    struct fsdp_model_file *mf;
    rc = fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    tap_ok(rc == 0 && strcmp(fsdp_model_file_tensor_dtype(mf, 0), fsdp_dtype_name(dt)) == 0 &&
               fsdp_model_file_tensor_bytes(mf, 0) == m.spec->params[0].numel * 2,
           "%s: dtype and bytes reported", fsdp_dtype_name(dt));
    float row[64];
    const struct fsdp_param_spec *p = &m.spec->params[0];
    rc = fsdp_model_file_read_rows(mf, p->name, 66, 1, row);
    tap_ok(rc == 0 && same_bits(m.units[0] + 66 * p->shape[1], row, p->shape[1], "row"),
           "%s: last row of wte via read_rows", fsdp_dtype_name(dt));
    fsdp_model_file_close(mf);
    units_free(&m, got);
    units_free(&m, m.units);
    fsdp_model_spec_destroy(m.spec);
}

static hid_t make_16bit(hid_t base, size_t mant, size_t exp, size_t bias)
{
    hid_t t = H5Tcopy(base);
    H5Tset_fields(t, 15, mant, exp, 0, mant);
    H5Tset_ebias(t, bias);
    H5Tset_precision(t, 16);
    H5Tset_size(t, 2);
    return t;
}

/* Rewrites one dataset of path in file type ftype from f32 values v. */
static int rewrite(const char *path, const char *name, hid_t ftype, const float *v)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t g = H5Gopen2(f, "model", H5P_DEFAULT);
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    hid_t s = H5Dget_space(d);
    H5Dclose(d);
    H5Ldelete(g, name, H5P_DEFAULT);
    d = H5Dcreate2(g, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(d);
    H5Sclose(s);
    H5Gclose(g);
    return H5Fclose(f) < 0 || e < 0 ? -1 : 0;
}

/*
 * Files from other tools: big-endian f16, bf16 and f64 datasets written by
 * HDF5's own conversions. The values are exactly representable in the
 * narrow types, so any correct conversion path must give them back exactly.
 */
static void test_foreign_types(void)
{
    struct model m;
    const char *path = tpath("foreign.h5");
    model_make(&m, 1);
    const char *names[3] = {"wte.weight", "h.0.attn.c_attn.weight", "h.1.ln_2.bias"};
    hid_t types[3] = {make_16bit(H5T_IEEE_F32BE, 10, 5, 15), make_16bit(H5T_IEEE_F32BE, 7, 8, 127),
                      H5Tcopy(H5T_IEEE_F64BE)};
    const char *want[3] = {"f16", "bf16", "f64"};
    for (int k = 0; k < 3; k++) {
        const struct fsdp_param_spec *p = &m.spec->params[fsdp_model_spec_find(m.spec, names[k])];
        float *v = m.units[p->unit] + p->offset;
        for (size_t i = 0; i < p->numel; i++) {
            v[i] = (float)((int)(rnd() % 511) - 255) / 64.0f; /* 8 bits: exact in bf16 */
        }
    }
    int rc = fsdp_model_file_write(path, m.spec, (const float *const *)m.units, NULL);
    for (int k = 0; k < 3 && rc == 0; k++) {
        const struct fsdp_param_spec *p = &m.spec->params[fsdp_model_spec_find(m.spec, names[k])];
        rc = rewrite(path, names[k], types[k], m.units[p->unit] + p->offset);
        H5Tclose(types[k]);
    }
    tap_ok(rc == 0, "wrote big-endian f16, bf16 and f64 datasets with HDF5");
    struct fsdp_model_file *mf;
    rc = fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    tap_ok(rc == 0, "foreign types accepted (%s)", fsdp_err_msg());
    if (rc < 0) {
        fsdp_err_clear();
        return;
    }
    for (int k = 0; k < 3; k++) {
        long i = fsdp_model_spec_find(m.spec, names[k]);
        const struct fsdp_param_spec *p = &m.spec->params[i];
        float *buf = malloc(p->numel * sizeof(float));
        rc = fsdp_model_file_read_rows(mf, names[k], 0, p->shape[0], buf);
        tap_ok(rc == 0 && strcmp(fsdp_model_file_tensor_dtype(mf, (size_t)i), want[k]) == 0 &&
                   same_bits(m.units[p->unit] + p->offset, buf, p->numel, names[k]),
               "%s stored as big-endian %s reads back exactly", names[k], want[k]);
        free(buf);
    }
    fsdp_model_file_close(mf);
    units_free(&m, m.units);
    fsdp_model_spec_destroy(m.spec);
}

static void test_writer_commit(void)
{
    struct model m;
    struct fsdp_model_writer *w;
    const char *path = tpath("partial.h5");
    model_make(&m, 1);
    char tmp[NAME_MAX + 1] = "";
    int rc = fsdp_model_writer_create(path, m.spec, NULL, &w);
    tap_ok(rc == 0 && tmp_entries("partial.h5", tmp, sizeof(tmp)) == 1 &&
               strncmp(tmp, "partial.h5.tmp.", 15) == 0 && strlen(tmp) == 21 &&
               access(path, F_OK) != 0,
           "writer: data goes to one partial.h5.tmp.XXXXXX (%s), the final name does not exist "
           "yet", tmp);
    fsdp_model_writer_put_unit(w, 0, m.units[0]);
    rc = fsdp_model_writer_put(w, 0, m.units[0]);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "wte.weight written twice"),
           "writer: a tensor written twice is rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_model_writer_commit(w);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "h.0.ln_1.weight was never written"),
           "writer: commit of an incomplete model is rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_model_writer_destroy(w);
    tap_ok(tmp_entries("partial.h5", NULL, 0) == 0 && access(path, F_OK) != 0,
           "writer: destroy without commit leaves nothing behind");
    struct fsdp_model_write_opts o = {.created_by = NULL, .dtype = FSDP_I32};
    rc = fsdp_model_writer_create(path, m.spec, &o, &w);
    tap_ok(rc == FSDP_ERR_INVALID, "writer: i32 storage rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    units_free(&m, m.units);
    fsdp_model_spec_destroy(m.spec);
}

int main(void)
{
    fsdp_model_registry_init();
    snprintf(dir, sizeof(dir), "/tmp/fsdpc-mf-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip(1);
    test_round_trip(0);
    test_half_storage(FSDP_F16);
    test_half_storage(FSDP_BF16);
    test_foreign_types();
    test_writer_commit();
    const char *files[] = {"tied.h5", "untied.h5", "f16.h5", "bf16.h5", "foreign.h5"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        unlink(tpath(files[i]));
    }
    rmdir(dir);
    return tap_done();
}
