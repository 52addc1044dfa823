/* SPDX-License-Identifier: MIT */
/*
 * Shared by every cmocka test. Include after <cmocka.h>'s prerequisites:
 *   #include <stdarg.h> <stddef.h> <stdint.h> <setjmp.h> <cmocka.h>
 */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

/*
 * A missing precondition (root, BPF, CRIU, ...) skips the test with the reason, explicitly.
 * Under BELAYER_TEST_NO_SKIP=1 (set by tools/dev test when CI=true) it fails instead: CI
 * provides every precondition, so a skip there is a failure to investigate.
 */
#define TEST_REQUIRE(cond, ...)                                        \
	do {                                                           \
		if (!(cond)) {                                         \
			test_precondition_missing(#cond, __VA_ARGS__); \
			return;                                        \
		}                                                      \
	} while (0)

void test_precondition_missing(const char *cond, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

bool test_is_root(void);

/* A fresh temporary directory for this test (removed recursively by test_rmtree). */
char *test_mkdtemp(const char *prefix);
int test_rmtree(const char *path);
/* dir/name written with text (asserted). */
void test_put_file(const char *dir, const char *name, const char *text);

/* Waits up to ms for the child pid to exit and returns its wait status. A child still there
 * then is a hang: the test fails naming what (with each thread's state and wait channel) and
 * the child is killed, instead of the test hanging until meson's timeout. */
int test_reap_within(pid_t pid, int ms, const char *what);
