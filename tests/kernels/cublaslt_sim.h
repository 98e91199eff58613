/*
 * cublaslt_sim.h - knobs and counters of the simulated cuBLASLt that
 * test_cuda_matmul links the cuda device's matmuls against
 * (tests/kernels/cublaslt_sim.c; its API is cublaslt_sim_api/cublasLt.h).
 * It runs on top of the simulated runtime (cuda_sim.c): device memory is
 * the simulation's, and a matmul is an item of its stream.
 *
 * What it computes (cublasLtMatmul, as documented): column-major A, B, C
 * and D with their leading dimensions, op(A) (m, k) and op(B) (k, n) after
 * TRANSA and TRANSB, D = alpha op(A) op(B) + beta C (+ bias[i] on row i
 * with the BIAS epilogue), sums of products in f32 in l order, inputs of
 * f32, bf16 or f16 read exactly (rounded to TF32 first under
 * CUBLAS_COMPUTE_32F_FAST_TF32), D written in its type; with beta == 0, C
 * is not read, as the library promises.
 *
 * What it refuses, each counted in sim_lt_refused (the status is the one
 * the library documents for the rule, or its nearest):
 *   - a handle not made by cublasLtCreate (NOT_INITIALIZED);
 *   - an attribute buffer whose size is not the attribute's (INVALID_VALUE);
 *   - a layout with rows or cols 0, or ld < rows, or row order (the last:
 *     NOT_SUPPORTED, as this simulation models column order only);
 *   - op(A), op(B), C and D whose shapes do not chain (m, k) (k, n) (m, n),
 *     or Cdesc different from Ddesc (INVALID_VALUE);
 *   - a (compute, scale, A, B, C=D) type combination outside the
 *     documented table's rows for these types: 32F with all f32;
 *     32F_FAST_TF32 with all f32; 32F with A, B both bf16 (or both f16)
 *     and C, D of that type or f32; scale type f32 (NOT_SUPPORTED);
 *   - pointer mode other than host, an epilogue other than DEFAULT and
 *     BIAS (NOT_SUPPORTED: not modelled);
 *   - BIAS with a bias type (default -1: Dtype) other than Dtype, or no
 *     bias pointer (INVALID_VALUE / NOT_SUPPORTED);
 *   - cublasLtMatmul with an algorithm not from the heuristic for this
 *     descriptor's types and layouts, a workspace smaller than the
 *     algorithm asked for, A, B, C, D less aligned than the preference's
 *     minimum alignments (256 bytes unless set) the algorithm was chosen
 *     under, or a bias pointer less aligned than the one the descriptor
 *     held when the heuristic chose it (cublasLt.h: the heuristic reads
 *     BIAS_POINTER for the alignment; none set reads as 0, aligned to
 *     anything, capped at 256 bytes) (INVALID_VALUE);
 *   - A, B, C, D, bias or workspace not in one device allocation of the
 *     runtime simulation for their whole extent (the library would fault:
 *     an illegal address; here INVALID_VALUE, before anything runs).
 * The heuristic returns one algorithm, asking for sim_lt_algo_workspace
 * bytes (capped by the preference's maximum).
 */
#ifndef FSDP_TESTS_CUBLASLT_SIM_H
#define FSDP_TESTS_CUBLASLT_SIM_H

#include <cublasLt.h>

/* knobs (sim_lt_reset restores the defaults) */
extern const char *sim_lt_fail_call;      /* the name of a call to fail once (NULL: none) */
extern cublasStatus_t sim_lt_fail_status; /* ... with this status */
extern size_t sim_lt_algo_workspace;      /* workspace bytes an algorithm asks for (1 MiB) */

/* what happened (sim_lt_reset zeroes them) */
extern int sim_lt_heuristics; /* successful cublasLtMatmulAlgoGetHeuristic calls */
extern int sim_lt_matmuls;    /* matmuls enqueued */
extern int sim_lt_refused;    /* calls refused by a rule above */
extern int sim_lt_tf32;       /* matmuls enqueued with CUBLAS_COMPUTE_32F_FAST_TF32 */

void sim_lt_reset(void);
/* Live handles, descriptors, layouts and preferences. */
int sim_lt_live(void);

#endif
