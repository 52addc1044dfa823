/* SPDX-License-Identifier: MIT */
/*
 * The container image's JSON parsers (supervisor/image/supervisor-image-json.c) on arbitrary
 * bytes: the first byte picks the document (0: an OCI index, 1: an image manifest, 2: an image
 * config, 3: a docker-archive manifest.json), the rest is it. They never crash, never leak,
 * and what they accept holds only what the store relies on: digests sha256:<64 hex>, counts
 * within IMAGE_LAYERS_MAX and IMAGE_ARGS_MAX, archive members relative and without "..".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor-image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_member(const char *p)
{
	if (!p[0] || p[0] == '/')
		abort();
	for (const char *c = p; *c;) {
		size_t n = strcspn(c, "/");

		if (n == 2 && c[0] == '.' && c[1] == '.')
			abort();
		c += n;
		while (*c == '/')
			c++;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct image_manifest m;
	char digest[IMAGE_DIGEST_LEN + 1], name[IMAGE_NAME_MAX + 1], why[IMAGE_ERROR_MAX];
	const char *doc = (const char *)data + 1;
	struct image_config c;
	bool nested;

	if (size < 1)
		return 0;
	size--;
	switch (data[0] % 4) {
	case 0:
		if (image_parse_index(doc, size, size & 1 ? "test" : NULL, digest, &nested, name,
				      why, sizeof(why)) == 0 &&
		    !image_digest_valid(digest))
			abort();
		break;
	case 1:
		if (image_parse_manifest(doc, size, &m, why, sizeof(why)) == 0) {
			if (!image_digest_valid(m.config_digest) || m.n_layers > IMAGE_LAYERS_MAX)
				abort();
			for (size_t i = 0; i < m.n_layers; i++)
				if (!image_digest_valid(m.layers[i].digest))
					abort();
		}
		break;
	case 2:
		if (image_parse_config(doc, size, &c, why, sizeof(why)) == 0) {
			if (c.n_diff_ids > IMAGE_LAYERS_MAX || c.n_argv > IMAGE_ARGS_MAX ||
			    c.n_env > IMAGE_ARGS_MAX || (c.n_argv && c.argv[c.n_argv]) ||
			    (c.n_env && c.env[c.n_env]))
				abort();
			for (size_t i = 0; i < c.n_diff_ids; i++)
				if (!image_digest_valid(c.diff_ids[i]))
					abort();
			for (size_t i = 0; i < c.n_env; i++)
				if (!strchr(c.env[i], '='))
					abort();
			image_config_finish(&c);
		}
		break;
	default:
		if (image_parse_docker_manifest(doc, size, size & 1 ? "localhost/a:1" : NULL, &m,
						why, sizeof(why)) == 0) {
			check_member(m.config_blob);
			for (size_t i = 0; i < m.n_layers; i++)
				check_member(m.layers[i].blob);
		}
	}
	return 0;
}
