/* SPDX-License-Identifier: MIT */
/*
 * safetensors files: an 8-byte little-endian header length, a JSON header mapping tensor
 * names to {dtype, shape, data_offsets} (plus "__metadata__", string to string), then the
 * tensors' bytes. The reader is bounded: header at most 100 MB (the format's own limit),
 * offsets inside the file, sizes consistent with dtype and shape, no overlaps past the end.
 */
#pragma once

#include <stdint.h>
#include <stddef.h>

#define ST_HEADER_MAX (100u << 20)
#define ST_MAX_DIMS   4

struct st_tensor {
	char *name;
	char dtype[8];
	uint32_t ndim;
	uint64_t shape[ST_MAX_DIMS];
	uint64_t begin, end; /* absolute file offsets */
};

struct st_file {
	int fd;
	uint64_t size;
	struct st_tensor *t;
	size_t n;
	struct json_object *meta; /* "__metadata__" or NULL */
};

/* Opens and validates path: 0 or -errno (-EBADMSG for a malformed file, logged). */
int st_open(const char *path, struct st_file *ret);
void st_close(struct st_file *f);
const struct st_tensor *st_find(const struct st_file *f, const char *name);
/* "__metadata__"[key] or NULL. */
const char *st_meta(const struct st_file *f, const char *key);
