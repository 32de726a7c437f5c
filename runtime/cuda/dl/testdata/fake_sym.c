/* A tiny library for the dl tests: a few functions with mixed argument
 * kinds, so binding and calling through purego can be checked. */
#include <stdint.h>

int32_t fake_add(int32_t a, int32_t b) { return a + b; }

/* Mixed integer and floating arguments land in different register files. */
double fake_affine(double x, float scale, int64_t shift) { return x * scale + (double)shift; }

uint64_t fake_version(void) { return 42; }

#ifndef NO_NEW
uint64_t fake_version_v2(void) { return 43; }
#endif

const char *fake_name(void) { return "fake library"; }
