/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
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

/* Each thread of pid: its state and where it waits (wchan), then the kernel stack of the
 * main thread where readable: what a hung process was doing. */
static void print_tasks(pid_t pid)
{
	char path[320], line[512];
	DIR *d;
	struct dirent *e;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		return;
	while ((e = readdir(d))) {
		char comm[64] = "", wchan[128] = "", state = '?';
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, e->d_name);
		f = fopen(path, "re");
		if (f && fgets(line, sizeof(line), f)) {
			char *open = strchr(line, '('), *close = strrchr(line, ')');

			if (open && close && close > open) {
				snprintf(comm, sizeof(comm), "%.*s", (int)(close - open - 1),
					 open + 1);
				state = close[2];
			}
		}
		if (f)
			fclose(f);
		snprintf(path, sizeof(path), "/proc/%d/task/%s/wchan", (int)pid, e->d_name);
		f = fopen(path, "re");
		if (f && !fgets(wchan, sizeof(wchan), f))
			wchan[0] = '\0';
		if (f)
			fclose(f);
		print_message("  task %s (%s): state %c, waits in %s\n", e->d_name, comm, state,
			      wchan[0] ? wchan : "-");
	}
	closedir(d);
	snprintf(path, sizeof(path), "/proc/%d/stack", (int)pid);
	{
		FILE *f = fopen(path, "re");

		while (f && fgets(line, sizeof(line), f))
			print_message("  stack: %s", line);
		if (f)
			fclose(f);
	}
}

int test_reap_within(pid_t pid, int ms, const char *what)
{
	struct timespec slice = {.tv_nsec = 10 * 1000 * 1000};
	int status = 0;

	for (int waited = 0;; waited += 10) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid || (r < 0 && errno != EINTR))
			return status;
		if (waited >= ms)
			break;
		(void)nanosleep(&slice, NULL);
	}
	print_message("%s (pid %d) did not exit within %d ms:\n", what, (int)pid, ms);
	print_tasks(pid);
	(void)kill(pid, SIGKILL);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	fail_msg("%s (pid %d) did not exit within %d ms (killed)", what, (int)pid, ms);
	return status;
}
