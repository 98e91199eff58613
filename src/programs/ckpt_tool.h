/*
 * ckpt_tool.h - fsdpc-ckpt's checkpoint subcommands (ckpt_tool.c): each takes
 * its own argv (argv[0] the subcommand name), parses its flags, prints, and
 * returns the exit status; errors end the program with one line.
 */
#ifndef FSDP_PROGRAMS_CKPT_TOOL_H
#define FSDP_PROGRAMS_CKPT_TOOL_H

struct fsdp_model_spec;

/* The whole of fsdpc-ckpt (ckpt_program.c): the built-in architectures are
 * registered, then argv[1] names the subcommand; returns the exit status. */
int fsdp_ckpt_program(int argc, char **argv);

/* Exits naming the option getopt refused (c: its return, '?' or ':'). */
_Noreturn void fsdp_ckpt_tool_bad_option(const char *cmd, int c, char **argv);

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
