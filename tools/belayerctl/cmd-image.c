/* SPDX-License-Identifier: MIT */
/*
 * Image references on the command line (issue 20): the supervisor resolves a path from its
 * own working directory, so a relative oci:DIR or docker-archive:FILE is made absolute here.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "belayerctl.h"

int image_arg(char *dst, size_t cap, const char *src)
{
	static const char *const transports[] = {"oci:", "docker-archive:"};
	char cwd[PATH_MAX], buf[PROTO_MAX_STR + 1];

	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++) {
		size_t n = strlen(transports[i]);

		if (strncmp(src, transports[i], n) != 0 || src[n] == '/' || !src[n])
			continue;
		if (!getcwd(cwd, sizeof(cwd)))
			return -errno;
		if ((size_t)snprintf(buf, sizeof(buf), "%s%s/%s", transports[i], cwd, src + n) >=
		    sizeof(buf))
			return -E2BIG;
		return copy_arg(dst, cap, buf, "IMAGE");
	}
	return copy_arg(dst, cap, src, "IMAGE");
}
