/*
 * test_train_options.c - the trainer's option parser, config files and the
 * learning-rate schedule, checked against hand-computed values.
 */
#include "config.h"
#include "train/schedule.h"
#include "train/train_config.h"
#include "core/error.h"
#include "../tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/fsdpc-opt.XXXXXX";

static const char *write_file(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs(text, fp);
        fclose(fp);
    }
    return path;
}

/* Parses argv (NULL-terminated) into a fresh config; returns the rc. */
static int parse(struct fsdp_train_config *c, struct fsdp_optset *s, const char **args)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"fsdpc-train";
    for (; *args && argc < 63; args++) {
        argv[argc++] = (char *)*args;
    }
    argv[argc] = NULL;
    fsdp_train_config_init(c, s);
    fsdp_err_clear();
    return fsdp_train_config_parse(c, s, argc, argv);
}

static int err_has(const char *needle)
{
    int ok = strstr(fsdp_err_msg(), needle) != NULL;
    if (!ok) {
        tap_diag("error message: '%s', expected to contain '%s'", fsdp_err_msg(), needle);
    }
    return ok;
}

static void test_schedule(void)
{
    struct fsdp_train_config c;
    struct fsdp_optset s;
    struct fsdp_lr_schedule sc;
    fsdp_train_config_init(&c, &s);
    c.lr = 1.0;
    c.min_lr = 0.1;
    c.warmup = 4;
    c.steps = 14;
    fsdp_lr_schedule_init(&sc, &c);
    tap_ok(fabs(fsdp_lr_at(&sc, 0) - 0.25) < 1e-12 && fabs(fsdp_lr_at(&sc, 3) - 1.0) < 1e-12,
           "warm-up: (s+1)/W of the peak");
    tap_ok(fabs(fsdp_lr_at(&sc, 4) - 1.0) < 1e-12, "cosine: peak on the first step after warm-up");
    tap_ok(fabs(fsdp_lr_at(&sc, 9) - 0.55) < 1e-12, "cosine: halfway is (lr + min_lr) / 2");
    tap_ok(fabs(fsdp_lr_at(&sc, 100) - 0.1) < 1e-12, "cosine: past the end stays at min_lr");
    c.lr_schedule = FSDP_LR_LINEAR;
    fsdp_lr_schedule_init(&sc, &c);
    tap_ok(fabs(fsdp_lr_at(&sc, 6) - (0.1 + 0.9 * 0.8)) < 1e-12, "linear: 1 - p of the range");
    c.lr_schedule = FSDP_LR_CONSTANT;
    fsdp_lr_schedule_init(&sc, &c);
    tap_ok(fabs(fsdp_lr_at(&sc, 2) - 0.75) < 1e-12 && fsdp_lr_at(&sc, 13) == 1.0,
           "constant: warm-up, then the peak");
    c.warmup = 0;
    c.steps = 1;
    c.lr_schedule = FSDP_LR_COSINE;
    fsdp_lr_schedule_init(&sc, &c);
    tap_ok(fsdp_lr_at(&sc, 0) == 1.0, "one step, no warm-up: the peak");
}

static void test_flags_and_file(void)
{
    struct fsdp_train_config c;
    struct fsdp_optset s;
    const char *req[] = {"--model", "m.h5", "--data=d.bin", "--steps", "5", "--batch-size", "2",
                         "--seq-len", "8", "--lr", "1e-3", NULL};
    tap_ok(parse(&c, &s, req) == 0 && c.steps == 5 && !strcmp(c.data, "d.bin") && c.lr == 1e-3,
           "flags, --key value and --key=value");
    tap_ok(c.grad_accum == 1 && c.beta2 == 0.95 && c.clip == 1.0 && c.threads == 1,
           "defaults");

    const char *cfg = write_file("a.cfg",
                                 "# comment\n"
                                 "model = \"dir with space/m.h5\"\n"
                                 "data=d#1.bin   # hash inside a value, comment after space\n"
                                 "  steps = 7\n"
                                 "\n"
                                 "batch-size = 3\n"
                                 "seq-len = 16\n"
                                 "lr = 2e-3\n"
                                 "lr-schedule = linear\n"
                                 "val-data =\n");
    const char *withfile[] = {"--steps", "9", "--config", cfg, NULL};
    int rc = parse(&c, &s, withfile);
    tap_ok(rc == 0 && !strcmp(c.model, "dir with space/m.h5") && !strcmp(c.data, "d#1.bin") &&
               c.lr_schedule == FSDP_LR_LINEAR && c.batch_size == 3 && !c.val_data[0],
           "config file: quotes, comments, '#' inside a value, empty value (rc %d %s)", rc,
           fsdp_err_msg());
    tap_ok(c.steps == 9, "a flag overrides the file, even when given before --config");

    /* the printout reads back to the same configuration */
    char path[256];
    snprintf(path, sizeof(path), "%s/printed.cfg", tmpdir);
    FILE *fp = fopen(path, "w");
    fsdp_opt_print(&s, fp, "  ");
    fclose(fp);
    struct fsdp_train_config c2;
    struct fsdp_optset s2;
    const char *again[] = {"--config", path, NULL};
    rc = parse(&c2, &s2, again);
    memset(c.config, 0, sizeof(c.config)); /* the one key that differs */
    memset(c2.config, 0, sizeof(c2.config));
    tap_ok(rc == 0 && memcmp(&c, &c2, sizeof(c)) == 0,
           "the printed configuration parses back to the same values (rc %d %s)", rc,
           fsdp_err_msg());

    const char *dup = write_file("dup.cfg", "steps = 1\nsteps = 2\n");
    const char *d[] = {"--config", dup, NULL};
    tap_ok(parse(&c, &s, d) < 0 && err_has("dup.cfg:2: 'steps' is set twice"),
           "a key set twice in a file is an error");
    const char *nest = write_file("nest.cfg", "config = other.cfg\n");
    const char *n[] = {"--config", nest, NULL};
    tap_ok(parse(&c, &s, n) < 0 && err_has("nest.cfg:1: 'config' is allowed on the command line only"),
           "config files do not nest");
    const char *unk = write_file("unk.cfg", "batchsize = 4\n");
    const char *u[] = {"--config", unk, NULL};
    tap_ok(parse(&c, &s, u) < 0 && err_has("unk.cfg:1: unknown key 'batchsize' (did you mean 'batch-size'?)"),
           "unknown key: file, line and a suggestion");
    const char *last[] = {"--model", "m.h5", "--data", "d.bin", "--steps", "5", "--batch-size",
                          "2", "--seq-len", "8", "--lr", "1e-3", "--lr", "5e-4", NULL};
    tap_ok(parse(&c, &s, last) == 0 && c.lr == 5e-4, "a flag given twice: the last wins");
    const char *nan[] = {"--lr", "nan", NULL};
    tap_ok(parse(&c, &s, nan) < 0 && err_has("--lr 'nan' is not a finite number"),
           "non-finite numbers are rejected");
    const char *beta[] = {"--model", "m", "--data", "d", "--steps", "5", "--batch-size", "2",
                          "--seq-len", "8", "--lr", "1e-3", "--beta2", "1", NULL};
    tap_ok(parse(&c, &s, beta) < 0 && err_has("must be below 1"), "beta2 = 1 is rejected");
    const char *warm[] = {"--model", "m", "--data", "d", "--steps", "5", "--batch-size", "2",
                          "--seq-len", "8", "--lr", "1e-3", "--warmup", "6", NULL};
    tap_ok(parse(&c, &s, warm) < 0 && err_has("warmup 6 is longer than steps 5"),
           "warm-up longer than the run is rejected");
    const char *help[] = {"--steps", "x", "--help", NULL};
    tap_ok(parse(&c, &s, help) == 1, "--help wins over everything else");
}

/* The line of fsdp_opt_print's output for key, trailing spaces squeezed: "resume = latest # flag". */
static int printed_line(const struct fsdp_optset *s, const char *key, char *out, size_t len)
{
    char path[256], line[4096];
    int found = 0;
    snprintf(path, sizeof(path), "%s/print.txt", tmpdir);
    FILE *fp = fopen(path, "w+");
    if (!fp) {
        return 0;
    }
    fsdp_opt_print(s, fp, "");
    rewind(fp);
    while (!found && fgets(line, sizeof(line), fp)) {
        size_t kl = strlen(key);
        if (strncmp(line, key, kl) != 0 || (line[kl] != ' ' && line[kl] != '=')) {
            continue;
        }
        size_t o = 0;
        for (const char *p = line; *p && *p != '\n' && o + 1 < len; p++) {
            if (*p != ' ' || (o > 0 && out[o - 1] != ' ')) {
                out[o++] = *p;
            }
        }
        out[o] = '\0';
        found = 1;
    }
    fclose(fp);
    return found;
}

#define REQ                                                                                        \
    "--model", "m.h5", "--data", "d.bin", "--batch-size", "2", "--seq-len", "8", "--lr", "1e-3",   \
        "--ckpt-dir", "ck"

/* --resume on the command line: bare (latest), with a path, empty. */
static void test_resume_flag(void)
{
    struct fsdp_train_config c;
    struct fsdp_optset s;
    char line[4096];
    const char *end[] = {REQ, "--steps", "5", "--resume", NULL};
    int rc = parse(&c, &s, end);
    tap_ok(rc == 0 && !strcmp(c.resume, "latest") && fsdp_opt_given(&s, "resume"),
           "bare --resume at the end means latest (rc %d %s)", rc, fsdp_err_msg());
    tap_ok(printed_line(&s, "resume", line, sizeof(line)) && !strcmp(line, "resume = latest # flag"),
           "the printed configuration shows 'resume = latest' for a bare --resume ('%s')", line);

    const char *before[] = {REQ, "--resume", "--steps", "10", NULL};
    rc = parse(&c, &s, before);
    tap_ok(rc == 0 && !strcmp(c.resume, "latest") && c.steps == 10,
           "bare --resume before another option means latest and the option keeps its value "
           "(rc %d %s)", rc, fsdp_err_msg());
    const char *before_eq[] = {REQ, "--resume", "--steps=7", NULL};
    rc = parse(&c, &s, before_eq);
    tap_ok(rc == 0 && !strcmp(c.resume, "latest") && c.steps == 7,
           "bare --resume before --key=value (rc %d %s)", rc, fsdp_err_msg());

    const char *eq[] = {REQ, "--steps", "5", "--resume=ck/step_3", NULL};
    rc = parse(&c, &s, eq);
    tap_ok(rc == 0 && !strcmp(c.resume, "ck/step_3"), "--resume=PATH gives the path (rc %d %s)",
           rc, fsdp_err_msg());
    const char *sep[] = {REQ, "--resume", "ck/step_3", "--steps", "5", NULL};
    rc = parse(&c, &s, sep);
    tap_ok(rc == 0 && !strcmp(c.resume, "ck/step_3") && c.steps == 5,
           "--resume PATH gives the path (rc %d %s)", rc, fsdp_err_msg());
    const char *word[] = {REQ, "--steps", "5", "--resume", "latest", NULL};
    rc = parse(&c, &s, word);
    tap_ok(rc == 0 && !strcmp(c.resume, "latest"), "--resume latest still means latest");
    const char *dashpath[] = {REQ, "--steps", "5", "--resume=-odd/step_3", NULL};
    rc = parse(&c, &s, dashpath);
    tap_ok(rc == 0 && !strcmp(c.resume, "-odd/step_3"),
           "--resume=PATH takes a path that starts with '-' (rc %d %s)", rc, fsdp_err_msg());
    const char *empty[] = {REQ, "--steps", "5", "--resume=", NULL};
    rc = parse(&c, &s, empty);
    tap_ok(rc == 0 && c.resume[0] == '\0', "--resume= is an empty value: no resume (rc %d %s)",
           rc, fsdp_err_msg());
    const char *nodir[] = {"--model", "m.h5", "--data", "d.bin", "--batch-size", "2",
                           "--seq-len", "8", "--lr", "1e-3", "--steps", "5", "--resume", NULL};
    tap_ok(parse(&c, &s, nodir) < 0 && err_has("resume latest needs ckpt-dir"),
           "bare --resume without --ckpt-dir is refused like --resume latest");
    const char *stray[] = {REQ, "--steps", "5", "--resume", "ck/a", "ck/b", NULL};
    tap_ok(parse(&c, &s, stray) < 0 && err_has("unexpected argument 'ck/b'"),
           "--resume takes one word at most");
}

/* --resume in a config file, and a bare --resume against the file. */
static void test_resume_config_file(void)
{
    struct fsdp_train_config c;
    struct fsdp_optset s;
    char line[4096];
    int rc;
    /* config files */
    const char *base = "model = m.h5\ndata = d.bin\nbatch-size = 2\nseq-len = 8\nlr = 1e-3\n"
                       "steps = 5\nckpt-dir = ck\n";
    char text[512];
    snprintf(text, sizeof(text), "%sresume =\n", base);
    const char *f1[] = {"--config", write_file("r1.cfg", text), NULL};
    rc = parse(&c, &s, f1);
    tap_ok(rc == 0 && !strcmp(c.resume, "latest"), "config file: 'resume =' means latest (rc %d %s)",
           rc, fsdp_err_msg());
    tap_ok(printed_line(&s, "resume", line, sizeof(line)) && !strcmp(line, "resume = latest # file"),
           "config file: printed as 'resume = latest' ('%s')", line);
    snprintf(text, sizeof(text), "%sresume =    # latest, with a comment\n", base);
    const char *f2[] = {"--config", write_file("r2.cfg", text), NULL};
    rc = parse(&c, &s, f2);
    tap_ok(rc == 0 && !strcmp(c.resume, "latest"),
           "config file: 'resume =' and a comment means latest (rc %d %s)", rc, fsdp_err_msg());
    snprintf(text, sizeof(text), "%sresume = latest\n", base);
    const char *f3[] = {"--config", write_file("r3.cfg", text), NULL};
    rc = parse(&c, &s, f3);
    tap_ok(rc == 0 && !strcmp(c.resume, "latest"), "config file: 'resume = latest' (rc %d %s)", rc,
           fsdp_err_msg());
    snprintf(text, sizeof(text), "%sresume = ck/step_3\n", base);
    const char *f4[] = {"--config", write_file("r4.cfg", text), NULL};
    rc = parse(&c, &s, f4);
    tap_ok(rc == 0 && !strcmp(c.resume, "ck/step_3"), "config file: 'resume = PATH' (rc %d %s)",
           rc, fsdp_err_msg());
    snprintf(text, sizeof(text), "%sresume = \"\"\n", base);
    const char *f5[] = {"--config", write_file("r5.cfg", text), NULL};
    rc = parse(&c, &s, f5);
    tap_ok(rc == 0 && c.resume[0] == '\0', "config file: 'resume = \"\"' is empty: no resume "
           "(rc %d %s)", rc, fsdp_err_msg());
    const char *f6[] = {"--config", write_file("r6.cfg", text), "--resume", NULL};
    rc = parse(&c, &s, f6);
    tap_ok(rc == 0 && !strcmp(c.resume, "latest"), "a bare --resume overrides the file (rc %d %s)",
           rc, fsdp_err_msg());
    const char *f7[] = {"--resume", "--config", f1[1], NULL};
    rc = parse(&c, &s, f7);
    tap_ok(rc == 0 && !strcmp(c.resume, "latest") && c.steps == 5 && !strcmp(c.config, f1[1]),
           "bare --resume before --config: the file is still read (rc %d %s)", rc, fsdp_err_msg());
}

/* The printout reads back: unset as "", bare as latest. */
static void test_resume_printout(void)
{
    struct fsdp_train_config c;
    struct fsdp_optset s;
    char line[4096];
    int rc;
    const char *unset[] = {REQ, "--steps", "5", NULL};
    rc = parse(&c, &s, unset);
    tap_ok(rc == 0 && printed_line(&s, "resume", line, sizeof(line)) &&
               !strcmp(line, "resume = \"\" # default"),
           "an unset resume prints as 'resume = \"\"' ('%s')", line);
    for (int bare = 0; bare < 2; bare++) {
        struct fsdp_train_config c2;
        struct fsdp_optset s2;
        const char *args[] = {REQ, "--steps", "5", bare ? "--resume" : NULL, NULL};
        parse(&c, &s, args);
        char path[256];
        snprintf(path, sizeof(path), "%s/printed.cfg", tmpdir);
        FILE *fp = fopen(path, "w");
        fsdp_opt_print(&s, fp, "");
        fclose(fp);
        const char *again[] = {"--config", path, NULL};
        rc = parse(&c2, &s2, again);
        tap_ok(rc == 0 && !strcmp(c.resume, c2.resume),
               "the printed configuration reads back with resume '%s' (rc %d %s)", c.resume, rc,
               fsdp_err_msg());
    }
}

/* --help shows --resume's value as optional. */
static void test_resume_help(void)
{
    struct fsdp_train_config c;
    struct fsdp_optset s;
    char path[256], help[8192];
    snprintf(path, sizeof(path), "%s/help.txt", tmpdir);
    FILE *fp = fopen(path, "w+");
    fsdp_train_config_init(&c, &s);
    fsdp_train_config_usage(&s, fp);
    rewind(fp);
    size_t n = fread(help, 1, sizeof(help) - 1, fp);
    help[n] = '\0';
    fclose(fp);
    tap_ok(strstr(help, "--resume [latest|required|PATH]") && !strstr(help, "[\"\"]"),
           "--help shows the value of --resume as optional");
}
#undef REQ

static void test_resume_optional_value(void)
{
    test_resume_flag();
    test_resume_config_file();
    test_resume_printout();
    test_resume_help();
}

/* An on/off option that takes a value (reshard-after-forward): stored 1 for
 * on, the spellings on and off only, a value always needed, printed on/off. */
static void test_bool_option(void)
{
    struct fsdp_train_config c;
    struct fsdp_optset s;
    char line[4096];
#define REQ "--model", "m.h5", "--data", "d.bin", "--batch-size", "2", "--seq-len", "8", \
            "--lr", "1e-3", "--steps", "5"
    const char *dflt[] = {REQ, NULL};
    tap_ok(parse(&c, &s, dflt) == 0 && c.reshard_after_forward == 1 &&
               !fsdp_train_config_wants_fsdp(&c),
           "reshard-after-forward defaults to on (1) and alone needs no sharding engine");
    const char *sep[] = {REQ, "--reshard-after-forward", "off", NULL};
    int rc = parse(&c, &s, sep);
    tap_ok(rc == 0 && c.reshard_after_forward == 0 && fsdp_train_config_wants_fsdp(&c),
           "--reshard-after-forward off stores 0 and asks for the sharding engine (rc %d %s)", rc,
           fsdp_err_msg());
    tap_ok(printed_line(&s, "reshard-after-forward", line, sizeof(line)) &&
               !strcmp(line, "reshard-after-forward = off # flag"),
           "printed as 'reshard-after-forward = off' ('%s')", line);
    const char *eq[] = {REQ, "--reshard-after-forward=on", NULL};
    tap_ok(parse(&c, &s, eq) == 0 && c.reshard_after_forward == 1, "--reshard-after-forward=on");
    const char *cfg = write_file("b1.cfg", "reshard-after-forward = off\n");
    const char *file[] = {REQ, "--config", cfg, NULL};
    tap_ok(parse(&c, &s, file) == 0 && c.reshard_after_forward == 0,
           "'reshard-after-forward = off' in a config file");
    const char *yes[] = {REQ, "--reshard-after-forward", "yes", NULL};
    tap_ok(parse(&c, &s, yes) < 0 && err_has("--reshard-after-forward 'yes' is not one of on|off"),
           "only on and off are accepted");
    const char *bare[] = {REQ, "--reshard-after-forward", NULL};
    tap_ok(parse(&c, &s, bare) < 0 && err_has("--reshard-after-forward needs a value"),
           "a bare --reshard-after-forward needs a value");
#undef REQ
}

/* --ckpt-async: auto unless given, on and off, anything else refused naming the choices. */
static void test_ckpt_async_option(void)
{
    struct fsdp_train_config c;
    struct fsdp_optset s;
#define REQ                                                                                        \
    "--model", "m.h5", "--data", "d.bin", "--batch-size", "2", "--seq-len", "8", "--lr", "1e-3",   \
        "--ckpt-dir", "ck"
    const char *dflt[] = {REQ, "--steps", "5", NULL};
    int rc = parse(&c, &s, dflt);
    tap_ok(rc == 0 && c.ckpt_async == FSDP_CKPT_ASYNC_AUTO, "--ckpt-async is auto by default");
    const char *on[] = {REQ, "--steps", "5", "--ckpt-async", "on", NULL};
    const char *off[] = {REQ, "--steps", "5", "--ckpt-async=off", NULL};
    tap_ok(parse(&c, &s, on) == 0 && c.ckpt_async == FSDP_CKPT_ASYNC_ON &&
               parse(&c, &s, off) == 0 && c.ckpt_async == FSDP_CKPT_ASYNC_OFF,
           "--ckpt-async on and off");
    const char *bad[] = {REQ, "--steps", "5", "--ckpt-async", "yes", NULL};
    tap_ok(parse(&c, &s, bad) < 0 && err_has("ckpt-async") && err_has("auto|on|off"),
           "--ckpt-async yes is refused, naming the choices");
#undef REQ
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        tap_skip("cannot create a temporary directory");
        return tap_done();
    }
    test_schedule();
    test_flags_and_file();
    test_resume_optional_value();
    test_bool_option();
    test_ckpt_async_option();
    static const char *const files[] = {"a.cfg",  "printed.cfg", "dup.cfg", "nest.cfg",
                                        "unk.cfg", "print.txt",  "help.txt", "r1.cfg",
                                        "r2.cfg",  "r3.cfg",     "r4.cfg",   "r5.cfg",
                                        "r6.cfg",  "b1.cfg"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char path[256];
        snprintf(path, sizeof(path), "%s/%s", tmpdir, files[i]);
        unlink(path);
    }
    rmdir(tmpdir);
    return tap_done();
}
