/*
 * train_nccl_sim.c - fsdpc-train with one more device, "cuda-sim" (the
 * CUDA device's host side over the simulated runtime of mpsim.h, with the
 * CPU kernel table), and the nccl backend over the simulated NCCL, whose
 * ranks are the processes mpiexec starts. test_nccl_train_sim.sh trains
 * with it over nccl (dp, tp, rdp x dp, and nccl mixed with mpi),
 * test_nccl_train_paths.sh (pipeline, offload, checkpoints, join, staging
 * in chunks), each against --device cpu --backend mpi; a missing event
 * wait between two streams stops the run (mpsim.h's order check).
 */
#include "config.h"
#include "compute/device.h"
#include "programs/train_program.h"
#include "tests/backends/mpsim.h"

int main(int argc, char **argv)
{
    if (fsdp_device_register("cuda-sim", mpsim_device_init) < 0) {
        return 1;
    }
    return fsdp_train_program(argc, argv);
}
