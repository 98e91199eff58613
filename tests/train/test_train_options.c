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

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        tap_skip("cannot create a temporary directory");
        return tap_done();
    }
    test_schedule();
    test_flags_and_file();
    static const char *const files[] = {"a.cfg", "printed.cfg", "dup.cfg", "nest.cfg", "unk.cfg"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char path[256];
        snprintf(path, sizeof(path), "%s/%s", tmpdir, files[i]);
        unlink(path);
    }
    rmdir(tmpdir);
    return tap_done();
}
