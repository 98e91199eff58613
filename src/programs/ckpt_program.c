/*
 * ckpt_program.c - the fsdpc-ckpt program (its main is ckpt_main.c, so that
 * a test program can run it with an architecture of its own registered):
 * creates and inspects model files; the checkpoint subcommands live in
 * ckpt_tool.c.
 *
 *   fsdpc-ckpt init --preset NAME [overrides] [--seed S] -o FILE
 *   fsdpc-ckpt inspect FILE|CHECKPOINT
 *   fsdpc-ckpt list DIR                                     (ckpt_list.c)
 *   fsdpc-ckpt verify | consolidate | reshard | convert ...
 *   fsdpc-ckpt export-safetensors | import-safetensors ...  (st_tool.c)
 *   fsdpc-ckpt import-hf | export-hf ...                    (hf_tool.c)
 *
 * Subcommands sit in one table (name, summary, function); each parses its own
 * flags and has its own --help. init draws the model's deterministic initial
 * values (fsdp_model_init_range) and streams them unit by unit through one
 * reused buffer, so even gpt2-xl (6 GB in f32) never sits in memory whole,
 * and the file appears under its name only once complete (tmp + rename).
 * Errors end the program with one line and a non-zero exit status.
 */
#include "config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "io/ckpt/ckpt.h"
#include "programs/ckpt_tool.h"
#include "io/h5/model_file.h"
#include "model/model.h"
#include "model/llama_spec.h"

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ckpt_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
};

static int parse_int_flag(const char *flag, const char *s, long long lo, long long hi)
{
    long long v;
    if (fsdp_parse_long(s, &v) < 0 || v < lo || v > hi) {
        fsdp_fatal("fsdpc-ckpt init: %s '%s' must be an integer in [%lld, %lld]", flag, s, lo, hi);
    }
    return (int)v;
}

static void human_bytes(char *buf, size_t len, double b)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) {
        b /= 1024.0;
        u++;
    }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
}

// ----------------------------------------------------------------------------
// init

static void init_usage(FILE *out)
{
    fprintf(out,
            "usage: fsdpc-ckpt init [--preset NAME] [overrides] [--seed S] [--dtype T] -o FILE\n"
            "\n"
            "Creates a freshly initialised model file. The preset picks the architecture:\n"
            "  gpt2:  tiny (default), bench-small, gpt2, gpt2-medium, gpt2-large, gpt2-xl;\n"
            "         weights N(0, 0.02) (residual projections N(0, 0.02/sqrt(2*n_layer))),\n"
            "         layer-norm weights 1, biases 0\n"
            "  llama: llama-tiny, llama-small, llama-1b (Llama 3.2 1B), llama-8b (Llama 3.1\n"
            "         8B); weights N(0, 0.02), RMSNorm weights 1, biases 0 (Hugging Face's)\n"
            "The file is written under a fresh temporary name beside it (FILE.tmp.XXXXXX)\n"
            "and renamed to FILE when complete.\n"
            "\n"
            "      --preset NAME        a preset above\n"
            "      --layers N           override n_layer\n"
            "      --heads N            override n_head\n"
            "      --width N            override n_embd (divisible by n_head)\n"
            "      --vocab N            override vocab_size\n"
            "      --context N          override the maximum sequence length\n"
            "      --untied             separate lm_head.weight instead of the embedding's\n"
            "  llama only:\n"
            "      --kv-heads N         override n_kv_head (dividing n_head; 1: multi-query)\n"
            "      --ffn N              override ffn_hidden (the MLP's intermediate size)\n"
            "      --attn-bias          biases on the q/k/v projections (Qwen2)\n"
            "      --rope-theta X       override rope_theta\n"
            "      --rope-scaling TYPE  none, linear or llama3\n"
            "      --rope-factor X      the scaling factor (linear, llama3)\n"
            "      --rope-original N    llama3's original context\n"
            "\n"
            "      --seed S             RNG seed (default 0); same seed, same values\n"
            "      --dtype T            stored type: f32 (default), bf16 or f16\n"
            "  -o, --output FILE        the model file to create\n"
            "  -h, --help               this text\n");
}

/* Flags that set one config attribute, by the attribute's name in the
 * architecture's table (an architecture without it refuses the flag). */
enum init_val { INIT_INT, INIT_FLOAT, INIT_ROPE, INIT_ONE, INIT_ZERO };
static const struct init_override {
    const char *flag;
    const char *attr;
    enum init_val kind;
} init_overrides[] = {
    {"layers", "n_layer", INIT_INT},
    {"heads", "n_head", INIT_INT},
    {"width", "n_embd", INIT_INT},
    {"vocab", "vocab_size", INIT_INT},
    {"context", "context", INIT_INT},
    {"untied", "tied_embeddings", INIT_ZERO},
    {"kv-heads", "n_kv_head", INIT_INT},
    {"ffn", "ffn_hidden", INIT_INT},
    {"attn-bias", "attn_bias", INIT_ONE},
    {"rope-theta", "rope_theta", INIT_FLOAT},
    {"rope-scaling", "rope_scaling", INIT_ROPE},
    {"rope-factor", "rope_factor", INIT_FLOAT},
    {"rope-original", "rope_original_context", INIT_INT},
};
#define INIT_N_OVERRIDES (sizeof(init_overrides) / sizeof(init_overrides[0]))

/* The value of override i from its argument (already range-checked). */
static double init_override_value(size_t i, const char *arg)
{
    const struct init_override *o = &init_overrides[i];
    char flag[32];
    snprintf(flag, sizeof(flag), "--%s", o->flag);
    switch (o->kind) {
    case INIT_INT: return parse_int_flag(flag, arg, 1, 1 << 20);
    case INIT_ONE: return 1;
    case INIT_ZERO: return 0;
    case INIT_ROPE: {
        int t;
        if (fsdp_llama_rope_parse(arg, &t) < 0) {
            fsdp_die(FSDP_ERR_INVALID, "fsdpc-ckpt init: --rope-scaling", NULL);
        }
        return t;
    }
    default: {
        char *end;
        double v = strtod(arg, &end);
        if (end == arg || *end != '\0' || !isfinite(v) || v <= 0) {
            fsdp_fatal("fsdpc-ckpt init: %s '%s' must be a positive number", flag, arg);
        }
        return v;
    }
    }
}

static int cmd_init(int argc, char **argv)
{
    static const struct option opts[] = {
        {"preset", required_argument, NULL, 'p'},
        {"layers", required_argument, NULL, 0},
        {"heads", required_argument, NULL, 1},
        {"width", required_argument, NULL, 2},
        {"vocab", required_argument, NULL, 3},
        {"context", required_argument, NULL, 4},
        {"untied", no_argument, NULL, 5},
        {"kv-heads", required_argument, NULL, 6},
        {"ffn", required_argument, NULL, 7},
        {"attn-bias", no_argument, NULL, 8},
        {"rope-theta", required_argument, NULL, 9},
        {"rope-scaling", required_argument, NULL, 10},
        {"rope-factor", required_argument, NULL, 11},
        {"rope-original", required_argument, NULL, 12},
        {"seed", required_argument, NULL, 's'},
        {"dtype", required_argument, NULL, 'd'},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *preset = "tiny", *out = NULL;
    int given[INIT_N_OVERRIDES] = {0}, c, rc;
    double value[INIT_N_OVERRIDES] = {0};
    long long seed = 0;
    enum fsdp_dtype dtype = FSDP_F32;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        if (c >= 0 && (size_t)c < INIT_N_OVERRIDES) {
            given[c] = 1;
            value[c] = init_override_value((size_t)c, optarg);
            continue;
        }
        switch (c) {
        case 'p': preset = optarg; break;
        case 's':
            if (fsdp_parse_long(optarg, &seed) < 0 || seed < 0) {
                fsdp_fatal("fsdpc-ckpt init: --seed '%s' must be a non-negative integer", optarg);
            }
            break;
        case 'd':
            if (fsdp_dtype_parse(optarg, &dtype) < 0 ||
                (dtype != FSDP_F32 && dtype != FSDP_BF16 && dtype != FSDP_F16)) {
                fsdp_fatal("fsdpc-ckpt init: --dtype '%s' must be f32, bf16 or f16", optarg);
            }
            break;
        case 'o': out = optarg; break;
        case 'h': init_usage(stdout); return 0;
        default: fsdp_ckpt_tool_bad_option("init", c, argv);
        }
    }
    if (optind != argc) {
        fsdp_fatal("fsdpc-ckpt init: unexpected argument '%s' (see --help)", argv[optind]);
    }
    if (!out) {
        fsdp_fatal("fsdpc-ckpt init: missing -o FILE (see --help)");
    }
    void *cfg = NULL;
    const struct fsdp_arch *arch = NULL;
    if ((rc = fsdp_arch_preset(preset, &arch, &cfg)) < 0) {
        fsdp_die(rc, "fsdpc-ckpt init: --preset", NULL);
    }
    for (size_t i = 0; i < INIT_N_OVERRIDES; i++) {
        const struct fsdp_attr_desc *a = NULL;
        for (size_t k = 0; given[i] && k < arch->n_attrs && !a; k++) {
            a = strcmp(arch->attrs[k].name, init_overrides[i].attr) == 0 ? &arch->attrs[k] : NULL;
        }
        if (given[i] && !a) {
            fsdp_fatal("fsdpc-ckpt init: --%s does not apply to %s models (preset %s)",
                       init_overrides[i].flag, arch->name, preset);
        }
        if (given[i] && fsdp_attr_set(a, cfg, value[i]) < 0) {
            fsdp_die(FSDP_ERR_INVALID, "fsdpc-ckpt init: model config", NULL);
        }
    }
    struct fsdp_model_spec *spec;
    if ((rc = arch->spec_create(cfg, &spec)) < 0) {
        fsdp_die(rc, "fsdpc-ckpt init: model config", NULL);
    }
    free(cfg);

    size_t widest = 0;
    for (int u = 0; u < spec->n_units; u++) {
        widest = spec->unit_numel[u] > widest ? spec->unit_numel[u] : widest;
    }
    float *buf = fsdp_alloc(widest * sizeof(float));
    if (!buf) {
        fsdp_fatal("fsdpc-ckpt init: cannot allocate the %zu-float unit buffer", widest);
    }
    char created_by[256];
    snprintf(created_by, sizeof(created_by), "fsdpc-ckpt init %s (preset %s, seed %lld)",
             PACKAGE_VERSION, preset, seed);
    struct fsdp_model_write_opts wopts = {.created_by = created_by, .dtype = dtype};
    struct fsdp_model_writer *w;
    double t0 = fsdp_now();
    if ((rc = fsdp_model_writer_create(out, spec, &wopts, &w)) < 0) {
        fsdp_die(rc, "fsdpc-ckpt init", NULL);
    }
    for (int u = 0; u < spec->n_units; u++) {
        FSDP_CHECK_GOTO(fsdp_model_init_range(spec, (uint64_t)seed, u, 0, spec->unit_numel[u], buf),
                        rc, fail);
        FSDP_CHECK_GOTO(fsdp_model_writer_put_unit(w, u, buf), rc, fail);
    }
    FSDP_CHECK_GOTO(fsdp_model_writer_commit(w), rc, fail);
    fsdp_model_writer_destroy(w);
    char hb[32], desc[256];
    human_bytes(hb, sizeof(hb), (double)spec->total_numel * (double)fsdp_dtype_size(dtype));
    fsdp_arch_describe(spec->arch, spec->cfg, desc, sizeof(desc));
    printf("%s: %s %s, %zu parameters, %s %s, seed %lld (%.1f s)\n", out, spec->arch->name, desc,
           spec->total_numel, hb, fsdp_dtype_name(dtype), seed, fsdp_now() - t0);
    fsdp_free(buf);
    fsdp_model_spec_destroy(spec);
    return 0;
fail:
    fsdp_model_writer_destroy(w);
    fsdp_die(rc, "fsdpc-ckpt init", NULL);
}

// ----------------------------------------------------------------------------
// inspect

static void inspect_usage(FILE *out)
{
    fprintf(out,
            "usage: fsdpc-ckpt inspect FILE|CHECKPOINT\n"
            "\n"
            "Validates a model file (attributes, every dataset's name, shape and type) and\n"
            "prints its architecture and a table of its tensors. Exit status 0 only when\n"
            "the file is valid. For a checkpoint (a step directory, its index.h5, or a\n"
            "checkpoint root whose 'latest' is followed) it also prints the step, tokens\n"
            "seen, mesh, data-loader and optimizer state and the stored configuration.\n"
            "\n"
            "  -h, --help   this text\n");
}

static int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, rc;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h': inspect_usage(stdout); return 0;
        default: fsdp_ckpt_tool_bad_option("inspect", c, argv);
        }
    }
    if (optind != argc - 1) {
        fsdp_fatal("fsdpc-ckpt inspect: expected one model file, got %d (see --help)",
                   argc - optind);
    }
    if (fsdp_ckpt_is_checkpoint(argv[optind])) {
        return fsdp_ckpt_tool_inspect(argv[optind]);
    }
    struct fsdp_model_file *mf;
    if ((rc = fsdp_model_file_open(argv[optind], fsdp_arch_registered(), &mf)) < 0) {
        fsdp_ckpt_tool_recovery_hint(argv[optind]); /* a step an interrupted save moved aside */
        fsdp_die(rc, "fsdpc-ckpt inspect", NULL);
    }
    const struct fsdp_model_spec *s = fsdp_model_file_spec(mf);
    const char *cb = fsdp_model_file_created_by(mf);
    char attrs[512];
    fsdp_attrs_format(s->arch, s->cfg, attrs, sizeof(attrs));
    printf("file          %s\n", argv[optind]);
    printf("format        %s version %d\n", FSDP_MODEL_FORMAT, FSDP_MODEL_FORMAT_VERSION);
    if (cb[0]) {
        printf("created by    %s\n", cb);
    }
    printf("architecture  %s: %s\n", s->arch->name, attrs);
    fsdp_ckpt_tool_print_tokens(s);
    size_t summed = fsdp_model_file_checksummed(mf);
    if (summed == s->n_params) {
        printf("checksums     xxh3_64 per block, recorded for all %zu tensors (checked as they "
               "are read)\n", summed);
    } else {
        printf("checksums     recorded for %zu of %zu tensors (%s)\n", summed, s->n_params,
               summed ? "the others are read unchecked"
                      : "a file from an fsdpc without them, or another tool: read unchecked");
    }
    printf("units         %d\n\n", s->n_units);
    int wn = 28; /* the name column fits the longest name */
    for (size_t i = 0; i < s->n_params; i++) {
        int n = (int)strlen(s->params[i].name);
        wn = n > wn ? n : wn;
    }
    printf("%-*s %5s  %-14s %-5s %14s\n", wn, "tensor", "unit", "shape", "dtype", "bytes");
    size_t bytes = 0;
    for (size_t i = 0; i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        char shape[48];
        if (p->ndim == 1) {
            snprintf(shape, sizeof(shape), "(%zu,)", p->shape[0]);
        } else {
            snprintf(shape, sizeof(shape), "(%zu, %zu)", p->shape[0], p->shape[1]);
        }
        size_t b = fsdp_model_file_tensor_bytes(mf, i);
        bytes += b;
        printf("%-*s %5d  %-14s %-5s %14zu\n", wn, p->name, p->unit, shape,
               fsdp_model_file_tensor_dtype(mf, i), b);
    }
    char hb[32];
    human_bytes(hb, sizeof(hb), (double)bytes);
    printf("\ntotal         %zu tensors, %zu parameters, %zu bytes (%s)\n", s->n_params,
           s->total_numel, bytes, hb);
    fsdp_model_file_close(mf);
    return 0;
}

// ----------------------------------------------------------------------------
// main

static const struct ckpt_cmd ckpt_cmds[] = {
    {"init", "create a freshly initialised model file", cmd_init},
    {"list", "list the checkpoints of a checkpoint root (a run's --ckpt-dir)",
     fsdp_ckpt_cmd_list},
    {"recover", "put a checkpoint root back in order after a crash, as the next run would",
     fsdp_ckpt_cmd_recover},
    {"inspect", "validate a model file or checkpoint and list its tensors", cmd_inspect},
    {"verify", "check that a checkpoint is complete and readable", fsdp_ckpt_cmd_verify},
    {"consolidate", "write a checkpoint as one model file", fsdp_ckpt_cmd_consolidate},
    {"reshard", "rewrite a checkpoint for another world size or mesh", fsdp_ckpt_cmd_reshard},
    {"convert", "write a model file or checkpoint as a model file of another dtype",
     fsdp_ckpt_cmd_convert},
    {"export-safetensors", "write a model file or checkpoint as Hugging Face GPT-2 safetensors",
     fsdp_ckpt_cmd_export_st},
    {"import-safetensors", "read Hugging Face GPT-2 safetensors into a model file",
     fsdp_ckpt_cmd_import_st},
    {"import-hf", "read a Hugging Face model directory into a model file", fsdp_ckpt_cmd_import_hf},
    {"export-hf", "write a model file or checkpoint as a Hugging Face model directory",
     fsdp_ckpt_cmd_export_hf},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: fsdpc-ckpt COMMAND [options]   (fsdpc %s)\n\ncommands:\n",
            PACKAGE_VERSION);
    for (size_t i = 0; i < sizeof(ckpt_cmds) / sizeof(ckpt_cmds[0]); i++) {
        fprintf(out, "  %-19s %s\n", ckpt_cmds[i].name, ckpt_cmds[i].summary);
    }
    fprintf(out, "\n'fsdpc-ckpt COMMAND --help' describes a command.\n");
}

int fsdp_ckpt_program(int argc, char **argv)
{
    fsdp_log_set_rank(0);
    if (fsdp_model_registry_init() < 0) {
        fsdp_die(FSDP_ERR_INTERNAL, "fsdpc-ckpt: model registry", NULL);
    }
    if (argc < 2) {
        usage(stderr);
        fsdp_fatal("fsdpc-ckpt: missing command");
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("fsdpc-ckpt fsdpc %s\n", PACKAGE_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof(ckpt_cmds) / sizeof(ckpt_cmds[0]); i++) {
        if (strcmp(argv[1], ckpt_cmds[i].name) == 0) {
            return ckpt_cmds[i].run(argc - 1, argv + 1);
        }
    }
    fsdp_fatal("fsdpc-ckpt: unknown command '%s' (see fsdpc-ckpt --help)", argv[1]);
}
