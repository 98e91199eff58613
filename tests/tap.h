/*
 * tap.h - a tiny TAP producer for the test programs (automake's tap-driver
 * counts every "ok"/"not ok" line as one test).
 *
 *   tap_ok(cond, "allreduce f32 sum n=%zu", n);
 *   tap_skip("no GPU: %s", why);
 *   return tap_done();        // prints the plan, exit status 0/1
 *
 * Failures should print a diff with tap_diag (max abs/rel error, first bad
 * index) before the "not ok" line.
 */
#ifndef FSDP_TESTS_TAP_H
#define FSDP_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>

static int tap_count_;
static int tap_failed_;

__attribute__((format(printf, 2, 3), unused)) static int tap_ok(int cond, const char *fmt, ...)
{
    va_list ap;
    tap_count_++;
    printf("%s %d - ", cond ? "ok" : "not ok", tap_count_);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (!cond) {
        tap_failed_++;
    }
    return cond;
}

__attribute__((format(printf, 1, 2), unused)) static void tap_skip(const char *fmt, ...)
{
    va_list ap;
    tap_count_++;
    printf("ok %d # SKIP ", tap_count_);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

__attribute__((format(printf, 1, 2), unused)) static void tap_diag(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

__attribute__((unused)) static int tap_done(void)
{
    printf("1..%d\n", tap_count_);
    fflush(stdout);
    return tap_failed_ ? 1 : 0;
}

#endif
