/* SPDX-License-Identifier: MIT */
/*
 * Sample messages of every protocol type and a msgpack map rewriter, shared by the unit tests
 * (round trips, malformed input) and the fuzz seed generator, so both exercise the same cases.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <msgpack.h>

#include "proto.h"

/* Fills *ret with sample i (0 <= i < proto_sample_count()); types carrying an fd get fd.
 * Returns the sample's name ("hello", "hello-max", ...) or NULL past the end. */
const char *proto_sample(size_t i, int fd, struct proto_msg *ret);
size_t proto_sample_count(void);
/* a and b are the same message: every field equal, blob fields by content. */
bool proto_msg_same(const struct proto_msg *a, const struct proto_msg *b);

enum proto_mutation {
	MUT_REMOVE,    /* drop key */
	MUT_DUPLICATE, /* key appears twice, with the same value */
	MUT_REPLACE,   /* key's value becomes *val */
	MUT_ADD,       /* key: *val appended (key need not be new) */
};

/* Rewrites the map encoded in in[0..len) and writes the result to out. Returns the new length,
 * -ENOENT when key is not in the map (except MUT_ADD), -ENOBUFS, or -EBADMSG for bad input. */
ssize_t proto_mutate(const void *in, size_t len, const char *key, enum proto_mutation op,
		     const msgpack_object *val, void *out, size_t cap);

/* The keys of the map in in[0..len), in order, into keys[] (each NUL-terminated, at most 15
 * bytes). Returns how many, or -errno. */
int proto_keys(const void *in, size_t len, char keys[][16], size_t max);
