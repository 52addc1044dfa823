/* SPDX-License-Identifier: MIT */
/*
 * The layer store driven directly (no daemon), for the image tests:
 *   image-tool STATE_DIR import REF [NAME]   prints: id, layers unpacked/cached, entries
 *   image-tool STATE_DIR list                one line per image: id name layers
 *   image-tool STATE_DIR rm WHAT
 *   image-tool STATE_DIR gc                  prints the layers removed
 *   image-tool STATE_DIR layers WHAT         the layer directories, bottom first
 *   image-tool STATE_DIR config WHAT         user, workdir, argv and env, one per line
 * Environments are looked for in STATE_DIR/envs. A failure prints why on stderr, exits 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sv-image.h"

static int die(int r, const char *why)
{
	fprintf(stderr, "image-tool: %s (%s)\n", why[0] ? why : "failed", strerror(-r));
	return 1;
}

int main(int argc, char **argv)
{
	struct image_store *s;
	struct image_info info;
	char envs[PATH_MAX], why[IMAGE_ERROR_MAX] = "";
	int r;

	if (argc < 3)
		return 2;
	snprintf(envs, sizeof(envs), "%s/envs", argv[1]);
	r = image_store_open(argv[1], envs, &s);
	if (r < 0)
		return die(r, "opening the store");
	if (strcmp(argv[2], "import") == 0 && argc >= 4) {
		struct image_import_stats st = {0};
		struct image_ref ref;

		r = image_ref_parse(argv[3], &ref);
		if (r < 0)
			return die(r, "not a reference");
		r = image_store_import(s, &ref, argc > 4 ? argv[4] : NULL, &info, &st, why,
				       sizeof(why));
		if (r < 0)
			return die(r, why);
		printf("%s unpacked=%" PRIu64 " cached=%" PRIu64 " entries=%" PRIu64
		       " bytes=%" PRIu64 " usec=%" PRIu64 "\n",
		       info.id, st.layers_unpacked, st.layers_cached, st.entries, st.bytes,
		       st.usec);
	} else if (strcmp(argv[2], "list") == 0) {
		struct image_info *v;
		size_t n;

		r = image_store_list(s, &v, &n);
		if (r < 0)
			return die(r, "list");
		for (size_t i = 0; i < n; i++)
			printf("%s %s %zu\n", v[i].id, v[i].name[0] ? v[i].name : "-",
			       v[i].n_layers);
		free(v);
	} else if (strcmp(argv[2], "rm") == 0 && argc == 4) {
		r = image_store_remove(s, argv[3], why, sizeof(why));
		if (r < 0)
			return die(r, why);
	} else if (strcmp(argv[2], "gc") == 0) {
		uint64_t n = 0;

		r = image_store_gc(s, &n);
		if (r < 0)
			return die(r, "gc");
		printf("%" PRIu64 "\n", n);
	} else if (strcmp(argv[2], "layers") == 0 && argc == 4) {
		char path[PATH_MAX];

		r = image_store_lookup(s, argv[3], &info);
		if (r < 0)
			return die(r, "lookup");
		for (size_t i = 0; i < info.n_layers; i++)
			if (image_store_layer_path(s, info.layers[i], path, sizeof(path)) == 0)
				printf("%s\n", path);
	} else if (strcmp(argv[2], "config") == 0 && argc == 4) {
		struct image_config c;

		r = image_store_lookup(s, argv[3], &info);
		if (r >= 0)
			r = image_store_config(s, info.id, &c);
		if (r < 0)
			return die(r, "config");
		printf("user=%s\nworkdir=%s\n", c.user, c.workdir);
		for (size_t i = 0; i < c.n_argv; i++)
			printf("arg=%s\n", c.argv[i]);
		for (size_t i = 0; i < c.n_env; i++)
			printf("env=%s\n", c.env[i]);
		image_config_finish(&c);
	} else
		return 2;
	image_store_close(s);
	return 0;
}
