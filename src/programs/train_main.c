/*
 * train_main.c - fsdpc-train (train_program.c).
 *
 *   fsdpc-train --model m.h5 --data train.bin --steps 1000 --batch-size 8 \
 *               --seq-len 256 --lr 6e-4 [--config run.cfg] [...]
 *   mpiexec.mpich -n 4 fsdpc-train ...
 */
#include "config.h"
#include "programs/train_program.h"

int main(int argc, char **argv)
{
    return fsdp_train_program(argc, argv);
}
