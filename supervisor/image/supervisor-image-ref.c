/* SPDX-License-Identifier: MIT */
/*
 * Image references, as the container tools (containers/image: skopeo, podman) spell the
 * transports that need no registry: "oci:DIR[:TAG]" and "docker-archive:FILE[:REF]". As
 * there, the path ends at its first ':' (a path holding ':' cannot be named), so that a REF
 * may itself hold one ("localhost/busybox:latest").
 */
#include <errno.h>
#include <string.h>

#include "supervisor-image.h"

int image_ref_parse(const char *text, struct image_ref *ret)
{
	static const struct {
		const char *prefix;
		enum image_format format;
	} transports[] = {
		{"oci:", IMAGE_FORMAT_OCI},
		{"docker-archive:", IMAGE_FORMAT_DOCKER},
	};
	const char *rest = NULL, *colon;
	size_t plen;

	memset(ret, 0, sizeof(*ret));
	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
		if (strncmp(text, transports[i].prefix, strlen(transports[i].prefix)) == 0) {
			rest = text + strlen(transports[i].prefix);
			ret->format = transports[i].format;
		}
	if (!rest || !rest[0])
		return -EINVAL;
	colon = strchr(rest, ':');
	plen = colon ? (size_t)(colon - rest) : strlen(rest);
	if (plen == 0 || plen >= sizeof(ret->path))
		return -EINVAL;
	memcpy(ret->path, rest, plen);
	if (colon) {
		if (!colon[1] || strlen(colon + 1) >= sizeof(ret->tag))
			return -EINVAL;
		strcpy(ret->tag, colon + 1);
	}
	return 0;
}
