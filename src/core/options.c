/*
 * options.c - the table-driven flag and config-file parser (see options.h).
 * Owns no state: everything lives in the caller's struct fsdp_optset.
 */
#include "config.h"
#include "core/options.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OPT_LINE_MAX 4096

/* Spellings of an on/off value, "off" first so that the index is the value
 * (a FLAG's odd index is on). */
#define OPT_FLAG_WORDS "off|on|0|1|false|true|no|yes"
#define OPT_BOOL_WORDS "off|on"

// ----------------------------------------------------------------------------
// lookup and "did you mean"

long fsdp_opt_find(const struct fsdp_optset *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++) {
        if (strcmp(s->opts[i].name, name) == 0) {
            return (long)i;
        }
    }
    return -1;
}

/* Edit distance with adjacent transpositions counted as one edit ("pt" is
 * one from "tp"), capped: names are short. */
static size_t opt_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t d[3][64]; /* rows i-2, i-1, i, cycled */
    if (la >= 63 || lb >= 63) {
        return 64;
    }
    for (size_t j = 0; j <= lb; j++) {
        d[0][j] = j;
    }
    for (size_t i = 1; i <= la; i++) {
        size_t *cur = d[i % 3], *prev = d[(i + 2) % 3], *prev2 = d[(i + 1) % 3];
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t best = prev[j - 1] + (a[i - 1] != b[j - 1]);
            best = prev[j] + 1 < best ? prev[j] + 1 : best;
            best = cur[j - 1] + 1 < best ? cur[j - 1] + 1 : best;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                prev2[j - 2] + 1 < best) {
                best = prev2[j - 2] + 1;
            }
            cur[j] = best;
        }
    }
    return d[la % 3][lb];
}

const char *fsdp_opt_nearest(const char *word, const char *const *names, size_t n, size_t max)
{
    const char *best = NULL;
    size_t best_d = max + 1;
    for (size_t i = 0; i < n; i++) {
        size_t d = opt_distance(word, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best;
}

/* The one visible option that name abbreviates ("temp" for "temperature"),
 * or NULL when none or several do or name is shorter than min. */
static const char *opt_prefix_of(const struct fsdp_optset *s, const char *name, size_t min)
{
    const char *found = NULL;
    size_t n = strlen(name);
    for (size_t i = 0; n >= min && i < s->n; i++) {
        if (!(s->opts[i].flags & FSDP_OPT_HIDDEN) && strncmp(s->opts[i].name, name, n) == 0) {
            if (found) {
                return NULL;
            }
            found = s->opts[i].name;
        }
    }
    return found;
}

static const char *opt_closest(const struct fsdp_optset *s, const char *name)
{
    const char *best = opt_prefix_of(s, name, 3);
    size_t best_d = 4; /* further than 3 edits is no hint */
    if (best) {
        return best;
    }
    for (size_t i = 0; i < s->n; i++) {
        if (s->opts[i].flags & FSDP_OPT_HIDDEN) {
            continue;
        }
        size_t d = opt_distance(name, s->opts[i].name);
        if (d < best_d) {
            best_d = d;
            best = s->opts[i].name;
        }
    }
    return best;
}

// ----------------------------------------------------------------------------
// values

/* Finds value in "a|b|c"; index or -1. */
static int opt_choice_index(const char *choices, const char *value)
{
    size_t vl = strlen(value);
    int idx = 0;
    for (const char *p = choices; *p; idx++) {
        size_t n = strcspn(p, "|");
        if (n == vl && strncmp(p, value, n) == 0) {
            return idx;
        }
        p += n;
        if (*p == '|') {
            p++;
        }
    }
    return -1;
}

static void opt_choice_name(const char *choices, int index, char *buf, size_t len)
{
    const char *p = choices;
    for (int i = 0; i < index && *p; i++) {
        p += strcspn(p, "|");
        if (*p == '|') {
            p++;
        }
    }
    snprintf(buf, len, "%.*s", (int)strcspn(p, "|"), p);
}

/* The value a key given without one takes, or NULL when it needs one. */
static const char *opt_implied(const struct fsdp_opt *o)
{
    if (!(o->flags & FSDP_OPT_OPTIONAL_VALUE) || o->type == FSDP_OPT_CHOICE ||
        o->type == FSDP_OPT_FLAG || o->type == FSDP_OPT_BOOL) {
        return NULL;
    }
    return o->choices;
}

/* An unknown key: the closest known one as a hint, else where to look. */
static int opt_unknown(const struct fsdp_optset *s, const char *key, int flag, const char *where)
{
    const char *hint = opt_closest(s, key);
    if (flag && hint) {
        return fsdp_err(FSDP_ERR_INVALID, "unknown option --%s (did you mean --%s?)", key, hint);
    }
    if (flag) {
        return fsdp_err(FSDP_ERR_INVALID, "unknown option --%s (see %s --help)", key, s->prog);
    }
    if (hint) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: unknown key '%s' (did you mean '%s'?)", where, key,
                        hint);
    }
    return fsdp_err(FSDP_ERR_INVALID, "%s: unknown key '%s' (see %s --help)", where, key, s->prog);
}

/* Whether v lies in o's range, open ends included. */
static int opt_in_range(const struct fsdp_opt *o, double v)
{
    if ((o->flags & FSDP_OPT_MIN_OPEN) ? !(v > o->min) : !(v >= o->min)) {
        return 0;
    }
    return (o->flags & FSDP_OPT_MAX_OPEN) ? v < o->max : v <= o->max;
}

/* "is out of range [1, 16]" or "(0, 1)" as the ends are. */
static int opt_out_of_range(const struct fsdp_opt *o, const char *desc)
{
    return fsdp_err(FSDP_ERR_INVALID, "%s is out of range %c%.15g, %.15g%c", desc,
                    (o->flags & FSDP_OPT_MIN_OPEN) ? '(' : '[', o->min, o->max,
                    (o->flags & FSDP_OPT_MAX_OPEN) ? ')' : ']');
}

static int opt_set_number(const struct fsdp_opt *o, char *field, const char *value,
                          const char *desc)
{
    if (o->type == FSDP_OPT_INT) {
        long long v;
        if (fsdp_parse_long(value, &v) < 0) {
            fsdp_err_clear();
            return fsdp_err(FSDP_ERR_INVALID, "%s is not an integer", desc);
        }
        if (!opt_in_range(o, (double)v)) {
            return opt_out_of_range(o, desc);
        }
        long lv = (long)v;
        memcpy(field, &lv, sizeof(lv));
        return 0;
    }
    if (o->type == FSDP_OPT_SIZE) {
        size_t v;
        if (fsdp_parse_size(value, &v) < 0) {
            fsdp_err_clear();
            return fsdp_err(FSDP_ERR_INVALID, "%s is not a byte count such as 4, 64K, 256M", desc);
        }
        if (!opt_in_range(o, (double)v)) {
            return opt_out_of_range(o, desc);
        }
        memcpy(field, &v, sizeof(v));
        return 0;
    }
    double v;
    if (fsdp_parse_double(value, &v) < 0 || !isfinite(v)) {
        fsdp_err_clear();
        return fsdp_err(FSDP_ERR_INVALID, "%s is not a finite number", desc);
    }
    if (!opt_in_range(o, v)) {
        return opt_out_of_range(o, desc);
    }
    memcpy(field, &v, sizeof(v));
    return 0;
}

/* FLAG, BOOL, CHOICE and DTYPE: a word out of a list. */
static int opt_set_word(const struct fsdp_opt *o, char *field, const char *value, const char *desc)
{
    int c;
    switch (o->type) {
    case FSDP_OPT_FLAG:
        if ((c = opt_choice_index(OPT_FLAG_WORDS, value)) < 0) {
            return fsdp_err(FSDP_ERR_INVALID, "%s is not on or off", desc);
        }
        c &= 1;
        break;
    case FSDP_OPT_BOOL:
        if ((c = opt_choice_index(OPT_BOOL_WORDS, value)) < 0) {
            return fsdp_err(FSDP_ERR_INVALID, "%s is not one of on|off", desc);
        }
        break;
    case FSDP_OPT_DTYPE: {
        enum fsdp_dtype t;
        if (fsdp_dtype_parse(value, &t) < 0 ||
            opt_choice_index(o->choices, fsdp_dtype_name(t)) < 0) {
            fsdp_err_clear();
            return fsdp_err(FSDP_ERR_INVALID, "%s is not one of %s", desc, o->choices);
        }
        memcpy(field, &t, sizeof(t));
        return 0;
    }
    default:
        if ((c = opt_choice_index(o->choices, value)) < 0) {
            return fsdp_err(FSDP_ERR_INVALID, "%s is not one of %s", desc, o->choices);
        }
        break;
    }
    memcpy(field, &c, sizeof(c));
    return 0;
}

int fsdp_opt_set(struct fsdp_optset *s, const char *key, const char *value,
                 enum fsdp_opt_source src, const char *where)
{
    const int flag = src == FSDP_SRC_FLAG;
    long idx = fsdp_opt_find(s, key);
    if (idx < 0) {
        return opt_unknown(s, key, flag, where);
    }
    const struct fsdp_opt *o = &s->opts[idx];
    /* what the messages quote: "--lr 'fast'" or "run.cfg:3: lr = 'fast'" */
    char desc[OPT_LINE_MAX + 64];
    if (flag) {
        snprintf(desc, sizeof(desc), "--%s '%.1000s'", key, value);
    } else {
        snprintf(desc, sizeof(desc), "%s: %s = '%.1000s'", where, key, value);
    }
    if (src == FSDP_SRC_FILE && (o->flags & FSDP_OPT_ARGV_ONLY)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: '%s' is allowed on the command line only", where,
                        key);
    }
    char *field = (char *)s->base + o->offset;
    if (o->type == FSDP_OPT_STR) {
        size_t n = strlen(value);
        if (n >= o->size) {
            return fsdp_err(FSDP_ERR_INVALID, "%s%s%s: value is longer than %zu characters",
                            flag ? "--" : where, flag ? "" : ": ", key, o->size - 1);
        }
        memcpy(field, value, n + 1);
    } else if (o->type == FSDP_OPT_INT || o->type == FSDP_OPT_FLOAT || o->type == FSDP_OPT_SIZE) {
        FSDP_CHECK(opt_set_number(o, field, value, desc));
    } else {
        FSDP_CHECK(opt_set_word(o, field, value, desc));
    }
    s->source[idx] = (unsigned char)src;
    return 0;
}

// ----------------------------------------------------------------------------
// config file

static char *opt_trim(char *p)
{
    while (isspace((unsigned char)*p)) {
        p++;
    }
    size_t n = strlen(p);
    while (n > 0 && isspace((unsigned char)p[n - 1])) {
        p[--n] = '\0';
    }
    return p;
}

/* Cuts a comment: '#' at the start or after whitespace, outside quotes. */
static void opt_cut_comment(char *line)
{
    int quoted = 0;
    for (char *p = line; *p; p++) {
        if (*p == '"') {
            quoted = !quoted;
        } else if (*p == '#' && !quoted && (p == line || isspace((unsigned char)p[-1]))) {
            *p = '\0';
            return;
        }
    }
}

int fsdp_opt_load_file(struct fsdp_optset *s, const char *path)
{
    FILE *fp = fopen(path, "r");
    char line[OPT_LINE_MAX];
    char where[OPT_LINE_MAX + 32];
    int lineno = 0, rc = 0;
    if (!fp) {
        return fsdp_err(FSDP_ERR_IO, "config file %s: %s", path, strerror(errno));
    }
    while (fgets(line, sizeof(line), fp)) {
        lineno++;
        snprintf(where, sizeof(where), "%s:%d", path, lineno);
        if (!strchr(line, '\n') && !feof(fp)) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: line longer than %d characters", where,
                          OPT_LINE_MAX - 2);
            break;
        }
        opt_cut_comment(line);
        char *p = opt_trim(line);
        if (*p == '\0') {
            continue;
        }
        char *eq = strchr(p, '=');
        if (!eq) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: expected 'key = value', got '%s'", where, p);
            break;
        }
        *eq = '\0';
        char *key = opt_trim(p);
        char *value = opt_trim(eq + 1);
        size_t vl = strlen(value);
        const int bare = vl == 0; /* "key =": an implied value applies; 'key = ""' is empty */
        if (vl >= 2 && value[0] == '"' && value[vl - 1] == '"') {
            value[vl - 1] = '\0';
            value++;
        }
        if (*key == '\0') {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: missing key before '='", where);
            break;
        }
        long idx = fsdp_opt_find(s, key);
        const char *implied = idx >= 0 ? opt_implied(&s->opts[idx]) : NULL;
        if (idx >= 0 && s->source[idx] == FSDP_SRC_FILE) {
            rc = fsdp_err(FSDP_ERR_INVALID, "%s: '%s' is set twice in the file", where, key);
            break;
        }
        if ((rc = fsdp_opt_set(s, key, bare && implied ? implied : value, FSDP_SRC_FILE, where)) <
            0) {
            break;
        }
    }
    if (rc == 0 && ferror(fp)) {
        rc = fsdp_err(FSDP_ERR_IO, "config file %s: read error", path);
    }
    fclose(fp);
    return rc;
}

// ----------------------------------------------------------------------------
// command line

static int opt_is_help(const char *a)
{
    return strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0;
}

/* One word of argv, or two ("--key value"), as the parser reads them. */
struct opt_word {
    char key[128];     /* the option's name; "" for an operand */
    const char *value; /* the value; NULL for an unknown key (reported by the caller) */
};

/*
 * The value of option idx, written as shown ("--output" or "-o"), whose word
 * held none: a flag takes no separate value; an option with an implied value
 * takes one only when the next word does not start with '-' (that word is
 * another option), else the implied value; any other takes the next word.
 */
static int opt_take_value(const struct fsdp_optset *s, long idx, int argc, char **argv, int *i,
                          const char *shown, const char **value)
{
    if (s->opts[idx].type == FSDP_OPT_FLAG) {
        *value = "on";
        return 0;
    }
    const char *implied = opt_implied(&s->opts[idx]);
    if (implied && (*i + 1 >= argc || argv[*i + 1][0] == '-')) {
        *value = implied; /* "--resume" at the end or before "--steps 10" */
        return 0;
    }
    if (*i + 1 >= argc) {
        return fsdp_err(FSDP_ERR_INVALID, "%s needs a value", shown);
    }
    *value = argv[++*i];
    return 0;
}

/* "-o FILE", "-oFILE" or "-q": an option by its letter. */
static int opt_short(const struct fsdp_optset *s, int argc, char **argv, int *i, struct opt_word *w)
{
    const char *a = argv[*i];
    long idx = -1;
    for (size_t k = 0; k < s->n && idx < 0; k++) {
        idx = s->opts[k].letter == a[1] ? (long)k : -1;
    }
    if (idx < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "unknown option -%c (see %s --help)", a[1], s->prog);
    }
    snprintf(w->key, sizeof(w->key), "%s", s->opts[idx].name);
    if (a[2] && s->opts[idx].type == FSDP_OPT_FLAG) {
        return fsdp_err(FSDP_ERR_INVALID, "-%c takes no value: '%.40s' (see %s --help)", a[1], a,
                        s->prog);
    }
    if (a[2]) {
        w->value = a + 2;
        return 0;
    }
    char shown[3] = {'-', a[1], '\0'};
    return opt_take_value(s, idx, argc, argv, i, shown, &w->value);
}

/*
 * Reads argv[*i] (and its value, advancing *i past a separate one) into w:
 * "--k=v", "--k v", "--flag", "-o v", or an operand where the set takes them
 * (every word after "--", which itself makes w->key and w->value NULL).
 */
static int opt_next(const struct fsdp_optset *s, int argc, char **argv, int *i, int *dashdash,
                    struct opt_word *w)
{
    const char *a = argv[*i];
    w->key[0] = '\0';
    w->value = NULL;
    if (s->operands && !*dashdash && strcmp(a, "--") == 0) {
        *dashdash = 1;
        return 0;
    }
    if (s->operands && (*dashdash || a[0] != '-' || a[1] == '\0')) {
        w->value = a;
        return 0;
    }
    if (a[0] == '-' && a[1] != '-' && a[1] != '\0') {
        return opt_short(s, argc, argv, i, w);
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
        return fsdp_err(FSDP_ERR_INVALID,
                        "unexpected argument '%s' (options are --key value; see %s --help)", a,
                        s->prog);
    }
    const char *eq = strchr(a + 2, '=');
    size_t kn = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
    if (kn >= sizeof(w->key)) {
        return fsdp_err(FSDP_ERR_INVALID, "unknown option %.40s... (see %s --help)", a, s->prog);
    }
    memcpy(w->key, a + 2, kn);
    w->key[kn] = '\0';
    const char *full =
        s->abbreviations && fsdp_opt_find(s, w->key) < 0 ? opt_prefix_of(s, w->key, 1) : NULL;
    if (full) { /* as getopt_long: "--out" for "--output" */
        snprintf(w->key, sizeof(w->key), "%s", full);
    }
    if (eq) {
        w->value = eq + 1;
        return 0;
    }
    long idx = fsdp_opt_find(s, w->key);
    if (idx < 0) {
        return 0; /* reported as unknown by the caller, value or not */
    }
    char shown[sizeof(w->key) + 2];
    snprintf(shown, sizeof(shown), "--%s", w->key);
    return opt_take_value(s, idx, argc, argv, i, shown, &w->value);
}

/* Pass 1: the config file config_key names on the command line, or NULL. */
static int opt_find_config(struct fsdp_optset *s, int argc, char **argv, const char *config_key,
                           struct opt_word *w, const char **path)
{
    int dashdash = 0;
    *path = NULL;
    for (int i = 1; config_key && i < argc; i++) {
        if (opt_next(s, argc, argv, &i, &dashdash, w) < 0) {
            fsdp_err_clear(); /* pass 2 reports it, in command-line order */
            break;
        }
        if (strcmp(w->key, config_key) == 0 && w->value) {
            if (*path) {
                return fsdp_err(FSDP_ERR_INVALID, "--%s is given twice", config_key);
            }
            *path = w->value;
        }
    }
    return 0;
}

int fsdp_opt_parse(struct fsdp_optset *s, int argc, char **argv, const char *config_key)
{
    struct opt_word w;
    char where[160];
    const char *config_path;
    int dashdash = 0;
    for (int i = 1; i < argc; i++) {
        if (opt_is_help(argv[i])) {
            return 1;
        }
    }
    /* pass 1: the config file, so that flags given in any order override it */
    FSDP_CHECK(opt_find_config(s, argc, argv, config_key, &w, &config_path));
    if (config_path) {
        FSDP_CHECK(fsdp_opt_load_file(s, config_path));
    }
    /* pass 2: flags and operands */
    s->n_operands = 0;
    for (int i = 1; i < argc; i++) {
        FSDP_CHECK(opt_next(s, argc, argv, &i, &dashdash, &w));
        if (w.key[0] == '\0') {
            if (w.value && s->n_operands < FSDP_OPT_MAX_OPERANDS) {
                s->operand[s->n_operands] = w.value;
            }
            s->n_operands += w.value != NULL;
            continue;
        }
        snprintf(where, sizeof(where), "--%s", w.key);
        FSDP_CHECK(fsdp_opt_set(s, w.key, w.value ? w.value : "", FSDP_SRC_FLAG, where));
    }
    return 0;
}

int fsdp_opt_check_required(const struct fsdp_optset *s)
{
    for (size_t i = 0; i < s->n; i++) {
        if ((s->opts[i].flags & FSDP_OPT_REQUIRED) && s->source[i] == FSDP_SRC_DEFAULT) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "missing required option '%s' (--%s %s, or '%s = %s' in a config file)",
                            s->opts[i].name, s->opts[i].name, s->opts[i].arg, s->opts[i].name,
                            s->opts[i].arg);
        }
    }
    return 0;
}

int fsdp_opt_given(const struct fsdp_optset *s, const char *name)
{
    long i = fsdp_opt_find(s, name);
    return i >= 0 && s->source[i] != FSDP_SRC_DEFAULT;
}

// ----------------------------------------------------------------------------
// printing

/* "256M" for 268435456: the largest binary suffix that divides it, as
 * fsdp_parse_size reads it back. */
static void opt_format_size(size_t v, char *buf, size_t len)
{
    static const char suffix[] = "KMGT";
    int u = -1;
    while (u < 3 && v >= 1024 && v % 1024 == 0) {
        v /= 1024;
        u++;
    }
    if (u < 0) {
        snprintf(buf, len, "%zu", v);
    } else {
        snprintf(buf, len, "%zu%c", v, suffix[u]);
    }
}

void fsdp_opt_format_value(const struct fsdp_optset *s, size_t i, char *buf, size_t len)
{
    const struct fsdp_opt *o = &s->opts[i];
    const char *field = (const char *)s->base + o->offset;
    switch (o->type) {
    case FSDP_OPT_STR: {
        /* an empty value of a key with an implied value: "key =" would read back as that */
        int quote = field[0] ? strpbrk(field, " \t#\"") != NULL : opt_implied(o) != NULL;
        snprintf(buf, len, quote ? "\"%s\"" : "%s", field);
        break;
    }
    case FSDP_OPT_INT: {
        long v;
        memcpy(&v, field, sizeof(v));
        snprintf(buf, len, "%ld", v);
        break;
    }
    case FSDP_OPT_FLOAT: {
        double v;
        memcpy(&v, field, sizeof(v));
        /* shortest text that reads back as the same double */
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, len, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) {
                break;
            }
        }
        break;
    }
    case FSDP_OPT_CHOICE: {
        int c;
        memcpy(&c, field, sizeof(c));
        opt_choice_name(o->choices, c, buf, len);
        break;
    }
    case FSDP_OPT_FLAG:
    case FSDP_OPT_BOOL: {
        int c;
        memcpy(&c, field, sizeof(c));
        snprintf(buf, len, "%s", c ? "on" : "off");
        break;
    }
    case FSDP_OPT_SIZE: {
        size_t v;
        memcpy(&v, field, sizeof(v));
        opt_format_size(v, buf, len);
        break;
    }
    case FSDP_OPT_DTYPE: {
        enum fsdp_dtype t;
        memcpy(&t, field, sizeof(t));
        snprintf(buf, len, "%s", fsdp_dtype_name(t));
        break;
    }
    }
}

/* The visible options (given_only: those a flag or the file set); returns
 * how many visible ones it left out. */
static size_t opt_print(const struct fsdp_optset *s, FILE *fp, const char *indent, int given_only)
{
    static const char *const src_name[] = {"default", "file", "flag"};
    size_t width = 0, left = 0;
    char value[OPT_LINE_MAX];
    for (size_t i = 0; i < s->n; i++) {
        size_t n = strlen(s->opts[i].name);
        width = n > width ? n : width;
    }
    for (size_t i = 0; i < s->n; i++) {
        if (s->opts[i].flags & FSDP_OPT_HIDDEN) {
            continue;
        }
        if (given_only && s->source[i] == FSDP_SRC_DEFAULT) {
            left++;
            continue;
        }
        fsdp_opt_format_value(s, i, value, sizeof(value));
        /* a key the file may not hold stays a comment, so the output reads back */
        int comment = (s->opts[i].flags & FSDP_OPT_ARGV_ONLY) != 0;
        fprintf(fp, "%s%s%-*s = %-12s # %s\n", indent, comment ? "# " : "", (int)width,
                s->opts[i].name, value, src_name[s->source[i]]);
    }
    return left;
}

void fsdp_opt_print(const struct fsdp_optset *s, FILE *fp, const char *indent)
{
    opt_print(s, fp, indent, 0);
}

size_t fsdp_opt_print_given(const struct fsdp_optset *s, FILE *fp, const char *indent)
{
    return opt_print(s, fp, indent, 1);
}

/* The default --help shows for option i, or "" when it has none to show:
 * required, an empty string, or a number outside its own range (a value the
 * program works out, which the help line explains). */
static void opt_usage_default(const struct fsdp_optset *s, size_t i, char *buf, size_t len)
{
    const struct fsdp_opt *o = &s->opts[i];
    const char *field = (const char *)s->base + o->offset;
    buf[0] = '\0';
    if (o->flags & FSDP_OPT_REQUIRED) {
        snprintf(buf, len, "(required)");
        return;
    }
    double v = 0.0;
    if (o->type == FSDP_OPT_INT) {
        long l;
        memcpy(&l, field, sizeof(l));
        v = (double)l;
    } else if (o->type == FSDP_OPT_SIZE) {
        size_t z;
        memcpy(&z, field, sizeof(z));
        v = (double)z;
    } else if (o->type == FSDP_OPT_FLOAT) {
        memcpy(&v, field, sizeof(v));
    }
    int number = o->type == FSDP_OPT_INT || o->type == FSDP_OPT_SIZE || o->type == FSDP_OPT_FLOAT;
    if (number && !opt_in_range(o, v)) {
        return;
    }
    char value[256];
    fsdp_opt_format_value(s, i, value, sizeof(value));
    if (value[0] && strcmp(value, "\"\"") != 0) {
        snprintf(buf, len, "[%s]", value);
    }
}

void fsdp_opt_usage(const struct fsdp_optset *s, FILE *fp, const char *synopsis)
{
    char left[96], dflt[300];
    int letters = 0; /* a set with one-letter aliases indents the options without one */
    for (size_t i = 0; i < s->n; i++) {
        letters |= s->opts[i].letter != 0;
    }
    fprintf(fp, "usage: %s %s\n", s->prog, synopsis);
    if (s->about) {
        fprintf(fp, "\n%s%s", s->about, s->about[strlen(s->about) - 1] == '\n' ? "" : "\n");
    }
    fprintf(fp, "\noptions:\n");
    for (size_t i = 0; i < s->n; i++) {
        const struct fsdp_opt *o = &s->opts[i];
        if (o->flags & FSDP_OPT_HIDDEN) {
            continue;
        }
        char lead[8] = "";
        if (letters) {
            snprintf(lead, sizeof(lead), o->letter ? "-%c, " : "    ", o->letter);
        }
        snprintf(left, sizeof(left), opt_implied(o) ? "%s--%s [%s]" : "%s--%s %s", lead, o->name,
                 o->arg);
        opt_usage_default(s, i, dflt, sizeof(dflt));
        fprintf(fp, "  %-26s %s%s%s\n", left, o->help, dflt[0] ? " " : "", dflt);
    }
    fprintf(fp, "  %-26s %s\n", "-h, --help", "this text");
}
