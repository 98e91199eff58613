/*
 * cli.h - what the programs with subcommands (fsdpc-ckpt, fsdpc-data) do
 * with core/options.h: parse a subcommand's flags and operands from its
 * table, print its generated --help, or end the program with one line that
 * names the bad flag and where its help is. Programs only: this exits.
 */
#ifndef FSDP_PROGRAMS_CLI_H
#define FSDP_PROGRAMS_CLI_H

#include "core/options.h"

/*
 * Parses argv[1..argc) into s (s->prog names the command: "fsdpc-ckpt
 * init"). Returns 1 after printing the --help text ("usage: PROG
 * SYNOPSIS", s->about, the options), 0 when parsed; ends the program with
 * "PROG: message" on an error.
 */
int fsdp_cli_parse(struct fsdp_optset *s, int argc, char **argv, const char *synopsis);

/* A subcommand's flags and help: its table, its synopsis (after "usage:
 * PROGRAM COMMAND "), and the paragraphs --help prints above the options. */
struct fsdp_cli_cmd {
    const char *synopsis;
    const char *about;
    const struct fsdp_opt *opts; /* (n,) */
    size_t n;
};

/*
 * Parses a subcommand's argv (argv[0]: its name) into base with cmd's table,
 * operands allowed; set says afterwards what was given and holds the
 * operands. Returns 1 after printing --help, else 0; a bad flag ends the
 * program with "PROGRAM COMMAND: message".
 */
int fsdp_cli_command(const char *program, const struct fsdp_cli_cmd *cmd, void *base, int argc,
                     char **argv, struct fsdp_optset *set);

/* The one operand the command takes (what: "checkpoint path"); ends the
 * program with "PROG: expected one WHAT, got N (see --help)" otherwise. */
const char *fsdp_cli_operand(const struct fsdp_optset *s, const char *what);

#endif
