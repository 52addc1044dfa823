/* SPDX-License-Identifier: MIT */
/* Small helpers every component uses: cleanup attributes, -errno conventions, visibility. */
#pragma once

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define _public_       __attribute__((visibility("default")))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _unused_       __attribute__((unused))
#define _cleanup_(f)   __attribute__((cleanup(f)))

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b)     ((a) < (b) ? (a) : (b))
#define MAX(a, b)     ((a) > (b) ? (a) : (b))

/* -errno of the last failure, never 0: for "r = negative_errno();" right after a call. */
static inline int negative_errno(void)
{
	return errno > 0 ? -errno : -EIO;
}

/* Closes fd if valid, preserving errno; returns -1 so "fd = safe_close(fd);" resets it. */
static inline int safe_close(int fd)
{
	if (fd >= 0) {
		int saved = errno;
		(void)close(fd);
		errno = saved;
	}
	return -1;
}

/* The value of one hexadecimal digit, or -1. */
static inline int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static inline void closep(int *fd)
{
	safe_close(*fd);
}

static inline void freep(void *p)
{
	free(*(void **)p);
}

static inline void fclosep(FILE **f)
{
	if (*f)
		(void)fclose(*f);
}

#define _cleanup_close_	 _cleanup_(closep)
#define _cleanup_free_	 _cleanup_(freep)
#define _cleanup_fclose_ _cleanup_(fclosep)

/* Hands ownership out of a cleanup variable: "return TAKE_FD(fd);". */
#define TAKE_FD(fd)              \
	({                       \
		int _fd_ = (fd); \
		(fd) = -1;       \
		_fd_;            \
	})
#define TAKE_PTR(p)                      \
	({                               \
		__typeof__(p) _p_ = (p); \
		(p) = NULL;              \
		_p_;                     \
	})
