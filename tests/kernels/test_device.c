/*
 * test_device.c - the device seam's own contract (compute/device.h), on the
 * cpu and guarded devices: allocation is zeroed and counted, copies and
 * kernels reach device memory, a host read or write of guarded memory
 * stops the process with the buffer's name (checked in a child process),
 * host waits and device-to-host copies are counted, an allocation past
 * the device's memory is one error naming the buffer, the bytes and the
 * free memory, every kernel that reads parameters gives, from bf16 or
 * f16 parameters, bit for bit what it gives from the same values in f32,
 * bf16 activation storage rounds as the host does, and every entry that
 * takes activations in a storage dtype gives, from bf16 activations, the
 * f32 entry's results from their widened values (rounded to bf16 where it
 * stores bf16), within bf16's rounding of the f32 entry's from the
 * unrounded values.
 */
#include "config.h"
#include "compute/device.h"
#include "core/error.h"
#include "tests/tap.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn(arg) in a child with stderr into a pipe; returns its signal (0:
 * none) and what it printed. */
static int child_signal(void (*fn)(void *), void *arg, char *out, size_t len)
{
    int fd[2];
    if (pipe(fd) != 0) {
        return -1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], STDERR_FILENO);
        fn(arg);
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < len && (r = read(fd[0], out + n, len - 1 - n)) > 0) {
        n += (size_t)r;
    }
    out[n] = '\0';
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static void host_reads(void *p)
{
    volatile float *x = p;
    fprintf(stderr, "%g\n", (double)x[3]);
}

static void host_memsets(void *p)
{
    memset(p, 0, 64);
}

static void test_device(const char *name)
{
    struct fsdp_device *d = NULL;
    if (!tap_ok(fsdp_device_create(name, 0, &d) == 0, "%s: created", name)) {
        return;
    }
    const int guarded = strcmp(name, "guarded") == 0;
    float host[16], back[16] = {0};
    void *p = NULL, *q = NULL;
    for (int i = 0; i < 16; i++) {
        host[i] = (float)i + 0.5f;
    }
    tap_ok(fsdp_device_alloc(d, sizeof(host), "test buffer", &p) == 0 &&
               fsdp_device_alloc(d, sizeof(host), "test output", &q) == 0,
           "%s: two named allocations", name);
    tap_ok(d->stats.bytes_now == 2 * sizeof(host), "%s: %zu bytes counted (want %zu)", name,
           d->stats.bytes_now, 2 * sizeof(host));
    fsdp_device_read(d, back, p, sizeof(back));
    tap_ok(back[0] == 0.0f && back[15] == 0.0f, "%s: allocations are zeroed", name);
    fsdp_device_write(d, p, host, sizeof(host));
    d->k->accumulate(d, q, p, 16);
    d->k->accumulate(d, q, p, 16);
    long waits = d->stats.host_waits, reads = d->stats.d2h_copies;
    fsdp_device_read(d, back, q, sizeof(back));
    tap_ok(back[3] == 7.0f && back[15] == 31.0f, "%s: write, two accumulate kernels, read back",
           name);
    tap_ok(d->stats.host_waits == waits + 1 && d->stats.d2h_copies == reads + 1,
           "%s: a read is one host wait and one device-to-host copy", name);
    char msg[2048];
    int sig = child_signal(host_reads, p, msg, sizeof(msg));
    if (guarded) {
        tap_ok(sig == SIGSEGV && strstr(msg, "'test buffer'") && strstr(msg, "64 bytes") &&
                   strstr(msg, "byte 12") && strstr(msg, "hint"),
               "guarded: a host read of device memory stops the process naming the buffer, its "
               "size and the offset (signal %d)",
               sig);
        tap_diag("%s", msg);
        sig = child_signal(host_memsets, q, msg, sizeof(msg));
        tap_ok(sig == SIGSEGV && strstr(msg, "'test output'"),
               "guarded: a host memset of device memory is stopped too (signal %d)", sig);
    } else {
        tap_ok(sig == 0, "cpu: the host may read the CPU device's memory");
    }
    d->ops->free(d, p);
    tap_ok(d->stats.bytes_now == sizeof(host) && d->stats.bytes_peak == 2 * sizeof(host),
           "%s: a free is counted, the peak kept", name);
    d->ops->free(d, q);
    size_t free_b = 0, total_b = 0;
    int mrc = d->ops->mem_info(d, &free_b, &total_b);
    tap_ok(mrc == 0 && total_b > 0 && free_b <= total_b, "%s: memory info (%zu of %zu bytes free)",
           name, free_b, total_b);
    if (guarded) {
        void *big = NULL;
        int rc = fsdp_device_alloc(d, total_b + 1, "a huge buffer", &big);
        const char *e = fsdp_err_msg();
        tap_ok(rc == FSDP_ERR_NOMEM && strstr(e, "'a huge buffer'") == NULL &&
                   strstr(e, "a huge buffer") && strstr(e, "free"),
               "guarded: out of memory names the buffer, the bytes and the free memory");
        tap_diag("%s", e);
        fsdp_err_clear();
    }
    fsdp_device_destroy(d);
}

// ----------------------------------------------------------------------------
// parameters in 16-bit storage

enum { PN = 6, PT = 3, PC = 40, PV = 11, POC = 24 };

struct pbufs {
    struct fsdp_device *d;
    float *x, *x2, *out, *out2, *stat, *stat2;
    int32_t *tok;
    void *w32, *w16; /* (PV + PT) x max(PC, POC) parameter values, f32 and 16-bit */
    size_t nw;
};

/* Device memory holding n host values. */
static void *pdev(struct fsdp_device *d, const void *host, size_t bytes)
{
    void *p = NULL;
    if (fsdp_device_alloc(d, bytes, "kernel test buffer", &p) == 0 && host) {
        (void)fsdp_device_write(d, p, host, bytes);
    }
    return p;
}

/* out (n floats of device memory) equal to out2, bit for bit. */
static int psame(struct fsdp_device *d, const float *a, const float *b, size_t n)
{
    float *ha = malloc(n * sizeof(float)), *hb = malloc(n * sizeof(float));
    int same = ha && hb && fsdp_device_read(d, ha, a, n * sizeof(float)) == 0 &&
               fsdp_device_read(d, hb, b, n * sizeof(float)) == 0 &&
               memcmp(ha, hb, n * sizeof(float)) == 0;
    free(ha);
    free(hb);
    return same;
}

static void pzero(struct pbufs *b, size_t n)
{
    (void)fsdp_device_zero(b->d, b->out, n * sizeof(float));
    (void)fsdp_device_zero(b->d, b->out2, n * sizeof(float));
    (void)fsdp_device_zero(b->d, b->stat, 4 * PC * sizeof(float));
    (void)fsdp_device_zero(b->d, b->stat2, 4 * PC * sizeof(float));
}

/* Each parameter-reading kernel with w32 (f32) and w16 (t): equal outputs. */
static int pkernels(struct pbufs *b, enum fsdp_dtype t)
{
    struct fsdp_device *d = b->d;
    const struct fsdp_kernels *k = d->k;
    const float *w = b->w32;
    const uint16_t *h = b->w16;
    size_t big = PN * (PV > POC ? PV : POC) * PC;
    int bad = 0;
    pzero(b, big);
    k->encoder_forward(d, b->out, b->tok, w, w + PV * PC, FSDP_F32, 2, PT, PC);
    k->encoder_forward(d, b->out2, b->tok, h, h + PV * PC, t, 2, PT, PC);
    bad += !psame(d, b->out, b->out2, PN * PC);
    k->embed_gather(d, b->out, b->tok, w, FSDP_F32, PN, PC);
    k->embed_gather(d, b->out2, b->tok, h, t, PN, PC);
    bad += !psame(d, b->out, b->out2, PN * PC);
    k->embed_rows_forward(d, b->out, b->tok, w, 2, 5, w + PV * PC, 1, 2, FSDP_F32, PN, PT, PC);
    k->embed_rows_forward(d, b->out2, b->tok, h, 2, 5, h + PV * PC, 1, 2, t, PN, PT, PC);
    bad += !psame(d, b->out, b->out2, PN * PC);
    k->layernorm_forward(d, b->out, b->stat, b->stat + PC, b->x, FSDP_F32, FSDP_F32, w, w + PC,
                         FSDP_F32, PN, PC, 1e-5f);
    k->layernorm_forward(d, b->out2, b->stat2, b->stat2 + PC, b->x, FSDP_F32, FSDP_F32, h, h + PC,
                         t, PN, PC, 1e-5f);
    bad += !psame(d, b->out, b->out2, PN * PC);
    k->layernorm_backward(d, b->out, b->stat + 2 * PC, b->stat + 3 * PC, b->x2, b->x, FSDP_F32, w,
                          FSDP_F32, b->stat, b->stat + PC, 1, PC);
    k->layernorm_backward(d, b->out2, b->stat2 + 2 * PC, b->stat2 + 3 * PC, b->x2, b->x, FSDP_F32,
                          h, t, b->stat, b->stat + PC, 1, PC);
    bad += !psame(d, b->out, b->out2, PC);
    k->rmsnorm_forward(d, b->out, b->stat, NULL, b->x, FSDP_F32, FSDP_F32, w, FSDP_F32, PN, PC,
                       1e-5f);
    k->rmsnorm_forward(d, b->out2, b->stat2, NULL, b->x, FSDP_F32, FSDP_F32, h, t, PN, PC, 1e-5f);
    bad += !psame(d, b->out, b->out2, PN * PC);
    k->rmsnorm_backward(d, b->out, b->stat + PC, b->x2, b->x, FSDP_F32, w, FSDP_F32, b->stat, PN,
                        PC);
    k->rmsnorm_backward(d, b->out2, b->stat2 + PC, b->x2, b->x, FSDP_F32, h, t, b->stat, PN, PC);
    bad += !psame(d, b->out, b->out2, PN * PC);
    k->matmul_forward(d, b->out, FSDP_F32, b->x, FSDP_F32, w, w + POC * PC, FSDP_F32, NULL, PN, PC,
                      POC);
    k->matmul_forward(d, b->out2, FSDP_F32, b->x, FSDP_F32, h, h + POC * PC, t, NULL, PN, PC, POC);
    bad += !psame(d, b->out, b->out2, PN * POC);
    k->matmul_backward(d, b->out, NULL, NULL, b->x2, b->x, FSDP_F32, w, FSDP_F32, PN, PC, POC, 1.0f,
                       0);
    k->matmul_backward(d, b->out2, NULL, NULL, b->x2, b->x, FSDP_F32, h, t, PN, PC, POC, 1.0f, 0);
    bad += !psame(d, b->out, b->out2, PN * PC);
    k->bias_residual_forward(d, b->out, b->x, w, FSDP_F32, b->x2, FSDP_F32, FSDP_F32, PN, PC);
    k->bias_residual_forward(d, b->out2, b->x, h, t, b->x2, FSDP_F32, FSDP_F32, PN, PC);
    bad += !psame(d, b->out, b->out2, PN * PC);
    k->bias_residual_forward(d, b->out, b->x, NULL, FSDP_F32, b->x2, FSDP_F32, FSDP_F32, PN, PC);
    k->bias_residual_forward(d, b->out2, b->x, NULL, t, b->x2, FSDP_F32, FSDP_F32, PN, PC);
    bad += !psame(d, b->out, b->out2, PN * PC);
    return bad;
}

static void test_param_dtypes(const char *name)
{
    struct pbufs b = {0};
    if (fsdp_device_create(name, 0, &b.d) < 0) {
        tap_ok(0, "%s: created for the parameter-dtype checks", name);
        return;
    }
    size_t rows = (PV > POC ? PV : POC) + PT, nw = rows * PC, nx = PN * (PV > POC ? PV : POC) * PC;
    float *hw = malloc(nw * sizeof(float)), *hx = malloc(nx * sizeof(float));
    uint16_t *h16 = malloc(nw * sizeof(uint16_t));
    int32_t tok[PN] = {3, 0, 10, 3, 7, 1};
    for (size_t i = 0; i < nx; i++) {
        hx[i] = sinf(0.37f * (float)i) + 0.1f;
    }
    const enum fsdp_dtype types[] = {FSDP_BF16, FSDP_F16};
    for (int k = 0; k < 2; k++) {
        enum fsdp_dtype t = types[k];
        for (size_t i = 0; i < nw; i++) {
            hw[i] = 0.8f + 0.3f * cosf(0.11f * (float)i); /* rounded to t below: exact both ways */
        }
        (t == FSDP_BF16 ? fsdp_cpu_f32_to_bf16 : fsdp_cpu_f32_to_f16)(h16, hw, nw);
        (t == FSDP_BF16 ? fsdp_cpu_bf16_to_f32 : fsdp_cpu_f16_to_f32)(hw, h16, nw);
        b.w32 = pdev(b.d, hw, nw * sizeof(float));
        b.w16 = pdev(b.d, h16, nw * sizeof(uint16_t));
        b.x = pdev(b.d, hx, nx * sizeof(float));
        b.x2 = pdev(b.d, hx + 7, (nx - 7) * sizeof(float));
        b.out = pdev(b.d, NULL, nx * sizeof(float));
        b.out2 = pdev(b.d, NULL, nx * sizeof(float));
        b.stat = pdev(b.d, NULL, 4 * PC * sizeof(float));
        b.stat2 = pdev(b.d, NULL, 4 * PC * sizeof(float));
        b.tok = pdev(b.d, tok, sizeof(tok));
        int bad = b.tok ? pkernels(&b, t) : -1;
        tap_ok(bad == 0,
               "%s: every parameter-reading kernel from %s parameters equals f32 bit for "
               "bit (%d differ)",
               name, fsdp_dtype_name(t), bad);
        void *all[] = {b.w32, b.w16, b.x, b.x2, b.out, b.out2, b.stat, b.stat2, b.tok};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
            b.d->ops->free(b.d, all[i]);
        }
    }
    free(hw), free(hx), free(h16);
    fsdp_device_destroy(b.d);
}

/*
 * bf16 activation storage (--activation-dtype bf16): the model rounds a
 * tensor through the table's f32_to_bf16 and bf16_to_f32, and the backward
 * widens the stored values again. On an odd length (a tensor's tail), the
 * round trip equals the host's rounding of each value, and a second one
 * changes nothing: what the backward reads is what the forward read.
 */
static void test_act_storage(const char *name)
{
    enum { AN = 1001 };
    struct fsdp_device *d = NULL;
    if (fsdp_device_create(name, 0, &d) < 0) {
        tap_ok(0, "%s: created for the activation-storage check", name);
        return;
    }
    static float h[AN], ref[AN], got[AN];
    static uint16_t h16[AN];
    for (size_t i = 0; i < AN; i++) {
        h[i] = ldexpf(sinf(0.91f * (float)i), (int)(i % 41) - 20) + (i % 7 == 0 ? 1e-3f : 0.0f);
    }
    h[5] = 1.0f + 1.0f / 256.0f; /* a tie: to even */
    fsdp_cpu_f32_to_bf16(h16, h, AN);
    fsdp_cpu_bf16_to_f32(ref, h16, AN);
    float *x = pdev(d, h, sizeof(h));
    uint16_t *st = pdev(d, NULL, AN * sizeof(uint16_t));
    int bad = 0;
    for (int pass = 0; pass < 2 && x && st; pass++) {
        d->k->f32_to_bf16(d, st, x, AN);
        d->k->bf16_to_f32(d, x, st, AN);
        fsdp_device_read(d, got, x, sizeof(got));
        for (size_t i = 0; i < AN; i++) {
            bad += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
        }
    }
    tap_ok(x && st && bad == 0,
           "%s: bf16 activation storage rounds as the host does, odd length, and a second "
           "round trip changes nothing (%d differ)",
           name, bad);
    d->ops->free(d, x);
    d->ops->free(d, st);
    fsdp_device_destroy(d);
}

// ----------------------------------------------------------------------------
// activations in bf16 storage

/* More than one CPU tile (2048 values) and odd: tiles and a tail. */
enum { AN = 5001, AE = 4 };

static const char *const aname[AE] = {"gelu_forward", "gelu_backward", "swiglu_forward",
                                      "swiglu_backward"};

struct abufs {
    struct fsdp_device *d;
    float *x[3][2];   /* [mode][input]: mode 1 rounded to bf16 and widened, 2 unrounded */
    uint16_t *x16[2]; /* mode 0: the inputs rounded to bf16 */
    float *dy;        /* an f32 gradient */
    float *o[2];      /* f32 outputs */
    uint16_t *o16;    /* a bf16 output */
};

/* The device's n values at p (bf16 when bf16) into h, as f32. */
static void aread_n(struct fsdp_device *d, float *h, const void *p, int bf16, size_t n)
{
    if (!bf16) {
        (void)fsdp_device_read(d, h, p, n * sizeof(float));
        return;
    }
    uint16_t *t = malloc(n * sizeof(uint16_t));
    if (t && fsdp_device_read(d, t, p, n * sizeof(uint16_t)) == 0) {
        fsdp_cpu_bf16_to_f32(h, t, n);
    }
    free(t);
}

static void aread(struct fsdp_device *d, float *h, const void *p, int bf16)
{
    aread_n(d, h, p, bf16, AN);
}

/* Entry e over the inputs of mode (0: bf16, else f32 mode 1 or 2); its
 * outputs into h[0] (and h[1]); returns whether the first is stored bf16. */
static int arun(struct abufs *b, int e, int mode, float h[2][AN])
{
    struct fsdp_device *d = b->d;
    const struct fsdp_kernels *k = d->k;
    enum fsdp_dtype at = mode ? FSDP_F32 : FSDP_BF16;
    const void *in0 = mode ? (const void *)b->x[mode][0] : b->x16[0];
    const void *in1 = mode ? (const void *)b->x[mode][1] : b->x16[1];
    void *out = mode ? (void *)b->o[0] : b->o16;
    switch (e) {
    case 0:
        k->gelu_forward(d, out, in0, at, AN);
        break;
    case 1:
        k->gelu_backward(d, b->o[0], in0, b->dy, at, AN);
        break;
    case 2:
        k->swiglu_forward(d, out, in0, in1, at, AN);
        break;
    default:
        k->swiglu_backward(d, b->o[0], b->o[1], b->dy, in0, in1, at, AN);
        aread(d, h[1], b->o[1], 0);
        break;
    }
    int bf16_out = !mode && (e == 0 || e == 2);
    aread(d, h[0], bf16_out ? (const void *)b->o16 : b->o[0], bf16_out);
    return e == 0 || e == 2;
}

/*
 * n values of an entry from bf16 activations (got) against the f32 entry
 * from their widened values (wide, rounded to bf16 where the output is
 * stored so): equal bit for bit; and against the f32 entry from the
 * unrounded inputs (ref): within bf16's rounding, |got - ref| <= units
 * 2^-8 (|ref| + mean |ref|). Returns the values that break either;
 * *worst: the largest |got - ref| / (2^-8 (|ref| + mean |ref|)).
 */
static int acheck_n(const float *got, float *wide, const float *ref, int bf16_out, double *worst,
                    size_t n, double units)
{
    uint16_t *t = malloc(n * sizeof(uint16_t));
    double mean = 0.0;
    int bad = 0;
    if (bf16_out && t) {
        fsdp_cpu_f32_to_bf16(t, wide, n);
        fsdp_cpu_bf16_to_f32(wide, t, n);
    }
    free(t);
    for (size_t i = 0; i < n; i++) {
        mean += fabs(ref[i]) / (double)n;
    }
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / ((fabs(ref[i]) + mean) * ldexp(1.0, -8));
        *worst = e > *worst ? e : *worst;
        bad += memcmp(&got[i], &wide[i], sizeof(float)) != 0 || !(e <= units);
    }
    return bad;
}

static int acheck(const float *got, float *wide, const float *ref, int bf16_out, double *worst)
{
    return acheck_n(got, wide, ref, bf16_out, worst, AN, 4.0);
}

static void test_act_dtypes(const char *name)
{
    struct abufs b = {0};
    static float hx[2][AN], hw[2][AN], hdy[AN], h[3][2][AN];
    static uint16_t h16[2][AN];
    if (fsdp_device_create(name, 0, &b.d) < 0) {
        tap_ok(0, "%s: created for the activation-dtype checks", name);
        return;
    }
    for (size_t i = 0; i < AN; i++) { /* gelu's and silu's curved range, and past it */
        hx[0][i] = 3.0f * sinf(0.37f * (float)i) + 0.1f;
        hx[1][i] = 0.5f + cosf(0.23f * (float)i);
        hdy[i] = 0.25f * cosf(0.91f * (float)i);
    }
    for (int j = 0; j < 2; j++) {
        fsdp_cpu_f32_to_bf16(h16[j], hx[j], AN);
        fsdp_cpu_bf16_to_f32(hw[j], h16[j], AN);
        b.x[1][j] = pdev(b.d, hw[j], sizeof(hw[j]));
        b.x[2][j] = pdev(b.d, hx[j], sizeof(hx[j]));
        b.x16[j] = pdev(b.d, h16[j], sizeof(h16[j]));
        b.o[j] = pdev(b.d, NULL, AN * sizeof(float));
    }
    b.dy = pdev(b.d, hdy, sizeof(hdy));
    b.o16 = pdev(b.d, NULL, AN * sizeof(uint16_t));
    for (int e = 0; e < AE; e++) {
        int bad = 0, bf16_out = 0;
        double worst = 0.0;
        for (int mode = 0; mode < 3 && b.o16; mode++) {
            bf16_out = arun(&b, e, mode, h[mode]);
        }
        for (int j = 0; j < (e == 3 ? 2 : 1) && b.o16; j++) {
            bad += acheck(h[0][j], h[1][j], h[2][j], bf16_out, &worst);
        }
        tap_ok(b.o16 && bad == 0,
               "%s: %s from bf16 activations equals the f32 entry from their widened values "
               "%s, and the f32 entry from unrounded ones within bf16's rounding (worst %.2f "
               "of 4 units of 2^-8; %d values off)",
               name, aname[e], bf16_out ? "rounded to bf16" : "bit for bit", worst, bad);
    }
    void *all[] = {b.x[1][0], b.x[1][1], b.x[2][0], b.x[2][1], b.x16[0],
                   b.x16[1],  b.dy,      b.o[0],    b.o[1],    b.o16};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        b.d->ops->free(b.d, all[i]);
    }
    fsdp_device_destroy(b.d);
}

/*
 * The attentions from bf16 activations (B sequences, odd T; GPT-2's entry
 * and the grouped one): forward from bf16 qkv, from its widened values and
 * from the unrounded ones; backward from bf16 qkv and out, from their
 * widened values (with the bf16 forward's lse) and from the unrounded f32
 * forward's. The outputs and lse as acheck_n checks them, the f32 ones
 * within 16 units (the softmax's sums magnify an input's rounding).
 */
enum { TB = 2, TT = 37, TNH = 4, THS = 8 };

static int att_run(struct fsdp_device *d, int gqa, int nkv, void *out, float *lse, float *sc,
                   const void *qkv, enum fsdp_dtype at)
{
    if (gqa) {
        d->k->gqa_attention_forward(d, out, lse, sc, qkv, at, TB, TT, TNH, nkv, THS);
    } else {
        d->k->attention_forward(d, out, lse, sc, qkv, at, TB, TT, TNH * THS, TNH);
    }
    return 0;
}

static void att_back(struct fsdp_device *d, int gqa, int nkv, float *dqkv, float *sc,
                     const float *dout, const void *qkv, const void *out, const float *lse,
                     enum fsdp_dtype at)
{
    if (gqa) {
        d->k->gqa_attention_backward(d, dqkv, sc, dout, qkv, out, lse, at, TB, TT, TNH, nkv, THS);
    } else {
        d->k->attention_backward(d, dqkv, sc, dout, qkv, out, lse, at, TB, TT, TNH * THS, TNH);
    }
}

static int test_act_attention_one(struct fsdp_device *d, int gqa, double *worst)
{
    int nkv = gqa ? 2 : TNH;
    size_t nq = (size_t)TB * TT * (TNH + 2 * nkv) * THS, no = (size_t)TB * TT * TNH * THS;
    size_t nl = (size_t)TB * TNH * TT,
           nsc = d->k->gqa_attention_scratch_floats(d, TT, TNH, nkv, THS);
    float *hq = malloc(nq * sizeof(float)), *hw = malloc(nq * sizeof(float));
    float *hd = malloc(no * sizeof(float)), *h[3][3];
    uint16_t *h16 = malloc(nq * sizeof(uint16_t));
    for (size_t i = 0; i < nq; i++) {
        hq[i] = 1.5f * sinf(0.29f * (float)i) + 0.05f * cosf(1.3f * (float)i);
    }
    for (size_t i = 0; i < no; i++) {
        hd[i] = 0.5f * cosf(0.77f * (float)i);
    }
    fsdp_cpu_f32_to_bf16(h16, hq, nq);
    fsdp_cpu_bf16_to_f32(hw, h16, nq);
    for (int m = 0; m < 3; m++) { /* [mode][out, lse, dqkv] */
        h[m][0] = malloc(no * sizeof(float)), h[m][1] = malloc(nl * sizeof(float));
        h[m][2] = malloc(nq * sizeof(float));
    }
    void *q16 = pdev(d, h16, nq * sizeof(uint16_t)), *qw = pdev(d, hw, nq * sizeof(float));
    void *qr = pdev(d, hq, nq * sizeof(float)), *dout = pdev(d, hd, no * sizeof(float));
    void *o16 = pdev(d, NULL, no * sizeof(uint16_t)), *ow = pdev(d, NULL, no * sizeof(float));
    void *orr = pdev(d, NULL, no * sizeof(float)), *sc = pdev(d, NULL, (nsc + 1) * sizeof(float));
    float *l[3], *dq = pdev(d, NULL, nq * sizeof(float));
    for (int m = 0; m < 3; m++) {
        l[m] = pdev(d, NULL, nl * sizeof(float));
    }
    void *qin[3] = {q16, qw, qr}, *oo[3] = {o16, ow, orr};
    for (int m = 0; m < 3; m++) {
        att_run(d, gqa, nkv, oo[m], l[m], sc, qin[m], m ? FSDP_F32 : FSDP_BF16);
        aread_n(d, h[m][0], oo[m], m == 0, no);
        aread_n(d, h[m][1], l[m], 0, nl);
    }
    /* backward: mode 1 reads the bf16 forward's out, widened, and lse */
    (void)fsdp_device_write(d, ow, h[0][0], no * sizeof(float));
    for (int m = 0; m < 3; m++) {
        att_back(d, gqa, nkv, dq, sc, dout, qin[m], oo[m], l[m == 2 ? 2 : 0],
                 m ? FSDP_F32 : FSDP_BF16);
        aread_n(d, h[m][2], dq, 0, nq);
    }
    int bad = acheck_n(h[0][0], h[1][0], h[2][0], 1, worst, no, 16.0);
    bad += acheck_n(h[0][1], h[1][1], h[2][1], 0, worst, nl, 16.0);
    bad += acheck_n(h[0][2], h[1][2], h[2][2], 0, worst, nq, 16.0);
    void *all[] = {q16, qw, qr, dout, o16, ow, orr, sc, dq, l[0], l[1], l[2]};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        d->ops->free(d, all[i]);
    }
    for (int m = 0; m < 3; m++) {
        free(h[m][0]), free(h[m][1]), free(h[m][2]);
    }
    free(hq), free(hw), free(hd), free(h16);
    return bad;
}

static void test_act_attention(const char *name)
{
    struct fsdp_device *d = NULL;
    if (fsdp_device_create(name, 0, &d) < 0) {
        tap_ok(0, "%s: created for the attention activation-dtype checks", name);
        return;
    }
    for (int gqa = 0; gqa < 2; gqa++) {
        double worst = 0.0;
        int bad = test_act_attention_one(d, gqa, &worst);
        tap_ok(bad == 0,
               "%s: %s forward and backward from bf16 activations equal the f32 entries from "
               "their widened values (out rounded to bf16), and from unrounded ones within "
               "bf16's rounding (worst %.2f of 16 units of 2^-8; %d values off)",
               name, gqa ? "gqa_attention" : "attention", worst, bad);
    }
    fsdp_device_destroy(d);
}

/*
 * The norms' backwards from a bf16 input (N rows of C: more than one of
 * the CPU's row tiles), as acheck_n checks them (16 units: the mean's
 * subtraction and the column sums magnify an input's rounding): from the bf16
 * input, from its widened values (the statistics of the widened values'
 * forward for both, as the model has them), and from the unrounded ones
 * (their own statistics). dinp, dweight (and dbias) each.
 */
enum { NN = 1000, NC = 37 };

static int norm_back(struct fsdp_device *d, int ln, void *x, enum fsdp_dtype at, float *w,
                     float *st, float *dy, float *g)
{
    (void)fsdp_device_zero(d, g, (NN + 2) * NC * sizeof(float));
    if (ln) {
        d->k->layernorm_backward(d, g, g + NN * NC, g + (NN + 1) * NC, dy, x, at, w, FSDP_F32, st,
                                 st + NN, NN, NC);
    } else {
        d->k->rmsnorm_backward(d, g, g + NN * NC, dy, x, at, w, FSDP_F32, st, NN, NC);
    }
    return 0;
}

static int test_act_norm_one(struct fsdp_device *d, int ln, double *worst)
{
    size_t n = (size_t)NN * NC, ng = (size_t)(NN + 2) * NC;
    float *hx = malloc(n * sizeof(float)), *hw = malloc(n * sizeof(float));
    float *hdy = malloc(n * sizeof(float)), *hwt = malloc(NC * sizeof(float)), *h[3];
    uint16_t *h16 = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        hx[i] = 2.0f * sinf(0.31f * (float)i) + 0.3f;
        hdy[i] = 0.5f * cosf(0.53f * (float)i);
    }
    for (size_t i = 0; i < NC; i++) {
        hwt[i] = 0.9f + 0.2f * sinf((float)i);
    }
    fsdp_cpu_f32_to_bf16(h16, hx, n);
    fsdp_cpu_bf16_to_f32(hw, h16, n);
    void *x16 = pdev(d, h16, n * sizeof(uint16_t));
    float *xw = pdev(d, hw, n * sizeof(float)), *xr = pdev(d, hx, n * sizeof(float));
    float *dy = pdev(d, hdy, n * sizeof(float)), *w = pdev(d, hwt, NC * sizeof(float));
    float *out = pdev(d, NULL, n * sizeof(float)), *g = pdev(d, NULL, ng * sizeof(float));
    float *sw = pdev(d, NULL, 2 * NN * sizeof(float)), *sr = pdev(d, NULL, 2 * NN * sizeof(float));
    float *bias = pdev(d, NULL, NC * sizeof(float));
    if (ln) {
        d->k->layernorm_forward(d, out, sw, sw + NN, xw, FSDP_F32, FSDP_F32, w, bias, FSDP_F32, NN,
                                NC, 1e-5f);
        d->k->layernorm_forward(d, out, sr, sr + NN, xr, FSDP_F32, FSDP_F32, w, bias, FSDP_F32, NN,
                                NC, 1e-5f);
    } else {
        d->k->rmsnorm_forward(d, out, sw, NULL, xw, FSDP_F32, FSDP_F32, w, FSDP_F32, NN, NC, 1e-5f);
        d->k->rmsnorm_forward(d, out, sr, NULL, xr, FSDP_F32, FSDP_F32, w, FSDP_F32, NN, NC, 1e-5f);
    }
    void *in[3] = {x16, xw, xr};
    float *sts[3] = {sw, sw, sr};
    for (int m = 0; m < 3; m++) {
        h[m] = malloc(ng * sizeof(float));
        norm_back(d, ln, in[m], m ? FSDP_F32 : FSDP_BF16, w, sts[m], dy, g);
        aread_n(d, h[m], g, 0, ng);
    }
    int bad = acheck_n(h[0], h[1], h[2], 0, worst, n, 16.0);
    bad += acheck_n(h[0] + n, h[1] + n, h[2] + n, 0, worst, (ln ? 2 : 1) * NC, 16.0);
    void *all[] = {x16, xw, xr, dy, w, out, g, sw, sr, bias};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        d->ops->free(d, all[i]);
    }
    for (int m = 0; m < 3; m++) {
        free(h[m]);
    }
    free(hx), free(hw), free(hdy), free(hwt), free(h16);
    return bad;
}

/*
 * The norms' forwards with a bf16 output, from a bf16 input (mode 0) and
 * from its widened values in f32 (mode 1, the first norm's case), against
 * the f32 entry from the widened values (bit for bit, rounded: the output;
 * exact: the statistics and RMSNorm's kept copy) and from the unrounded
 * values (within bf16's rounding: 4 units). N rows of C: two row tiles.
 */
static void norm_fwd(struct fsdp_device *d, int ln, void *out, enum fsdp_dtype at, const void *x,
                     enum fsdp_dtype it, float *w, float *st, float *keep)
{
    if (ln) {
        d->k->layernorm_forward(d, out, st, st + NN, x, at, it, w, w + NC, FSDP_F32, NN, NC, 1e-5f);
    } else {
        d->k->rmsnorm_forward(d, out, st, keep, x, at, it, w, FSDP_F32, NN, NC, 1e-5f);
    }
}

static int test_act_norm_fwd_one(struct fsdp_device *d, int ln, double *worst)
{
    size_t n = (size_t)NN * NC, nh = n + 2 * NN;
    float *hx = malloc(n * sizeof(float)), *hw = malloc(n * sizeof(float)), hwt[2 * NC];
    float *h[4], *ref = malloc(nh * sizeof(float)), *wide = malloc(nh * sizeof(float));
    uint16_t *h16 = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        hx[i] = 2.0f * sinf(0.31f * (float)i) + 0.3f;
    }
    for (size_t i = 0; i < 2 * NC; i++) {
        hwt[i] = 0.9f + 0.2f * sinf((float)i);
    }
    fsdp_cpu_f32_to_bf16(h16, hx, n);
    fsdp_cpu_bf16_to_f32(hw, h16, n);
    void *x16 = pdev(d, h16, n * sizeof(uint16_t)), *o16 = pdev(d, NULL, n * sizeof(uint16_t));
    float *xw = pdev(d, hw, n * sizeof(float)), *xr = pdev(d, hx, n * sizeof(float));
    float *w = pdev(d, hwt, 2 * NC * sizeof(float)), *out = pdev(d, NULL, n * sizeof(float));
    float *st = pdev(d, NULL, 2 * NN * sizeof(float)), *keep = pdev(d, NULL, n * sizeof(float));
    norm_fwd(d, ln, out, FSDP_F32, xw, FSDP_F32, w, st, NULL);
    aread_n(d, wide, out, 0, n), aread_n(d, wide + n, st, 0, 2 * NN);
    norm_fwd(d, ln, out, FSDP_F32, xr, FSDP_F32, w, st, NULL);
    aread_n(d, ref, out, 0, n), aread_n(d, ref + n, st, 0, 2 * NN);
    int bad = 0;
    for (int m = 0; m < 2; m++) {
        for (int i = 0; i < 2; i++) {
            h[2 * m + i] = malloc(nh * sizeof(float));
        }
        norm_fwd(d, ln, o16, FSDP_BF16, m ? (void *)xw : x16, m ? FSDP_F32 : FSDP_BF16, w, st,
                 keep);
        aread_n(d, h[2 * m], o16, 1, n), aread_n(d, h[2 * m] + n, st, 0, 2 * NN);
        aread_n(d, h[2 * m + 1], keep, 0, n);
        bad += memcmp(h[2 * m] + n, wide + n, (ln ? 2 : 1) * NN * sizeof(float)) != 0;
        bad += !ln && memcmp(h[2 * m + 1], hw, n * sizeof(float)) != 0;
        bad += acheck_n(h[2 * m], wide, ref, 1, worst, n, 4.0);
    }
    void *all[] = {x16, o16, xw, xr, w, out, st, keep};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        d->ops->free(d, all[i]);
    }
    for (int m = 0; m < 4; m++) {
        free(h[m]);
    }
    free(hx), free(hw), free(h16), free(ref), free(wide);
    return bad;
}

/*
 * The residual add (with a bias) to a bf16 output from a bf16 residual,
 * to a bf16 output from an f32 one and to an f32 output from a bf16 one,
 * against the f32 entry from the widened residual (bit for bit, rounded
 * where the output is bf16) and from the unrounded one (within bf16's
 * rounding: 4 units). N rows of C: two row tiles.
 */
static int test_act_residual_one(struct fsdp_device *d, double *worst)
{
    size_t n = (size_t)NN * NC;
    float *hx = malloc(n * sizeof(float)), *hw = malloc(n * sizeof(float)), hb[NC];
    float *hi = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    float *wide = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    float *cp = malloc(n * sizeof(float));
    uint16_t *h16 = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        hx[i] = 2.0f * sinf(0.31f * (float)i) + 0.3f;
        hi[i] = 0.7f * cosf(0.17f * (float)i);
    }
    for (size_t i = 0; i < NC; i++) {
        hb[i] = 0.1f * sinf((float)i);
    }
    fsdp_cpu_f32_to_bf16(h16, hx, n);
    fsdp_cpu_bf16_to_f32(hw, h16, n);
    void *r16 = pdev(d, h16, n * sizeof(uint16_t)), *o16 = pdev(d, NULL, n * sizeof(uint16_t));
    float *rw = pdev(d, hw, n * sizeof(float)), *rr = pdev(d, hx, n * sizeof(float));
    float *in = pdev(d, hi, n * sizeof(float)), *b = pdev(d, hb, NC * sizeof(float));
    float *out = pdev(d, NULL, n * sizeof(float));
    const enum fsdp_dtype F = FSDP_F32, H = FSDP_BF16;
    d->k->bias_residual_forward(d, out, in, b, F, rw, F, F, NN, NC);
    aread_n(d, wide, out, 0, n);
    d->k->bias_residual_forward(d, out, in, b, F, rr, F, F, NN, NC);
    aread_n(d, ref, out, 0, n);
    int bad = 0;
    for (int m = 0; m < 3; m++) {
        enum fsdp_dtype at = m == 2 ? F : H, rt = m == 1 ? F : H;
        void *o = at == H ? o16 : (void *)out;
        d->k->bias_residual_forward(d, o, in, b, F, rt == H ? r16 : (void *)rw, at, rt, NN, NC);
        aread_n(d, got, o, at == H, n);
        memcpy(cp, wide, n * sizeof(float));
        bad += acheck_n(got, cp, ref, at == H, worst, n, 4.0);
    }
    void *all[] = {r16, o16, rw, rr, in, b, out};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        d->ops->free(d, all[i]);
    }
    free(hx), free(hw), free(hi), free(got), free(wide), free(ref), free(cp), free(h16);
    return bad;
}

/*
 * The matmuls with bf16 activations, weights and bias f32 or bf16 (pt: one
 * workspace then holds them and the activations): the forward from a bf16
 * input to an f32 and a bf16 output and from an f32 input to a bf16 one,
 * and the backward from a bf16 input (dinp, dweight, dbias), against the
 * f32 entry from the widened input, bit for bit (rounded where stored).
 */
enum { MOC = 29 };

static int test_act_matmul_one(struct fsdp_device *d, enum fsdp_dtype pt, double *worst)
{
    const enum fsdp_dtype F = FSDP_F32, H = FSDP_BF16;
    size_t nx = (size_t)NN * NC, ny = (size_t)NN * MOC, nw = (size_t)MOC * NC + MOC;
    float *hx = malloc(nx * 4), *hw = malloc(nw * 4), *hy = malloc(ny * 4), *ref = malloc(ny * 4);
    float *got = malloc(ny * 4), *cp = malloc(ny * 4);
    uint16_t *x16 = malloc(nx * 2), *w16 = malloc(nw * 2);
    for (size_t i = 0; i < nx; i++) {
        hx[i] = 2.0f * sinf(0.31f * (float)i) + 0.3f;
    }
    for (size_t i = 0; i < ny; i++) {
        hy[i] = 0.5f * sinf(0.7f * (float)i);
    }
    for (size_t i = 0; i < nw; i++) {
        hw[i] = 0.2f * cosf(0.13f * (float)i);
    }
    fsdp_cpu_f32_to_bf16(x16, hx, nx);
    fsdp_cpu_bf16_to_f32(hx, x16, nx); /* the widened input */
    fsdp_cpu_f32_to_bf16(w16, hw, nw);
    void *xh = pdev(d, x16, nx * 2), *xw = pdev(d, hx, nx * 4), *y16 = pdev(d, NULL, ny * 2);
    void *w = pt == F ? pdev(d, hw, nw * 4) : pdev(d, w16, nw * 2);
    const void *b = (const char *)w + (size_t)MOC * NC * (pt == F ? 4 : 2);
    float *y = pdev(d, NULL, ny * 4), *dy = pdev(d, hy, ny * 4), *g[2];
    d->k->matmul_forward(d, y, F, xw, F, w, b, pt, NULL, NN, NC, MOC);
    aread_n(d, ref, y, 0, ny);
    int bad = 0;
    for (int m = 0; m < 3; m++) {
        enum fsdp_dtype it = m == 1 ? F : H, ot = m == 0 ? F : H;
        void *o = ot == H ? y16 : (void *)y;
        d->k->matmul_forward(d, o, ot, it == H ? xh : xw, it, w, b, pt, NULL, NN, NC, MOC);
        aread_n(d, got, o, ot == H, ny);
        memcpy(cp, ref, ny * 4);
        bad += acheck_n(got, cp, ref, ot == H, worst, ny, 1.0);
    }
    for (int j = 0; j < 2; j++) { /* dinp (nx), dweight, dbias (nw) */
        g[j] = pdev(d, NULL, (nx + nw) * 4);
        d->k->matmul_backward(d, g[j], g[j] + nx, g[j] + nx + nw - MOC, dy, j ? xh : xw, j ? H : F,
                              w, pt, NN, NC, MOC, 0.5f, 0);
    }
    bad += !psame(d, g[0], g[1], nx + nw);
    void *all[] = {xh, xw, y16, w, y, dy, g[0], g[1]};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        d->ops->free(d, all[i]);
    }
    free(hx), free(hw), free(hy), free(ref), free(got), free(cp), free(x16), free(w16);
    return bad;
}

static void test_act_norms(const char *name)
{
    struct fsdp_device *d = NULL;
    if (fsdp_device_create(name, 0, &d) < 0) {
        tap_ok(0, "%s: created for the norms' activation-dtype checks", name);
        return;
    }
    for (int ln = 0; ln < 2; ln++) {
        double worst = 0.0;
        int bad = test_act_norm_one(d, ln, &worst);
        tap_ok(bad == 0,
               "%s: %s_backward from a bf16 input equals the f32 entry from its widened values "
               "bit for bit, and from unrounded ones within bf16's rounding (worst %.2f of 16 "
               "units of 2^-8; %d values off)",
               name, ln ? "layernorm" : "rmsnorm", worst, bad);
        worst = 0.0;
        bad = test_act_norm_fwd_one(d, ln, &worst);
        tap_ok(bad == 0,
               "%s: %s_forward to a bf16 output from a bf16 and an f32 input equals the f32 "
               "entry from the widened values bit for bit, rounded (statistics and kept copy "
               "exact), and from unrounded ones within bf16's rounding (worst %.2f of 4 units "
               "of 2^-8; %d off)",
               name, ln ? "layernorm" : "rmsnorm", worst, bad);
    }
    double worst = 0.0;
    int bad = test_act_residual_one(d, &worst);
    tap_ok(bad == 0,
           "%s: bias_residual_forward with a bf16 output or residual equals the f32 entry from "
           "the widened residual bit for bit, rounded where stored, and from the unrounded one "
           "within bf16's rounding (worst %.2f of 4 units of 2^-8; %d off)",
           name, worst, bad);
    for (int j = 0; j < 2; j++) {
        worst = 0.0;
        bad = test_act_matmul_one(d, j ? FSDP_BF16 : FSDP_F32, &worst);
        tap_ok(bad == 0,
               "%s: matmul_forward from a bf16 input, to a bf16 output or both, and "
               "matmul_backward from a bf16 input (%s weights) equal the f32 entries from the "
               "widened input bit for bit, rounded where stored (worst %.2f of 1 unit of 2^-8; "
               "%d off)",
               name, j ? "bf16" : "f32", worst, bad);
    }
    fsdp_device_destroy(d);
}

// ----------------------------------------------------------------------------
// the matmul contract and its out-of-memory line, in a child

struct mm_call {
    struct fsdp_device *d;
    size_t N;
    int residual; /* 1: a residual with a bf16 output; 0: a bf16 output too large for memory */
};

static void mm_call_run(void *arg)
{
    const struct mm_call *c = arg;
    static float buf[64];
    c->d->k->matmul_forward(c->d, buf, FSDP_BF16, buf, FSDP_F32, buf, NULL, FSDP_F32,
                            c->residual ? buf : NULL, c->N, 1, 4);
}

/* Whether the child stopped with one line holding want. */
static int mm_stops(struct fsdp_device *d, size_t N, int residual, const char *want)
{
    char msg[1024];
    struct mm_call c = {d, N, residual};
    child_signal(mm_call_run, &c, msg, sizeof(msg));
    char *nl = strchr(msg, '\n');
    int ok = strstr(msg, want) && nl && nl[1] == '\0';
    if (!ok) {
        tap_diag("child said: %s", msg);
    }
    return ok;
}

static void test_matmul_contract(const char *name)
{
    struct fsdp_device *d = NULL;
    if (fsdp_device_create(name, 0, &d) < 0) {
        tap_ok(0, "%s: created for the matmul contract", name);
        return;
    }
    tap_ok(mm_stops(d, 2, 1, "matmul_forward with a residual writes f32, not bf16; round the sum"),
           "%s: matmul_forward with a residual and a bf16 output ends the job in one line, as "
           "on the cuda tables",
           name);
    if (strcmp(name, "cpu") == 0) { /* 2^46 rows of 4: 2^50 bytes to round, past any host */
        tap_ok(mm_stops(d, (size_t)1 << 46, 0,
                        "no host memory to round a bf16 output for a matmul (281474976710656 "
                        "f32 values"),
               "%s: a bf16 output with no host memory to round it: one line saying so "
               "(not widening an activation)",
               name);
    }
    fsdp_device_destroy(d);
}

int main(void)
{
    /* the guarded device's reservation, small for the test */
    setenv("FSDPC_GUARDED_BYTES", "67108864", 1);
    test_device("cpu");
    test_device("guarded");
    test_param_dtypes("cpu");
    test_param_dtypes("guarded");
    test_act_storage("cpu");
    test_act_storage("guarded");
    test_act_dtypes("cpu");
    test_act_dtypes("guarded");
    test_act_attention("cpu");
    test_act_attention("guarded");
    test_act_norms("cpu");
    test_act_norms("guarded");
    test_matmul_contract("cpu");
    test_matmul_contract("guarded");
    struct fsdp_device *d = NULL;
    int rc = fsdp_device_create("gpu9", 0, &d);
    tap_ok(rc < 0 && strstr(fsdp_err_msg(), "(devices: cpu, guarded)"),
           "an unknown device is refused naming the ones this build has");
    return tap_done();
}
