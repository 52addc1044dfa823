/* SPDX-License-Identifier: MIT */
/*
 * Where a supervisor pins its BPF objects when [env] pin_dir is not set: a directory of its own
 * under /sys/fs/bpf/belayer, named after its state directory (the last component, for the eye,
 * then a hash of the canonical path, for uniqueness), so that supervisors with different state
 * directories never share pins. The supervisor and belayerctl derive it alike.
 */
#pragma once

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PIN_DIR_ROOT "/sys/fs/bpf/belayer"

/* 0, or -errno: the state directory does not resolve (it must exist: the name is its canonical
 * path's), or buf is too small. */
static inline int pin_dir_for_state(const char *state_dir, char *buf, size_t cap)
{
	char canon[PATH_MAX], name[33];
	uint64_t h = 0xcbf29ce484222325u; /* FNV-1a 64 */
	const char *base;
	size_t n = 0;
	int k;

	if (!state_dir || !state_dir[0])
		return -EINVAL;
	if (!realpath(state_dir, canon))
		return -errno;
	for (const char *p = canon; *p; p++) {
		h ^= (uint8_t)*p;
		h *= 0x100000001b3u;
	}
	/* bpffs refuses names with a dot: only letters, digits, '-' and '_' are kept */
	base = strrchr(canon, '/') + 1;
	for (; *base && n < sizeof(name) - 1; base++)
		name[n++] = isalnum((unsigned char)*base) || *base == '-' ? *base : '_';
	name[n] = '\0';
	k = snprintf(buf, cap, "%s/%s%s%016" PRIx64, PIN_DIR_ROOT, name, n ? "-" : "", h);
	return k < 0 || (size_t)k >= cap ? -ENAMETOOLONG : 0;
}
