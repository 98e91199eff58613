/*
 * pp_plan.c - pipeline stages as contiguous blocks of layers (pp_plan.h):
 * the split that balances each stage's memory, and the split a user gives.
 */
#include "parallel/pp_plan.h"

#include <errno.h>
#include <float.h>
#include <stdlib.h>

#include "core/error.h"

double fsdp_pp_stage_bytes(const struct fsdp_pp_costs *c, int s, int P, int a, int b, size_t held)
{
    double bytes = 0, act = 0;
    for (int l = a; l < b; l++) {
        bytes += c->param[l];
        act += c->act[l];
    }
    if (s == 0) {
        bytes += c->first;
        act += c->first_act;
    }
    if (s == P - 1) {
        bytes += c->last;
        act += c->last_act;
    }
    return bytes + act * (double)held;
}

/*
 * Dynamic programming over (stage, layers placed): best[s][j] is the
 * smallest largest stage for stages 0 .. s holding layers [0, j); from[s][j]
 * where stage s starts in that split. O(P L^2) stage sums, each O(L):
 * nothing a model has layers enough to notice.
 */
int fsdp_pp_partition(const struct fsdp_pp_costs *c, int P, const size_t *held, int *first,
                      double *peak)
{
    const int L = c->L;
    if (P < 1 || L < P) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "pipeline: %d stages of a model of %d layers: each "
                        "stage needs a layer, so use at most %d stages",
                        P, L, L);
    }
    size_t n = (size_t)P * (size_t)(L + 1);
    double *best = malloc(n * sizeof(double));
    int *from = malloc(n * sizeof(int));
    if (!best || !from) {
        free(best);
        free(from);
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline plan of %d stages", P);
    }
#define AT(s, j) ((size_t)(s) * (size_t)(L + 1) + (size_t)(j))
    for (size_t i = 0; i < n; i++) {
        best[i] = DBL_MAX; /* no split reaches (s, j) */
    }
    for (int s = 0; s < P; s++) {
        /* stage s ends at layer j: stages 0 .. s take at least s + 1 layers,
         * and leave at least P - 1 - s for the rest; the first starts at 0 */
        for (int j = s + 1; j <= L - (P - 1 - s); j++) {
            for (int a = s; a < (s == 0 ? 1 : j); a++) { /* stage s holds [a, j) */
                double before = s == 0 ? 0 : best[AT(s - 1, a)];
                if (before == DBL_MAX) {
                    continue;
                }
                double here = fsdp_pp_stage_bytes(c, s, P, a, j, held[s]);
                double worst = before < here ? here : before;
                if (worst < best[AT(s, j)]) {
                    best[AT(s, j)] = worst;
                    from[AT(s, j)] = a;
                }
            }
        }
    }
    first[P] = L;
    for (int s = P - 1; s >= 0; s--) {
        first[s] = from[AT(s, first[s + 1])];
    }
    if (peak) {
        *peak = best[AT(P - 1, L)];
    }
#undef AT
    free(best);
    free(from);
    return 0;
}

int fsdp_pp_layers_parse(const char *s, int L, int P, int *first)
{
    const char *p = s ? s : "";
    int k = 0, at = 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > L || (*end && *end != ',') ||
            (*end == ',' && !end[1])) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "--pp-layers '%s': each stage's layer count must "
                            "be a whole number from 1 to %d, separated by commas",
                            s, L);
        }
        if (k == P) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "--pp-layers '%s': more counts than the %d "
                            "pipeline stages",
                            s, P);
        }
        first[k++] = at;
        at += (int)v;
        p = *end ? end + 1 : end;
    }
    if (k != P) {
        return fsdp_err(FSDP_ERR_INVALID, "--pp-layers '%s': %d counts for %d pipeline stages",
                        s ? s : "", k, P);
    }
    if (at != L) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "--pp-layers '%s': the counts add up to %d layers, the "
                        "model has %d",
                        s, at, L);
    }
    first[P] = L;
    return 0;
}
