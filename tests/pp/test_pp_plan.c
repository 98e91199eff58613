/*
 * test_pp_plan.c - pipeline stages as contiguous blocks of layers: the
 * balanced split's largest stage equals the smallest any split reaches
 * (every composition tried, up to 9 layers and 4 stages, random costs, the
 * 1f1b peaks P - s held); a uniform model splits evenly, and the first
 * stage, which holds the most micro-batches, gets fewer layers; --pp-layers
 * counts and the errors of each malformed one.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "parallel/pp_plan.h"
#include "tests/tap.h"

#define MAXL 9
#define MAXP 4

static uint64_t rng = 88172645463325252ull;

static double next_cost(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng % 1000) + 1;
}

/* The smallest largest stage over every split of layers [a, L) into
 * stages s .. P-1 (brute force). */
static double brute(const struct fsdp_pp_costs *c, int P, const size_t *held, int s, int a,
                    double worst)
{
    if (s == P - 1) {
        double here = fsdp_pp_stage_bytes(c, s, P, a, c->L, held[s]);
        return here > worst ? here : worst;
    }
    double best = INFINITY;
    for (int b = a + 1; b <= c->L - (P - 1 - s); b++) {
        double here = fsdp_pp_stage_bytes(c, s, P, a, b, held[s]);
        double w = brute(c, P, held, s + 1, b, here > worst ? here : worst);
        best = w < best ? w : best;
    }
    return best;
}

static void balanced_is_optimal(void)
{
    int trials = 0, bad = 0;
    for (int L = 1; L <= MAXL; L++) {
        for (int P = 1; P <= MAXP && P <= L; P++) {
            for (int t = 0; t < 20; t++) {
                double param[MAXL], act[MAXL];
                size_t held[MAXP];
                for (int l = 0; l < L; l++) {
                    param[l] = next_cost();
                    act[l] = next_cost() / 10;
                }
                for (int s = 0; s < P; s++) {
                    held[s] = (size_t)(P - s);
                }
                struct fsdp_pp_costs c = {.L = L,
                                          .param = param,
                                          .act = act,
                                          .first = next_cost(),
                                          .last = next_cost(),
                                          .first_act = 1,
                                          .last_act = 7};
                int first[MAXP + 1];
                double peak = -1;
                int rc = fsdp_pp_partition(&c, P, held, first, &peak);
                double want = brute(&c, P, held, 0, 0, 0);
                double got = 0;
                int ok = rc == 0 && first[0] == 0 && first[P] == L;
                for (int s = 0; s < P && ok; s++) {
                    ok = first[s + 1] > first[s];
                    double b = fsdp_pp_stage_bytes(&c, s, P, first[s], first[s + 1], held[s]);
                    got = b > got ? b : got;
                }
                trials++;
                if (!ok || got != want || peak != want) {
                    if (!bad) {
                        tap_diag("L %d P %d: plan's largest stage %.1f (says %.1f), best %.1f", L,
                                 P, got, peak, want);
                    }
                    bad++;
                }
            }
        }
    }
    tap_ok(bad == 0,
           "balanced split: the smallest largest stage of every split, %d of %d random "
           "models",
           trials - bad, trials);
}

static void uniform(void)
{
    double param[8], act[8];
    for (int l = 0; l < 8; l++) {
        param[l] = 100, act[l] = 0;
    }
    size_t held[4] = {1, 1, 1, 1};
    struct fsdp_pp_costs c = {.L = 8, .param = param, .act = act};
    int first[5];
    fsdp_pp_partition(&c, 4, held, first, NULL);
    tap_ok(first[0] == 0 && first[1] == 2 && first[2] == 4 && first[3] == 6 && first[4] == 8,
           "8 equal layers over 4 stages: 2 each (%d %d %d %d)", first[1] - first[0],
           first[2] - first[1], first[3] - first[2], first[4] - first[3]);
    for (int l = 0; l < 8; l++) {
        param[l] = 10, act[l] = 10;
    }
    size_t f1b[4] = {4, 3, 2, 1};
    fsdp_pp_partition(&c, 4, f1b, first, NULL);
    tap_ok(first[1] - first[0] < first[4] - first[3],
           "under 1f1b the first stage, holding 4 micro-batches, gets fewer layers than the last "
           "(%d against %d)",
           first[1] - first[0], first[4] - first[3]);
    int rc = fsdp_pp_partition(&c, 9, f1b, first, NULL);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "at most 8 stages"),
           "more stages than layers: one error (%s)", fsdp_err_msg());
    fsdp_err_clear();
}

static void parse(void)
{
    int first[5];
    int rc = fsdp_pp_layers_parse("5,6,6,5", 22, 4, first);
    tap_ok(rc == 0 && first[0] == 0 && first[1] == 5 && first[2] == 11 && first[3] == 17 &&
               first[4] == 22,
           "--pp-layers 5,6,6,5 of 22 layers");
    static const struct {
        const char *s, *says;
    } bad[] = {
        {"5,6,6", "3 counts for 4"},
        {"5,6,6,5,1", "more counts"},
        {"5,6,6,4", "add up to 21"},
        {"5,0,6,11", "from 1 to 22"},
        {"5,x,6,5", "whole number"},
        {"5,6,6,5,", "whole number"},
        {"", "0 counts for 4"},
        {"5,,6,11", "whole number"},
        {"99999999999999999999,1,1,1", "whole number"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        rc = fsdp_pp_layers_parse(bad[i].s, 22, 4, first);
        tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), bad[i].says) &&
                   !strchr(fsdp_err_msg(), '\n'),
               "--pp-layers '%s': %s", bad[i].s, fsdp_err_msg());
        fsdp_err_clear();
    }
}

int main(void)
{
    fsdp_log_quiet();
    balanced_is_optimal();
    uniform();
    parse();
    return tap_done();
}
