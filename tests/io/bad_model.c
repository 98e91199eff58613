/*
 * bad_model.c - test helper: copies a model file and damages (or re-types)
 * one thing in the copy, so tests can check what the reader says about it.
 *
 *   bad_model KIND[:ARG] IN OUT
 *
 *   attr-missing:NAME       delete root attribute NAME
 *   attr-string:NAME        make NAME a string ("12")
 *   attr-float:NAME         make NAME a float (4.0)
 *   attr-int:NAME=V         set NAME to the int32 V
 *   attr-str:NAME=V         set NAME to the string V
 *   attr-array:NAME         make NAME an int32 array of two values
 *   missing:DSET            delete /model/DSET
 *   extra:NAME              add a float dataset /model/NAME of shape (4,)
 *   shape:DSET              give /model/DSET a wrong shape (one row short)
 *   int:DSET                rewrite /model/DSET as int32
 *   group:DSET              replace /model/DSET by a group
 *   f64:DSET, f16be:DSET, bf16:DSET
 *                           rewrite /model/DSET with the same values in that
 *                           type (valid files: the reader converts)
 *   vds:DSET                move /model/DSET into OUT.src.h5 and make it a
 *                           virtual dataset mapping that file (by its
 *                           relative name); valid until the source is removed
 *   no-model                delete the group /model
 *
 * Checksums (DSET is under /model, or a full path such as
 * /optim/exp_avg/wte.weight in a checkpoint shard):
 *   flip:DSET[=BYTE]        flip the lowest bit of byte BYTE (default: the
 *                           middle one) of DSET's data in the file
 *   unsum                   delete the checksum attributes of every dataset
 *                           and of the root attributes, and a shard's
 *                           summary (a file from before checksums)
 *   sum-whole:DSET          replace DSET's checksums by one XXH3-64 of all
 *                           its bytes as stored, without xxh3_64_rows (what
 *                           a hand-written file with h5py would hold)
 *   sum-type:DSET           make xxh3_64 an int32 array
 *   sum-count:DSET          give xxh3_64 one hash too many
 *   sum-rows:DSET=N         set xxh3_64_rows to N
 */
#include <hdf5.h>
#include <xxhash.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "bad_model: %s\n", what);
    exit(2);
}

static void copy_file(const char *in, const char *out)
{
    FILE *a = fopen(in, "rb"), *b = fopen(out, "wb");
    char buf[1 << 16];
    size_t n;
    if (!a || !b) {
        fail("cannot open input or output");
    }
    while ((n = fread(buf, 1, sizeof(buf), a)) > 0) {
        if (fwrite(buf, 1, n, b) != n) {
            fail("write failed");
        }
    }
    fclose(a);
    if (fclose(b) != 0) {
        fail("write failed");
    }
}

static void put_attr(hid_t f, const char *name, hid_t ftype, hid_t mtype, const void *v, int n)
{
    hsize_t dims = (hsize_t)n;
    if (H5Aexists(f, name) > 0 && H5Adelete(f, name) < 0) {
        fail("cannot delete attribute");
    }
    hid_t s = n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &dims, NULL);
    hid_t a = H5Acreate2(f, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, mtype, v) < 0) {
        fail("cannot write attribute");
    }
    H5Aclose(a);
    H5Sclose(s);
}

static void put_str_attr(hid_t f, const char *name, const char *v)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    put_attr(f, name, t, t, v, 1);
    H5Tclose(t);
}

static hid_t make_16bit(hid_t base, size_t mant, size_t exp, size_t bias)
{
    hid_t t = H5Tcopy(base);
    if (H5Tset_fields(t, 15, mant, exp, 0, mant) < 0 || H5Tset_ebias(t, bias) < 0 ||
        H5Tset_precision(t, 16) < 0 || H5Tset_size(t, 2) < 0) {
        fail("cannot build 16-bit type");
    }
    return t;
}

/* Rewrites dataset name with file type ftype; shape_delta shortens dim 0. */
static void retype(hid_t g, const char *name, hid_t ftype, int shape_delta)
{
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0) {
        fail("no such dataset");
    }
    hid_t s = H5Dget_space(d);
    hsize_t dims[2];
    int nd = H5Sget_simple_extent_dims(s, dims, NULL);
    hssize_t n = H5Sget_simple_extent_npoints(s);
    float *v = malloc((size_t)n * sizeof(float));
    if (!v || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
        fail("cannot read dataset");
    }
    H5Dclose(d);
    H5Sclose(s);
    if (H5Ldelete(g, name, H5P_DEFAULT) < 0) {
        fail("cannot delete dataset");
    }
    dims[0] -= (hsize_t)shape_delta;
    s = H5Screate_simple(nd, dims, NULL);
    d = H5Dcreate2(g, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (d < 0 || H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
        fail("cannot write dataset");
    }
    H5Dclose(d);
    H5Sclose(s);
    free(v);
}

/* Moves dataset name into "<out>.src.h5" and maps it back as a virtual dataset. */
static void make_virtual(hid_t g, const char *name, const char *out)
{
    char src[4096];
    const char *base = strrchr(out, '/');
    base = base ? base + 1 : out;
    snprintf(src, sizeof(src), "%s.src.h5", out);
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0) {
        fail("no such dataset");
    }
    hid_t space = H5Dget_space(d);
    hssize_t n = H5Sget_simple_extent_npoints(space);
    float *v = malloc((size_t)n * sizeof(float));
    if (!v || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
        fail("cannot read dataset");
    }
    H5Dclose(d);
    hid_t sf = H5Fcreate(src, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t sd = H5Dcreate2(sf, "data", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                          H5P_DEFAULT);
    if (sd < 0 || H5Dwrite(sd, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
        fail("cannot write the source file");
    }
    H5Dclose(sd);
    H5Fclose(sf);
    free(v);
    H5Ldelete(g, name, H5P_DEFAULT);
    char rel[4096];
    snprintf(rel, sizeof(rel), "%s.src.h5", base);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (H5Pset_virtual(dcpl, space, rel, "data", space) < 0) {
        fail("cannot map the virtual dataset");
    }
    d = H5Dcreate2(g, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (d < 0) {
        fail("cannot create the virtual dataset");
    }
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(space);
}

/* DSET of the checksum kinds: a full path, or a name under /model. */
static hid_t open_dset(hid_t f, const char *arg)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s%s", arg[0] == '/' ? "" : "/model/", arg);
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    if (d < 0) {
        fail("no such dataset");
    }
    return d;
}

/* Flips the lowest bit of byte `at` (-1: the middle) of the data of dset arg. */
static void flip(const char *file, hid_t f, const char *arg, long at)
{
    hid_t d = open_dset(f, arg);
    haddr_t off = H5Dget_offset(d);
    hsize_t size = H5Dget_storage_size(d);
    H5Dclose(d);
    if (off == HADDR_UNDEF || size == 0 || (at >= 0 && (hsize_t)at >= size)) {
        fail("dataset has no contiguous data to flip");
    }
    if (H5Fclose(f) < 0) {
        fail("close failed");
    }
    FILE *fp = fopen(file, "r+b");
    long pos = (long)off + (at >= 0 ? at : (long)(size / 2));
    int c = fp && fseek(fp, pos, SEEK_SET) == 0 ? fgetc(fp) : EOF;
    if (c == EOF || fseek(fp, pos, SEEK_SET) != 0 || fputc(c ^ 1, fp) == EOF || fclose(fp) != 0) {
        fail("cannot flip the byte");
    }
}

static herr_t unsum_one(hid_t obj, const char *name, const H5O_info_t *info, void *arg)
{
    (void)arg;
    if (info->type == H5O_TYPE_DATASET) {
        H5Adelete_by_name(obj, name, "xxh3_64", H5P_DEFAULT);
        H5Adelete_by_name(obj, name, "xxh3_64_rows", H5P_DEFAULT);
    }
    return 0;
}

static void put_hashes(hid_t d, hid_t ftype, const uint64_t *h, hsize_t n)
{
    if (H5Aexists(d, "xxh3_64") > 0) {
        H5Adelete(d, "xxh3_64");
    }
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t a = H5Acreate2(d, "xxh3_64", ftype, s, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, H5T_NATIVE_UINT64, h) < 0) {
        fail("cannot write xxh3_64");
    }
    H5Aclose(a);
    H5Sclose(s);
}

/* The checksum kinds that rewrite attributes of DSET. */
static void sum_attr(hid_t f, const char *kind, const char *arg, const char *val)
{
    hid_t d = open_dset(f, arg);
    if (!strcmp(kind, "sum-whole")) {
        hid_t t = H5Dget_type(d), s = H5Dget_space(d);
        size_t bytes = (size_t)H5Sget_simple_extent_npoints(s) * H5Tget_size(t);
        void *raw = malloc(bytes ? bytes : 1);
        if (!raw || H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw) < 0) {
            fail("cannot read dataset");
        }
        uint64_t h = XXH3_64bits(raw, bytes);
        free(raw);
        H5Tclose(t);
        H5Sclose(s);
        put_hashes(d, H5T_STD_U64LE, &h, 1);
        if (H5Aexists(d, "xxh3_64_rows") > 0) {
            H5Adelete(d, "xxh3_64_rows");
        }
    } else if (!strcmp(kind, "sum-type")) {
        uint64_t h[1] = {7};
        put_hashes(d, H5T_STD_I32LE, h, 1);
    } else if (!strcmp(kind, "sum-count")) {
        hid_t a = H5Aopen(d, "xxh3_64", H5P_DEFAULT);
        hid_t s = a < 0 ? -1 : H5Aget_space(a);
        hssize_t n = s < 0 ? -1 : H5Sget_simple_extent_npoints(s);
        uint64_t *h = n >= 0 ? calloc((size_t)n + 1, sizeof(uint64_t)) : NULL;
        if (!h || H5Aread(a, H5T_NATIVE_UINT64, h) < 0) {
            fail("cannot read xxh3_64");
        }
        H5Sclose(s);
        H5Aclose(a);
        put_hashes(d, H5T_STD_U64LE, h, (hsize_t)n + 1);
        free(h);
    } else if (!strcmp(kind, "sum-rows") && val) {
        long long v = atoll(val);
        put_attr(d, "xxh3_64_rows", H5T_STD_I64LE, H5T_NATIVE_LLONG, &v, 1);
    } else {
        fail("unknown kind");
    }
    H5Dclose(d);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fail("usage: bad_model KIND[:ARG] IN OUT");
    }
    char kind[256], *arg = NULL, *val = NULL;
    snprintf(kind, sizeof(kind), "%s", argv[1]);
    if ((arg = strchr(kind, ':'))) {
        *arg++ = '\0';
        if ((val = strchr(arg, '='))) {
            *val++ = '\0';
        }
    }
    copy_file(argv[2], argv[3]);
    hid_t f = H5Fopen(argv[3], H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t g = f >= 0 ? H5Gopen2(f, "model", H5P_DEFAULT) : -1;
    if (g < 0) {
        fail("cannot open the copy as a model file");
    }
    if (!strcmp(kind, "attr-missing") && arg) {
        if (H5Adelete(f, arg) < 0) {
            fail("no such attribute");
        }
    } else if (!strcmp(kind, "attr-string") && arg) {
        put_str_attr(f, arg, "12");
    } else if (!strcmp(kind, "attr-float") && arg) {
        float v = 4.0f;
        put_attr(f, arg, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &v, 1);
    } else if (!strcmp(kind, "attr-int") && arg && val) {
        int v = atoi(val);
        put_attr(f, arg, H5T_STD_I32LE, H5T_NATIVE_INT, &v, 1);
    } else if (!strcmp(kind, "attr-str") && arg && val) {
        put_str_attr(f, arg, val);
    } else if (!strcmp(kind, "attr-array") && arg) {
        int v[2] = {4, 4};
        put_attr(f, arg, H5T_STD_I32LE, H5T_NATIVE_INT, v, 2);
    } else if (!strcmp(kind, "missing") && arg) {
        if (H5Ldelete(g, arg, H5P_DEFAULT) < 0) {
            fail("no such dataset");
        }
    } else if (!strcmp(kind, "extra") && arg) {
        hsize_t n = 4;
        hid_t s = H5Screate_simple(1, &n, NULL);
        hid_t d = H5Dcreate2(g, arg, H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (d < 0) {
            fail("cannot create dataset");
        }
        H5Dclose(d);
        H5Sclose(s);
    } else if (!strcmp(kind, "shape") && arg) {
        retype(g, arg, H5T_IEEE_F32LE, 1);
    } else if (!strcmp(kind, "int") && arg) {
        retype(g, arg, H5T_STD_I32LE, 0);
    } else if (!strcmp(kind, "group") && arg) {
        if (H5Ldelete(g, arg, H5P_DEFAULT) < 0) {
            fail("no such dataset");
        }
        hid_t sub = H5Gcreate2(g, arg, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (sub < 0) {
            fail("cannot create group");
        }
        H5Gclose(sub);
    } else if (!strcmp(kind, "f64") && arg) {
        retype(g, arg, H5T_IEEE_F64LE, 0);
    } else if (!strcmp(kind, "f16be") && arg) {
        hid_t t = make_16bit(H5T_IEEE_F32BE, 10, 5, 15);
        retype(g, arg, t, 0);
        H5Tclose(t);
    } else if (!strcmp(kind, "bf16") && arg) {
        hid_t t = make_16bit(H5T_IEEE_F32LE, 7, 8, 127);
        retype(g, arg, t, 0);
        H5Tclose(t);
    } else if (!strcmp(kind, "vds") && arg) {
        make_virtual(g, arg, argv[3]);
    } else if (!strcmp(kind, "flip") && arg) {
        H5Gclose(g);
        flip(argv[3], f, arg, val ? atol(val) : -1);
        return 0;
    } else if (!strcmp(kind, "unsum")) {
        if (H5Ovisit(f, H5_INDEX_NAME, H5_ITER_NATIVE, unsum_one, NULL) < 0) {
            fail("cannot walk the file");
        }
        if (H5Aexists(f, "xxh3_64_attrs") > 0) {
            H5Adelete(f, "xxh3_64_attrs");
        }
        if (H5Aexists(f, "ckpt_summary") > 0) { /* a shard's, which came later */
            H5Adelete(f, "ckpt_summary");
        }
    } else if (!strncmp(kind, "sum-", 4) && arg) {
        sum_attr(f, kind, arg, val);
    } else if (!strcmp(kind, "no-model")) {
        H5Gclose(g);
        g = -1;
        if (H5Ldelete(f, "model", H5P_DEFAULT) < 0) {
            fail("cannot delete /model");
        }
    } else {
        fail("unknown kind");
    }
    if (g >= 0) {
        H5Gclose(g);
    }
    if (H5Fclose(f) < 0) {
        fail("close failed");
    }
    return 0;
}
