/*
 * ckpt_main.c - fsdpc-ckpt (ckpt_program.c).
 *
 *   fsdpc-ckpt init --preset NAME [overrides] [--seed S] -o FILE
 *   fsdpc-ckpt import-hf DIR -o MODEL.h5
 *   fsdpc-ckpt --help
 */
#include "config.h"
#include "programs/ckpt_tool.h"

int main(int argc, char **argv)
{
    return fsdp_ckpt_program(argc, argv);
}
