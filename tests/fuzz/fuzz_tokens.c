/*
 * fuzz_tokens.c - libFuzzer harness: the input is an llm.c token file; it
 * must open or be refused, and an accepted one must read in full, pass the
 * range scan and feed a data loader of 2 ranks through a wrap-around.
 */
#include "config.h"
#include "tests/fuzz/fuzz.h"
#include "io/text/tokens.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fsdp_tokens *t;
    fuzz_init();
    const char *path = fuzz_write("train.bin", data, size);
    int rc = fsdp_tokens_open(path, &t);
    if (rc == 0) {
        size_t n = fsdp_tokens_count(t);
        uint32_t *buf = malloc((n ? n : 1) * sizeof(uint32_t)), lo, hi;
        rc = buf ? fsdp_tokens_read(t, 0, n, buf) : -1;
        if (rc == 0 && n > 0) {
            rc = fsdp_tokens_range(t, &lo, &hi);
        }
        free(buf);
        fsdp_tokens_close(t);
    }
    struct fsdp_dataloader *dl = NULL;
    int lrc = fsdp_dataloader_create(path, 2, 4, 1, 2, 256, &dl);
    for (int s = 0; lrc == 0 && s < 8; s++) {
        lrc = fsdp_dataloader_next(dl);
    }
    fsdp_dataloader_destroy(dl);
    fuzz_done(rc); /* counted by the token reader's verdict */
    return 0;
}
