/* SPDX-License-Identifier: MIT */
/*
 * What an environment is refused of the host's /etc (supervisor-env-etc.h): the scan's rule on
 * a tree of every kind of object and mode, its bounds, and its cost on this host's /etc. Suite
 * sandbox runs the masks themselves in real environments (test-sandbox.sh).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "supervisor-env-etc.h"
#include "test-util.h"
#include "util.h"

static void make(const char *root, const char *rel, mode_t mode)
{
	char path[PATH_MAX];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	if (S_ISDIR(mode)) {
		assert_int_equal(mkdir(path, 0755), 0);
	} else if (S_ISFIFO(mode)) {
		assert_int_equal(mkfifo(path, 0644), 0);
	} else {
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		assert_true(fd >= 0);
		assert_int_equal(write(fd, "x", 1), 1);
		close(fd);
	}
	/* chmod after: the umask would take bits off */
	assert_int_equal(chmod(path, mode & 07777), 0);
}

static const struct env_etc_mask *find(const struct env_etc_masks *m, const char *path)
{
	for (size_t i = 0; i < m->n; i++)
		if (strcmp(m->v[i].path, path) == 0)
			return &m->v[i];
	return NULL;
}

static void rule(void **state)
{
	_cleanup_free_ char *etc = test_mkdtemp("belayer-etc");
	struct env_etc_masks m = {0};
	char path[PATH_MAX];

	(void)state;
	assert_non_null(etc);
	assert_int_equal(chmod(etc, 0755), 0);
	make(etc, "passwd", S_IFREG | 0644);
	make(etc, "shadow", S_IFREG | 0640); /* root:shadow: the group reads, others not */
	make(etc, "secret", S_IFREG | 0600);
	make(etc, "wronly", S_IFREG | 0602); /* others write but do not read */
	make(etc, "fifo", S_IFIFO | 0600);   /* not a regular file: masked all the same */
	make(etc, "ssl", S_IFDIR | 0755);
	make(etc, "ssl/cert.pem", S_IFREG | 0644);
	make(etc, "ssl/private", S_IFDIR | 0700);
	make(etc, "ssl/private/key.pem", S_IFREG | 0644); /* below a mask: not looked at */
	make(etc, "traverse", S_IFDIR | 0711); /* others enter by name, cannot list: masked */
	make(etc, "traverse/a", S_IFREG | 0600);
	make(etc, "listonly", S_IFDIR | 0754); /* others list, cannot enter: masked */
	make(etc, "deep", S_IFDIR | 0755);
	make(etc, "deep/er", S_IFDIR | 0755);
	make(etc, "deep/er/key", S_IFREG | 0400);
	/* symlinks are never followed: to a secret (masked on its own), to a directory, out */
	snprintf(path, sizeof(path), "%s/to-secret", etc);
	assert_int_equal(symlink("secret", path), 0);
	snprintf(path, sizeof(path), "%s/to-private", etc);
	assert_int_equal(symlink("ssl/private", path), 0);
	snprintf(path, sizeof(path), "%s/loop", etc);
	assert_int_equal(symlink(".", path), 0);

	assert_int_equal(env_etc_scan(etc, &m), 0);
	assert_int_equal(m.n, 8);
	assert_false(find(&m, "shadow")->dir);
	assert_false(find(&m, "secret")->dir);
	assert_false(find(&m, "wronly")->dir);
	assert_false(find(&m, "fifo")->dir);
	assert_true(find(&m, "ssl/private")->dir);
	assert_true(find(&m, "traverse")->dir);
	assert_true(find(&m, "listonly")->dir);
	assert_false(find(&m, "deep/er/key")->dir);
	env_etc_masks_finish(&m);

	/* an /etc closed to others altogether: all of it */
	assert_int_equal(chmod(etc, 0700), 0);
	assert_int_equal(env_etc_scan(etc, &m), 0);
	assert_int_equal(m.n, 1);
	assert_string_equal(m.v[0].path, "");
	assert_true(m.v[0].dir);
	env_etc_masks_finish(&m);
	assert_int_equal(chmod(etc, 0755), 0);

	/* a symlink for /etc itself is refused, not followed */
	snprintf(path, sizeof(path), "%s/loop", etc);
	{
		int r = env_etc_scan(path, &m);

		assert_true(r == -ELOOP || r == -ENOTDIR);
	}
	assert_int_equal(m.n, 0);
	assert_int_equal(test_rmtree(etc), 0);
}

static void bounds(void **state)
{
	_cleanup_free_ char *etc = test_mkdtemp("belayer-etc");
	struct env_etc_masks m = {0};
	char rel[PATH_MAX] = "", name[32];
	size_t len = 0;

	(void)state;
	assert_non_null(etc);
	assert_int_equal(chmod(etc, 0755), 0);
	/* ENV_ETC_DEPTH_MAX levels walk; one more is refused */
	for (int i = 0; i < ENV_ETC_DEPTH_MAX; i++) {
		len += (size_t)snprintf(rel + len, sizeof(rel) - len, "%sd", len ? "/" : "");
		make(etc, rel, S_IFDIR | 0755);
	}
	assert_int_equal(env_etc_scan(etc, &m), 0);
	assert_int_equal(m.n, 0);
	snprintf(rel + len, sizeof(rel) - len, "/d");
	make(etc, rel, S_IFDIR | 0755);
	assert_int_equal(env_etc_scan(etc, &m), -ELOOP);
	assert_int_equal(m.n, 0);
	/* closed, the deepest one is masked, not walked */
	{
		char path[PATH_MAX];

		snprintf(path, sizeof(path), "%s/%s", etc, rel);
		assert_int_equal(chmod(path, 0700), 0);
	}
	assert_int_equal(env_etc_scan(etc, &m), 0);
	assert_int_equal(m.n, 1);
	assert_true(m.v[0].dir);
	env_etc_masks_finish(&m);
	assert_int_equal(test_rmtree(etc), 0);
	free(etc);

	/* more masks than ENV_ETC_MASKS_MAX */
	etc = test_mkdtemp("belayer-etc");
	assert_non_null(etc);
	assert_int_equal(chmod(etc, 0755), 0);
	for (int i = 0; i <= ENV_ETC_MASKS_MAX; i++) {
		snprintf(name, sizeof(name), "s%d", i);
		make(etc, name, S_IFREG | 0600);
	}
	assert_int_equal(env_etc_scan(etc, &m), -E2BIG);
	assert_int_equal(m.n, 0);
	assert_int_equal(test_rmtree(etc), 0);
	free(etc);

	/* more entries than ENV_ETC_ENTRIES_MAX (readable ones: no mask, only the walk) */
	etc = test_mkdtemp("belayer-etc");
	assert_non_null(etc);
	assert_int_equal(chmod(etc, 0755), 0);
	for (int i = 0; i <= ENV_ETC_ENTRIES_MAX; i++) {
		char path[PATH_MAX];

		snprintf(path, sizeof(path), "%s/p%d", etc, i);
		assert_int_equal(mkfifo(path, 0644), 0);
	}
	assert_int_equal(env_etc_scan(etc, &m), -E2BIG);
	assert_int_equal(m.n, 0);
	assert_int_equal(test_rmtree(etc), 0);
}

/* This host's /etc: what a launch pays (README "Sandbox" quotes it). */
static void host_etc(void **state)
{
	struct env_etc_masks m = {0};
	struct timespec a, b;
	double best = 1e9;

	(void)state;
	for (int i = 0; i < 20; i++) {
		clock_gettime(CLOCK_MONOTONIC, &a);
		assert_int_equal(env_etc_scan("/etc", &m), 0);
		clock_gettime(CLOCK_MONOTONIC, &b);
		if ((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6 < best)
			best = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
		if (i < 19)
			env_etc_masks_finish(&m);
	}
	printf("/etc: %zu entries, %zu masked, best of 20 scans %.2f ms\n", m.entries, m.n, best);
	for (size_t i = 0; i < m.n; i++)
		printf("  %s /etc/%s\n", m.v[i].dir ? "tmpfs" : "null ", m.v[i].path);
	/* the host's own secrets are among them when they are there (Debian: always) */
	if (access("/etc/shadow", F_OK) == 0)
		assert_non_null(find(&m, "shadow"));
	env_etc_masks_finish(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(rule),
		cmocka_unit_test(bounds),
		cmocka_unit_test(host_etc),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
