/*
 * pp_table.c - prints one rank's pipeline table as the runtime logs the
 * passes it ran ("F0 F1 B0 ...") and the schedule's bound on the inputs it
 * holds, for test_pp_equiv.sh to compare with a run's log:
 *   pp_table KIND P M RANK   ->   "F0 F1 B0 B1 | peak 2"
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "parallel/pp_schedule.h"

int main(int argc, char **argv)
{
    enum fsdp_pp_kind kind;
    struct fsdp_pp_schedule s;
    if (argc != 5 || fsdp_pp_kind_parse(argv[1], &kind) < 0) {
        fprintf(stderr, "usage: pp_table gpipe|1f1b P M RANK\n");
        return 2;
    }
    int P = atoi(argv[2]), M = atoi(argv[3]), r = atoi(argv[4]);
    if (fsdp_pp_schedule_create(kind, P, 1, M, r, &s) < 0) {
        fprintf(stderr, "pp_table: no table for %s P %d M %d rank %d\n", argv[1], P, M, r);
        return 1;
    }
    for (size_t i = 0; i < s.n; i++) {
        printf("%s%c%d", i ? " " : "", s.at[i].op == FSDP_PP_FWD ? 'F' : 'B', s.at[i].mb);
    }
    printf(" | peak %zu\n", fsdp_pp_peak_bound(kind, P, 1, M, r));
    fsdp_pp_schedule_free(&s);
    return 0;
}
