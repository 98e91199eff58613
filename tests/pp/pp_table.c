/*
 * pp_table.c - prints one rank's pipeline table as the runtime logs the
 * passes it ran ("F0 F1 B0 ...") and the schedule's bound on the inputs it
 * holds, for test_pp_equiv.sh to compare with a run's log:
 *   pp_table KIND P M RANK [V]   ->   "F0 F1 B0 B1 | peak 2"
 * (with V > 1 each pass names its chunk: "F0.0 F1.0 F0.1 ...").
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "parallel/pp_schedule.h"

int main(int argc, char **argv)
{
    enum fsdp_pp_kind kind;
    struct fsdp_pp_schedule s;
    if ((argc != 5 && argc != 6) || fsdp_pp_kind_parse(argv[1], &kind) < 0) {
        fprintf(stderr, "usage: pp_table gpipe|1f1b|interleaved P M RANK [V]\n");
        return 2;
    }
    int P = atoi(argv[2]), M = atoi(argv[3]), r = atoi(argv[4]), V = argc == 6 ? atoi(argv[5]) : 1;
    if (fsdp_pp_schedule_create(kind, P, V, M, r, &s) < 0) {
        fprintf(stderr, "pp_table: no table for %s P %d M %d rank %d\n", argv[1], P, M, r);
        return 1;
    }
    for (size_t i = 0; i < s.n; i++) {
        printf("%s%c%d", i ? " " : "", s.at[i].op == FSDP_PP_FWD ? 'F' : 'B', s.at[i].mb);
        if (V > 1) {
            printf(".%d", s.at[i].chunk);
        }
    }
    printf(" | peak %zu\n", fsdp_pp_peak_bound(kind, P, V, M, r));
    fsdp_pp_schedule_free(&s);
    return 0;
}
