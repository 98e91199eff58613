/*
 * fuzz_model_file.c - libFuzzer harness: the input is a model file; opening
 * it must succeed or refuse with an error, and an accepted file must read
 * in full (every tensor, converted to f32).
 */
#include "config.h"
#include "tests/fuzz/fuzz.h"
#include "io/h5/model_file.h"
#include "core/spec.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fsdp_model_file *mf;
    fuzz_init();
    int rc = fsdp_model_file_open(fuzz_write("model.h5", data, size), fsdp_arch_registered(), &mf);
    if (rc == 0) {
        const struct fsdp_model_spec *s = fsdp_model_file_spec(mf);
        float *buf = malloc(fsdp_model_spec_largest(s) * sizeof(float));
        for (size_t i = 0; buf && rc == 0 && i < s->n_params; i++) {
            const struct fsdp_param_spec *p = &s->params[i];
            rc = fsdp_model_file_read_block(mf, i, 0, p->shape[0], 0, p->shape[1], buf);
        }
        free(buf);
        fsdp_model_file_close(mf);
    }
    fuzz_done(rc);
    return 0;
}
