/*
 * tokenizer.c - loading a Hugging Face tokenizer.json (see tokenizer.h for
 * what it may hold) and decoding ids to text.
 *
 * The file is untrusted: its JSON is parsed by Jansson (duplicate keys
 * refused), every field is checked against the subset fsdpc implements, and
 * what falls outside it is one error naming the file and the field, never a
 * silently different tokenization. Ids are bounded (FSDP_TOKENIZER_MAX_VOCAB)
 * before any table is sized from them. Encoding lives in tokenizer_encode.c.
 */
#include "config.h"
#include "io/text/tokenizer_impl.h"
#include "io/util/json.h"
#include "core/error.h"
#include "core/util.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define TK_FILE_MAX ((size_t)256 << 20) /* real ones are below 40 MB */

// ----------------------------------------------------------------------------
// The byte-level alphabet (GPT-2's bytes_to_unicode)

/* Printable bytes stand for themselves; the other 68 take the code points
 * from 256 on, in byte order: 0-32, then 127-160, then 173. */
static int tk_byte_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

uint32_t tk_byte_char(unsigned b)
{
    if (tk_byte_printable(b)) {
        return b;
    }
    if (b <= 32) {
        return 256 + b;
    }
    return b == 173 ? 323 : 289 + (b - 127);
}

int tk_char_byte(uint32_t cp)
{
    if (cp < 256) {
        return tk_byte_printable(cp) ? (int)cp : -1;
    }
    if (cp <= 288) {
        return (int)(cp - 256);
    }
    if (cp <= 322) {
        return (int)(cp - 289 + 127);
    }
    return cp == 323 ? 173 : -1;
}

// ----------------------------------------------------------------------------
// Hash tables

uint64_t tk_hash(const void *s, size_t len)
{
    return XXH3_64bits(s, len);
}

static size_t tk_pow2_above(size_t n)
{
    size_t c = 64;
    while (c < 2 * n) {
        c *= 2;
    }
    return c;
}

int tk_strmap_init(struct tk_strmap *m, size_t expect)
{
    memset(m, 0, sizeof(*m));
    m->cap = tk_pow2_above(expect);
    m->slot = calloc(m->cap, sizeof(*m->slot));
    return m->slot ? 0 : fsdp_err(FSDP_ERR_NOMEM, "tokenizer: hash table of %zu entries", expect);
}

void tk_strmap_free(struct tk_strmap *m)
{
    free(m->slot);
    free(m->arena);
    memset(m, 0, sizeof(*m));
}

static struct tk_strent *tk_strmap_find(const struct tk_strmap *m, const char *key, size_t len,
                                        uint64_t h)
{
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        struct tk_strent *e = &m->slot[i];
        if (!e->used || (e->hash == h && e->len == len &&
                         memcmp(m->arena + e->off, key, len) == 0)) {
            return e;
        }
    }
}

int tk_strmap_put(struct tk_strmap *m, const char *key, size_t len, uint32_t val, uint32_t *old)
{
    uint64_t h = tk_hash(key, len);
    if (2 * (m->n + 1) > m->cap || len > UINT32_MAX - m->arena_len) {
        return fsdp_err(FSDP_ERR_INTERNAL, "tokenizer: hash table sized too small");
    }
    struct tk_strent *e = tk_strmap_find(m, key, len, h);
    if (e->used) {
        *old = e->val;
        return 1;
    }
    if (m->arena_len + len > m->arena_cap) {
        size_t c = m->arena_cap ? m->arena_cap : 4096;
        while (c < m->arena_len + len) {
            c *= 2;
        }
        char *a = realloc(m->arena, c);
        if (!a) {
            return fsdp_err(FSDP_ERR_NOMEM, "tokenizer: string table");
        }
        m->arena = a;
        m->arena_cap = c;
    }
    memcpy(m->arena + m->arena_len, key, len);
    *e = (struct tk_strent){h, (uint32_t)m->arena_len, (uint32_t)len, val, 1};
    m->arena_len += len;
    m->n++;
    return 0;
}

int tk_strmap_get(const struct tk_strmap *m, const char *key, size_t len, uint32_t *val)
{
    if (!m->slot) {
        return 0;
    }
    const struct tk_strent *e = tk_strmap_find(m, key, len, tk_hash(key, len));
    if (e->used) {
        *val = e->val;
    }
    return e->used ? 1 : 0;
}

/* Sets (a, b) -> (rank, id); a pair listed twice keeps its last rank, as
 * `tokenizers` (which collects the merges into a map) does. */
static void tk_pair_put(struct tk_pairmap *m, uint32_t a, uint32_t b, uint32_t rank, uint32_t id)
{
    uint64_t key = (uint64_t)a << 32 | b;
    size_t i = tk_mix64(key) & (m->cap - 1);
    while (m->slot[i].rank1 != 0 && m->slot[i].key != key) {
        i = (i + 1) & (m->cap - 1);
    }
    m->slot[i] = (struct tk_pairent){key, rank + 1, id};
}

// ----------------------------------------------------------------------------
// Errors that name the field

int tk_bad(const struct fsdp_tokenizer *tok, int code, const char *field, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return fsdp_err(code, "%s: %s: %s", tok->path, field, msg);
}

const char *tk_show(char *buf, size_t n, const char *s)
{
    return fsdp_str_printable(buf, n, s, 0);
}

int tk_keys(const struct fsdp_tokenizer *tok, const json_t *obj, const char *field,
            const char *const *allowed)
{
    const char *key;
    json_t *v;
    char show[TK_SHOW];
    json_object_foreach((json_t *)obj, key, v) {
        size_t i = 0;
        while (allowed[i] && strcmp(allowed[i], key) != 0) {
            i++;
        }
        if (!allowed[i]) {
            return tk_bad(tok, FSDP_ERR_UNSUPPORTED, field, "unknown key '%s'",
                          tk_show(show, sizeof(show), key));
        }
    }
    return 0;
}

int tk_bool(const struct fsdp_tokenizer *tok, const json_t *obj, const char *field,
            const char *key, int dflt, int *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "'%s' must be true or false", key);
    }
    *out = json_is_true(v);
    return 0;
}

int tk_type(const struct fsdp_tokenizer *tok, const json_t *obj, const char *field,
            const char **type)
{
    json_t *t = json_is_object(obj) ? json_object_get(obj, "type") : NULL;
    if (!json_is_string(t)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "expected an object with a string 'type'");
    }
    *type = json_string_value(t);
    return 0;
}

int tk_id(const struct fsdp_tokenizer *tok, const json_t *v, const char *field, uint32_t *id)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (json_int_t)json_integer_value(v) >= (json_int_t)FSDP_TOKENIZER_MAX_VOCAB) {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "id must be an integer in [0, %zu)",
                      FSDP_TOKENIZER_MAX_VOCAB);
    }
    *id = (uint32_t)json_integer_value(v);
    return 0;
}

// ----------------------------------------------------------------------------
// model

/* model.vocab into the string table; the largest id. */
static int tk_load_vocab(struct fsdp_tokenizer *tok, const json_t *vocab, uint32_t *max_id)
{
    const char *key;
    json_t *v;
    char field[TK_SHOW + 32], show[TK_SHOW], show2[TK_SHOW];
    if (!json_is_object(vocab) || json_object_size(vocab) == 0) {
        return tk_bad(tok, FSDP_ERR_FORMAT, "model.vocab", "expected a non-empty object");
    }
    tok->n_model = json_object_size(vocab);
    FSDP_CHECK(tk_strmap_init(&tok->vocab, tok->n_model + 1));
    *max_id = 0;
    json_object_foreach((json_t *)vocab, key, v) {
        uint32_t id = 0, old = 0;
        size_t len = strlen(key);
        snprintf(field, sizeof(field), "model.vocab['%s']", tk_show(show, sizeof(show), key));
        if (len == 0) {
            return tk_bad(tok, FSDP_ERR_FORMAT, "model.vocab", "an empty token");
        }
        FSDP_CHECK(tk_id(tok, v, field, &id));
        FSDP_CHECK(tk_strmap_put(&tok->vocab, key, len, id, &old)); /* keys are unique */
        *max_id = id > *max_id ? id : *max_id;
    }
    /* one token per id: a table of owners finds a shared one */
    int32_t *owner = malloc(((size_t)*max_id + 1) * sizeof(int32_t));
    if (!owner) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: model.vocab ids", tok->path);
    }
    memset(owner, 0xff, ((size_t)*max_id + 1) * sizeof(int32_t));
    for (size_t i = 0; i < tok->vocab.cap; i++) {
        const struct tk_strent *e = &tok->vocab.slot[i];
        if (!e->used) {
            continue;
        }
        if (owner[e->val] >= 0) {
            const struct tk_strent *o = &tok->vocab.slot[owner[e->val]];
            char a[TK_SHOW], b[TK_SHOW];
            snprintf(a, sizeof(a), "%.*s", (int)o->len, tok->vocab.arena + o->off);
            snprintf(b, sizeof(b), "%.*s", (int)e->len, tok->vocab.arena + e->off);
            free(owner);
            int ab = strcmp(a, b) < 0; /* named in a fixed order */
            return tk_bad(tok, FSDP_ERR_FORMAT, "model.vocab", "'%s' and '%s' share id %u",
                          tk_show(show, sizeof(show), ab ? a : b),
                          tk_show(show2, sizeof(show2), ab ? b : a), (unsigned)e->val);
        }
        owner[e->val] = (int32_t)i;
    }
    free(owner);
    return 0;
}

/* One merge: "a b" (one space) or ["a", "b"]; *a and *b malloc'd. */
static int tk_merge_parts(struct fsdp_tokenizer *tok, const json_t *m, const char *field,
                          char **a, char **b)
{
    *a = *b = NULL;
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ') || sp == s || sp[1] == '\0') {
            return tk_bad(tok, FSDP_ERR_FORMAT, field, "expected two symbols separated by one "
                          "space");
        }
        *a = strndup(s, (size_t)(sp - s));
        *b = strdup(sp + 1);
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
        *a = strdup(json_string_value(json_array_get(m, 0)));
        *b = strdup(json_string_value(json_array_get(m, 1)));
    } else {
        return tk_bad(tok, FSDP_ERR_FORMAT, field, "expected \"a b\" or [\"a\", \"b\"]");
    }
    return *a && *b ? 0 : fsdp_err(FSDP_ERR_NOMEM, "%s: merges", tok->path);
}

static int tk_load_merges(struct fsdp_tokenizer *tok, const json_t *merges)
{
    char field[48], show[TK_SHOW];
    if (!json_is_array(merges)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, "model.merges", "expected an array");
    }
    size_t n = json_array_size(merges);
    tok->merges.cap = tk_pow2_above(n + 1);
    tok->merges.slot = calloc(tok->merges.cap, sizeof(*tok->merges.slot));
    if (!tok->merges.slot) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: %zu merges", tok->path, n);
    }
    for (size_t r = 0; r < n; r++) {
        char *a, *b, *ab = NULL;
        uint32_t ia, ib, iab;
        int rc = 0;
        snprintf(field, sizeof(field), "model.merges[%zu]", r);
        FSDP_CHECK_GOTO(tk_merge_parts(tok, json_array_get(merges, r), field, &a, &b), rc, out);
        size_t la = strlen(a), lb = strlen(b);
        int has_a = tk_strmap_get(&tok->vocab, a, la, &ia);
        if (!has_a || !tk_strmap_get(&tok->vocab, b, lb, &ib)) {
            rc = tk_bad(tok, FSDP_ERR_FORMAT, field, "'%s' is not in model.vocab",
                        tk_show(show, sizeof(show), has_a ? b : a));
            goto out;
        }
        if (!(ab = malloc(la + lb + 1))) {
            rc = fsdp_err(FSDP_ERR_NOMEM, "%s: merges", tok->path);
            goto out;
        }
        memcpy(ab, a, la);
        memcpy(ab + la, b, lb + 1);
        if (!tk_strmap_get(&tok->vocab, ab, la + lb, &iab)) {
            rc = tk_bad(tok, FSDP_ERR_FORMAT, field, "the merged token '%s' is not in "
                        "model.vocab", tk_show(show, sizeof(show), ab));
            goto out;
        }
        tk_pair_put(&tok->merges, ia, ib, (uint32_t)r, iab);
out:
        free(a);
        free(b);
        free(ab);
        if (rc < 0) {
            return rc;
        }
    }
    return 0;
}

static int tk_load_model(struct fsdp_tokenizer *tok, const json_t *model, uint32_t *max_id)
{
    static const char *const keys[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                       "end_of_word_suffix", "fuse_unk", "byte_fallback",
                                       "ignore_merges", "vocab", "merges", NULL};
    const char *type = "";
    char show[TK_SHOW];
    int flag = 0;
    /* files written before models carried a type (GPT-2's on the Hub) are
     * told apart by their fields, as `tokenizers` does: merges make a BPE */
    if (json_is_object(model) && !json_object_get(model, "type") &&
        json_object_get(model, "merges")) {
        type = "BPE";
    } else {
        FSDP_CHECK(tk_type(tok, model, "model", &type));
    }
    if (strcmp(type, "BPE") != 0) {
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, "model.type", "'%s' is not supported (only BPE)",
                      tk_show(show, sizeof(show), type));
    }
    FSDP_CHECK(tk_keys(tok, model, "model", keys));
    json_t *v = json_object_get(model, "dropout");
    if (v && !json_is_null(v)) {
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, "model.dropout", "BPE dropout is not supported "
                      "(must be null)");
    }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0)) {
            return tk_bad(tok, FSDP_ERR_UNSUPPORTED, "model", "'%s' is not supported (must be "
                          "null or empty)", affixes[i]);
        }
    }
    v = json_object_get(model, "unk_token");
    if (v && !json_is_null(v) && !json_is_string(v)) {
        return tk_bad(tok, FSDP_ERR_FORMAT, "model.unk_token", "must be null or a string");
    }
    FSDP_CHECK(tk_bool(tok, model, "model", "fuse_unk", 0, &flag));
    FSDP_CHECK(tk_bool(tok, model, "model", "byte_fallback", 0, &flag));
    if (flag) {
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, "model.byte_fallback", "true is not supported "
                      "(byte-level BPE needs none)");
    }
    FSDP_CHECK(tk_bool(tok, model, "model", "ignore_merges", 0, &tok->ignore_merges));
    FSDP_CHECK(tk_load_vocab(tok, json_object_get(model, "vocab"), max_id));
    FSDP_CHECK(tk_load_merges(tok, json_object_get(model, "merges")));
    /* every byte must have its symbol: `tokenizers` would drop the byte */
    for (unsigned b = 0; b < 256; b++) {
        char sym[2];
        size_t n = tk_utf8_put(tk_byte_char(b), sym);
        if (!tk_strmap_get(&tok->vocab, sym, n, &tok->byte_id[b])) {
            return tk_bad(tok, FSDP_ERR_UNSUPPORTED, "model.vocab", "no symbol for byte 0x%02x "
                          "('%.*s'): not a byte-level BPE vocabulary", b, (int)n, sym);
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// pre_tokenizer, decoder and the rest

static int tk_load_bytelevel(struct fsdp_tokenizer *tok, const json_t *bl, const char *field)
{
    static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex",
                                       NULL};
    /* GPT-2's pattern, which ByteLevel applies when use_regex is true */
    static const char gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
                               "|\\s+(?!\\S)|\\s+";
    int use_regex, trim;
    FSDP_CHECK(tk_keys(tok, bl, field, keys));
    FSDP_CHECK(tk_bool(tok, bl, field, "add_prefix_space", 1, &tok->prefix_space));
    FSDP_CHECK(tk_bool(tok, bl, field, "trim_offsets", 1, &trim));
    FSDP_CHECK(tk_bool(tok, bl, field, "use_regex", 1, &use_regex));
    if (use_regex) {
        FSDP_CHECK(tk_regex_compile(tok, gpt2, sizeof(gpt2) - 1, 0, field, &tok->bl));
    }
    return 0;
}

static int tk_load_split(struct fsdp_tokenizer *tok, const json_t *sp, const char *field,
                         struct tk_regex *out)
{
    static const char *const keys[] = {"type", "pattern", "behavior", "invert", NULL};
    char f[96], show[TK_SHOW];
    int invert;
    FSDP_CHECK(tk_keys(tok, sp, field, keys));
    json_t *beh = json_object_get(sp, "behavior");
    if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated") != 0) {
        snprintf(f, sizeof(f), "%s.behavior", field);
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, f, "'%s' is not supported (only Isolated)",
                      json_is_string(beh) ? tk_show(show, sizeof(show), json_string_value(beh))
                                          : "?");
    }
    FSDP_CHECK(tk_bool(tok, sp, field, "invert", 0, &invert));
    if (invert) {
        snprintf(f, sizeof(f), "%s.invert", field);
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, f, "true is not supported");
    }
    json_t *pat = json_object_get(sp, "pattern");
    json_t *re = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
    json_t *lit = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
    snprintf(f, sizeof(f), "%s.pattern", field);
    if (!json_is_object(pat) || json_object_size(pat) != 1 ||
        !(json_is_string(re) || json_is_string(lit))) {
        return tk_bad(tok, FSDP_ERR_FORMAT, f, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    json_t *p = re ? re : lit;
    /* text can be encoded in pieces (fsdp_tokenizer_cut) only through patterns
     * known never to cross a newline that a letter or digit follows */
    static const char llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                 "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                 "\\s+(?!\\S)|\\s+";
    if (re ? strcmp(json_string_value(p), llama3) != 0
           : memchr(json_string_value(p), '\n', json_string_length(p)) != NULL) {
        tok->no_cut = 1;
    }
    return tk_regex_compile(tok, json_string_value(p), json_string_length(p), re == NULL, f, out);
}

static int tk_load_pretok(struct fsdp_tokenizer *tok, const json_t *pt)
{
    const char *type = "";
    char field[64], show[TK_SHOW];
    if (!pt || json_is_null(pt)) {
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, "pre_tokenizer", "null is not supported "
                      "(byte-level BPE needs ByteLevel)");
    }
    FSDP_CHECK(tk_type(tok, pt, "pre_tokenizer", &type));
    if (strcmp(type, "ByteLevel") == 0) {
        return tk_load_bytelevel(tok, pt, "pre_tokenizer");
    }
    static const char *const keys[] = {"type", "pretokenizers", NULL};
    json_t *list = json_object_get(pt, "pretokenizers");
    if (strcmp(type, "Sequence") != 0) {
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, "pre_tokenizer.type", "'%s' is not supported "
                      "(ByteLevel, or a Sequence of Split ending in ByteLevel)",
                      tk_show(show, sizeof(show), type));
    }
    FSDP_CHECK(tk_keys(tok, pt, "pre_tokenizer", keys));
    size_t n = json_is_array(list) ? json_array_size(list) : 0;
    if (n == 0) {
        return tk_bad(tok, FSDP_ERR_FORMAT, "pre_tokenizer.pretokenizers", "expected a "
                      "non-empty array");
    }
    tok->splits = calloc(n, sizeof(*tok->splits));
    if (!tok->splits) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: pre-tokenizer", tok->path);
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(field, sizeof(field), "pre_tokenizer.pretokenizers[%zu]", i);
        FSDP_CHECK(tk_type(tok, json_array_get(list, i), field, &type));
        const char *want = i + 1 < n ? "Split" : "ByteLevel";
        if (strcmp(type, want) != 0) {
            return tk_bad(tok, FSDP_ERR_UNSUPPORTED, field, "'%s' is not supported here "
                          "(Split stages, then ByteLevel last)", tk_show(show, sizeof(show), type));
        }
        if (i + 1 < n) {
            FSDP_CHECK(tk_load_split(tok, json_array_get(list, i), field, &tok->splits[i]));
            tok->n_splits++;
        } else {
            FSDP_CHECK(tk_load_bytelevel(tok, json_array_get(list, i), field));
        }
    }
    return 0;
}

static int tk_load_rest(struct fsdp_tokenizer *tok, const json_t *root)
{
    static const char *const keys[] = {"version", "truncation", "padding", "added_tokens",
                                       "normalizer", "pre_tokenizer", "post_processor", "decoder",
                                       "model", NULL};
    static const char *const dec_keys[] = {"type", "add_prefix_space", "trim_offsets",
                                           "use_regex", NULL};
    static const char *const nulls[] = {"normalizer", "truncation", "padding"};
    const char *type = "";
    char show[TK_SHOW];
    FSDP_CHECK(tk_keys(tok, root, "top level", keys));
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(root, nulls[i]);
        if (v && !json_is_null(v)) {
            json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
            return tk_bad(tok, FSDP_ERR_UNSUPPORTED, nulls[i], "%s%s%sis not supported (must be "
                          "null)", t && json_is_string(t) ? "'" : "",
                          t && json_is_string(t) ? tk_show(show, sizeof(show), json_string_value(t))
                                                 : "",
                          t && json_is_string(t) ? "' " : "");
        }
    }
    json_t *dec = json_object_get(root, "decoder");
    if (!dec || json_is_null(dec)) {
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, "decoder", "null is not supported (ByteLevel)");
    }
    FSDP_CHECK(tk_type(tok, dec, "decoder", &type));
    if (strcmp(type, "ByteLevel") != 0) {
        return tk_bad(tok, FSDP_ERR_UNSUPPORTED, "decoder.type", "'%s' is not supported (only "
                      "ByteLevel)", tk_show(show, sizeof(show), type));
    }
    FSDP_CHECK(tk_keys(tok, dec, "decoder", dec_keys));
    return tk_load_pretok(tok, json_object_get(root, "pre_tokenizer"));
}

// ----------------------------------------------------------------------------
// The decoding table

/* A token's bytes: its characters mapped back through the byte-level
 * alphabet, or its UTF-8 as it is when one character is outside it (the
 * ByteLevel decoder's rule, applied per token). Returns the count. */
static size_t tk_token_bytes(const char *s, size_t len, unsigned char *out)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        size_t k;
        if (c < 0x80) {
            cp = c, k = 1;
        } else if ((c & 0xe0) == 0xc0 && i + 1 < len) {
            cp = (uint32_t)(c & 0x1f) << 6 | ((unsigned char)s[i + 1] & 0x3f), k = 2;
        } else {
            cp = UINT32_MAX, k = 1;
        }
        int b = tk_char_byte(cp);
        if (b < 0) {
            memcpy(out, s, len);
            return len;
        }
        out[n++] = (unsigned char)b;
        i += k;
    }
    return n;
}

static int tk_build_decoder(struct fsdp_tokenizer *tok)
{
    size_t V = tok->vocab_size, total = tok->vocab.arena_len;
    for (size_t i = 0; i < tok->n_added; i++) {
        total += tok->added[i].len;
    }
    uint64_t *len = calloc(V + 1, sizeof(uint64_t));
    const char **src = calloc(V + 1, sizeof(char *));
    tok->dec_off = calloc(V + 1, sizeof(uint64_t));
    tok->dec_flags = calloc(V + 1, 1);
    tok->dec = malloc(total + 1);
    if (!len || !src || !tok->dec_off || !tok->dec_flags || !tok->dec) {
        free(len);
        free(src);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: decoding table of %zu ids", tok->path, V);
    }
    for (size_t i = 0; i < tok->vocab.cap; i++) {
        const struct tk_strent *e = &tok->vocab.slot[i];
        if (e->used) {
            src[e->val] = tok->vocab.arena + e->off;
            len[e->val] = e->len;
            tok->dec_flags[e->val] = TK_DEC_KNOWN;
        }
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        const struct tk_added *a = &tok->added[i];
        uint32_t mid;
        if ((tok->dec_flags[a->id] & TK_DEC_KNOWN) &&
            !tk_strmap_get(&tok->vocab, a->content, a->len, &mid)) {
            char f[40];
            snprintf(f, sizeof(f), "added_tokens[%zu]", i);
            free(len);
            free(src);
            return tk_bad(tok, FSDP_ERR_FORMAT, f, "id %u belongs to another token of "
                          "model.vocab", (unsigned)a->id);
        }
        src[a->id] = a->content;
        len[a->id] = a->len;
        tok->dec_flags[a->id] = (uint8_t)(TK_DEC_KNOWN | (a->special ? TK_DEC_SPECIAL : 0));
    }
    uint64_t off = 0;
    for (size_t id = 0; id < V; id++) {
        tok->dec_off[id] = off;
        if (src[id]) {
            off += tk_token_bytes(src[id], len[id], tok->dec + off);
        }
    }
    tok->dec_off[V] = off;
    free(len);
    free(src);
    return 0;
}

// ----------------------------------------------------------------------------
// Load and free

/* The JSON of path: a regular file (a FIFO is refused, not waited on),
 * read in blocks. */
static int tk_read_json(const char *path, json_t **root)
{
    FSDP_CHECK(fsdp_json_parse_file(path, TK_FILE_MAX, root));
    if (!json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        return fsdp_err(FSDP_ERR_FORMAT, "%s: not a tokenizer.json (the top level is not an "
                        "object)", path);
    }
    return 0;
}

int fsdp_tokenizer_load(const char *path, struct fsdp_tokenizer **out)
{
    json_t *root = NULL;
    uint32_t max_id = 0;
    int rc;
    struct fsdp_tokenizer *tok = calloc(1, sizeof(*tok));
    if (!tok || !(tok->path = strdup(path))) {
        free(tok);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: tokenizer", path);
    }
    FSDP_CHECK_GOTO(tk_read_json(path, &root), rc, err);
    json_t *model = json_object_get(root, "model");
    if (!model) {
        rc = tk_bad(tok, FSDP_ERR_FORMAT, "model", "missing: not a tokenizer.json");
        goto err;
    }
    FSDP_CHECK_GOTO(tk_load_model(tok, model, &max_id), rc, err);
    FSDP_CHECK_GOTO(tk_load_added(tok, json_object_get(root, "added_tokens"), &max_id), rc, err);
    FSDP_CHECK_GOTO(tk_load_rest(tok, root), rc, err);
    tok->vocab_size = (size_t)max_id + 1;
    FSDP_CHECK_GOTO(tk_load_post(tok, json_object_get(root, "post_processor")), rc, err);
    FSDP_CHECK_GOTO(tk_build_decoder(tok), rc, err);
    json_decref(root);
    *out = tok;
    return 0;
err:
    json_decref(root);
    fsdp_tokenizer_free(tok);
    return rc;
}

void fsdp_tokenizer_free(struct fsdp_tokenizer *tok)
{
    if (!tok) {
        return;
    }
    tk_encoder_free(tok);
    for (size_t i = 0; i < tok->n_splits; i++) {
        tk_regex_free(&tok->splits[i]);
    }
    free(tok->splits);
    tk_regex_free(&tok->bl);
    pcre2_match_context_free(tok->mctx);
    pcre2_jit_stack_free(tok->jit);
    for (size_t i = 0; i < tok->n_added; i++) {
        free(tok->added[i].content);
    }
    free(tok->added);
    free(tok->set_raw.lens);
    free(tok->set_norm.lens);
    tk_strmap_free(&tok->set_raw.by_content);
    tk_strmap_free(&tok->set_norm.by_content);
    tk_strmap_free(&tok->vocab);
    free(tok->merges.slot);
    free(tok->dec_off);
    free(tok->dec);
    free(tok->dec_flags);
    free(tok->post_ids);
    free(tok->path);
    free(tok);
}

size_t fsdp_tokenizer_vocab_size(const struct fsdp_tokenizer *tok)
{
    return tok->vocab_size;
}

long fsdp_tokenizer_token_id(const struct fsdp_tokenizer *tok, const char *content)
{
    uint32_t id;
    size_t len = strlen(content);
    for (size_t i = 0; i < tok->n_added; i++) {
        if (tok->added[i].len == len && memcmp(tok->added[i].content, content, len) == 0) {
            return (long)tok->added[i].id;
        }
    }
    return tk_strmap_get(&tok->vocab, content, len, &id) ? (long)id : -1;
}

// ----------------------------------------------------------------------------
// Decoding

int tk_utf8_seq(const unsigned char *in, size_t avail, size_t *n)
{
    unsigned char c = in[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        lo = c == 0xe0 ? 0xa0 : 0x80;
        hi = c == 0xed ? 0x9f : 0xbf;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        lo = c == 0xf0 ? 0x90 : 0x80;
        hi = c == 0xf4 ? 0x8f : 0xbf;
    } else {
        *n = 1;
        return 0;
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= avail) {
            *n = k;
            return -1;
        }
        unsigned char x = in[k];
        if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xbf)) {
            *n = k;
            return 0;
        }
    }
    *n = need;
    return 1;
}

size_t fsdp_utf8_lossy(const char *in, size_t n, int final, char *out, size_t *out_len)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0, o = 0, k;
    while (i < n) {
        if (s[i] < 0x80) {
            out[o++] = (char)s[i++];
            continue;
        }
        int r = tk_utf8_seq(s + i, n - i, &k);
        if (r < 0 && !final) {
            break; /* the rest may complete it */
        }
        if (r > 0) {
            memcpy(out + o, s + i, k);
            o += k;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
        }
        i += k;
    }
    *out_len = o;
    return i;
}

int fsdp_tokenizer_decode(const struct fsdp_tokenizer *tok, const uint32_t *ids, size_t n,
                          unsigned flags, char **text, size_t *len)
{
    size_t total = 0;
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= tok->vocab_size || !(tok->dec_flags[ids[i]] & TK_DEC_KNOWN)) {
            return fsdp_err(FSDP_ERR_INVALID, "%s: token id %u at position %zu is not in the "
                            "vocabulary (%zu ids)", tok->path, (unsigned)ids[i], i,
                            tok->vocab_size);
        }
        total += tok->dec_off[ids[i] + 1] - tok->dec_off[ids[i]];
    }
    int raw = (flags & FSDP_TOKENIZER_RAW) != 0;
    char *bytes = malloc(total + 1), *t = raw ? bytes : malloc(3 * total + 1);
    if (!bytes || !t) {
        free(bytes);
        free(raw ? NULL : t);
        return fsdp_err(FSDP_ERR_NOMEM, "decoding %zu tokens", n);
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if ((flags & FSDP_TOKENIZER_SKIP_SPECIAL) && (tok->dec_flags[id] & TK_DEC_SPECIAL)) {
            continue;
        }
        size_t k = tok->dec_off[id + 1] - tok->dec_off[id];
        memcpy(bytes + o, tok->dec + tok->dec_off[id], k);
        o += k;
    }
    if (!raw) {
        fsdp_utf8_lossy(bytes, o, 1, t, &o);
        free(bytes);
    }
    t[o] = '\0';
    *text = t;
    *len = o;
    return 0;
}
