/* SPDX-License-Identifier: MIT */
/*
 * The bodies of decoded msgpack strs. msgpack-c leaves a str's ptr NULL when its size is 0, and
 * memchr/memcpy/memcmp must not be given NULL even for 0 bytes (UBSan: "null pointer passed as
 * argument declared to never be null"): the decoders touch str bodies only through these.
 */
#pragma once

#include <stdbool.h>
#include <string.h>

#include <msgpack.h>

/* A str of at most max bytes without a NUL byte (one would cut it short as a C string). */
static inline bool mpstr_ok(const msgpack_object *o, size_t max)
{
	return o->type == MSGPACK_OBJECT_STR && o->via.str.size <= max &&
	       (o->via.str.size == 0 || !memchr(o->via.str.ptr, '\0', o->via.str.size));
}

/* Copies o's bytes and a NUL into buf (o->via.str.size + 1 bytes). */
static inline void mpstr_copy(char *buf, const msgpack_object *o)
{
	if (o->via.str.size)
		memcpy(buf, o->via.str.ptr, o->via.str.size);
	buf[o->via.str.size] = '\0';
}

/* Two strs with the same bytes. */
static inline bool mpstr_equal(const msgpack_object *a, const msgpack_object *b)
{
	return a->via.str.size == b->via.str.size &&
	       (a->via.str.size == 0 ||
		memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0);
}
