/*
 * train_program.h - fsdpc-train as a function: parses argv, joins the job,
 * trains, and returns the process's exit status (errors abort the job).
 */
#ifndef FSDP_PROGRAMS_TRAIN_PROGRAM_H
#define FSDP_PROGRAMS_TRAIN_PROGRAM_H

int fsdp_train_program(int argc, char **argv);

#endif
