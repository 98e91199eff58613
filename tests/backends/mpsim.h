/*
 * mpsim.h - a simulated CUDA runtime and NCCL for ranks that are separate
 * processes (started by mpiexec), which train_nccl_sim links fsdpc-train,
 * the nccl backend and the CUDA device's host side (device_cuda.c) against.
 *
 * The model:
 *   memory     cudaMalloc hands out host memory (not cleared: the CUDA
 *              device zeroes what it hands out, on its own stream); the
 *              device "cuda-sim" is the CUDA device's host side with the
 *              CPU kernel table run on that memory.
 *   streams    every call runs at once, in issue order, on the calling
 *              thread; what a GPU would run out of order is found by the
 *              order check below, not by the values.
 *   order      each stream keeps a vector clock (its own count of ops and
 *              how far it has waited for every other stream, through
 *              cudaStreamWaitEvent or the host's synchronisations); every
 *              device buffer (an allocation of the device, or a cudaMalloc
 *              outside it) remembers the stream and clock of its last
 *              writer. A kernel, copy, memset or NCCL collective on one
 *              stream that reads or writes a buffer another stream last
 *              wrote, without having waited for that write, stops the
 *              process naming both streams, the buffer and the op.
 *   NCCL       communicators are MPI communicators over the members (the
 *              unique id names the world rank that made it, which gathers
 *              the members at init); a collective exchanges the data with
 *              MPI when it is called and reduces in rank order, with the
 *              library's own reductions (core/dtype.h), as the mpi backend
 *              does. Send/recv inside ncclGroupStart/End are posted
 *              together at ncclGroupEnd. Every call returns ncclSuccess at
 *              once (no in-progress states: test_nccl_sim covers those).
 * MPI must have been initialised by the program (fsdpc-train does under
 * mpiexec); NCCL calls come from the thread that initialised it.
 */
#ifndef FSDP_TESTS_MPSIM_H
#define FSDP_TESTS_MPSIM_H

#include <stddef.h>

#include "compute/device.h"

/* The device "cuda-sim" (an fsdp_device_init_fn): the CUDA device's ops
 * over the simulated runtime, the CPU kernel table, kernels checked
 * against the order of the streams. */
int mpsim_device_init(struct fsdp_device *d, int index);

/* ---- shared by mpsim_cuda.c and mpsim_nccl.c ---- */

/* The simulated stream's index for a handle; -1 for none. */
int mpsim_stream_id(void *stream);
/* An op called what on stream s: ticks its clock, checks the buffer it
 * reads and the one it writes (marked as s's last write), and stops the
 * process on a race. NULL pointers and host memory are skipped. */
void mpsim_order(int s, const char *what, const void *read, const void *write);
/* The calling thread's current device. */
int mpsim_current_device(void);

#endif
