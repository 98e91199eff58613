/*
 * cli.h - what the programs with subcommands (fsdpc-ckpt, fsdpc-data) do
 * with core/options.h: pick the subcommand, parse its flags and operands
 * from its table, print its generated --help, or end the program with one
 * line that names the bad flag and where its help is. Programs only: this
 * exits.
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

/* One subcommand of a program: its name, its line in the program's usage,
 * and what runs it (argv[0]: the name). */
struct fsdp_cli_sub {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
};

/* A program made of subcommands (fsdpc-ckpt, fsdpc-data). */
struct fsdp_cli_program {
    const char *name;                /* "fsdpc-ckpt" */
    const struct fsdp_cli_sub *cmds; /* (n,) */
    size_t n;
    int width; /* of the name column in the usage */
};

/*
 * The program's main after its setup: -h/--help prints the usage (a line per
 * subcommand), --version the version, a subcommand's name runs it with the
 * rest of argv and returns what it returns. No argument, or an unknown one,
 * ends the program with one line that says so.
 */
int fsdp_cli_main(const struct fsdp_cli_program *p, int argc, char **argv);

#endif
