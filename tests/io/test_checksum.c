/*
 * test_checksum.c - per-tensor checksums of model files and checkpoints
 * (io/h5/checksum.h; the definition is doc/formats.md, "Checksums"):
 *  - the attributes fsdpc writes hold what formats.md defines, recomputed
 *    here from each dataset's bytes with plain HDF5 and xxhash (f32 and
 *    bf16 model files with one block and with several, checkpoint shards,
 *    and the index that records every shard's);
 *  - checked reads give back the values written: whole tensors, rows and
 *    columns, across block and shard boundaries;
 *  - a flipped byte fails exactly the reads that touch its block, with one
 *    line naming the file, the tensor and the block's rows; the other
 *    blocks still read;
 *  - a tensor stored as big-endian f16 with one hash over its bytes and no
 *    xxh3_64_rows (a file written by hand) reads, and fails once flipped;
 *    one without checksums reads unchecked.
 */
#include "config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/ckpt/ckpt.h"
#include "io/h5/model_file.h"
#include "io/util/fileutil.h"
#include "model/gpt2_spec.h"
#include "model/model.h"
#include "tests/tap.h"

#include <hdf5.h>
#include <xxhash.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static const char *tpath(const char *name)
{
    static char buf[4][160];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

/* V = 20000 rows of C = 128: wte is 10 MB in f32, ten blocks (9 of 2048
 * rows, the last of 1568), and 5 MB in bf16, five blocks (4 of 4096 rows,
 * the last of 3616). */
#define V 20000
#define C 128

struct model {
    struct fsdp_model_spec *spec;
    float **units; /* (n_units,) */
};

static float value(size_t i, unsigned salt)
{
    return (float)((i * 2654435761u + salt * 40503u) % 2001u) / 1000.0f - 1.0f;
}

static void model_make(struct model *m, unsigned salt)
{
    struct fsdp_gpt2_config c = {.vocab_size = V, .context = 16, .n_layer = 1, .n_head = 2,
                                 .n_embd = C, .ln_eps = 1e-5f, .tied = 1};
    if (fsdp_gpt2_spec_create(&c, &m->spec) < 0) {
        tap_diag("spec: %s", fsdp_err_msg());
        exit(1);
    }
    m->units = calloc((size_t)m->spec->n_units, sizeof(float *));
    for (int u = 0; u < m->spec->n_units; u++) {
        m->units[u] = malloc(m->spec->unit_numel[u] * sizeof(float));
        for (size_t i = 0; i < m->spec->unit_numel[u]; i++) {
            m->units[u][i] = value(i, salt + (unsigned)u);
        }
    }
}

static void model_free(struct model *m)
{
    for (int u = 0; u < m->spec->n_units; u++) {
        free(m->units[u]);
    }
    free(m->units);
    fsdp_model_spec_destroy(m->spec);
}

static const float *param(const struct model *m, const char *name)
{
    const struct fsdp_param_spec *p = &m->spec->params[fsdp_model_spec_find(m->spec, name)];
    return m->units[p->unit] + p->offset;
}

// ----------------------------------------------------------------------------
// The definition, written out again from doc/formats.md

/* Rows per block: whole rows in 1 MiB (at least one); ceil(rows / 4096) if
 * that makes more than 4096 blocks; at most the tensor's rows. */
static size_t def_block_rows(size_t rows, size_t row_bytes)
{
    size_t b = ((size_t)1 << 20) / row_bytes;
    b = b ? b : 1;
    if ((rows + b - 1) / b > 4096) {
        b = (rows + 4095) / 4096;
    }
    return b < rows ? b : rows ? rows : 1;
}

/* Appends to h the hashes of the blocks of `rows` rows of bytes (0 rows:
 * one hash of nothing); returns how many. */
static size_t def_hashes(const unsigned char *bytes, size_t rows, size_t row_bytes, size_t b,
                         uint64_t *h)
{
    size_t n = 0;
    for (size_t r = 0; r < rows || n == 0; r += b) {
        size_t k = rows - r < b ? rows - r : b;
        h[n++] = XXH3_64bits(bytes + r * row_bytes, k * row_bytes);
    }
    return n;
}

/* Reads attribute xxh3_64 of dset into h (at most max); returns its length. */
static size_t read_attr_hashes(hid_t d, uint64_t *h, size_t max)
{
    hid_t a = H5Aopen(d, "xxh3_64", H5P_DEFAULT);
    hid_t s = a < 0 ? -1 : H5Aget_space(a);
    hssize_t n = s < 0 ? -1 : H5Sget_simple_extent_npoints(s);
    if (n < 0 || (size_t)n > max || H5Aread(a, H5T_NATIVE_UINT64, h) < 0) {
        n = -1;
    }
    if (s >= 0) {
        H5Sclose(s);
    }
    if (a >= 0) {
        H5Aclose(a);
    }
    return n < 0 ? (size_t)-1 : (size_t)n;
}

static long long read_attr_rows(hid_t d)
{
    long long v = -1;
    hid_t a = H5Aopen(d, "xxh3_64_rows", H5P_DEFAULT);
    if (a >= 0) {
        H5Aread(a, H5T_NATIVE_LLONG, &v);
        H5Aclose(a);
    }
    return v;
}

/*
 * Dataset `name` of file: its bytes as stored, cut into blocks by the
 * definition for a tensor of full_rows rows, hashed, equal to its
 * attributes? Returns the number of blocks, or -1 (with a diagnostic).
 */
static long check_dataset(hid_t f, const char *name, size_t full_rows)
{
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t t = H5Dget_type(d), s = H5Dget_space(d);
    hsize_t dims[2] = {0, 1};
    H5Sget_simple_extent_dims(s, dims, NULL);
    size_t rows = dims[0], row_bytes = (size_t)(H5Sget_simple_extent_ndims(s) == 2 ? dims[1] : 1) *
                                       H5Tget_size(t);
    unsigned char *raw = malloc(rows * row_bytes + 1);
    uint64_t want[64], got[64];
    long rc = -1;
    if (raw && (rows == 0 || H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw) >= 0)) {
        size_t b = def_block_rows(full_rows, row_bytes);
        size_t n = def_hashes(raw, rows, row_bytes, b, want);
        size_t m = read_attr_hashes(d, got, 64);
        long long ab = read_attr_rows(d);
        if (m == n && ab == (long long)b && memcmp(want, got, n * sizeof(uint64_t)) == 0) {
            rc = (long)n;
        } else {
            tap_diag("%s: %zu hashes over blocks of %zu rows by the definition; the file has %zu "
                     "over %lld (first 0x%016llx vs 0x%016llx)", name, n, b, m, ab,
                     (unsigned long long)want[0], (unsigned long long)got[0]);
        }
    }
    free(raw);
    H5Sclose(s);
    H5Tclose(t);
    H5Dclose(d);
    return rc;
}

/* Every tensor of a model file as the definition says; blocks of wte into *wte. */
static int check_model_file(const char *path, const struct fsdp_model_spec *spec, long *wte)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    int bad = f < 0;
    char name[160];
    for (size_t i = 0; !bad && i < spec->n_params; i++) {
        snprintf(name, sizeof(name), "/model/%s", spec->params[i].name);
        long n = check_dataset(f, name, spec->params[i].shape[0]);
        bad = n < 0;
        if (i == 0) {
            *wte = n;
        }
    }
    if (f >= 0) {
        H5Fclose(f);
    }
    return bad ? -1 : 0;
}

// ----------------------------------------------------------------------------
// Damage

/* Flips the lowest bit of byte `at` of dataset name's data in path. */
static int flip(const char *path, const char *name, size_t at)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = f < 0 ? -1 : H5Dopen2(f, name, H5P_DEFAULT);
    haddr_t off = d < 0 ? HADDR_UNDEF : H5Dget_offset(d);
    if (d >= 0) {
        H5Dclose(d);
    }
    if (f >= 0) {
        H5Fclose(f);
    }
    int fd = open(path, O_RDWR);
    unsigned char c;
    int ok = off != HADDR_UNDEF && fd >= 0 && pread(fd, &c, 1, (off_t)(off + at)) == 1;
    c ^= 1;
    ok = ok && pwrite(fd, &c, 1, (off_t)(off + at)) == 1;
    if (fd >= 0) {
        close(fd);
    }
    return ok ? 0 : -1;
}

static int same(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            tap_diag("%s: first difference at %zu: %.9g vs %.9g", what, i, (double)a[i],
                     (double)b[i]);
            return 0;
        }
    }
    return 1;
}

/* rc is a checksum failure whose message contains each of the parts. */
static int failed_with(int rc, const char *a, const char *b, const char *c)
{
    const char *m = fsdp_err_msg();
    int ok = rc == FSDP_ERR_FORMAT && strstr(m, a) && strstr(m, b) && (!c || strstr(m, c));
    tap_diag("error: %s", m);
    fsdp_err_clear();
    return ok;
}

// ----------------------------------------------------------------------------
// Model files

static void test_model_f32(void)
{
    struct model m;
    model_make(&m, 1);
    const char *path = tpath("f32.h5");
    long wte = 0;
    int rc = fsdp_model_file_write(path, m.spec, (const float *const *)m.units, NULL);
    int ok = rc == 0 && check_model_file(path, m.spec, &wte) == 0 && wte == 10;
    tap_ok(ok, "f32 model file: every tensor's attributes are the definition's (wte: %ld blocks)",
           wte);

    struct fsdp_model_file *mf;
    float *buf = malloc((size_t)V * C * sizeof(float));
    const float *w = param(&m, "wte.weight");
    rc = fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    rc = rc ? rc : fsdp_model_file_read_rows(mf, "wte.weight", 0, V, buf);
    tap_ok(rc == 0 && same(buf, w, (size_t)V * C, "wte"), "checked read of the whole tensor");
    rc = fsdp_model_file_read_rows(mf, "wte.weight", 8000, 400, buf);
    tap_ok(rc == 0 && same(buf, w + 8000 * C, 400 * C, "rows"),
           "rows [8000, 8400) across a block boundary, partial blocks on both sides");
    rc = fsdp_model_file_read_block(mf, 0, 9000, 3, 5, 40, buf);
    ok = rc == 0;
    for (size_t r = 0; ok && r < 3; r++) {
        ok = same(buf + r * 40, w + (9000 + r) * C + 5, 40, "cols");
    }
    tap_ok(ok, "a block of rows and columns [5, 45) inside a checksum block");
    fsdp_model_file_close(mf);

    /* a byte in row 9000 (block 4: rows [8192, 10240)) */
    ok = flip(path, "/model/wte.weight", (size_t)9000 * C * 4 + 6) == 0;
    rc = fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    tap_ok(ok && rc == 0, "a flipped byte: the file still opens (opening reads no tensor)");
    if (rc < 0) {
        fsdp_err_clear();
        model_free(&m);
        free(buf);
        return;
    }
    rc = fsdp_model_file_read_rows(mf, "wte.weight", 0, 8192, buf);
    int rc2 = fsdp_model_file_read_rows(mf, "wte.weight", 10240, V - 10240, buf);
    tap_ok(rc == 0 && rc2 == 0, "the blocks before and after the damaged one read");
    rc = fsdp_model_file_read_rows(mf, "wte.weight", 8000, 200, buf);
    tap_ok(failed_with(rc, "f32.h5: tensor 'wte.weight' rows [8192, 10240): checksum mismatch "
                           "(stored 0x", "): the file is damaged", NULL),
           "rows that touch the damaged block fail, naming file, tensor and rows");
    rc = fsdp_model_file_read_block(mf, 0, 9000, 1, 0, 8, buf);
    tap_ok(failed_with(rc, "tensor 'wte.weight' rows [8192, 10240)", "checksum mismatch", NULL),
           "so does a column block inside it");
    float *units_buf = malloc(m.spec->unit_numel[0] * sizeof(float));
    rc = fsdp_model_file_read_unit(mf, 0, units_buf);
    tap_ok(failed_with(rc, "wte.weight", "checksum mismatch", NULL), "and the unit read");
    free(units_buf);
    fsdp_model_file_close(mf);
    model_free(&m);
    free(buf);
}

static void test_model_bf16(void)
{
    struct model m;
    model_make(&m, 2);
    const char *path = tpath("bf16.h5");
    struct fsdp_model_write_opts o = {.dtype = FSDP_BF16};
    long wte = 0;
    int rc = fsdp_model_file_write(path, m.spec, (const float *const *)m.units, &o);
    int ok = rc == 0 && check_model_file(path, m.spec, &wte) == 0 && wte == 5;
    tap_ok(ok, "bf16 model file: the hashes cover the 2-byte values as stored (wte: %ld blocks)",
           wte);
    float *buf = malloc((size_t)V * C * sizeof(float)), *want = malloc(400 * C * sizeof(float));
    uint16_t *h = malloc(400 * C * sizeof(uint16_t));
    fsdp_convert(h, FSDP_BF16, param(&m, "wte.weight") + 12100 * C, FSDP_F32, 400 * C);
    fsdp_convert(want, FSDP_F32, h, FSDP_BF16, 400 * C);
    struct fsdp_model_file *mf;
    rc = fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    rc = rc ? rc : fsdp_model_file_read_rows(mf, "wte.weight", 12100, 400, buf);
    tap_ok(rc == 0 && same(buf, want, 400 * C, "bf16 rows"),
           "bf16 rows across a block boundary read back as written");
    fsdp_model_file_close(mf);
    rc = flip(path, "/model/wte.weight", (size_t)17000 * C * 2 + 1);
    rc = rc ? rc : fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    int a = rc == 0 ? fsdp_model_file_read_rows(mf, "wte.weight", 0, 16384, buf) : -1;
    int b = rc == 0 ? fsdp_model_file_read_rows(mf, "wte.weight", 16900, 200, buf) : 0;
    tap_ok(a == 0 && failed_with(b, "tensor 'wte.weight' rows [16384, 20000)", "mismatch", NULL),
           "bf16: a flipped byte fails its block only");
    fsdp_model_file_close(mf);
    free(h);
    free(want);
    free(buf);
    model_free(&m);
}

/* Rewrites dataset /model/<name> of path as big-endian f16 from v, with one
 * hash over all its bytes as stored (sum) or no checksum attributes. */
static int rewrite_be16(const char *path, const char *name, const float *v, int sum)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32BE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_ebias(t, 15);
    H5Tset_precision(t, 16);
    H5Tset_size(t, 2);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t g = H5Gopen2(f, "model", H5P_DEFAULT);
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    hid_t s = H5Dget_space(d);
    H5Dclose(d);
    H5Ldelete(g, name, H5P_DEFAULT);
    d = H5Dcreate2(g, name, t, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    if (sum && e >= 0) {
        size_t bytes = (size_t)H5Sget_simple_extent_npoints(s) * 2;
        unsigned char *raw = malloc(bytes);
        e = H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw);
        uint64_t h = XXH3_64bits(raw, bytes);
        free(raw);
        hid_t as = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(d, "xxh3_64", H5T_STD_U64LE, as, H5P_DEFAULT, H5P_DEFAULT);
        e = e < 0 || a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_UINT64, &h);
        H5Aclose(a);
        H5Sclose(as);
    }
    H5Dclose(d);
    H5Sclose(s);
    H5Gclose(g);
    H5Tclose(t);
    return H5Fclose(f) < 0 || e < 0 ? -1 : 0;
}

static void test_foreign(void)
{
    struct model m;
    model_make(&m, 3);
    const char *path = tpath("foreign.h5"), *name = "h.0.attn.c_attn.weight";
    long idx = fsdp_model_spec_find(m.spec, name);
    const struct fsdp_param_spec *p = &m.spec->params[idx];
    float *v = m.units[p->unit] + p->offset;
    for (size_t i = 0; i < p->numel; i++) {
        v[i] = (float)((int)(i % 511) - 255) / 64.0f; /* exact in f16 */
    }
    float *buf = malloc(p->numel * sizeof(float));
    struct fsdp_model_file *mf;
    int rc = fsdp_model_file_write(path, m.spec, (const float *const *)m.units, NULL);
    rc = rc ? rc : rewrite_be16(path, name, v, 1);
    rc = rc ? rc : fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    int r = rc ? rc : fsdp_model_file_read_rows(mf, name, 10, 100, buf);
    tap_ok(r == 0 && same(buf, v + 10 * C, 100 * C, name),
           "big-endian f16 with one hash of its bytes as stored and no xxh3_64_rows: reads (%s)",
           r ? fsdp_err_msg() : "ok");
    fsdp_err_clear();
    if (rc == 0) {
        fsdp_model_file_close(mf);
    }
    rc = flip(path, "/model/h.0.attn.c_attn.weight", 3 * C * 2);
    rc = rc ? rc : fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    r = rc ? rc : fsdp_model_file_read_rows(mf, name, 300, 10, buf);
    tap_ok(failed_with(r, "tensor 'h.0.attn.c_attn.weight' rows [0, 384)", "mismatch", NULL),
           "... and a flipped byte anywhere in it fails any read of it");
    if (rc == 0) {
        fsdp_model_file_close(mf);
    }
    rc = rewrite_be16(path, name, v, 0);
    rc = rc ? rc : fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    r = rc ? rc : fsdp_model_file_read_rows(mf, name, 0, p->shape[0], buf);
    tap_ok(r == 0 && same(buf, v, p->numel, name), "without checksum attributes: read unchecked");
    fsdp_err_clear();
    if (rc == 0) {
        fsdp_model_file_close(mf);
    }
    free(buf);
    model_free(&m);
}

// ----------------------------------------------------------------------------
// Checkpoints

/* AdamW's state tensors, as the optimizer names them: kinds 1 and 2 */
static const char *const adamw[] = {"exp_avg", "exp_avg_sq"};
#define KINDS 3
#define EXP_AVG 1

static int write_ckpt_kinds(const char *d, const struct model *m, unsigned salt, int n_shards,
                            const struct fsdp_ckpt_kinds *kinds)
{
    const struct fsdp_model_spec *s = m->spec;
    float *buf = malloc(fsdp_model_spec_largest(s) * sizeof(float));
    int rc = 0;
    for (int r = 0; rc == 0 && r < n_shards; r++) {
        struct fsdp_ckpt_shard_writer *w;
        rc = fsdp_ckpt_shard_create(d, r, n_shards, 3, s, kinds, &w);
        for (int k = 0; rc == 0 && k < kinds->n; k++) {
            for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
                const struct fsdp_param_spec *p = &s->params[i];
                size_t row0, rows;
                fsdp_ckpt_rows(p->shape[0], n_shards, r, &row0, &rows);
                for (size_t j = 0; j < rows * p->shape[1]; j++) {
                    buf[j] = value(row0 * p->shape[1] + j, salt + (unsigned)(k * 100 + (int)i));
                }
                rc = fsdp_ckpt_shard_put(w, k, i, buf);
            }
        }
        rc = rc ? rc : fsdp_ckpt_shard_commit(w);
        fsdp_ckpt_shard_destroy(w);
    }
    free(buf);
    if (rc < 0) {
        return rc;
    }
    struct fsdp_ckpt_meta meta = {.step = 3, .world_size = n_shards, .n_shards = n_shards,
                                  .mesh = "dp=2", .backends = "dp=tcp", .loss_scale = 1.0};
    return fsdp_ckpt_index_write(d, s, kinds, &meta);
}

static int write_ckpt(const char *d, const struct model *m, unsigned salt, int n_shards)
{
    struct fsdp_ckpt_kinds kinds;
    FSDP_CHECK(fsdp_ckpt_kinds_init(&kinds, 2, adamw));
    return write_ckpt_kinds(d, m, salt, n_shards, &kinds);
}

/* io fixes no optimizer: a checkpoint keeps the states it is given, by name */
static void test_ckpt_kinds(void)
{
    struct model m;
    struct fsdp_ckpt_kinds kinds;
    const char *const one[] = {"momentum_buffer"}, *const bad[] = {"m", "../v"},
                      *const twice[] = {"v", "v"};
    model_make(&m, 4);
    int rc = fsdp_ckpt_kinds_init(&kinds, 2, bad);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "'../v' is not a name"),
           "a state name that is not a plain name is refused (%s)", fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_ckpt_kinds_init(&kinds, 2, twice);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "'v' is named twice"),
           "a state named twice is refused (%s)", fsdp_err_msg());
    fsdp_err_clear();
    const char *d = tpath("ck_sgd");
    mkdir(d, 0755);
    rc = fsdp_ckpt_kinds_init(&kinds, 1, one);
    rc = rc ? rc : write_ckpt_kinds(d, &m, 9, 2, &kinds);
    struct fsdp_ckpt *ck = NULL;
    rc = rc ? rc : fsdp_ckpt_open(d, fsdp_arch_registered(), &ck);
    float *buf = malloc((size_t)V * C * sizeof(float));
    rc = rc ? rc : fsdp_ckpt_read_rows(ck, 1, 0, 0, V, buf);
    int ok = rc == 0 && fsdp_ckpt_kinds(ck)->n == 2 &&
             fsdp_ckpt_kind_of(fsdp_ckpt_kinds(ck), "momentum_buffer") == 1 &&
             fsdp_ckpt_kind_of(fsdp_ckpt_kinds(ck), "exp_avg") < 0;
    for (size_t j = 0; ok && j < (size_t)V * C; j++) {
        ok = buf[j] == value(j, 9 + 100);
    }
    tap_ok(ok, "a checkpoint of one state tensor, 'momentum_buffer', written and read back (%s)",
           rc ? fsdp_err_msg() : "ok");
    rc = ck ? fsdp_ckpt_read_rows(ck, 2, 0, 0, 1, buf) : -1;
    tap_ok(rc == FSDP_ERR_INVALID, "a kind the checkpoint does not keep is refused");
    fsdp_err_clear();
    fsdp_ckpt_close(ck);
    free(buf);
    model_free(&m);
}

static void test_ckpt(void)
{
    struct model m;
    model_make(&m, 4);
    const char *d = tpath("ck");
    mkdir(d, 0755);
    int rc = write_ckpt(d, &m, 7, 2);
    tap_ok(rc == 0, "checkpoint of 2 shards written (%s)", rc ? fsdp_err_msg() : "ok");
    fsdp_err_clear();
    /* every shard dataset by the definition (blocks cut from the shard's
     * first row, the size from the whole tensor); the index's list is the
     * shards' lists in shard order */
    int ok = rc == 0;
    char name[160], sh[160];
    for (int k = 0; ok && k < KINDS; k++) {
        for (size_t i = 0; ok && i < m.spec->n_params; i++) {
            const struct fsdp_param_spec *p = &m.spec->params[i];
            uint64_t all[64], idx[64];
            size_t n = 0;
            if (k == 0) {
                snprintf(name, sizeof(name), "/model/%s", p->name);
            } else { /* the layout of every fsdpc checkpoint: /optim/<state>/<name> */
                snprintf(name, sizeof(name), "/optim/%s/%s", adamw[k - 1], p->name);
            }
            for (int r = 0; ok && r < 2; r++) {
                snprintf(sh, sizeof(sh), "%s/shard_%d.h5", d, r);
                hid_t f = H5Fopen(sh, H5F_ACC_RDONLY, H5P_DEFAULT);
                ok = check_dataset(f, name, p->shape[0]) > 0;
                hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
                size_t got = read_attr_hashes(ds, all + n, 64 - n);
                ok = ok && got != (size_t)-1;
                n += ok ? got : 0;
                H5Dclose(ds);
                H5Fclose(f);
            }
            snprintf(sh, sizeof(sh), "%s/index.h5", d);
            hid_t f = H5Fopen(sh, H5F_ACC_RDONLY, H5P_DEFAULT);
            hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
            ok = ok && read_attr_hashes(ds, idx, 64) == n && memcmp(all, idx, n * 8) == 0 &&
                 read_attr_rows(ds) == (long long)def_block_rows(p->shape[0], p->shape[1] * 4);
            if (!ok) {
                tap_diag("%s: index list differs from the shards' (%zu hashes)", name, n);
            }
            H5Dclose(ds);
            H5Fclose(f);
        }
    }
    tap_ok(ok, "shards hold the definition's hashes of their rows; index.h5 the shards' lists");

    struct fsdp_ckpt *ck;
    float *buf = malloc((size_t)V * C * sizeof(float)), *want = malloc((size_t)V * C * 4);
    for (size_t j = 0; j < (size_t)V * C; j++) {
        want[j] = value(j, 7 + 100); /* exp_avg of wte (k = 1, i = 0) */
    }
    rc = fsdp_ckpt_open(d, fsdp_arch_registered(), &ck);
    if (rc == 0) { /* the kinds come back from the file by the optimizer's names */
        const struct fsdp_ckpt_kinds *ks = fsdp_ckpt_kinds(ck);
        tap_ok(ks->n == KINDS && fsdp_ckpt_kind_of(ks, "exp_avg") == EXP_AVG &&
                   fsdp_ckpt_kind_of(ks, "exp_avg_sq") == 2 && fsdp_ckpt_kind_of(ks, "m") < 0 &&
                   strcmp(fsdp_ckpt_kind_group(ks, 2), "optim/exp_avg_sq") == 0,
               "kinds read back: model, exp_avg, exp_avg_sq (%d)", ks->n);
    }
    rc = rc ? rc : fsdp_ckpt_read_rows(ck, EXP_AVG, 0, 9000, 2000, buf);
    tap_ok(rc == 0 && same(buf, want + 9000 * C, 2000 * C, "exp_avg rows") &&
               fsdp_ckpt_checksum_blocks(ck, EXP_AVG, 0) == 10,
           "rows [9000, 11000), a partial block of each shard, read back (10 blocks in all)");
    fsdp_err_clear();
    fsdp_ckpt_close(ck);

    /* a byte in shard 1's row 100 (tensor row 10100): its block is [10000, 12048) */
    snprintf(sh, sizeof(sh), "%s/shard_1.h5", d);
    rc = flip(sh, "/optim/exp_avg/wte.weight", 100 * C * 4 + 2);
    rc = rc ? rc : fsdp_ckpt_open(d, fsdp_arch_registered(), &ck);
    tap_ok(rc == 0, "a flipped byte in a shard: the checkpoint still opens");
    if (rc == 0) {
        int a = fsdp_ckpt_read_rows(ck, EXP_AVG, 0, 0, 10000, buf);
        int b = fsdp_ckpt_read_rows(ck, EXP_AVG, 0, 12048, V - 12048, buf);
        int c = fsdp_ckpt_read_rows(ck, FSDP_CKPT_MODEL, 0, 0, V, buf);
        tap_ok(a == 0 && b == 0 && c == 0,
               "shard 0, the undamaged block of shard 1 and the other tensors read");
        rc = fsdp_ckpt_read_rows(ck, EXP_AVG, 0, 9990, 20, buf);
        tap_ok(failed_with(rc, "ck/shard_1.h5: tensor 'optim/exp_avg/wte.weight' rows "
                               "[10000, 12048): checksum mismatch (stored 0x",
                           "the shard file is damaged", NULL),
               "rows reaching into the damaged block fail, naming the shard file and tensor");
        fsdp_ckpt_close(ck);
    }
    fsdp_err_clear();

    /* the index before every shard exists */
    const char *e = tpath("early");
    mkdir(e, 0755);
    struct fsdp_ckpt_shard_writer *w;
    struct fsdp_ckpt_kinds kinds;
    fsdp_ckpt_kinds_init(&kinds, 2, adamw);
    rc = fsdp_ckpt_shard_create(e, 0, 2, 3, m.spec, &kinds, &w);
    fsdp_ckpt_shard_destroy(w);
    struct fsdp_ckpt_meta meta = {.step = 3, .world_size = 2, .n_shards = 2, .loss_scale = 1.0};
    rc = fsdp_ckpt_index_write(e, m.spec, &kinds, &meta);
    tap_ok(rc < 0 && access(tpath("early/index.h5"), F_OK) != 0,
           "the index refuses to be written before its shards, and leaves nothing: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    rmdir(e);
    free(buf);
    free(want);
    model_free(&m);
}

int main(void)
{
    fsdp_model_registry_init();
    snprintf(dir, sizeof(dir), "/tmp/fsdpc-sum-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    test_model_f32();
    test_model_bf16();
    test_foreign();
    test_ckpt();
    test_ckpt_kinds();
    const char *files[] = {"f32.h5", "bf16.h5", "foreign.h5", "ck/shard_0.h5", "ck/shard_1.h5",
                           "ck/index.h5"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        unlink(tpath(files[i]));
    }
    rmdir(tpath("ck"));
    fsdp_file_rmtree(tpath("ck_sgd"));
    rmdir(dir);
    return tap_done();
}
