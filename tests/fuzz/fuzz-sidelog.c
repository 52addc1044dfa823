/* SPDX-License-Identifier: MIT */
/*
 * An environment's side-effect log (supervisor-sidelog.h) on arbitrary bytes: the input is
 * written to a file and sidelog_read() walks it with a callback that reads every field of
 * every entry (so ASan sees any string that is not NUL-terminated or outlives its zone). No
 * crash, no leak, no fd left open, and an error is -EBADMSG.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz-common.h"
#include "supervisor-sidelog.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t touch(const char *s)
{
	return s ? strlen(s) : 0;
}

static int on_entry(const struct sidelog_entry *e, void *userdata)
{
	uint64_t *sum = userdata;

	FUZZ_CHECK(memchr(e->kind, '\0', sizeof(e->kind)));
	FUZZ_CHECK(e->argc <= SIDELOG_ARGV_MAX);
	*sum += strlen(e->kind) + e->ts_ns + (uint64_t)e->pid + e->env_id + touch(e->op) +
		touch(e->path) + touch(e->path2) + touch(e->reason) + touch(e->exe) +
		(uint64_t)e->child + (uint64_t)e->code;
	for (size_t i = 0; i < e->argc; i++) {
		FUZZ_CHECK(e->argv[i]);
		*sum += touch(e->argv[i]);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char tmp[] = "/tmp/fuzz-sidelog-XXXXXX", path[64];
	static int fd = -1;
	uint64_t sum = 0;
	int r;

	if (fuzz_devnull < 0) {
		fuzz_fd_setup();
		/* One unlinked file for the whole run, rewritten per input, read by its name in
		 * /proc as sidelog_read() takes a path. */
		fd = mkstemp(tmp);
		FUZZ_CHECK(fd >= 0);
		FUZZ_CHECK(unlink(tmp) == 0);
		(void)snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	}
	FUZZ_CHECK(ftruncate(fd, 0) == 0);
	for (size_t off = 0; off < size;) {
		ssize_t n = pwrite(fd, data + off, size - off, (off_t)off);

		FUZZ_CHECK(n > 0);
		off += (size_t)n;
	}
	fuzz_fd_mark();
	r = sidelog_read(path, on_entry, &sum);
	FUZZ_CHECK(r == 0 || r == -EBADMSG);
	fuzz_fd_check();
	return 0;
}
