/*
 * mlp_train.c - fsdpc-train with the test-only "mlp" architecture
 * registered, and a way to make its model files:
 *
 *   mlp_train --init FILE V T C H L TIED SEED    writes an initialised model
 *   mlp_train <fsdpc-train options>              trains it, as fsdpc-train
 *
 * Proof that the model seam is real: the trainer, the sharding engine, io
 * and checkpoints run a model they were not written for.
 */
#include "config.h"
#include "tests/model/mlp_model.h"
#include "programs/train_program.h"
#include "core/error.h"
#include "core/util.h"
#include "io/h5/model_file.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mlp_init_file(char **argv)
{
    struct fsdp_test_mlp_config c = {
        .vocab_size = atoi(argv[1]), .context = atoi(argv[2]), .n_embd = atoi(argv[3]),
        .n_hidden = atoi(argv[4]), .n_layer = atoi(argv[5]), .tied = atoi(argv[6])};
    struct fsdp_model_spec *s;
    FSDP_CHECK(fsdp_test_mlp_arch.spec_create(&c, &s));
    float *all = fsdp_calloc(s->total_numel * sizeof(float));
    float **units = calloc((size_t)s->n_units, sizeof(*units));
    int rc = all && units ? 0 : fsdp_err(FSDP_ERR_NOMEM, "mlp model");
    size_t off = 0;
    for (int u = 0; rc == 0 && u < s->n_units; u++) {
        units[u] = all + off;
        off += s->unit_numel[u];
    }
    if (rc == 0) {
        rc = fsdp_model_init_params(s, (uint64_t)atoll(argv[7]), units);
    }
    if (rc == 0) {
        struct fsdp_model_write_opts o = {.created_by = "mlp_train --init", .dtype = FSDP_F32};
        rc = fsdp_model_file_write(argv[0], s, (const float *const *)units, &o);
    }
    fsdp_free(all);
    free(units);
    fsdp_model_spec_destroy(s);
    return rc;
}

int main(int argc, char **argv)
{
    if (fsdp_model_registry_init() < 0 || fsdp_test_mlp_register() < 0) {
        fsdp_die(FSDP_ERR_INTERNAL, "mlp_train: registry", NULL);
    }
    if (argc >= 2 && strcmp(argv[1], "--init") == 0) {
        if (argc != 10) {
            fprintf(stderr, "usage: mlp_train --init FILE V T C H L TIED SEED\n");
            return 2;
        }
        if (mlp_init_file(argv + 2) < 0) {
            fsdp_die(FSDP_ERR_INVALID, "mlp_train --init", NULL);
        }
        return 0;
    }
    return fsdp_train_program(argc, argv);
}
