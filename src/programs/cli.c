/*
 * cli.c - subcommand flags through the one option parser (see cli.h).
 */
#include "config.h"
#include "programs/cli.h"
#include "core/error.h"

#include <stdio.h>
#include <string.h>

int fsdp_cli_parse(struct fsdp_optset *s, int argc, char **argv, const char *synopsis)
{
    int rc = fsdp_opt_parse(s, argc, argv, NULL);
    if (rc == 1) {
        fsdp_opt_usage(s, stdout, synopsis);
        return 1;
    }
    if (rc < 0) {
        fsdp_fatal("%s: %s", s->prog, fsdp_err_msg());
    }
    return 0;
}

const char *fsdp_cli_operand(const struct fsdp_optset *s, const char *what)
{
    if (s->n_operands != 1) {
        fsdp_fatal("%s: expected one %s, got %d (see --help)", s->prog, what, s->n_operands);
    }
    return s->operand[0];
}

int fsdp_cli_command(const char *program, const struct fsdp_cli_cmd *cmd, void *base, int argc,
                     char **argv, struct fsdp_optset *set)
{
    static char prog[96]; /* what messages and --help call the command */
    snprintf(prog, sizeof(prog), "%s %s", program, argv[0]);
    *set = (struct fsdp_optset){.prog = prog,
                                .opts = cmd->opts,
                                .n = cmd->n,
                                .base = base,
                                .about = cmd->about,
                                .operands = 1,
                                .abbreviations = 1};
    return fsdp_cli_parse(set, argc, argv, cmd->synopsis);
}

static void cli_usage(const struct fsdp_cli_program *p, FILE *out)
{
    fprintf(out, "usage: %s COMMAND [options]   (fsdpc %s)\n\ncommands:\n", p->name,
            PACKAGE_VERSION);
    for (size_t i = 0; i < p->n; i++) {
        fprintf(out, "  %-*s %s\n", p->width, p->cmds[i].name, p->cmds[i].summary);
    }
    fprintf(out, "\n'%s COMMAND --help' describes a command.\n", p->name);
}

int fsdp_cli_main(const struct fsdp_cli_program *p, int argc, char **argv)
{
    if (argc < 2) {
        cli_usage(p, stderr);
        fsdp_fatal("%s: missing command", p->name);
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        cli_usage(p, stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("%s fsdpc %s\n", p->name, PACKAGE_VERSION);
        return 0;
    }
    for (size_t i = 0; i < p->n; i++) {
        if (strcmp(argv[1], p->cmds[i].name) == 0) {
            return p->cmds[i].run(argc - 1, argv + 1);
        }
    }
    fsdp_fatal("%s: unknown command '%s' (see %s --help)", p->name, argv[1], p->name);
}
