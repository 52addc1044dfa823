/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test-util.h"

void test_precondition_missing(const char *cond, const char *fmt, ...)
{
	char reason[512];
	va_list ap;
	const char *no_skip = getenv("BELAYER_TEST_NO_SKIP");

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);

	if (no_skip && strcmp(no_skip, "0") != 0)
		fail_msg("precondition missing (%s): %s; BELAYER_TEST_NO_SKIP forbids skipping",
			 cond, reason);
	print_message("[ SKIP     ] precondition missing (%s): %s\n", cond, reason);
	skip();
}

bool test_is_root(void)
{
	return geteuid() == 0;
}

char *test_mkdtemp(const char *prefix)
{
	char *path = NULL;
	const char *tmp = getenv("TMPDIR");

	if (asprintf(&path, "%s/%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix) < 0)
		return NULL;
	if (!mkdtemp(path)) {
		free(path);
		return NULL;
	}
	return path;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)type;
	(void)ftw;
	return remove(path) < 0 ? -1 : 0;
}

int test_rmtree(const char *path)
{
	return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) < 0 ? -1 : 0;
}

void test_put_file(const char *dir, const char *name, const char *text)
{
	char path[PATH_MAX];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "we");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}
