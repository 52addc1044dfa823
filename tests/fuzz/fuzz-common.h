/* SPDX-License-Identifier: MIT */
/*
 * What every proto fuzz target checks beyond "no crash": a message that decodes re-encodes
 * and decodes to the same thing, a failure is one of the documented errors with *ret zeroed,
 * and no fd is leaked or closed twice across an input.
 */
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "util.h"

#define FUZZ_CHECK(cond)                                                                         \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			abort();                                                                 \
		}                                                                                \
	} while (0)

static int fuzz_devnull = -1;
static int fuzz_fd_floor = -1;

/*
 * The lowest free fd number when an input starts must be free again when it ends, or the input
 * leaked an fd. Marked per input, not once: libFuzzer and the sanitizers open fds of their own
 * between inputs (the symbolizer's pipes, for instance).
 */
static inline void fuzz_fd_setup(void)
{
	fuzz_devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	FUZZ_CHECK(fuzz_devnull >= 0);
}

static inline void fuzz_fd_mark(void)
{
	int probe = fcntl(fuzz_devnull, F_DUPFD_CLOEXEC, 0);

	FUZZ_CHECK(probe >= 0);
	fuzz_fd_floor = probe;
	FUZZ_CHECK(close(probe) == 0);
}

static inline void fuzz_fd_check(void)
{
	int probe = fcntl(fuzz_devnull, F_DUPFD_CLOEXEC, 0);

	FUZZ_CHECK(probe >= 0);
	FUZZ_CHECK(probe == fuzz_fd_floor);
	FUZZ_CHECK(close(probe) == 0);
}

static inline int fuzz_fd_new(void)
{
	int fd = fcntl(fuzz_devnull, F_DUPFD_CLOEXEC, 0);

	FUZZ_CHECK(fd >= 0);
	return fd;
}

static inline bool fuzz_all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		if (b[i])
			return false;
	return true;
}

/* m decoded successfully (and owns its fds): re-encode, decode again, compare, then close. */
static inline void fuzz_check_roundtrip(struct proto_msg *m)
{
	static uint8_t buf[PROTO_MAX_MSG], buf2[PROTO_MAX_MSG];
	int fds[PROTO_MAX_FDS], dups[PROTO_MAX_FDS], fds2[PROTO_MAX_FDS];
	struct proto_msg again;
	size_t len, len2, nfds;
	int r;

	r = proto_encode(m, buf, sizeof(buf), &len, fds, &nfds);
	FUZZ_CHECK(r == 0);
	FUZZ_CHECK(nfds == (size_t)proto_type_nfds(m->type));
	/* again gets copies of m's fds: each message owns and frees its own (fds, blobs). */
	for (size_t i = 0; i < nfds; i++)
		FUZZ_CHECK((dups[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 0)) >= 0);
	r = proto_decode(buf, len, dups, nfds, &again);
	FUZZ_CHECK(r == 0);
	FUZZ_CHECK(proto_msg_equal(m, &again, false));
	/* Encoding is deterministic: the copy encodes to the same bytes. */
	r = proto_encode(&again, buf2, sizeof(buf2), &len2, fds2, &nfds);
	FUZZ_CHECK(r == 0 && len2 == len && memcmp(buf, buf2, len) == 0);
	proto_msg_finish(&again);
	proto_msg_finish(m);
	for (size_t i = 0; i < nfds; i++)
		FUZZ_CHECK(fcntl(fds[i], F_GETFD) < 0 && errno == EBADF);
}

static inline void fuzz_check_failure(int r, const struct proto_msg *m)
{
	FUZZ_CHECK(r == -EBADMSG || r == -EPROTONOSUPPORT);
	FUZZ_CHECK(fuzz_all_zero(m, sizeof(*m)));
}
