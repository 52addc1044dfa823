/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "gpu-uuid.h"
#include "util.h"

/* Where the groups end: after bytes 4, 6, 8 and 10 comes a '-'. */
static bool dash_after(int byte)
{
	return byte == 4 || byte == 6 || byte == 8 || byte == 10;
}

void gpu_uuid_format(const uint8_t uuid[PROTO_UUID_LEN], char buf[GPU_UUID_STR_LEN + 1])
{
	char *p = buf + 4;

	memcpy(buf, "GPU-", 4);
	for (int i = 0; i < PROTO_UUID_LEN; i++) {
		if (dash_after(i))
			*p++ = '-';
		p += snprintf(p, 3, "%02x", uuid[i]);
	}
	*p = '\0';
}

int gpu_uuid_parse(const char *s, uint8_t ret[PROTO_UUID_LEN])
{
	uint8_t u[PROTO_UUID_LEN];

	if (strncmp(s, "GPU-", 4) != 0)
		return -EINVAL;
	s += 4;
	for (int i = 0; i < PROTO_UUID_LEN; i++) {
		int hi, lo;

		if (dash_after(i) && *s++ != '-')
			return -EINVAL;
		hi = hex_digit(s[0]);
		lo = hi < 0 ? -1 : hex_digit(s[1]);
		if (lo < 0)
			return -EINVAL;
		u[i] = (uint8_t)(hi << 4 | lo);
		s += 2;
	}
	memcpy(ret, u, sizeof(u));
	return 0;
}
