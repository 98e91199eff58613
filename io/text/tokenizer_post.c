/*
 * tokenizer_post.c - a tokenizer.json's post_processor: what
 * Tokenizer.encode(text) adds around the ids of a text when it adds special
 * tokens. ByteLevel changes no id; TemplateProcessing's "single" template
 * is special tokens and the sequence "A" in some order, the special tokens'
 * ids listed under "special_tokens"; a Sequence applies its processors in
 * turn (Llama 3: ByteLevel, then a template that puts <|begin_of_text|>
 * first). Other types are recorded and refused only when applied.
 */
#include "config.h"
#include "io/text/tokenizer_impl.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ByteLevel as a post-processor: offsets only, never ids. */
static int tk_post_bytelevel(struct fsdp_tokenizer *tok, const json_t *pp, const char *field)
{
    static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex",
                                       NULL};
    return tk_keys(tok, pp, field, keys);
}

/* The ids of special token `name` of the template (its "special_tokens"
 * entry), appended to tok->post_ids. */
static int tk_post_special(struct fsdp_tokenizer *tok, const json_t *specials, const char *name,
                           const char *field, size_t *n)
{
    char f[TK_SHOW + 192], show[TK_SHOW];
    const json_t *e = json_is_object(specials) ? json_object_get(specials, name) : NULL;
    const json_t *ids = json_is_object(e) ? json_object_get(e, "ids") : NULL;
    size_t k = json_is_array(ids) ? json_array_size(ids) : 0;
    if (!json_is_array(ids)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "special token '%s' has no 'ids' list under "
                      "special_tokens", tk_show(show, sizeof(show), name));
    }
    uint32_t *grown = realloc(tok->post_ids, (*n + k + 1) * sizeof(*grown));
    if (!grown) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: post-processor", tok->path);
    }
    tok->post_ids = grown;
    for (size_t i = 0; i < k; i++) {
        uint32_t id;
        snprintf(f, sizeof(f), "%s: special_tokens['%s'].ids[%zu]", field,
                 tk_show(show, sizeof(show), name), i);
        FSDP_CHECK(tk_id(tok, json_array_get(ids, i), f, &id));
        if (id >= tok->vocab_size) {
            return tk_bad(tok, FSDP_ERR_FORMAT, f, "id %u is not in the vocabulary (ids below "
                          "%zu)", id, tok->vocab_size);
        }
        tok->post_ids[(*n)++] = id;
    }
    return 0;
}

/* TemplateProcessing: its "single" template into post_ids. */
static int tk_post_template(struct fsdp_tokenizer *tok, const json_t *pp, const char *field)
{
    static const char *const keys[] = {"type", "single", "pair", "special_tokens", NULL};
    const json_t *single = json_object_get(pp, "single");
    const json_t *specials = json_object_get(pp, "special_tokens");
    char f[128], show[TK_SHOW];
    size_t n = 0, seq = 0;
    FSDP_CHECK(tk_keys(tok, pp, field, keys));
    if (tok->post_template++) {
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, field, "a second TemplateProcessing");
    }
    if (!json_is_array(single)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "'single' must be a list of pieces");
    }
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *piece = json_array_get(single, i), *sp, *sq;
        snprintf(f, sizeof(f), "%s.single[%zu]", field, i);
        sp = json_is_object(piece) ? json_object_get(piece, "SpecialToken") : NULL;
        sq = json_is_object(piece) ? json_object_get(piece, "Sequence") : NULL;
        const json_t *id = json_object_get(sp ? sp : sq, "id");
        if (!json_is_object(piece) || json_object_size(piece) != 1 || (!sp && !sq) ||
            !json_is_string(id)) {
            return tk_bad(tok, FSDP_ERR_FORMAT, f, "expected {\"SpecialToken\": {\"id\": ...}} "
                          "or {\"Sequence\": {\"id\": \"A\"}}");
        }
        if (sq) {
            if (strcmp(json_string_value(id), "A") != 0 || seq++) {
                return tk_bad(tok, FSDP_ERR_FORMAT, f, "the single template holds the sequence "
                              "\"A\" once ('%s' here)",
                              tk_show(show, sizeof(show), json_string_value(id)));
            }
            tok->n_before = n;
            continue;
        }
        FSDP_CHECK(tk_post_special(tok, specials, json_string_value(id), f, &n));
    }
    if (seq != 1) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "the single template has no sequence \"A\"");
    }
    tok->n_after = n - tok->n_before;
    return 0;
}

/* One processor (a Sequence's, or the whole post_processor). */
static int tk_post_one(struct fsdp_tokenizer *tok, const json_t *pp, const char *field)
{
    const char *type;
    FSDP_CHECK(tk_type(tok, pp, field, &type));
    if (strcmp(type, "ByteLevel") == 0) {
        return tk_post_bytelevel(tok, pp, field);
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        return tk_post_template(tok, pp, field);
    }
    if (!tok->post_type[0]) {
        tk_show(tok->post_type, sizeof(tok->post_type), type);
    }
    return 0;
}

int tk_load_post(struct fsdp_tokenizer *tok, const json_t *pp)
{
    static const char *const keys[] = {"type", "processors", NULL};
    const char *type;
    char f[64];
    if (!pp || json_is_null(pp)) {
        return 0;
    }
    FSDP_CHECK(tk_type(tok, pp, "post_processor", &type));
    if (strcmp(type, "Sequence") != 0) {
        return tk_post_one(tok, pp, "post_processor");
    }
    FSDP_CHECK(tk_keys(tok, pp, "post_processor", keys));
    const json_t *list = json_object_get(pp, "processors");
    if (!json_is_array(list)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, "post_processor.processors", "expected a list");
    }
    for (size_t i = 0; i < json_array_size(list); i++) {
        snprintf(f, sizeof(f), "post_processor.processors[%zu]", i);
        FSDP_CHECK(tk_post_one(tok, json_array_get(list, i), f));
    }
    return 0;
}

int fsdp_tokenizer_specials(const struct fsdp_tokenizer *tok, const uint32_t **before,
                            size_t *n_before, const uint32_t **after, size_t *n_after)
{
    if (tok->post_type[0]) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: post_processor: '%s' is not applied here "
                        "(ByteLevel and TemplateProcessing are)", tok->path, tok->post_type);
    }
    *before = tok->post_ids;
    *n_before = tok->n_before;
    *after = tok->post_ids ? tok->post_ids + tok->n_before : NULL;
    *n_after = tok->n_after;
    return 0;
}
