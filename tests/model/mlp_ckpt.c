/*
 * mlp_ckpt.c - fsdpc-ckpt with the test-only "mlp" architecture registered
 * (mlp_model.h, its Hugging Face-style map in mlp_hf.c): the same commands,
 * run on a model they were not written for.
 *
 *   mlp_ckpt <fsdpc-ckpt command and options>
 */
#include "config.h"
#include "tests/model/mlp_model.h"
#include "programs/ckpt_tool.h"
#include "core/error.h"
#include "model/model.h"

int main(int argc, char **argv)
{
    if (fsdp_model_registry_init() < 0 || fsdp_test_mlp_register() < 0) {
        fsdp_die(FSDP_ERR_INTERNAL, "mlp_ckpt: registry", NULL);
    }
    return fsdp_ckpt_program(argc, argv);
}
