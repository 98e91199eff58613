/*
 * sample_main.c - fsdpc-sample (sample_program.c).
 *
 *   fsdpc-sample --model m.h5 --prompt "int main(" --tokens 200 \
 *                --temperature 0.8 --top-k 40 --seed 1
 */
#include "config.h"
#include "programs/sample_program.h"

int main(int argc, char **argv)
{
    return fsdp_sample_program(argc, argv);
}
