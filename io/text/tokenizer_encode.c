/*
 * tokenizer_encode.c - text to ids, in the order `tokenizers` applies its
 * steps: added tokens are cut out of the text first (tokens with normalized
 * false, then those with normalized true in what is left; each pass takes
 * the leftmost match, the longest at a position), each remaining piece goes
 * through the Split stages (matches and the text between them become
 * pieces, empty ones dropped), then ByteLevel (a prefix space, its own
 * regex), then byte-level BPE: merges applied by rank through a heap with
 * the same order and the same stale-entry test as `tokenizers`, results
 * kept in a word cache.
 *
 * Regexes run on PCRE2 (UTF, Unicode properties, JIT where available).
 * Oniguruma, which `tokenizers` uses, reads \s as Unicode White_Space while
 * PCRE2's \s also takes U+180E; patterns are rewritten to spell White_Space
 * out. The text is checked to be UTF-8 once, so matching skips the check.
 * A match sees a growing window of the text, and the growth is charged to a
 * bound per text (tk_match), so that no pattern makes encoding quadratic.
 */
#include "config.h"
#include "io/text/tokenizer_impl.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TK_CACHE_SLOTS ((size_t)1 << 16)
#define TK_CACHE_KEY_MAX 255            /* longer pieces are not cached */
#define TK_CACHE_KEYS ((size_t)4 << 20) /* key bytes kept before a clear */
#define TK_CACHE_IDS ((size_t)1 << 20)  /* ids kept before a clear */
#define TK_OUT_BATCH 4096               /* ids handed to the sink at a time */
/* Regex work, in PCRE2 match-limit steps: a match sees TK_RE_WINDOW bytes
 * from where it starts, with TK_RE_STEPS_PER_BYTE steps per window byte;
 * a match that needs more doubles both, and the steps of those larger
 * windows count against the text's bound (per byte, plus a floor). */
#define TK_RE_WINDOW ((size_t)32)
#define TK_RE_STEPS_PER_BYTE ((uint64_t)32)
#define TK_RE_WORK_PER_BYTE 1024u
#define TK_RE_WORK_MIN ((uint64_t)4 << 20)
#define TK_RE_DEPTH_LIMIT 100000u                /* the interpreter's backtracking depth */
#define TK_RE_HEAP_KIB 65536u                    /* and its heap (64 MiB) */

/* Unicode White_Space, spelled for use inside a character class. */
static const char tk_ws[] = "\\t\\n\\x0b\\f\\r\\x20\\x85\\xa0\\x{1680}\\x{2000}-\\x{200a}"
                            "\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

// ----------------------------------------------------------------------------
// Regexes

/* pattern with \s and \S spelled out (tk_ws); \S inside a class has no
 * spelling and is refused. *out malloc'd, NUL-terminated. */
static int tk_pattern_rewrite(const struct fsdp_tokenizer *tok, const char *p, size_t n,
                              const char *field, char **out)
{
    char *o = malloc(n * (sizeof(tk_ws) + 4) + 1);
    size_t k = 0, i = 0;
    int in_class = 0;
    if (!o) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: pattern", tok->path);
    }
    while (i < n) {
        char c = p[i];
        if (c == '\\' && i + 1 < n && p[i + 1] == 'Q') { /* quoted up to \E */
            const char *e = memmem(p + i + 2, n - i - 2, "\\E", 2);
            size_t end = e ? (size_t)(e - p) + 2 : n;
            memcpy(o + k, p + i, end - i);
            k += end - i;
            i = end;
        } else if (c == '\\' && i + 1 < n && (p[i + 1] == 's' || p[i + 1] == 'S')) {
            int neg = p[i + 1] == 'S';
            if (in_class && neg) {
                free(o);
                return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: %s: \\S inside a character class is "
                                "not supported", tok->path, field);
            }
            k += (size_t)sprintf(o + k, in_class ? "%s" : neg ? "[^%s]" : "[%s]", tk_ws);
            i += 2;
        } else if (c == '\\' && i + 1 < n) {
            o[k++] = c;
            o[k++] = p[i + 1];
            i += 2;
        } else if (!in_class && c == '[') {
            in_class = 1;
            o[k++] = p[i++];
            if (i < n && p[i] == '^') {
                o[k++] = p[i++];
            }
            if (i < n && p[i] == ']') { /* a ']' first is literal */
                o[k++] = p[i++];
            }
        } else if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
            const char *e = memmem(p + i + 2, n - i - 2, ":]", 2);
            size_t end = e ? (size_t)(e - p) + 2 : i + 1;
            memcpy(o + k, p + i, end - i);
            k += end - i;
            i = end;
        } else {
            in_class = in_class && c != ']';
            o[k++] = p[i++];
        }
    }
    o[k] = '\0';
    *out = o;
    return 0;
}

int tk_regex_compile(struct fsdp_tokenizer *tok, const char *pattern, size_t len, int literal,
                     const char *field, struct tk_regex *out)
{
    char *pat = NULL;
    int err;
    PCRE2_SIZE at;
    uint32_t minlen = 0;
    if (!tok->mctx) {
        tok->mctx = pcre2_match_context_create(NULL);
        tok->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        if (!tok->mctx || !tok->jit) {
            return fsdp_err(FSDP_ERR_NOMEM, "%s: regex match context", tok->path);
        }
        pcre2_jit_stack_assign(tok->mctx, NULL, tok->jit);
        pcre2_set_depth_limit(tok->mctx, TK_RE_DEPTH_LIMIT);
        pcre2_set_heap_limit(tok->mctx, TK_RE_HEAP_KIB);
    }
    if (!literal) {
        FSDP_CHECK(tk_pattern_rewrite(tok, pattern, len, field, &pat));
    }
    out->re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : pat), literal ? len : strlen(pat),
                            PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &err, &at, NULL);
    free(pat);
    if (!out->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return fsdp_err(FSDP_ERR_FORMAT, "%s: %s: the pattern does not compile: %s", tok->path,
                        field, (const char *)msg);
    }
    pcre2_pattern_info(out->re, PCRE2_INFO_MINLENGTH, &minlen);
    if (minlen == 0) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: %s: a pattern that can match the empty "
                        "string is not supported", tok->path, field);
    }
    /* the interpreter serves where JIT cannot */
    pcre2_jit_compile(out->re, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
    out->md = pcre2_match_data_create_from_pattern(out->re, NULL);
    if (!out->md) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: regex match data", tok->path);
    }
    return 0;
}

void tk_regex_free(struct tk_regex *r)
{
    pcre2_match_data_free(r->md);
    pcre2_code_free(r->re);
    r->md = NULL;
    r->re = NULL;
}

/* Charges steps to the text's bound, or refuses the text. */
static int tk_re_charge(struct fsdp_tokenizer *tok, uint64_t steps)
{
    if (steps > tok->re_budget - tok->re_used) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: the pre-tokenizer regex needs more than "
                        "%llu matching steps for a text of %llu bytes (the limit: %u per byte "
                        "+ %llu): a pattern that looks far ahead or backtracks", tok->path,
                        (unsigned long long)tok->re_budget, (unsigned long long)tok->re_len,
                        TK_RE_WORK_PER_BYTE, (unsigned long long)TK_RE_WORK_MIN);
    }
    tok->re_used += steps;
    return 0;
}

/*
 * The next match of r in s[0, n) from off: 1 and [*ms, *me), 0 none. The
 * matcher sees s up to a window's end, a character boundary: a hard partial
 * match (it reached that end) or its step limit doubles the window and the
 * limit and tries again, no match moves the window on. A match that never
 * reached the window's end is the match on the whole text. The first
 * window of each search costs at most its small limit; the doubled ones,
 * what a look far ahead or backtracking needs, are charged (tk_re_charge).
 */
static int tk_match(struct fsdp_tokenizer *tok, const struct tk_regex *r, const char *s,
                    size_t n, size_t off, size_t *ms, size_t *me)
{
    size_t w = TK_RE_WINDOW;
    int rc;
    for (;;) {
        size_t end = n - off > w ? off + w : n;
        while (end < n && ((unsigned char)s[end] & 0xc0) == 0x80) {
            end--;
        }
        uint64_t steps = TK_RE_STEPS_PER_BYTE * w;
        if (w > TK_RE_WINDOW) {
            FSDP_CHECK(tk_re_charge(tok, steps));
        }
        pcre2_set_match_limit(tok->mctx, steps < UINT32_MAX ? (uint32_t)steps : UINT32_MAX);
        rc = pcre2_match(r->re, (PCRE2_SPTR)s, end, off,
                         PCRE2_NO_UTF_CHECK | (end < n ? PCRE2_PARTIAL_HARD : 0), r->md,
                         tok->mctx);
        if (rc == PCRE2_ERROR_PARTIAL || rc == PCRE2_ERROR_MATCHLIMIT) {
            w = w <= SIZE_MAX / 2 ? 2 * w : w;
        } else if (rc == PCRE2_ERROR_NOMATCH && end < n) {
            off = end; /* no match starts before the window's end */
        } else {
            break;
        }
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
        return 0;
    }
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        return fsdp_err(FSDP_ERR_INVALID, "%s: pre-tokenizer regex failed on a piece of %zu "
                        "bytes: %s", tok->path, n, (const char *)msg);
    }
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->md);
    if (ov[1] < ov[0]) { /* \K in a lookahead */
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: a pre-tokenizer match ends before it "
                        "starts (\\K)", tok->path);
    }
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* The offset after the character at s[i]. */
static size_t tk_next_char(const char *s, size_t n, size_t i)
{
    i++;
    while (i < n && ((unsigned char)s[i] & 0xc0) == 0x80) {
        i++;
    }
    return i;
}

// ----------------------------------------------------------------------------
// Output and scratch

static int tk_flush(struct fsdp_tokenizer *tok)
{
    int rc = 0;
    if (tok->out_n) {
        rc = tok->sink(tok->out, tok->out_n, tok->sink_arg);
        tok->out_n = 0;
    }
    return rc < 0 ? rc : 0;
}

static int tk_emit(struct fsdp_tokenizer *tok, const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        tok->out[tok->out_n++] = ids[i];
        if (tok->out_n == tok->out_cap) {
            FSDP_CHECK(tk_flush(tok));
        }
    }
    return 0;
}

/* Room for n elements of size sz in *p (capacity *cap). */
static int tk_reserve(void **p, size_t *cap, size_t n, size_t sz)
{
    if (n <= *cap) {
        return 0;
    }
    size_t c = *cap ? *cap : 256;
    while (c < n) {
        c *= 2;
    }
    void *q = c <= SIZE_MAX / sz ? realloc(*p, c * sz) : NULL;
    if (!q) {
        return fsdp_err(FSDP_ERR_NOMEM, "tokenizer scratch of %zu bytes", n * sz);
    }
    *p = q;
    *cap = c;
    return 0;
}

void tk_encoder_free(struct fsdp_tokenizer *tok)
{
    free(tok->cache.slot);
    free(tok->cache.keys);
    free(tok->cache.ids);
    free(tok->sym);
    free(tok->heap);
    free(tok->pre);
    free(tok->buf);
    free(tok->out);
    memset(&tok->cache, 0, sizeof(tok->cache));
    tok->sym = NULL;
    tok->heap = NULL;
    tok->pre = tok->buf = NULL;
    tok->out = NULL;
    tok->sym_cap = tok->heap_cap = tok->pre_cap = tok->buf_cap = tok->out_cap = 0;
}

// ----------------------------------------------------------------------------
// Word cache

static void tk_cache_clear(struct tk_cache *c)
{
    memset(c->slot, 0, c->cap * sizeof(*c->slot));
    c->n = c->keys_len = c->ids_len = 0;
}

static struct tk_cache_ent *tk_cache_find(struct tk_cache *c, const char *p, size_t n,
                                          uint64_t h)
{
    for (size_t i = h & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
        struct tk_cache_ent *e = &c->slot[i];
        if (e->key_len == 0 ||
            (e->hash == h && e->key_len == n && memcmp(c->keys + e->key_off, p, n) == 0)) {
            return e;
        }
    }
}

static int tk_cache_init(struct tk_cache *c)
{
    c->cap = TK_CACHE_SLOTS;
    c->slot = calloc(c->cap, sizeof(*c->slot));
    c->keys = malloc(TK_CACHE_KEYS);
    c->ids = malloc(TK_CACHE_IDS * sizeof(uint32_t));
    if (!c->slot || !c->keys || !c->ids) {
        return fsdp_err(FSDP_ERR_NOMEM, "tokenizer word cache");
    }
    return 0;
}

static void tk_cache_put(struct tk_cache *c, const char *p, size_t n, uint64_t h,
                         const uint32_t *ids, size_t k)
{
    if (4 * (c->n + 1) > 3 * c->cap || c->keys_len + n > TK_CACHE_KEYS ||
        c->ids_len + k > TK_CACHE_IDS) {
        tk_cache_clear(c);
    }
    struct tk_cache_ent *e = tk_cache_find(c, p, n, h);
    memcpy(c->keys + c->keys_len, p, n);
    memcpy(c->ids + c->ids_len, ids, k * sizeof(uint32_t));
    *e = (struct tk_cache_ent){h, (uint32_t)c->keys_len, (uint32_t)n, (uint32_t)c->ids_len,
                               (uint32_t)k};
    c->keys_len += n;
    c->ids_len += k;
    c->n++;
}

// ----------------------------------------------------------------------------
// BPE

static void tk_heap_push(struct tk_merge *h, size_t *n, struct tk_merge m)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (h[up].rank < m.rank || (h[up].rank == m.rank && h[up].pos <= m.pos)) {
            break;
        }
        h[i] = h[up];
        i = up;
    }
    h[i] = m;
}

static struct tk_merge tk_heap_pop(struct tk_merge *h, size_t *n)
{
    struct tk_merge top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const struct tk_merge *b = &last;
        for (size_t c = l; c <= l + 1 && c < *n; c++) {
            if (h[c].rank < b->rank || (h[c].rank == b->rank && h[c].pos < b->pos)) {
                best = c;
                b = &h[c];
            }
        }
        if (best == i) {
            break;
        }
        h[i] = h[best];
        i = best;
    }
    if (*n) {
        h[i] = last;
    }
    return top;
}

/* Pushes the merge of the pair at pos (symbol pos and its next), if any. */
static void tk_push_pair(const struct fsdp_tokenizer *tok, struct tk_merge *h, size_t *n,
                         uint32_t pos)
{
    const struct tk_sym *s = tok->sym;
    const struct tk_pairent *e = tk_pair_get(&tok->merges, s[pos].id, s[s[pos].next].id);
    if (e) {
        tk_heap_push(h, n, (struct tk_merge){e->rank1 - 1, pos, e->id});
    }
}

/* The word's symbols merged; leaves the ids at tok->sym[..].id along the
 * list from 0 and returns how many. */
static int tk_merge_word(struct fsdp_tokenizer *tok, const unsigned char *p, size_t n,
                         size_t *count)
{
    if (n >= INT32_MAX / 4) { /* symbols link with int32 */
        return fsdp_err(FSDP_ERR_INVALID, "a pre-tokenized piece of %zu bytes is too long to "
                        "merge (at most %d)", n, INT32_MAX / 4 - 1);
    }
    FSDP_CHECK(tk_reserve((void **)&tok->sym, &tok->sym_cap, n, sizeof(struct tk_sym)));
    FSDP_CHECK(tk_reserve((void **)&tok->heap, &tok->heap_cap, 3 * n, sizeof(struct tk_merge)));
    struct tk_sym *s = tok->sym;
    struct tk_merge *h = tok->heap;
    size_t hn = 0, left = n;
    for (size_t i = 0; i < n; i++) {
        s[i] = (struct tk_sym){tok->byte_id[p[i]], (int32_t)i - 1,
                               i + 1 < n ? (int32_t)i + 1 : -1, 1};
    }
    for (size_t i = 0; i + 1 < n; i++) {
        tk_push_pair(tok, h, &hn, (uint32_t)i);
    }
    while (hn) {
        struct tk_merge m = tk_heap_pop(h, &hn);
        struct tk_sym *a = &s[m.pos];
        if (a->len == 0 || a->next < 0) {
            continue;
        }
        struct tk_sym *b = &s[a->next];
        /* an entry whose pair has changed since it was pushed is stale */
        const struct tk_pairent *e = tk_pair_get(&tok->merges, a->id, b->id);
        if (!e || e->id != m.id) {
            continue;
        }
        a->id = m.id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (a->next >= 0) {
            s[a->next].prev = (int32_t)m.pos;
        }
        left--;
        if (a->prev >= 0) {
            tk_push_pair(tok, h, &hn, (uint32_t)a->prev);
        }
        if (a->next >= 0) {
            tk_push_pair(tok, h, &hn, m.pos);
        }
    }
    *count = left;
    return 0;
}

/* One piece (raw bytes) to ids. */
static int tk_bpe(struct fsdp_tokenizer *tok, const char *p, size_t n)
{
    if (tok->ignore_merges) { /* a piece the vocabulary holds whole is one token */
        uint32_t id;
        FSDP_CHECK(tk_reserve((void **)&tok->buf, &tok->buf_cap, 2 * n, 1));
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            k += tk_utf8_put(tk_byte_char((unsigned char)p[i]), tok->buf + k);
        }
        if (tk_strmap_get(&tok->vocab, tok->buf, k, &id)) {
            return tk_emit(tok, &id, 1);
        }
    }
    uint64_t hash = 0;
    struct tk_cache *c = &tok->cache;
    if (n <= TK_CACHE_KEY_MAX) {
        hash = tk_hash(p, n);
        const struct tk_cache_ent *e = tk_cache_find(c, p, n, hash);
        if (e->key_len) {
            return tk_emit(tok, c->ids + e->ids_off, e->n_ids);
        }
    }
    size_t k = 0;
    FSDP_CHECK(tk_merge_word(tok, (const unsigned char *)p, n, &k));
    /* the ids, in order, packed into the heap's room (no longer needed) */
    uint32_t *ids = (uint32_t *)tok->heap;
    size_t j = 0;
    for (int32_t i = 0; i >= 0; i = tok->sym[i].next) {
        ids[j++] = tok->sym[i].id;
    }
    if (n <= TK_CACHE_KEY_MAX) {
        tk_cache_put(c, p, n, hash, ids, k);
    }
    return tk_emit(tok, ids, k);
}

// ----------------------------------------------------------------------------
// Pre-tokenizer

/* ByteLevel: the prefix space, then its regex's pieces (or the whole). */
static int tk_bytelevel(struct fsdp_tokenizer *tok, const char *s, size_t n)
{
    if (tok->prefix_space && s[0] != ' ') {
        FSDP_CHECK(tk_reserve((void **)&tok->pre, &tok->pre_cap, n + 1, 1));
        tok->pre[0] = ' ';
        memcpy(tok->pre + 1, s, n);
        s = tok->pre;
        n++;
    }
    if (!tok->bl.re) {
        return tk_bpe(tok, s, n);
    }
    size_t prev = 0, off = 0, ms, me;
    int m;
    while (off < n && (m = tk_match(tok, &tok->bl, s, n, off, &ms, &me)) != 0) {
        FSDP_CHECK(m);
        if (me == ms) {
            off = tk_next_char(s, n, ms);
            continue;
        }
        if (ms > prev) {
            FSDP_CHECK(tk_bpe(tok, s + prev, ms - prev));
        }
        FSDP_CHECK(tk_bpe(tok, s + ms, me - ms));
        prev = off = me;
    }
    return prev < n ? tk_bpe(tok, s + prev, n - prev) : 0;
}

/* Split stage `stage` (Isolated: matches and the text between them are
 * pieces), then the next; ByteLevel after the last. */
static int tk_pretok(struct fsdp_tokenizer *tok, size_t stage, const char *s, size_t n)
{
    if (n == 0) {
        return 0;
    }
    if (stage == tok->n_splits) {
        return tk_bytelevel(tok, s, n);
    }
    const struct tk_regex *r = &tok->splits[stage];
    size_t prev = 0, off = 0, ms, me;
    int m;
    while (off < n && (m = tk_match(tok, r, s, n, off, &ms, &me)) != 0) {
        FSDP_CHECK(m);
        if (me == ms) {
            off = tk_next_char(s, n, ms);
            continue;
        }
        FSDP_CHECK(tk_pretok(tok, stage + 1, s + prev, ms - prev));
        FSDP_CHECK(tk_pretok(tok, stage + 1, s + ms, me - ms));
        prev = off = me;
    }
    return tk_pretok(tok, stage + 1, s + prev, n - prev);
}

// ----------------------------------------------------------------------------
// Added tokens

/* Cuts set's tokens out of s[0, n) and hands what lies between them on:
 * to the second set (pass 0) or to the pre-tokenizer (pass 1). */
static int tk_added_pass(struct fsdp_tokenizer *tok, int pass, const char *s, size_t n)
{
    const struct tk_addset *set = pass == 0 ? &tok->set_raw : &tok->set_norm;
    size_t start = 0;
    if (set->n > 0) {
        for (size_t pos = 0; pos < n;) {
            unsigned b = (unsigned char)s[pos];
            const struct tk_added *hit = NULL;
            for (uint32_t j = set->from[b]; j < set->from[b + 1] && !hit; j++) {
                uint32_t i;
                if (set->lens[j] <= n - pos &&
                    tk_strmap_get(&set->by_content, s + pos, set->lens[j], &i)) {
                    hit = &tok->added[i];
                }
            }
            if (!hit) {
                pos++;
                continue;
            }
            if (pos > start) {
                FSDP_CHECK(pass == 0 ? tk_added_pass(tok, 1, s + start, pos - start)
                                     : tk_pretok(tok, 0, s + start, pos - start));
            }
            FSDP_CHECK(tk_emit(tok, &hit->id, 1));
            pos += hit->len;
            start = pos;
        }
    }
    if (start == n) {
        return 0;
    }
    return pass == 0 ? tk_added_pass(tok, 1, s + start, n - start)
                     : tk_pretok(tok, 0, s + start, n - start);
}

// ----------------------------------------------------------------------------
// Encode

/* The offset of the first byte that is not UTF-8, or n. */
static size_t tk_utf8_check(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, k;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ull) == 0) {
                i += 8;
                continue;
            }
        }
        if (s[i] < 0x80) {
            i++;
        } else if (tk_utf8_seq(s + i, n - i, &k) > 0) {
            i += k;
        } else {
            return i;
        }
    }
    return n;
}

size_t fsdp_utf8_prefix(const char *text, size_t n, int *bad)
{
    size_t i = tk_utf8_check(text, n), k;
    *bad = 0;
    if (i < n) { /* invalid, or a sequence the buffer's end cuts short */
        *bad = tk_utf8_seq((const unsigned char *)text + i, n - i, &k) == 0;
    }
    return i;
}

size_t fsdp_tokenizer_cut(const struct fsdp_tokenizer *tok, const char *text, size_t len)
{
    if (tok->prefix_space || tok->no_cut) {
        return 0; /* every piece would get its own prefix space; an unknown pattern */
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        if (memchr(tok->added[i].content, '\n', tok->added[i].len)) {
            return 0;
        }
    }
    /* q with text[q - 2] a visible ASCII character, text[q - 1] '\n' and text[q]
     * a letter or digit: the newline is a whitespace run of its own, one
     * piece in either pattern whether the text goes on after it or ends
     * there (GPT-2's \s+(?!\S) looks ahead), and no piece starts before it
     * and goes past it */
    for (size_t q = len; q-- > 2;) {
        unsigned char c = (unsigned char)text[q], b = (unsigned char)text[q - 2];
        if (text[q - 1] == '\n' && b > 0x20 && b < 0x7f &&
            ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) {
            return q;
        }
    }
    return 0;
}

int fsdp_tokenizer_encode_to(struct fsdp_tokenizer *tok, const char *text, size_t len,
                             fsdp_tokenizer_sink sink, void *arg)
{
    size_t bad = tk_utf8_check(text, len);
    if (bad < len) {
        return fsdp_err(FSDP_ERR_INVALID, "not valid UTF-8 at byte %zu (0x%02x)", bad,
                        (unsigned char)text[bad]);
    }
    if (!tok->cache.slot) {
        FSDP_CHECK(tk_cache_init(&tok->cache));
    }
    FSDP_CHECK(tk_reserve((void **)&tok->out, &tok->out_cap, TK_OUT_BATCH, sizeof(uint32_t)));
    tok->out_cap = TK_OUT_BATCH;
    tok->out_n = 0;
    tok->sink = sink;
    tok->sink_arg = arg;
    tok->re_len = len;
    tok->re_used = 0;
    tok->re_budget = (uint64_t)TK_RE_WORK_PER_BYTE * len + TK_RE_WORK_MIN;
    int rc = tk_added_pass(tok, 0, text, len);
    if (rc == 0) {
        rc = tk_flush(tok);
    }
    tok->out_n = 0;
    return rc;
}

struct tk_vec {
    uint32_t *v;
    size_t n, cap;
};

static int tk_vec_sink(const uint32_t *ids, size_t n, void *arg)
{
    struct tk_vec *vec = arg;
    FSDP_CHECK(tk_reserve((void **)&vec->v, &vec->cap, vec->n + n, sizeof(uint32_t)));
    memcpy(vec->v + vec->n, ids, n * sizeof(uint32_t));
    vec->n += n;
    return 0;
}

int fsdp_tokenizer_encode(struct fsdp_tokenizer *tok, const char *text, size_t len,
                          uint32_t **ids, size_t *n)
{
    struct tk_vec vec = {NULL, 0, 0};
    int rc = fsdp_tokenizer_encode_to(tok, text, len, tk_vec_sink, &vec);
    if (rc < 0) {
        free(vec.v);
        *ids = NULL;
        *n = 0;
        return rc;
    }
    *ids = vec.v;
    *n = vec.n;
    return 0;
}
