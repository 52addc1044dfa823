/* SPDX-License-Identifier: MIT */
/*
 * The layer store under <state_dir>/images (layout: supervisor-image.h). Removals and garbage
 * collection hold images/lock exclusively; imports, lookups and image_store_use() hold it
 * shared (imports run side by side, and an environment of a stored image starts while another
 * image is imported). image_store_use() holding it shared means
 * that an image cannot be removed between an environment's choice of it and the record of
 * that choice (<env dir>/image, which image_store_remove() reads: an image some environment
 * uses is refused with -EBUSY).
 */
#pragma once

#include <stdint.h>

#include "supervisor-image.h"

struct image_store;

struct image_info {
	char id[IMAGE_DIGEST_LEN + 1];			     /* the config's digest */
	char name[IMAGE_NAME_MAX + 1];			     /* "" when it has none */
	char layers[IMAGE_LAYERS_MAX][IMAGE_DIGEST_LEN + 1]; /* diff_ids, bottom first */
	size_t n_layers;
};

struct image_import_stats {
	uint64_t layers_unpacked, layers_cached, entries, bytes, usec;
};

/* Opens (and makes) <state_dir>/images; envs_dir: where environments record their image
 * (<envs_dir>/<id>/image). */
int image_store_open(const char *state_dir, const char *envs_dir, struct image_store **ret);
void image_store_close(struct image_store *s);
/* Imports ref (unpacking only the layers the store lacks); a name given (non-empty) names
 * the image instead of the source's own tag. */
int image_store_import(struct image_store *s, const struct image_ref *ref, const char *name,
		       struct image_info *ret, struct image_import_stats *stats, char *why,
		       size_t cap);
/* An image by name, by "sha256:<hex>" or by 12 or more leading hex digits of its id. */
int image_store_lookup(struct image_store *s, const char *what, struct image_info *ret);
/* Every image (free *ret). */
int image_store_list(struct image_store *s, struct image_info **ret, size_t *ret_n);
/* Removes an image (-EBUSY: an environment uses it, named in why), then collects garbage. */
int image_store_remove(struct image_store *s, const char *what, char *why, size_t cap);
/* Removes layers no image lists, and what an interrupted import left. */
int image_store_gc(struct image_store *s, uint64_t *ret_layers);
/* Resolves what (a stored image, or a reference, imported if needed) and records its id in
 * env_dir/image, under the shared lock. */
int image_store_use(struct image_store *s, const char *what, const char *env_dir,
		    struct image_info *ret, char *why, size_t cap);
/* The image's config, from the store. */
int image_store_config(struct image_store *s, const char *id, struct image_config *ret);
/* The directory of a stored layer, as a path (buf of PATH_MAX). */
int image_store_layer_path(struct image_store *s, const char *diff_id, char *buf, size_t cap);
