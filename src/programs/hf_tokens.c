/*
 * hf_tokens.c - the begin- and end-of-text token ids of a Hugging Face
 * directory (config.json, generation_config.json) or a tokenizer.json, and
 * generation_config.json written from a model's ids.
 *
 * transformers' generate() stops at generation_config.eos_token_id; when a
 * directory says nothing, the model class's default applies (Llama: 2),
 * which in another tokenizer is an ordinary token. So the ids travel with
 * the model (struct fsdp_model_spec, root attributes of the model file) and
 * an export writes them into both files, or warns that it cannot.
 */
#include "config.h"
#include "programs/hf_map.h"
#include "io/util/json.h"
#include "model/hf_json.h"
#include "io/text/tokenizer.h"
#include "core/error.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HF_GENERATION_CONFIG "generation_config.json"

/* One key of one file: the id, or the first of a list (warned). An id
 * outside the vocabulary is left out with a warning: transformers loads
 * such a directory (GPT2Config's 50256 on a smaller vocabulary) and would
 * never produce it. */
static int hf_token_id(const struct fsdp_json_obj *j, const char *key, long vocab, long *id)
{
    long long v[1];
    size_t n;
    FSDP_CHECK(fsdp_json_int_list(j, key, -(1LL << 62), 1LL << 62, v, 1, &n));
    if (n > 1) {
        FSDP_WARN(FSDP_SUB_IO, "%s: %s lists %zu ids; the model file keeps the first, %lld, and "
                  "an export writes only that one", j->file, key, n, v[0]);
    }
    if (n > 0 && (v[0] < 0 || v[0] >= vocab)) {
        FSDP_WARN(FSDP_SUB_IO, "%s: %s %lld is outside the vocabulary (vocab_size %ld): left "
                  "out", j->file, key, v[0], vocab);
    } else if (n > 0) {
        *id = (long)v[0];
    }
    return 0;
}

int fsdp_hf_tokens_read(const char *dir, const struct fsdp_json_obj *config, long vocab,
                        long *bos, long *eos)
{
    *bos = *eos = -1;
    FSDP_CHECK(hf_token_id(config, "bos_token_id", vocab, bos));
    FSDP_CHECK(hf_token_id(config, "eos_token_id", vocab, eos));
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, HF_GENERATION_CONFIG);
    FILE *f = fopen(path, "rb");
    if (!f) {
        return 0; /* optional: transformers makes one from config.json */
    }
    fclose(f);
    struct json_t *doc;
    struct fsdp_json_obj gen;
    FSDP_CHECK(fsdp_json_load(path, (size_t)1 << 20, &doc, &gen));
    /* what generate() reads wins over config.json */
    int rc = hf_token_id(&gen, "bos_token_id", vocab, bos);
    if (rc == 0) {
        rc = hf_token_id(&gen, "eos_token_id", vocab, eos);
    }
    fsdp_json_free(doc);
    return rc;
}

/* The first of names the tokenizer has, or -1; which one in *found. */
static long hf_first_token(const struct fsdp_tokenizer *tok, const char *const *names,
                           const char **found)
{
    for (size_t i = 0; names[i]; i++) {
        long id = fsdp_tokenizer_token_id(tok, names[i]);
        if (id >= 0) {
            *found = names[i];
            return id;
        }
    }
    return -1;
}

int fsdp_hf_tokens_from_tokenizer(const char *path, long *bos, long *eos, char *desc, size_t len)
{
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<|endoftext|>", "<bos>",
                                            NULL};
    static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>",
                                            NULL};
    struct fsdp_tokenizer *tok;
    const uint32_t *before, *after;
    size_t nb = 0, na = 0;
    const char *bname = "its post-processor's first token", *ename = "";
    FSDP_CHECK(fsdp_tokenizer_load(path, &tok));
    if (fsdp_tokenizer_specials(tok, &before, &nb, &after, &na) < 0) {
        fsdp_err_clear();
        nb = 0;
    }
    *bos = nb > 0 ? (long)before[0] : hf_first_token(tok, bos_names, &bname);
    *eos = hf_first_token(tok, eos_names, &ename);
    snprintf(desc, len, "%s: bos %ld (%s), eos %ld (%s)", path, *bos,
             *bos >= 0 ? bname : "none found", *eos, *eos >= 0 ? ename : "none found");
    fsdp_tokenizer_free(tok);
    return 0;
}

int fsdp_hf_generation_config_write(const struct fsdp_model_spec *s, char **text, size_t *len)
{
    struct fsdp_json_writer w;
    FSDP_CHECK(fsdp_json_writer_init(&w));
    fsdp_json_begin_obj(&w, NULL);
    fsdp_json_put_bool(&w, "_from_model_config", 1);
    fsdp_hf_tokens_put(&w, s);
    fsdp_json_end(&w);
    return fsdp_json_writer_finish(&w, text, len);
}
