/*
 * cuda_emu_kernels.cpp - the CUDA kernel sources, unchanged, compiled as
 * host C++ under the emulation (compute/cuda/emu.h) for test_cuda_emu.
 * nvcc compiles the same files for the GPU (tests/kernels/test_cuda_nvcc.sh).
 */
#include "config.h"

#include "compute/cuda/attention.cu"
#include "compute/cuda/elementwise.cu"
#include "compute/cuda/embed.cu"
#include "compute/cuda/loss.cu"
#include "compute/cuda/norms.cu"
#include "compute/cuda/optim.cu"
#include "compute/cuda/small.cu"
#include "compute/cuda/table.cu"
