/*
 * options.h - the one option parser of every program: table-driven long
 * GNU-style flags ("--key value" or "--key=value", or a bare "--key" for an
 * option whose value is optional), one-letter aliases ("-o FILE", "-oFILE"),
 * operands where a program takes them (fsdpc-ckpt's PATH), a config file of
 * "key = value" lines with the same keys, range and choice checks, the
 * --help text generated from the table, and printing of the resolved set as
 * a valid config file.
 *
 * A program describes its options once, as an array of struct fsdp_opt
 * pointing into its own config struct; the parser fills that struct. Every
 * problem (unknown key, malformed or out-of-range value, missing required
 * key) is one error message that names the key and where it came from
 * ("--lr" or "run.cfg:7"). Nothing here exits: programs decide; printing is
 * only what a caller asks for (--help, the resolved set).
 */
#ifndef FSDP_CORE_OPTIONS_H
#define FSDP_CORE_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

enum fsdp_opt_type {
    FSDP_OPT_STR = 0, /* char[size]; "" means unset */
    FSDP_OPT_INT,     /* long, within [min, max] */
    FSDP_OPT_FLOAT,   /* double, finite, within [min, max] */
    FSDP_OPT_CHOICE,  /* int: index into the '|'-separated choices */
    FSDP_OPT_FLAG,    /* int 0/1: a bare "--key" sets it; "--key=off", "key = on" */
    FSDP_OPT_BOOL,    /* int 0/1 from a value that must be given: "--key on|off",
                         "--key=off", "key = on"; printed on or off */
    FSDP_OPT_SIZE,    /* size_t byte count: 4, 64K, 256M, 1G (binary suffixes), within
                         [min, max] */
    FSDP_OPT_DTYPE,   /* enum fsdp_dtype by name or alias (core/dtype.h), one of the
                         '|'-separated choices ("f32|bf16|f16") */
};

enum fsdp_opt_flags {
    FSDP_OPT_REQUIRED = 1u << 0,  /* must be given by a flag or the file */
    FSDP_OPT_ARGV_ONLY = 1u << 1, /* not allowed in a config file (e.g. "config") */
    FSDP_OPT_HIDDEN = 1u << 2,    /* left out of --help and of the printed config */
    /*
     * STR, INT and FLOAT options: the value may be left out, like getopt's
     * optional_argument; the key then takes its implied value, the option's
     * 'choices' string. A bare "--key" at the end of argv or followed by a
     * word starting with '-' (another option) takes it; "--key WORD" (WORD
     * not starting with '-') and "--key=WORD" still give WORD, and "--key="
     * an empty value. In a config file "key =" with nothing after '=' takes
     * it, while 'key = ""' is an empty value.
     */
    FSDP_OPT_OPTIONAL_VALUE = 1u << 3,
    /* FLOAT: min (MIN_OPEN) or max (MAX_OPEN) itself is outside the range */
    FSDP_OPT_MIN_OPEN = 1u << 4,
    FSDP_OPT_MAX_OPEN = 1u << 5,
};

/* Where a value came from; the printed config says so for each key. */
enum fsdp_opt_source {
    FSDP_SRC_DEFAULT = 0,
    FSDP_SRC_FILE,
    FSDP_SRC_FLAG,
};

struct fsdp_opt {
    const char *name; /* "batch-size": the flag without dashes and the file key */
    enum fsdp_opt_type type;
    size_t offset;       /* of the field inside the config struct */
    size_t size;         /* FSDP_OPT_STR: buffer size, including the NUL */
    double min, max;     /* inclusive range for INT and FLOAT */
    const char *choices; /* FSDP_OPT_CHOICE: "cosine|linear|constant";
                            FSDP_OPT_OPTIONAL_VALUE: the implied value */
    const char *arg;     /* placeholder in --help: "N", "FILE", "X" */
    unsigned flags;      /* enum fsdp_opt_flags */
    const char *help;    /* one line; --help adds the default (a default outside
                            [min, max] means "worked out", which help says) */
    char letter;         /* one-letter alias: 'o' for "-o"; 0: none */
};

#define FSDP_OPT_MAX 64
#define FSDP_OPT_MAX_OPERANDS 8

/* A program's options bound to its config struct. */
struct fsdp_optset {
    const char *prog;                   /* "fsdpc-train", "fsdpc-ckpt init" */
    const struct fsdp_opt *opts;        /* (n,) */
    size_t n;                           /* <= FSDP_OPT_MAX */
    void *base;                         /* the config struct being filled */
    unsigned char source[FSDP_OPT_MAX]; /* (n,) enum fsdp_opt_source per option */
    const char *about; /* --help's paragraphs between the usage line and the options */
    int operands;      /* nonzero: words that are no option are operands (after "--": all) */
    int abbreviations; /* nonzero: a long option's unique prefix stands for it ("--out" for
                          "--output"), as getopt_long takes it */
    const char *operand[FSDP_OPT_MAX_OPERANDS]; /* the first operands, in argv */
    int n_operands;                             /* how many were given (may exceed the array) */
};

/* Index of the option called name, or -1. */
long fsdp_opt_find(const struct fsdp_optset *s, const char *name);
/* The first of names[0, n) nearest to word, at most max edits away
 * (insertions, deletions, substitutions, adjacent swaps), or NULL: the
 * "did you mean" of an option or any other name. */
const char *fsdp_opt_nearest(const char *word, const char *const *names, size_t n, size_t max);

/*
 * Parses value for key and stores it. Error messages quote the flag
 * ("--lr 'fast' is not a finite number") or, for a file, where ("run.cfg:7")
 * and the key ("run.cfg:7: lr = 'fast' ..."); an unknown key names the
 * closest known one as a hint.
 */
int fsdp_opt_set(struct fsdp_optset *s, const char *key, const char *value,
                 enum fsdp_opt_source src, const char *where);

/*
 * Reads "key = value" lines: '#' starts a comment at the start of a line or
 * after whitespace; blank lines are skipped; a value may be wrapped in
 * double quotes; an empty value unsets a string key, except that a key with
 * an implied value takes that value when nothing follows '=' (a quoted ""
 * is still an empty value).
 */
int fsdp_opt_load_file(struct fsdp_optset *s, const char *path);

/*
 * Parses argv[1..argc): first the config file named by the option
 * config_key (when given and present on the command line), then every flag,
 * so that flags override the file (a flag given twice: the last wins; a key
 * set twice in the file is an error). Returns 1 when --help or -h was seen
 * (nothing else is checked then), else 0 or an error. Positional arguments
 * are errors.
 */
int fsdp_opt_parse(struct fsdp_optset *s, int argc, char **argv, const char *config_key);

/* Error naming the first required option that is still unset. */
int fsdp_opt_check_required(const struct fsdp_optset *s);

/* True when the option called name was set by a flag or the file. */
int fsdp_opt_given(const struct fsdp_optset *s, const char *name);

/*
 * Value as text ("3e-04", "cosine", "runs/m.h5"); an empty string value of a
 * key with an implied value is '""', which a config file reads back as empty.
 */
void fsdp_opt_format_value(const struct fsdp_optset *s, size_t i, char *buf, size_t len);

/*
 * Prints every visible option as "key = value" with a "# default", "# file"
 * or "# flag" comment: the output is itself a valid config file (options
 * allowed on the command line only are printed as comments).
 */
void fsdp_opt_print(const struct fsdp_optset *s, FILE *fp, const char *indent);
/* The same for the options a flag or the file set; returns how many visible
 * options it left out at their defaults (the output still reads back as the
 * same configuration while the defaults stay the same). */
size_t fsdp_opt_print_given(const struct fsdp_optset *s, FILE *fp, const char *indent);

/*
 * Prints the --help text: "usage: PROG SYNOPSIS", the set's about text, then
 * one line per visible option ("-o, --output FILE  help [default]") and -h.
 */
void fsdp_opt_usage(const struct fsdp_optset *s, FILE *fp, const char *synopsis);

#endif
