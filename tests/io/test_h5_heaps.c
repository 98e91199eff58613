/*
 * test_h5_heaps.c - the global heap check run before HDF5 opens a file: its
 * work stays linear in the file's size. Collections that each claim the
 * rest of the file, one every 32 bytes, cost a walk over most of the file
 * per collection (quadratic: a 4 MiB file took minutes); they are refused
 * within a few times the file's size of counted work. Collections side by
 * side, as HDF5 writes them, are all walked and accepted, and so is a file
 * HDF5 itself wrote with many variable-length strings.
 */
#include "config.h"
#include "core/error.h"
#include "io/h5/h5util.h"
#include "tests/tap.h"

#include <hdf5.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static void put_le(unsigned char *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

/* A 16-byte collection header (sizes of 8 bytes) or object header. */
static void put_gcol(unsigned char *p, uint64_t size)
{
    memcpy(p, "GCOL\1\0\0\0", 8);
    put_le(p + 8, size, 8);
}

static void put_obj(unsigned char *p, unsigned idx, uint64_t size)
{
    memset(p, 0, 8);
    put_le(p, idx, 2);
    put_le(p + 8, size, 8);
}

/* size bytes (a multiple of 64): a version-0 superblock with 8-byte
 * lengths, then 32-byte units up to the end. overlap: from byte 512, a
 * 16-byte collection (which walks step over as one object) and a
 * collection claiming the rest of the file, whose walk steps over every
 * later unit and is sound. Otherwise, from byte 544 (one collection then
 * straddles the scan's 4 MiB blocks), 64-byte sound collections side by
 * side: two objects and free space each. */
static int write_heaps(const char *path, size_t size, int overlap)
{
    unsigned char *b = calloc(1, size);
    if (!b) {
        return -1;
    }
    memcpy(b, "\211HDF\r\n\032\n", 8);
    b[13] = 8;
    b[14] = 8;
    for (size_t u = overlap ? 512 : 544; u + 64 <= size; u += 64) {
        if (overlap) {
            put_gcol(b + u, 16);
            put_gcol(b + u + 16, size - (u + 16));
            put_gcol(b + u + 32, 16);
            put_gcol(b + u + 48, size - (u + 48));
        } else {
            put_gcol(b + u, 64);
            put_obj(b + u + 16, 1, 8);
            put_obj(b + u + 40, 0, 24);
        }
    }
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(b, 1, size, f) == size ? 0 : -1;
    if (f && fclose(f) != 0) {
        rc = -1;
    }
    free(b);
    return rc;
}

/* A file HDF5 writes: n variable-length strings in one dataset. */
static int write_strings(const char *path, size_t n)
{
    char **v = calloc(n, sizeof(*v));
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t t = H5Tcopy(H5T_C_S1);
    hsize_t dim = n;
    hid_t sp = H5Screate_simple(1, &dim, NULL);
    int rc = -1;
    if (v && f >= 0 && t >= 0 && sp >= 0 && H5Tset_size(t, H5T_VARIABLE) >= 0) {
        for (size_t i = 0; i < n; i++) {
            v[i] = malloc(24);
            snprintf(v[i], 24, "string %zu", i);
        }
        hid_t d = H5Dcreate2(f, "s", t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        rc = d >= 0 && H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0 ? 0 : -1;
        fsdp_h5_close(d);
        for (size_t i = 0; i < n; i++) {
            free(v[i]);
        }
    }
    fsdp_h5_close(sp);
    fsdp_h5_close(t);
    fsdp_h5_close(f);
    free(v);
    return rc;
}

static size_t work(const struct fsdp_h5_heap_stats *st)
{
    return st->bytes_read + 16 * st->objects;
}

static void overlapping(size_t size)
{
    char path[128];
    struct fsdp_h5_heap_stats st;
    snprintf(path, sizeof(path), "%s/overlap_%zu.h5", dir, size);
    tap_ok(write_heaps(path, size, 1) == 0, "write %zu-byte overlapping heaps", size);
    int rc = fsdp_h5_scan_heaps(path, &st);
    /* each walk would step over every later unit: (size / 32)^2 / 2 objects */
    size_t bound = 4 * size + ((size_t)32 << 20);
    tap_diag("%zu bytes: rc %d, %zu signatures, %zu collections, %zu objects, %zu bytes read",
             size, rc, st.signatures, st.collections, st.objects, st.bytes_read);
    tap_ok(rc == FSDP_ERR_FORMAT && strstr(fsdp_err_msg(), "collections overlap"),
           "%zu-byte file of overlapping collections refused: %s", size, fsdp_err_msg());
    fsdp_err_clear();
    tap_ok(work(&st) <= bound, "... after %zu units of work (bound %zu; the full walk is %zu)",
           work(&st), bound, (size / 32) * (size / 32) / 2 * 16);
}

int main(void)
{
    fsdp_h5_quiet();
    snprintf(dir, sizeof(dir), "/tmp/fsdp_h5heaps_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    overlapping((size_t)1 << 20);
    overlapping((size_t)4 << 20);

    char path[128];
    struct fsdp_h5_heap_stats st;
    size_t size = (size_t)6 << 20, units = (size - 544) / 64;
    snprintf(path, sizeof(path), "%s/side.h5", dir);
    tap_ok(write_heaps(path, size, 0) == 0, "write %zu-byte side-by-side heaps", size);
    int rc = fsdp_h5_scan_heaps(path, &st);
    tap_diag("side by side: rc %d, %zu collections, %zu objects, %zu bytes read", rc,
             st.collections, st.objects, st.bytes_read);
    tap_ok(rc == 0 && st.collections == units && st.objects == 2 * units,
           "%zu collections side by side across %zu-byte blocks: all walked, accepted", units,
           (size_t)4 << 20);
    tap_ok(work(&st) <= 3 * size, "... in %zu units of work (3 x the file: %zu)", work(&st),
           3 * size);

    snprintf(path, sizeof(path), "%s/strings.h5", dir);
    tap_ok(write_strings(path, 20000) == 0, "HDF5 writes 20000 variable-length strings");
    rc = fsdp_h5_scan_heaps(path, &st);
    tap_ok(rc == 0 && st.collections > 0 && st.objects >= 20000,
           "that file's heaps accepted (rc %d, %zu collections, %zu objects)", rc,
           st.collections, st.objects);

    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) {
        tap_diag("could not remove %s", dir);
    }
    return tap_done();
}
