/*
 * test_options.c - what the option parser adds for programs other than the
 * trainer (whose table tests/train/test_train_options.c covers): one-letter
 * aliases, operands and "--", byte counts, dtypes, open ranges, and the
 * --help text generated from the table.
 */
#include "config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/options.h"
#include "../tap.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tool_config {
    char out[64];
    long seed;
    size_t max;
    double frac;
    double timeout; /* 0: worked out by the program */
    enum fsdp_dtype dtype;
    int quiet;
};

#define F(field) offsetof(struct tool_config, field)
static const struct fsdp_opt tool_opts[] = {
    {"output", FSDP_OPT_STR, F(out), 64, 0, 0, NULL, "FILE", 0, "where it goes", 'o'},
    {"seed", FSDP_OPT_INT, F(seed), 0, 0, 100, NULL, "S", 0, "random seed", 0},
    {"max", FSDP_OPT_SIZE, F(max), 0, 1, 1e12, NULL, "BYTES", 0, "largest size", 0},
    {"frac", FSDP_OPT_FLOAT, F(frac), 0, 0, 1, NULL, "X", FSDP_OPT_MIN_OPEN | FSDP_OPT_MAX_OPEN,
     "a fraction", 0},
    {"timeout", FSDP_OPT_FLOAT, F(timeout), 0, 0, 1e6, NULL, "S", FSDP_OPT_MIN_OPEN,
     "deadline (default: the environment's)", 0},
    {"dtype", FSDP_OPT_DTYPE, F(dtype), 0, 0, 0, "f32|bf16|f16", "T", 0, "stored type", 0},
    {"quiet", FSDP_OPT_FLAG, F(quiet), 0, 0, 0, NULL, "", 0, "less output", 'q'},
};
#undef F

static int abbreviations; /* the next parse takes unique prefixes, as getopt_long */

/* Parses args (NULL-terminated) into a fresh config; returns the rc. */
static int parse(struct tool_config *c, struct fsdp_optset *s, const char **args)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"tool";
    for (; *args && argc < 31; args++) {
        argv[argc++] = (char *)*args;
    }
    argv[argc] = NULL;
    *c = (struct tool_config){.seed = 7, .max = (size_t)256 << 20, .frac = 0.5, .dtype = FSDP_F32};
    *s = (struct fsdp_optset){.prog = "tool cmd",
                              .opts = tool_opts,
                              .n = sizeof(tool_opts) / sizeof(tool_opts[0]),
                              .base = c,
                              .about = "Does a thing.",
                              .operands = 1,
                              .abbreviations = abbreviations};
    fsdp_err_clear();
    return fsdp_opt_parse(s, argc, argv, NULL);
}

static int err_has(const char *needle)
{
    int ok = strstr(fsdp_err_msg(), needle) != NULL;
    if (!ok) {
        tap_diag("error message: '%s', expected to contain '%s'", fsdp_err_msg(), needle);
    }
    return ok;
}

static void test_letters_and_operands(void)
{
    struct tool_config c;
    struct fsdp_optset s;
    const char *a1[] = {"in.h5", "-o", "x.h5", "-q", "--seed=3", NULL};
    tap_ok(parse(&c, &s, a1) == 0 && !strcmp(c.out, "x.h5") && c.quiet && c.seed == 3 &&
               s.n_operands == 1 && !strcmp(s.operand[0], "in.h5"),
           "-o FILE, -q and an operand before them");
    const char *a2[] = {"-ox.h5", "a", "--", "-b", NULL};
    tap_ok(parse(&c, &s, a2) == 0 && !strcmp(c.out, "x.h5") && s.n_operands == 2 &&
               !strcmp(s.operand[1], "-b"),
           "-oFILE; after --, a word starting with '-' is an operand");
    const char *a3[] = {"-z", NULL};
    tap_ok(parse(&c, &s, a3) < 0 && err_has("unknown option -z (see tool cmd --help)"),
           "an unknown letter is named");
    const char *a4[] = {"in", "-o", NULL};
    tap_ok(parse(&c, &s, a4) < 0 && err_has("-o needs a value"), "-o at the end needs a value");
    const char *a5[] = {"-qx", NULL};
    tap_ok(parse(&c, &s, a5) < 0 && err_has("-q takes no value"), "a flag's letter takes no value");
    const char *a6[] = {"--outptu", "x", NULL};
    tap_ok(parse(&c, &s, a6) < 0 && err_has("unknown option --outptu (did you mean --output?)"),
           "a misspelt long option gets a suggestion");
    const char *a7[] = {"--out", "x.h5", "--se=4", NULL};
    tap_ok(parse(&c, &s, a7) < 0 && err_has("unknown option --out (did you mean --output?)"),
           "a prefix is no option of its own");
    abbreviations = 1;
    tap_ok(parse(&c, &s, a7) == 0 && !strcmp(c.out, "x.h5") && c.seed == 4,
           "with abbreviations, unique prefixes stand for their options (--out, --se=4)");
    const char *a8[] = {"--t", "5", NULL}; /* only timeout starts with t */
    tap_ok(parse(&c, &s, a8) == 0 && c.timeout == 5, "a one-letter prefix when it is unique");
    abbreviations = 0;
}

static void test_values(void)
{
    struct tool_config c;
    struct fsdp_optset s;
    const char *a1[] = {"--max", "64K", "--dtype", "bfloat16", "--frac", "0.25", NULL};
    tap_ok(parse(&c, &s, a1) == 0 && c.max == 65536 && c.dtype == FSDP_BF16 && c.frac == 0.25,
           "a byte count, a dtype by alias, a fraction");
    const char *a2[] = {"--max", "lots", NULL};
    tap_ok(parse(&c, &s, a2) < 0 && err_has("--max 'lots' is not a byte count"), "a bad size");
    const char *a3[] = {"--dtype", "i32", NULL};
    tap_ok(parse(&c, &s, a3) < 0 && err_has("--dtype 'i32' is not one of f32|bf16|f16"),
           "a dtype outside the choices");
    const char *a4[] = {"--frac", "1", NULL};
    tap_ok(parse(&c, &s, a4) < 0 && err_has("--frac '1' is out of range (0, 1)"),
           "an open end is outside the range");
    const char *a5[] = {"--timeout", "0", NULL};
    tap_ok(parse(&c, &s, a5) < 0 && err_has("--timeout '0' is out of range (0, 1000000]"),
           "an open lower end, a closed upper one");
}

static void test_usage(void)
{
    struct tool_config c;
    struct fsdp_optset s;
    const char *none[] = {NULL};
    char help[4096];
    parse(&c, &s, none);
    FILE *fp = tmpfile();
    fsdp_opt_usage(&s, fp, "PATH -o FILE");
    rewind(fp);
    size_t n = fread(help, 1, sizeof(help) - 1, fp);
    help[n] = '\0';
    fclose(fp);
    tap_ok(strncmp(help, "usage: tool cmd PATH -o FILE\n\nDoes a thing.\n\noptions:\n", 52) == 0,
           "usage line, then the about text, then the options");
    tap_ok(strstr(help, "\n  -o, --output FILE ") && strstr(help, "\n      --seed S ") &&
               strstr(help, "random seed [7]\n") && strstr(help, "largest size [256M]\n") &&
               strstr(help, "stored type [f32]\n"),
           "letters line up, defaults are shown in the form they are written");
    tap_ok(strstr(help, "deadline (default: the environment's)\n") != NULL,
           "a default outside its range (worked out by the program) is not shown");
    if (!tap_ok(strstr(help, "\n  -h, --help ") != NULL, "-h, --help is listed")) {
        tap_diag("%s", help);
    }
}

int main(void)
{
    test_letters_and_operands();
    test_values();
    test_usage();
    return tap_done();
}
