/*
 * ckpt_tool.h - fsdpc-ckpt's checkpoint subcommands (ckpt_tool.c): each takes
 * its own argv (argv[0] the subcommand name), parses its flags with its own
 * option table (programs/cli.h), prints, and returns the exit status; errors
 * end the program with one line.
 */
#ifndef FSDP_PROGRAMS_CKPT_TOOL_H
#define FSDP_PROGRAMS_CKPT_TOOL_H

#include "core/dtype.h"
#include "programs/cli.h"

struct fsdp_model_spec;
struct fsdp_param_spec;
struct fsdp_ckpt;
struct fsdp_model_file;

#define FSDP_CKPT_TOOL_PATH 4096

/* The flags of the checkpoint subcommands, one struct: each command's
 * table points at the fields it takes (init has its own, ckpt_program.c). */
struct fsdp_ckpt_args {
    int n_operands;                          /* how many the command was given (the parse's) */
    char out[FSDP_CKPT_TOOL_PATH];           /* -o, --output */
    enum fsdp_dtype dtype;                   /* --dtype */
    int quiet, scan_nan;                     /* verify */
    int quick, verify;                       /* list */
    int with_optimizer;                      /* consolidate */
    long world_size;                         /* reshard: 0 unless given */
    char mesh[256];                          /* reshard */
    long heads;                              /* import-safetensors: 0 unless given */
    double ln_eps;                           /* import-safetensors: 0 unless given */
    char max_shard_size[64];                 /* export-hf */
    int force;                               /* export-hf */
    char tokenizer[FSDP_CKPT_TOOL_PATH];     /* export-hf */
    char bos_token_id[32], eos_token_id[32]; /* export-hf, checked against the model */
};

/* Parses a subcommand's argv into a with cmd's table: 1 after --help, else
 * 0 with *in the one operand, or NULL when there is not exactly one (how
 * many there were: a->n_operands). */
int fsdp_ckpt_tool_parse(const struct fsdp_cli_cmd *cmd, struct fsdp_ckpt_args *a, int argc,
                         char **argv, const char **in);
/* The same for a command that turns one input into -o OUTPUT (argv[0]: its
 * name): without both, ends the program with "fsdpc-ckpt NAME: expected one
 * INPUT and -o OUTPUT (see --help)". */
int fsdp_ckpt_tool_parse_io(const struct fsdp_cli_cmd *cmd, struct fsdp_ckpt_args *a, int argc,
                            char **argv, const char **in, const char *input, const char *output);

/* The whole of fsdpc-ckpt (ckpt_program.c): the built-in architectures are
 * registered, then argv[1] names the subcommand; returns the exit status. */
int fsdp_ckpt_program(int argc, char **argv);

/* The weights an export or a conversion reads: a model file or a
 * checkpoint, whichever the path is (the other NULL). */
struct fsdp_ckpt_source {
    struct fsdp_ckpt *ck;
    struct fsdp_model_file *mf;
};
/* Opens path into src and returns its spec; ends the program with "WHAT:
 * message" when it cannot. */
const struct fsdp_model_spec *fsdp_ckpt_source_open(const char *what, const char *path,
                                                    struct fsdp_ckpt_source *src);
/* Parameter i (p) as f32 into dst. */
int fsdp_ckpt_source_read(const struct fsdp_ckpt_source *src, size_t i,
                          const struct fsdp_param_spec *p, float *dst);
void fsdp_ckpt_source_close(struct fsdp_ckpt_source *src);

/* b bytes for people: "512 B", or with decimals digits "1.5 MiB" up to TiB. */
void fsdp_ckpt_tool_bytes(char *buf, size_t len, double b, int decimals);

/* Prints a checkpoint's state and tensor table; 0 on success. */
int fsdp_ckpt_tool_inspect(const char *path);
/* inspect's line of the special-token ids spec carries (or that it has none). */
void fsdp_ckpt_tool_print_tokens(const struct fsdp_model_spec *s);

int fsdp_ckpt_cmd_verify(int argc, char **argv);
int fsdp_ckpt_cmd_consolidate(int argc, char **argv);
int fsdp_ckpt_cmd_reshard(int argc, char **argv);
int fsdp_ckpt_cmd_convert(int argc, char **argv);
/* ckpt_list.c: the checkpoints of a checkpoint root */
int fsdp_ckpt_cmd_list(int argc, char **argv);
int fsdp_ckpt_cmd_recover(int argc, char **argv);
/* After a failed open of path: a hint when an interrupted save moved the
 * step aside in its root (ckpt_list.c). */
void fsdp_ckpt_tool_recovery_hint(const char *path);

/* st_tool.c: Hugging Face GPT-2 safetensors */
int fsdp_ckpt_cmd_export_st(int argc, char **argv);
int fsdp_ckpt_cmd_import_st(int argc, char **argv);
/* hf_tool.c: Hugging Face model directories (import-hf, export-hf) */
int fsdp_ckpt_cmd_import_hf(int argc, char **argv), fsdp_ckpt_cmd_export_hf(int argc, char **argv);

#endif
