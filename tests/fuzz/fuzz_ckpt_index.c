/*
 * fuzz_ckpt_index.c - libFuzzer harness: the input is the index.h5 of a
 * checkpoint whose shard files ($FSDPC_FUZZ_CKPT/shard_<r>.h5) are good. The
 * checkpoint reader must open it or refuse it, and read every row of an
 * accepted one; the index is then also read as a model file, as
 * fsdpc-train --model D/index.h5 does (through its virtual datasets).
 */
#include "config.h"
#include "tests/fuzz/fuzz.h"
#include "io/ckpt/ckpt.h"
#include "io/h5/model_file.h"
#include "core/spec.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_shards(void)
{
    static int done;
    const char *src = getenv("FSDPC_FUZZ_CKPT");
    char path[4096], name[64];
    if (done++) {
        return;
    }
    for (int r = 0; src; r++) {
        snprintf(path, sizeof(path), "%s/shard_%d.h5", src, r);
        snprintf(name, sizeof(name), "shard_%d.h5", r);
        if (fuzz_copy(path, name) < 0) {
            return;
        }
    }
}

static int fuzz_read_ckpt(const char *dir)
{
    struct fsdp_ckpt *ck;
    int rc = fsdp_ckpt_open(dir, fsdp_arch_registered(), &ck);
    if (rc < 0) {
        return rc;
    }
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(ck);
    float *buf = malloc(fsdp_model_spec_largest(s) * sizeof(float));
    for (int k = 0; buf && rc == 0 && k < fsdp_ckpt_kinds(ck)->n; k++) {
        for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
            rc = fsdp_ckpt_read_rows(ck, k, i, 0, s->params[i].shape[0], buf);
        }
    }
    free(buf);
    fsdp_ckpt_close(ck);
    return rc;
}

static int fuzz_read_model(const char *path)
{
    struct fsdp_model_file *mf;
    int rc = fsdp_model_file_open(path, fsdp_arch_registered(), &mf);
    if (rc < 0) {
        return rc;
    }
    const struct fsdp_model_spec *s = fsdp_model_file_spec(mf);
    float *buf = malloc(fsdp_model_spec_largest(s) * sizeof(float));
    for (size_t i = 0; buf && rc == 0 && i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        rc = fsdp_model_file_read_block(mf, i, 0, p->shape[0], 0, p->shape[1], buf);
    }
    free(buf);
    fsdp_model_file_close(mf);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_init();
    fuzz_shards();
    const char *index = fuzz_write("index.h5", data, size);
    int rc = fuzz_read_ckpt(fuzz_dir());
    (void)fuzz_read_model(index);
    fuzz_done(rc); /* counted by the checkpoint reader's verdict */
    return 0;
}
