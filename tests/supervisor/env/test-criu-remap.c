/* SPDX-License-Identifier: MIT */
/* The reading of CRIU's remap-fpath.img (supervisor-criu-remap.h): linked remaps counted,
 * ghosts not, anything malformed refused. The images are as CRIU 4.2 wrote them here. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor-criu-remap.h"

#define MAGICS 0x19, 0x43, 0x56, 0x54, 0x54, 0x39, 0x13, 0x59

static const uint8_t linked[] = {MAGICS, 6, 0, 0, 0, 0x08, 0x0d, 0x10, 0x0e, 0x18, 0x00};
static const uint8_t ghost[] = {MAGICS, 6, 0, 0, 0, 0x08, 0x0d, 0x10, 0x0e, 0x18, 0x01};
/* a ghost, a linked remap, and one without remap_type (an old image's: linked) */
static const uint8_t mixed[] = {MAGICS, 6, 0, 0, 0, 0x08, 0x0d, 0x10, 0x02, 0x18,
				0x01,	6, 0, 0, 0, 0x08, 0x0f, 0x10, 0x10, 0x18,
				0x00,	4, 0, 0, 0, 0x08, 0x11, 0x10, 0x12};
static const uint8_t empty[] = {MAGICS};

static void counts(void **state)
{
	(void)state;
	assert_int_equal(sv_criu_remap_count_linked(linked, sizeof(linked)), 1);
	assert_int_equal(sv_criu_remap_count_linked(ghost, sizeof(ghost)), 0);
	assert_int_equal(sv_criu_remap_count_linked(mixed, sizeof(mixed)), 2);
	assert_int_equal(sv_criu_remap_count_linked(empty, sizeof(empty)), 0);
}

static void malformed(void **state)
{
	uint8_t b[sizeof(linked)];

	(void)state;
	/* cut anywhere after the magics: a length or an entry short */
	for (size_t n = 9; n < sizeof(linked); n++)
		assert_int_equal(sv_criu_remap_count_linked(linked, n), -EBADMSG);
	assert_int_equal(sv_criu_remap_count_linked(linked, 4), -EBADMSG);
	memcpy(b, linked, sizeof(b));
	b[7] = 0; /* another image's magic */
	assert_int_equal(sv_criu_remap_count_linked(b, sizeof(b)), -EBADMSG);
	memcpy(b, linked, sizeof(b));
	b[12] = 0x0a; /* field 1 as a length-delimited one: not CRIU's */
	assert_int_equal(sv_criu_remap_count_linked(b, sizeof(b)), -EBADMSG);
	memcpy(b, linked, sizeof(b));
	b[8] = 0xff; /* an entry longer than any of CRIU's */
	assert_int_equal(sv_criu_remap_count_linked(b, sizeof(b)), -EBADMSG);
	memcpy(b, linked, sizeof(b));
	b[17] = 0x80; /* a varint that does not end */
	assert_int_equal(sv_criu_remap_count_linked(b, sizeof(b)), -EBADMSG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(counts),
		cmocka_unit_test(malformed),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
