/*
 * device.h - the compute-device seam: where tensors live and what runs on
 * them. A device object (chosen once, by the training layer) carries its
 * memory kind, an allocator, copies between host and device, streams and
 * their synchronisation, events, pinned host memory, memory info and
 * counts, and the kernel table the models, the engine and the optimizer
 * call instead of naming an implementation. Every kernel takes its device
 * first and runs on its current stream (d->stream). Built here: the CPU
 * device (streams and events are no-ops) and the guarded device (the CPU's
 * kernels on memory the host cannot touch, with a check of stream order:
 * device_guarded.c). A CUDA device fills the same table with cuBLASLt and
 * its own kernels, and its memory kind tells the collectives where their
 * buffers are.
 *
 * Kernel semantics are kernels.h's, entry for entry (the CPU table's
 * entries run the fsdp_cpu_* functions between the device's hooks).
 * Tables are written out longhand and only grow at the end.
 */
#ifndef FSDP_COMPUTE_DEVICE_H
#define FSDP_COMPUTE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "compute/kernels.h"
#include "core/dtype.h"
#include "core/mem.h"

struct fsdp_device;

/*
 * Parameters in storage dtypes: the entries that read model parameters
 * (weights, biases, norm scales, embedding tables) take them as const void *
 * with their dtype pt (FSDP_F32, FSDP_BF16 or FSDP_F16), so gathered
 * parameters stay in the dtype they were gathered in; activations, their
 * gradients and parameter gradients are f32. The CPU table widens a 16-bit
 * parameter exactly into a workspace of the device (or row by row for the
 * embedding lookups) and computes in f32, so a bf16 run computes the same
 * numbers as one whose parameters were widened before the kernel.
 *
 * Activations in storage dtypes: the entries that read or write saved
 * activations (model.h act_dtype) take them as void * (const where read)
 * with their dtype at (FSDP_F32 or FSDP_BF16); gradients, statistics and
 * scratch stay f32. The CPU table widens a bf16 input exactly, tile by
 * tile through buffers of its own, runs the f32 kernel and rounds an
 * output to bf16 to nearest even (fsdp_cpu_f32_to_bf16), so it computes
 * what a kernel fed widened values computes, then rounded; a GPU table
 * converts in registers. So far: gelu, swiglu, attention and
 * gqa_attention (the CPU widens one sequence at a time through a device
 * workspace: the kernels compute each sequence apart), the norms'
 * forwards' output and input (a tile of rows at a time: the kernels
 * compute each row apart), the residual adds' output and residual
 * (bias_residual_forward, tile by tile), the norms' backwards' input (a tile of
 * rows at a time: the kernels add each row's parameter gradients in row
 * order) and the matmuls' input and output (widened as a whole operand
 * into the workspace, so the f32 kernel's call is the same and its bits
 * cannot move; an output computed there, then rounded). The other entries
 * (RoPE, in place on an f32 product; the embeddings, into the f32
 * residual stream; cross-entropy, on f32 logits) see f32 activations.
 */
struct fsdp_kernels {
    size_t size; /* sizeof(struct fsdp_kernels) of the implementation */
    void (*encoder_forward)(struct fsdp_device *d, float *out, const int32_t *tokens,
                            const void *wte, const void *wpe, enum fsdp_dtype pt, int B, int T,
                            int C);
    void (*encoder_backward)(struct fsdp_device *d, float *dwte, float *dwpe, const float *dout,
                             const int32_t *tokens, int B, int T, int C);
    /* out an activation in at, inp one in it (the residual stream's f32
     * slot or a store); mean and rstd f32 */
    void (*layernorm_forward)(struct fsdp_device *d, void *out, float *mean, float *rstd,
                              const void *inp, enum fsdp_dtype at, enum fsdp_dtype it,
                              const void *weight, const void *bias, enum fsdp_dtype pt, size_t N,
                              size_t C, float eps);
    /* inp an activation in at; dinp, dweight, dbias, dout f32 */
    void (*layernorm_backward)(struct fsdp_device *d, float *dinp, float *dweight, float *dbias,
                               const float *dout, const void *inp, enum fsdp_dtype at,
                               const void *weight, enum fsdp_dtype pt, const float *mean,
                               const float *rstd, size_t N, size_t C);
    /* out an activation in ot, inp one in it; residual f32 (a call with a
     * residual has ot f32, or every table ends the job with the one line of
     * fsdp_device_check_matmul; residual may be out) */
    void (*matmul_forward)(struct fsdp_device *d, void *out, enum fsdp_dtype ot, const void *inp,
                           enum fsdp_dtype it, const void *weight, const void *bias,
                           enum fsdp_dtype pt, const float *residual, size_t N, size_t C,
                           size_t OC);
    /* inp an activation in it; dinp, dweight, dbias, dout f32 */
    void (*matmul_backward)(struct fsdp_device *d, float *dinp, float *dweight, float *dbias,
                            const float *dout, const void *inp, enum fsdp_dtype it,
                            const void *weight, enum fsdp_dtype pt, size_t N, size_t C, size_t OC,
                            float alpha, int accumulate_dinp);
    size_t (*attention_scratch_floats)(struct fsdp_device *d, int T);
    /* out and qkv (and the backward's out) activations in at; lse, scratch,
     * dqkv and dout f32 */
    void (*attention_forward)(struct fsdp_device *d, void *out, float *lse, float *scratch,
                              const void *qkv, enum fsdp_dtype at, int B, int T, int C, int NH);
    void (*attention_backward)(struct fsdp_device *d, float *dqkv, float *scratch,
                               const float *dout, const void *qkv, const void *out,
                               const float *lse, enum fsdp_dtype at, int B, int T, int C, int NH);
    /* out and inp activations in at (in place allowed); dinp and dout f32 */
    void (*gelu_forward)(struct fsdp_device *d, void *out, const void *inp, enum fsdp_dtype at,
                         size_t n);
    void (*gelu_backward)(struct fsdp_device *d, float *dinp, const void *inp, const float *dout,
                          enum fsdp_dtype at, size_t n);
    /* No kept count: the host counts it from its own copy of the targets,
     * which the model checked at set_batch (so no target is out of range). */
    void (*crossentropy_forward)(struct fsdp_device *d, float *losses, float *stats,
                                 const float *logits, const int32_t *targets, size_t N, size_t V,
                                 int32_t ignore_index);
    void (*crossentropy_backward)(struct fsdp_device *d, float *dlogits, const float *logits,
                                  const float *stats, const int32_t *targets, size_t N, size_t V,
                                  int32_t ignore_index, float dscale);
    void (*adamw_update)(struct fsdp_device *d, float *param, const float *grad, float *m, float *v,
                         size_t n, const struct fsdp_adamw_params *hp, int decay, float grad_scale);
    /* *acc (device memory) += the sum of squares of x, as fsdp_cpu_sumsq
     * adds it: the host reads the total once per step. */
    void (*sumsq)(struct fsdp_device *d, double *acc, const float *x, size_t n);
    void (*scale)(struct fsdp_device *d, float *x, size_t n, float s);
    void (*narrow_inplace)(struct fsdp_device *d, void *buf, size_t n, int bf16);
    void (*widen_inplace)(struct fsdp_device *d, void *buf, size_t n, int bf16);
    void (*f32_to_bf16)(struct fsdp_device *d, uint16_t *dst, const float *src, size_t n);
    void (*bf16_to_f32)(struct fsdp_device *d, float *dst, const uint16_t *src, size_t n);
    void (*f32_to_f16)(struct fsdp_device *d, uint16_t *dst, const float *src, size_t n);
    void (*f16_to_f32)(struct fsdp_device *d, float *dst, const uint16_t *src, size_t n);
    void (*embed_rows_forward)(struct fsdp_device *d, float *out, const int32_t *tokens,
                               const void *wte, size_t v0, size_t vn, const void *wpe, size_t p0,
                               size_t pn, enum fsdp_dtype pt, size_t N, int T, int C);
    void (*embed_rows_backward)(struct fsdp_device *d, float *dwte, float *dwpe, const float *dout,
                                const int32_t *tokens, size_t v0, size_t vn, size_t p0, size_t pn,
                                size_t N, int T, int C);
    void (*crossentropy_slice_forward)(struct fsdp_device *d, float *stats, float *target_logit,
                                       const float *logits, const int32_t *targets, size_t N,
                                       size_t n, size_t col0, int32_t ignore_index, int first);
    void (*crossentropy_slice_backward)(struct fsdp_device *d, float *dlogits, const float *logits,
                                        const float *stats, const int32_t *targets, size_t N,
                                        size_t n, size_t col0, int32_t ignore_index, float dscale);
    /* out an activation in at, residual one in rt (a store or an f32
     * slot); inp f32 (out may be inp at f32) */
    void (*bias_residual_forward)(struct fsdp_device *d, void *out, const float *inp,
                                  const void *bias, enum fsdp_dtype pt, const void *residual,
                                  enum fsdp_dtype at, enum fsdp_dtype rt, size_t N, size_t C);
    /* --- appended: the Llama family, the decoders, the engine's loops --- */
    /* rmsnorm_forward with an optional f32 copy of inp (keep may be
     * NULL); out an activation in at, inp one in it, rstd f32 */
    void (*rmsnorm_forward)(struct fsdp_device *d, void *out, float *rstd, float *keep,
                            const void *inp, enum fsdp_dtype at, enum fsdp_dtype it,
                            const void *weight, enum fsdp_dtype pt, size_t N, size_t C, float eps);
    /* inp an activation in at; dinp, dweight, dout f32 */
    void (*rmsnorm_backward)(struct fsdp_device *d, float *dinp, float *dweight, const float *dout,
                             const void *inp, enum fsdp_dtype at, const void *weight,
                             enum fsdp_dtype pt, const float *rstd, size_t N, size_t C);
    void (*rope_forward)(struct fsdp_device *d, float *qkv, const float *cos_t, const float *sin_t,
                         int B, int T, int NH, int NKV, int hs);
    void (*rope_backward)(struct fsdp_device *d, float *dqkv, const float *cos_t,
                          const float *sin_t, int B, int T, int NH, int NKV, int hs);
    /* out, gate and up activations in at; dgate, dup and dout f32 (at f32
     * dgate and dup may be gate and up) */
    void (*swiglu_forward)(struct fsdp_device *d, void *out, const void *gate, const void *up,
                           enum fsdp_dtype at, size_t n);
    void (*swiglu_backward)(struct fsdp_device *d, float *dgate, float *dup, const float *dout,
                            const void *gate, const void *up, enum fsdp_dtype at, size_t n);
    size_t (*gqa_attention_scratch_floats)(struct fsdp_device *d, int T, int NH, int NKV, int hs);
    /* activations in at as attention_forward's and attention_backward's */
    void (*gqa_attention_forward)(struct fsdp_device *d, void *out, float *lse, float *scratch,
                                  const void *qkv, enum fsdp_dtype at, int B, int T, int NH,
                                  int NKV, int hs);
    void (*gqa_attention_backward)(struct fsdp_device *d, float *dqkv, float *scratch,
                                   const float *dout, const void *qkv, const void *out,
                                   const float *lse, enum fsdp_dtype at, int B, int T, int NH,
                                   int NKV, int hs);
    /* out[r,:] = table[tokens[r],:] (N rows of C) */
    void (*embed_gather)(struct fsdp_device *d, float *out, const int32_t *tokens,
                         const void *table, enum fsdp_dtype pt, size_t N, size_t C);
    /* dtable[tokens[r],:] += dout[r,:], rows in order (deterministic) */
    void (*embed_scatter_add)(struct fsdp_device *d, float *dtable, const float *dout,
                              const int32_t *tokens, size_t N, size_t C);
    void (*attention_decode)(struct fsdp_device *d, float *out, float *scores, const float *q,
                             const float *kcache, const float *vcache, int n, int NH, int NKV,
                             int hs, int ld);
    /* y += x */
    void (*accumulate)(struct fsdp_device *d, float *y, const float *x, size_t n);
    /* y = (accumulate ? y : 0) + x, x n 16-bit values (bf16 when bf16, else
     * f16) widened to f32 */
    void (*accumulate16)(struct fsdp_device *d, float *y, const uint16_t *x, size_t n, int bf16,
                         int accumulate);
    /* *acc (device) += the losses of the rows whose target is not
     * ignore_index, in row order, in double. */
    void (*loss_sum)(struct fsdp_device *d, double *acc, const float *losses,
                     const int32_t *targets, size_t N, int32_t ignore_index);
    /* The loss of each row from the merged vocabulary-slice statistics
     * (crossentropy_slice_forward): max + log(sum) - target logit; 0 for
     * ignored rows. */
    void (*xent_losses)(struct fsdp_device *d, float *losses, const float *stats,
                        const float *target_logit, const int32_t *targets, size_t N,
                        int32_t ignore_index);
    /* The parallel cross-entropy's steps around its two all-reduces over
     * the ranks that each hold a vocabulary slice (rows N; have 0: this
     * rank's slice is empty): phase 0 mx = row maxima (-inf without a
     * slice); phase 1 (after the max) sz = each sum rescaled to mx, sz + N
     * = the target logits; phase 2 (after the sum) back into stats and zt. */
    void (*xent_combine)(struct fsdp_device *d, int phase, float *stats, float *zt, float *mx,
                         float *sz, size_t N, int have);
    /* x[i * stride] = value for i < n (padding statistics, -inf maxima). */
    void (*fill)(struct fsdp_device *d, float *x, size_t n, size_t stride, float value);
    /* --- appended --- */
    /* Optional (NULL: none). Frees the table's own state (d->kstate):
     * its workspaces and library handles; fsdp_device_destroy calls it. */
    void (*kstate_free)(struct fsdp_device *d);
};

/* A live allocation, as named at alloc. */
struct fsdp_device_buffer {
    const char *name;
    size_t bytes;
};

enum fsdp_copy_dir {
    FSDP_COPY_H2D = 0,
    FSDP_COPY_D2H,
    FSDP_COPY_D2D,
};

/*
 * Every op orders its work on a stream (NULL: the device's current
 * compute stream, d->stream) and returns when it is enqueued, unless it
 * says it blocks. Ops that block the host (synchronize, event_synchronize)
 * are the host's waits; the device counts them (struct fsdp_device_stats)
 * so a test can pin how many a step makes.
 */
struct fsdp_device_ops {
    size_t size; /* sizeof(struct fsdp_device_ops) of the implementation */
    const char *name;
    /* Zeroed device memory of bytes, called name in errors and fault
     * reports; NULL when out of memory (the caller says so, with
     * mem_info's figures). */
    void *(*alloc)(struct fsdp_device *d, size_t bytes, const char *name);
    void (*free)(struct fsdp_device *d, void *p);
    /* Ordered on stream; returns when enqueued. The host side of an H2D or
     * D2H copy should be pinned memory (host_alloc) for the copy to be
     * asynchronous on a GPU; a D2H copy's data is the host's only after a
     * wait (synchronize or an event). The sides must be what dir says, as
     * a GPU's copy of that kind requires (the guarded device checks it). */
    int (*copy)(struct fsdp_device *d, void *dst, const void *src, size_t bytes,
                enum fsdp_copy_dir dir, void *stream);
    int (*stream_create)(struct fsdp_device *d, void **stream);
    void (*stream_destroy)(struct fsdp_device *d, void *stream);
    /* Blocks until everything enqueued on stream (NULL: every stream) is done. */
    int (*synchronize)(struct fsdp_device *d, void *stream);
    /* --- appended --- */
    /* bytes of device memory at p set to byte value (memset), on stream. */
    int (*memset)(struct fsdp_device *d, void *p, int value, size_t bytes, void *stream);
    /* Events: record marks the point reached on stream; stream_wait makes
     * stream wait for it before its later work (the host does not block);
     * query: 1 done, 0 not yet, < 0 error; event_synchronize blocks the host. */
    int (*event_create)(struct fsdp_device *d, void **ev);
    void (*event_destroy)(struct fsdp_device *d, void *ev);
    int (*event_record)(struct fsdp_device *d, void *ev, void *stream);
    int (*stream_wait)(struct fsdp_device *d, void *stream, void *ev);
    int (*event_query)(struct fsdp_device *d, void *ev);
    int (*event_synchronize)(struct fsdp_device *d, void *ev);
    /* Page-locked host memory for staging copies (zeroed); NULL when out of memory. */
    void *(*host_alloc)(struct fsdp_device *d, size_t bytes);
    void (*host_free)(struct fsdp_device *d, void *p);
    /* The device's free and total memory in bytes. */
    int (*mem_info)(struct fsdp_device *d, size_t *free_bytes, size_t *total_bytes);
    /* Optional (NULL: the device keeps no names). The live allocations,
     * at most max of them into out; returns how many there are. */
    size_t (*buffers)(struct fsdp_device *d, struct fsdp_device_buffer *out, size_t max);
    /* Optional (NULL: the device keeps no arena). Reserves device memory
     * for bytes of allocations in one piece, which later allocs are carved
     * from (the trainer passes its memory plan's total before it
     * allocates); blocks the host. */
    int (*reserve)(struct fsdp_device *d, size_t bytes);
    /* Optional (NULL: the caller measures the host). The device's dense
     * peak FLOP/s for matmuls whose weights are dt (f32, bf16, f16), from
     * what it knows of its hardware: *flops > 0 and what says where the
     * figure comes from, or *flops = 0 and what says why it is unknown. */
    int (*peak_flops)(struct fsdp_device *d, enum fsdp_dtype dt, double *flops, char *what,
                      size_t n);
};

/* What a device counts, for tests and --print-memory. */
struct fsdp_device_stats {
    size_t bytes_now;  /* device memory allocated and not freed */
    size_t bytes_peak; /* the most bytes_now has been */
    long host_waits;   /* synchronize and event_synchronize calls */
    long d2h_copies;   /* device-to-host copies (each a value the host will read) */
};

struct fsdp_device {
    const struct fsdp_device_ops *ops;
    const struct fsdp_kernels *k;
    enum fsdp_mem mem; /* where its buffers live, for the collectives */
    int index;         /* device ordinal (0 on the CPU) */
    void *stream;      /* the current compute stream: kernels run on it */
    struct fsdp_device_stats stats;
    /* A checking device's hooks around every kernel (NULL: none): the
     * guarded device checks the kernel's buffers against the order of the
     * streams and opens its memory for the kernel's run. p: the kernel's
     * pointer arguments, the nw it writes first, n in all (NULLs skipped). */
    void (*kernel_enter)(struct fsdp_device *d, const void *const *p, int nw, int n);
    void (*kernel_leave)(struct fsdp_device *d);
    void *impl;
    /* The kernel table's own state (its workspaces: the CPU's widened 16-bit
     * parameters, a GPU's device buffers and library handles), made at its
     * first need and freed by the table's kstate_free with the device. */
    void *kstate;
};

/* name "cpu", "guarded" (device_guarded.c), "cuda" (cuda/device_cuda.c; in
 * a build with the CUDA kernels) or one a program registered. index: the
 * device ordinal, from the local rank. */
int fsdp_device_create(const char *name, int index, struct fsdp_device **out);
void fsdp_device_destroy(struct fsdp_device *d);
/* A device a program adds under name (a test's emulated device), created
 * by init as fsdp_device_create creates the built-in ones. */
typedef int (*fsdp_device_init_fn)(struct fsdp_device *d, int index);
int fsdp_device_register(const char *name, fsdp_device_init_fn init);
/* The names a build knows, for messages ("cpu, guarded", and cuda in a
 * build with the CUDA kernels). */
const char *fsdp_device_names(void);
/* The device a program uses by default: cuda when this build has the CUDA
 * kernels and a GPU is visible, else cpu. */
const char *fsdp_device_default_name(void);

/* The CPU kernel table (models created without a device use it). */
const struct fsdp_kernels *fsdp_cpu_kernels(void);
/* A process-wide CPU device for code created without one (a model made by
 * a test or a tool); never destroyed. */
struct fsdp_device *fsdp_cpu_device(void);

/* The backend's memory capability flag (FSDP_CAP_MEM_*) for the device's
 * memory kind. */
uint32_t fsdp_device_mem_cap(const struct fsdp_device *d);

// ----------------------------------------------------------------------------
// conveniences over the ops (device.c)

/* Device memory of bytes called name, or an out-of-memory error naming
 * it, the bytes and the device's free memory. */
int fsdp_device_alloc(struct fsdp_device *d, size_t bytes, const char *name, void **out);
/* Reserves bytes of device memory for later allocations where the device
 * keeps an arena (ops->reserve); nothing otherwise. */
int fsdp_device_reserve(struct fsdp_device *d, size_t bytes);
/* Zeroes bytes at p on the compute stream. */
int fsdp_device_zero(struct fsdp_device *d, void *p, size_t bytes);
/* Device to host, waited for: the host may read dst on return. Counted. */
int fsdp_device_read(struct fsdp_device *d, void *dst, const void *src, size_t bytes);
/* Host to device on the compute stream (src may be reused on return:
 * the copy is waited for when src is not pinned memory). */
int fsdp_device_write(struct fsdp_device *d, void *dst, const void *src, size_t bytes);
/* Device to device on the compute stream. */
int fsdp_device_copy(struct fsdp_device *d, void *dst, const void *src, size_t bytes);
/* matmul_forward's contract, kept by every table: a residual is added in
 * f32, so a call with one writes f32 (ot FSDP_F32). A call that breaks it
 * ends the job with one line (fsdp_fatal), the same on every table. */
void fsdp_device_check_matmul(const struct fsdp_device *d, enum fsdp_dtype ot,
                              const void *residual);

#endif
