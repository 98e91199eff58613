/*
 * tokenizer_added.c - the added_tokens of a tokenizer.json: each checked
 * (its keys, an id and content that agree with model.vocab, no repeat of an
 * earlier one's id or content, found through hash tables), then the two
 * matching sets encoding uses (tokenizer_encode.c): by content, with the
 * distinct lengths of the tokens starting with each byte, longest first.
 * Private to io/tokenizer*.c.
 */
#include "config.h"
#include "io/text/tokenizer_impl.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tk_load_added_one(struct fsdp_tokenizer *tok, const json_t *t, const char *field,
                             struct tk_added *a)
{
    static const char *const keys[] = {"id", "content", "single_word", "lstrip", "rstrip",
                                       "normalized", "special", NULL};
    static const char *const refused[] = {"single_word", "lstrip", "rstrip"};
    char show[TK_SHOW];
    int flag = 0;
    if (!json_is_object(t)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "expected an object");
    }
    FSDP_CHECK(tk_keys(tok, t, field, keys));
    FSDP_CHECK(tk_id(tok, json_object_get(t, "id"), field, &a->id));
    json_t *c = json_object_get(t, "content");
    if (!json_is_string(c) || json_string_length(c) == 0 ||
        strlen(json_string_value(c)) != json_string_length(c)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "'content' must be a non-empty string");
    }
    for (int i = 0; i < 3; i++) {
        FSDP_CHECK(tk_bool(tok, t, field, refused[i], 0, &flag));
        if (flag) {
            return tk_bad(tok, FSDP_ERR_UNSUPPORTED, field, "'%s' true is not supported (token "
                          "'%s')", refused[i], tk_show(show, sizeof(show), json_string_value(c)));
        }
    }
    FSDP_CHECK(tk_bool(tok, t, field, "special", 0, &a->special));
    FSDP_CHECK(tk_bool(tok, t, field, "normalized", !a->special, &a->normalized));
    a->len = json_string_length(c);
    a->content = strdup(json_string_value(c));
    if (!a->content) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: added tokens", tok->path);
    }
    /* the model's entry of the same text must be the same id */
    uint32_t mid;
    if (tk_strmap_get(&tok->vocab, a->content, a->len, &mid) && mid != a->id) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "'%s' has id %u but model.vocab gives it %u",
                      tk_show(show, sizeof(show), a->content), (unsigned)a->id, (unsigned)mid);
    }
    return 0;
}

/* Orders a set's tokens by first byte, then longest first (the first
 * length that matches at a position is the longest), then by index. */
struct tk_addkey {
    unsigned char first;
    size_t len;
    uint32_t idx;
};

static int tk_addkey_cmp(const void *pa, const void *pb)
{
    const struct tk_addkey *a = pa, *b = pb;
    if (a->first != b->first) {
        return a->first < b->first ? -1 : 1;
    }
    if (a->len != b->len) {
        return a->len > b->len ? -1 : 1;
    }
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* A matching set of the added tokens whose normalized flag is norm. */
static int tk_addset_build(struct fsdp_tokenizer *tok, int norm, struct tk_addset *s)
{
    struct tk_addkey *k = malloc((tok->n_added + 1) * sizeof(*k));
    s->lens = malloc((tok->n_added + 1) * sizeof(uint32_t));
    s->n = 0;
    for (size_t i = 0; k && i < tok->n_added; i++) {
        const struct tk_added *a = &tok->added[i];
        if (!!a->normalized == norm) {
            k[s->n++] = (struct tk_addkey){(unsigned char)a->content[0], a->len, (uint32_t)i};
        }
    }
    int rc = k && s->lens ? tk_strmap_init(&s->by_content, s->n)
                          : fsdp_err(FSDP_ERR_NOMEM, "%s: added tokens", tok->path);
    if (rc == 0) {
        qsort(k, s->n, sizeof(*k), tk_addkey_cmp);
    }
    size_t j = 0, nl = 0;
    for (unsigned b = 0; rc == 0 && b < 256; b++) {
        s->from[b] = (uint32_t)nl;
        for (; rc == 0 && j < s->n && k[j].first == b; j++) {
            uint32_t dup;
            const struct tk_added *a = &tok->added[k[j].idx];
            if (nl == s->from[b] || s->lens[nl - 1] != a->len) {
                s->lens[nl++] = (uint32_t)a->len;
            }
            rc = tk_strmap_put(&s->by_content, a->content, a->len, k[j].idx, &dup);
        }
    }
    s->from[256] = (uint32_t)nl;
    free(k);
    return rc < 0 ? rc : 0;
}

/* added[i] repeats no earlier token's content or id: seen_content and
 * seen_id (the id's 4 bytes) map each to the first index that had it. */
static int tk_added_unique(struct fsdp_tokenizer *tok, size_t i, const char *field,
                           struct tk_strmap *seen_content, struct tk_strmap *seen_id)
{
    const struct tk_added *a = &tok->added[i];
    char show[TK_SHOW];
    uint32_t j1 = UINT32_MAX, j2 = UINT32_MAX;
    int rc1 = tk_strmap_put(seen_content, a->content, a->len, (uint32_t)i, &j1);
    int rc2 = rc1 < 0 ? rc1 : tk_strmap_put(seen_id, (const char *)&a->id, sizeof(a->id),
                                            (uint32_t)i, &j2);
    if (rc1 < 0 || rc2 < 0) {
        return rc1 < 0 ? rc1 : rc2;
    }
    if (rc1 == 1 || rc2 == 1) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "'%s' (id %u) repeats added_tokens[%u]",
                      tk_show(show, sizeof(show), a->content), (unsigned)a->id,
                      (unsigned)(j1 < j2 ? j1 : j2));
    }
    return 0;
}

int tk_load_added(struct fsdp_tokenizer *tok, const json_t *list, uint32_t *max_id)
{
    char field[40];
    struct tk_strmap seen_content = {0}, seen_id = {0};
    if (!list || json_is_null(list)) {
        list = NULL;
    } else if (!json_is_array(list)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, "added_tokens", "expected an array");
    }
    size_t n = list ? json_array_size(list) : 0;
    tok->added = calloc(n + 1, sizeof(*tok->added));
    if (!tok->added) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: added tokens", tok->path);
    }
    int rc = tk_strmap_init(&seen_content, n);
    if (rc == 0) {
        rc = tk_strmap_init(&seen_id, n);
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        struct tk_added *a = &tok->added[i];
        snprintf(field, sizeof(field), "added_tokens[%zu]", i);
        rc = tk_load_added_one(tok, json_array_get(list, i), field, a);
        if (rc == 0) {
            tok->n_added++;
            rc = tk_added_unique(tok, i, field, &seen_content, &seen_id);
        }
        *max_id = a->id > *max_id ? a->id : *max_id;
    }
    tk_strmap_free(&seen_content);
    tk_strmap_free(&seen_id);
    FSDP_CHECK(rc);
    FSDP_CHECK(tk_addset_build(tok, 0, &tok->set_raw));
    return tk_addset_build(tok, 1, &tok->set_norm);
}
