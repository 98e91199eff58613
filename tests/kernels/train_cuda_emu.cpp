/*
 * train_cuda_emu.cpp - fsdpc-train (or, with "sample" as its first
 * argument, fsdpc-sample) with one more device, "cuda-emu": the
 * CPU device's memory and ops with the CUDA device's kernel table
 * (src/compute/cuda/table.cu) compiled under the host emulation of the
 * execution model (compute/cuda/emu.h). test_cuda_train.sh trains with it
 * and with --device cpu and compares: the whole training path through the
 * CUDA kernels, on a machine without a GPU (cuBLASLt aside: the emulated
 * table's matmuls are the CPU's).
 */
extern "C" {
#include "config.h"
#include "compute/device.h"
#include "compute/device_impl.h"
#include "programs/sample_program.h"
#include "programs/train_program.h"
const struct fsdp_kernels *fsdp_cuda_kernels(void);
}

#include <string.h>

static int emu_init(struct fsdp_device *d, int index)
{
    int rc = fsdp_cpu_device_init(d, index);
    d->k = fsdp_cuda_kernels();
    return rc;
}

int main(int argc, char **argv)
{
    if (fsdp_device_register("cuda-emu", emu_init) < 0) {
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "sample") == 0) {
        argv[1] = argv[0];
        return fsdp_sample_program(argc - 1, argv + 1);
    }
    return fsdp_train_program(argc, argv);
}
