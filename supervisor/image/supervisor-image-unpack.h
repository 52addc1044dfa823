/* SPDX-License-Identifier: MIT */
/*
 * One layer blob (a tar, gzip- or zstd-compressed or not) streamed into the layer store: both
 * digests (the blob's and the uncompressed tar's diff_id) computed while it streams, its
 * entries created beneath a fresh temporary directory only, which is renamed to
 * layers/<diff_id hex> once everything checked out; any failure removes it.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Reads up to cap bytes of the blob into buf: the count, 0 at its end, or -errno. */
typedef ssize_t (*image_read_fn)(void *userdata, void *buf, size_t cap);

struct image_unpack_stats {
	uint64_t entries, bytes; /* entries created, bytes of file data written */
};

/* Unpacks the blob read through rd into layers_fd/<hex of diff_id>. digest (may be ""):
 * what the blob itself must hash to; size (0: unknown): its length. label names the layer in
 * why ("layer 3 (sha256:…)"). -EEXIST is never returned: a layer present already (another
 * import made it meanwhile) is success. -EBADMSG (digest or size mismatch, a truncated or
 * malformed tar) and -EPERM (a hostile entry: device node, absolute or ".." path, a path
 * through a symlink, a hard link out of the layer, an overlay xattr) say why. */
int image_unpack_layer(int layers_fd, image_read_fn rd, void *userdata, const char *digest,
		       uint64_t size, const char *diff_id, const char *label,
		       struct image_unpack_stats *stats, char *why, size_t cap);
/* Removes name under dir_fd, recursively, never following a symlink. */
int image_remove_tree(int dir_fd, const char *name);
