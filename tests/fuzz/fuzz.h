/*
 * fuzz.h - what the reader fuzz harnesses share (libFuzzer entry points in
 * fuzz_<reader>.c, built and run by run_fuzz.sh through `make fuzz`; never
 * part of `make check`): a scratch directory of the process's own, the input
 * written there as a file (the readers take paths), and counts of accepted
 * and refused inputs kept in $FSDPC_FUZZ_STATS.<pid>.
 *
 * A reader that leaves an HDF5 object open after it returns is a bug (the
 * next open of the same name would see the stale file): fuzz_done traps,
 * so libFuzzer keeps the input as a crash.
 */
#ifndef FSDP_TESTS_FUZZ_H
#define FSDP_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Once per process: the architecture registry, quiet logs, the scratch dir. */
void fuzz_init(void);
/* The scratch directory (no trailing slash). */
const char *fuzz_dir(void);
/* Writes data to <scratch>/name as a new file (a new inode each time) and
 * returns its path in a static buffer. */
const char *fuzz_write(const char *name, const uint8_t *data, size_t size);
/* Copies the file src to <scratch>/name; 0 or -1. */
int fuzz_copy(const char *src, const char *name);
/* Counts the input as accepted (rc 0) or refused, clears the error record
 * and traps on a leaked HDF5 object. */
void fuzz_done(int rc);

#endif
