/*
 * fuzz_safetensors.c - libFuzzer harness: the input is a safetensors file;
 * it must open or be refused, every tensor of an accepted one must read, and
 * every name must be found again by lookup.
 */
#include "config.h"
#include "tests/fuzz/fuzz.h"
#include "io/hf/safetensors.h"
#include "core/error.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fsdp_safetensors *st;
    fuzz_init();
    int rc = fsdp_safetensors_open(fuzz_write("x.safetensors", data, size), &st);
    if (rc == 0) {
        for (size_t i = 0; rc == 0 && i < st->n; i++) {
            size_t bytes = st->t[i].end - st->t[i].begin;
            void *buf = malloc(bytes ? bytes : 1);
            rc = buf ? fsdp_safetensors_read(st, i, buf) : -1;
            free(buf);
            if (fsdp_safetensors_find(st, st->t[i].name) != (long)i) {
                __builtin_trap(); /* names are unique once open succeeded */
            }
        }
        (void)fsdp_safetensors_meta(st, "fsdpc_n_head");
        fsdp_safetensors_close(st);
    }
    fuzz_done(rc);
    return 0;
}
