/*
 * sample_program.h - fsdpc-sample as a function (sample_program.c), so that
 * a test program can run it with a device of its own (a registered one).
 */
#ifndef FSDP_PROGRAMS_SAMPLE_PROGRAM_H
#define FSDP_PROGRAMS_SAMPLE_PROGRAM_H

/* fsdpc-sample's main: argv as the program's; returns its exit status. */
int fsdp_sample_program(int argc, char **argv);

#endif
