/* SPDX-License-Identifier: MIT */
/*
 * CRIU's remap-fpath.img as an environment's checkpoint reads it after a dump
 * (supervisor-criu-remap.h: does it hold a linked remap?), on arbitrary bytes: no crash, no
 * read past the input, and the answer is -EBADMSG or a count no larger than the entries the
 * input can hold (each at least 4 bytes of length).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-common.h"
#include "supervisor-criu-remap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* an exact-size copy, so ASan sees any read past the end */
	uint8_t *buf = malloc(size ? size : 1);
	int r;

	FUZZ_CHECK(buf);
	if (size)
		memcpy(buf, data, size);
	r = sv_criu_remap_count_linked(buf, size);
	FUZZ_CHECK(r == -EBADMSG || (r >= 0 && (size_t)r <= size / 4));
	free(buf);
	return 0;
}
