/* SPDX-License-Identifier: MIT */
/* The checkpoint manifest's encoder and bounded decoder (supervisor-env-manifest.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "supervisor-env-manifest.h"
#include "test-util.h"
#include "util.h"

static char cap_value[20] = {0x00, 0x00, 0x00, 0x02, 0x00, 0x20}; /* cap_net_raw=p, v2 */
static struct env_xattr dir_xattrs[] = {
	{.name = "trusted.overlay.opaque", .value = "y", .len = 1},
	{.name = "user.empty", .value = "", .len = 0},
};
static struct env_xattr file_xattrs[] = {
	{.name = "user.x", .value = "new-x", .len = 5},
	{.name = "security.capability", .value = cap_value, .len = sizeof(cap_value)},
};

static void sample(struct env_manifest *m)
{
	struct env_entry e = {.path = "work",
			      .kind = ENV_ENTRY_DIR,
			      .mode = 0755,
			      .opaque = true,
			      .xattrs = dir_xattrs,
			      .n_xattrs = 2};

	memset(m, 0, sizeof(*m));
	strcpy(m->id, "c00000002");
	strcpy(m->parent, "c00000001");
	strcpy(m->env, "env-1");
	strcpy(m->delta_path, ENV_DELTA_PATH_DIRTY_SET);
	strcpy(m->kind, ENV_KIND_FS_ONLY);
	strcpy(m->images, "c00000001");
	m->precopy_rounds = 2;
	m->precopy_bytes = 1600000;
	m->precopy_frozen_bytes = 4096;
	memset(m->uuid, 0x5a, 16);
	strcpy(m->trajectory, "traj");
	m->turn = 7;
	m->prefix_tokens = 4096;
	m->prefix_hash = 0xdeadbeefcafeull;
	m->fs_bytes = 12;
	m->criu_bytes = 1 << 20;
	m->nproc = 3;
	m->dump_us = 90000;
	assert_int_equal(env_manifest_add(m, &e), 0);
	e = (struct env_entry){.path = "work/a",
			       .kind = ENV_ENTRY_REG,
			       .mode = 0644,
			       .size = 12,
			       .data_key = 3,
			       .xattrs = file_xattrs,
			       .n_xattrs = 2};
	strcpy(e.src, "c00000001");
	assert_int_equal(env_manifest_add(m, &e), 0);
	e = (struct env_entry){
		.path = "work/b", .kind = ENV_ENTRY_HARDLINK, .mode = 0644, .hardlink = "work/a"};
	assert_int_equal(env_manifest_add(m, &e), 0);
	e = (struct env_entry){
		.path = "work/l", .kind = ENV_ENTRY_SYMLINK, .mode = 0777, .target = "/etc/passwd"};
	assert_int_equal(env_manifest_add(m, &e), 0);
	e = (struct env_entry){.path = "gone", .kind = ENV_ENTRY_WHITEOUT};
	assert_int_equal(env_manifest_add(m, &e), 0);
	e = (struct env_entry){.path = "work/stale.sock", .kind = ENV_ENTRY_SOCKET, .mode = 0755};
	assert_int_equal(env_manifest_add(m, &e), 0);
}

static void test_round_trip(void **state)
{
	struct env_manifest m, d;
	char *buf;
	size_t len;

	(void)state;
	sample(&m);
	assert_int_equal(env_manifest_encode(&m, &buf, &len), 0);
	assert_int_equal(env_manifest_decode(buf, len, &d), 0);
	assert_string_equal(d.id, m.id);
	assert_string_equal(d.parent, m.parent);
	assert_memory_equal(d.uuid, m.uuid, 16);
	assert_int_equal(d.turn, 7);
	assert_string_equal(d.delta_path, "dirty-set");
	assert_string_equal(d.kind, "fs-only");
	assert_string_equal(d.images, "c00000001");
	assert_int_equal(d.precopy_rounds, 2);
	assert_int_equal(d.precopy_bytes, 1600000);
	assert_int_equal(d.precopy_frozen_bytes, 4096);
	assert_int_equal(d.prefix_tokens, 4096);
	assert_true(d.prefix_hash == m.prefix_hash);
	assert_int_equal(d.n_entries, 6);
	assert_true(d.entries[0].opaque);
	/* Every xattr, byte for byte, an empty value included. */
	assert_int_equal(d.entries[0].n_xattrs, 2);
	assert_string_equal(d.entries[0].xattrs[1].name, "user.empty");
	assert_int_equal(d.entries[0].xattrs[1].len, 0);
	assert_int_equal(d.entries[1].n_xattrs, 2);
	assert_string_equal(d.entries[1].xattrs[0].name, "user.x");
	assert_memory_equal(d.entries[1].xattrs[0].value, "new-x", 5);
	assert_int_equal(d.entries[1].xattrs[1].len, sizeof(cap_value));
	assert_memory_equal(d.entries[1].xattrs[1].value, cap_value, sizeof(cap_value));
	assert_int_equal(d.entries[2].n_xattrs, 0);
	assert_int_equal(d.entries[5].kind, ENV_ENTRY_SOCKET);
	assert_string_equal(d.entries[1].src, "c00000001");
	assert_int_equal(d.entries[1].data_key, 3);
	assert_string_equal(d.entries[2].hardlink, "work/a");
	assert_string_equal(d.entries[3].target, "/etc/passwd");
	assert_int_equal(d.entries[4].kind, ENV_ENTRY_WHITEOUT);
	/* Every strict prefix is refused (truncation), and trailing bytes are. */
	for (size_t i = 0; i < len; i++) {
		struct env_manifest t;

		assert_int_equal(env_manifest_decode(buf, i, &t), -EBADMSG);
	}
	buf = realloc(buf, len + 1);
	buf[len] = 0;
	{
		struct env_manifest t;

		assert_int_equal(env_manifest_decode(buf, len + 1, &t), -EBADMSG);
	}
	free(buf);
	env_manifest_finish(&m);
	env_manifest_finish(&d);
}

static void expect_refused(struct env_manifest *m)
{
	struct env_manifest d;
	char *buf;
	size_t len;

	assert_int_equal(env_manifest_encode(m, &buf, &len), 0);
	assert_int_equal(env_manifest_decode(buf, len, &d), -EBADMSG);
	free(buf);
	env_manifest_finish(m);
}

/* Paths that climb out, ids that are paths, dangling hard links, a checkpoint its own
 * parent: all refused by the decoder. */
static void test_refused(void **state)
{
	static const char *const bad_paths[] = {"../x", "/abs", "a/../b", "a//b",
						"a/",	".",	"a/./b"};
	struct env_manifest m;

	(void)state;
	for (size_t i = 0; i < sizeof(bad_paths) / sizeof(bad_paths[0]); i++) {
		sample(&m);
		free(m.entries[0].path);
		m.entries[0].path = strdup(bad_paths[i]);
		expect_refused(&m);
	}
	sample(&m);
	strcpy(m.id, "../c1");
	expect_refused(&m);
	sample(&m);
	strcpy(m.parent, m.id);
	expect_refused(&m);
	sample(&m);
	free(m.entries[2].hardlink);
	m.entries[2].hardlink = strdup("work/nothere");
	expect_refused(&m);
	sample(&m);
	m.entries[1].src[0] = '\0';
	expect_refused(&m);
	sample(&m);
	m.entries[1].mode = 0100644; /* type bits are the kind's */
	expect_refused(&m);
	/* A checkpoint kind other than full and fs-only ("skipped" is never stored), an images'
	 * checkpoint that is not an id. */
	sample(&m);
	strcpy(m.kind, ENV_KIND_SKIPPED);
	expect_refused(&m);
	sample(&m);
	strcpy(m.images, "../c1");
	expect_refused(&m);
	/* Pre-copy rounds past the decoder's bound. */
	sample(&m);
	m.precopy_rounds = ENV_PRECOPY_ROUNDS_MAX + 1;
	expect_refused(&m);
	/* The delta's path is bounded (ENV_DELTA_PATH_MAX): a longer one is refused. */
	sample(&m);
	memset(m.delta_path, 'x', ENV_DELTA_PATH_MAX);
	{
		char *buf;
		size_t len;
		struct env_manifest d;
		char *at;

		assert_int_equal(env_manifest_encode(&m, &buf, &len), 0);
		/* "xxx...x" (15) grown to 16 in place: the fixstr header says 16 too. */
		at = memmem(buf, len, m.delta_path, ENV_DELTA_PATH_MAX);
		assert_non_null(at);
		buf = realloc(buf, len + 1);
		at = memmem(buf, len, m.delta_path, ENV_DELTA_PATH_MAX);
		memmove(at + 1, at, (size_t)(buf + len - at));
		at[-1] = (char)(0xa0 | (ENV_DELTA_PATH_MAX + 1));
		assert_int_equal(env_manifest_decode(buf, len + 1, &d), -EBADMSG);
		free(buf);
		env_manifest_finish(&m);
	}
}

/* An older writer's opaque directory ("opq" only, no "xa") reads back with its xattr. */
static void test_opaque_without_xattrs(void **state)
{
	struct env_manifest m, d;
	char *buf;
	size_t len;

	(void)state;
	sample(&m);
	env_xattrs_free(m.entries[0].xattrs, m.entries[0].n_xattrs);
	m.entries[0].xattrs = NULL;
	m.entries[0].n_xattrs = 0;
	assert_int_equal(env_manifest_encode(&m, &buf, &len), 0);
	assert_int_equal(env_manifest_decode(buf, len, &d), 0);
	assert_int_equal(d.entries[0].n_xattrs, 1);
	assert_string_equal(d.entries[0].xattrs[0].name, "trusted.overlay.opaque");
	assert_memory_equal(d.entries[0].xattrs[0].value, "y", 1);
	free(buf);
	env_manifest_finish(&m);
	env_manifest_finish(&d);
}

/* Replaces e's xattrs with n of len bytes each (user.0, user.1, ...), past any check. */
static void own_xattrs(struct env_entry *e, uint32_t n, uint32_t len)
{
	env_xattrs_free(e->xattrs, e->n_xattrs);
	e->xattrs = calloc(n, sizeof(*e->xattrs));
	assert_non_null(e->xattrs);
	for (uint32_t i = 0; i < n; i++) {
		assert_true(asprintf(&e->xattrs[i].name, "user.%u", i) > 0);
		e->xattrs[i].value = calloc(1, len);
		assert_non_null(e->xattrs[i].value);
		e->xattrs[i].len = len;
	}
	e->n_xattrs = n;
}

/* Xattrs past the bounds (count, value size, per entry, per manifest), of no namespace, twice
 * the same name, or on a hard link: refused by env_manifest_add and by the decoder. */
static void test_xattr_bounds(void **state)
{
	static char big[ENV_XATTR_VALUE_MAX + 1];
	struct env_xattr many[ENV_XATTRS_MAX + 1], heavy[8];
	char names[ENV_XATTRS_MAX + 1][16];
	struct env_entry e = {.path = "f", .kind = ENV_ENTRY_REG, .mode = 0644};
	struct env_manifest m = {0};
	size_t added = 0, before, per;

	(void)state;
	strcpy(e.src, "c1");
	for (size_t i = 0; i < ENV_XATTRS_MAX + 1; i++) {
		snprintf(names[i], sizeof(names[i]), "user.%zu", i);
		many[i] = (struct env_xattr){.name = names[i], .value = "v", .len = 1};
	}
	e.xattrs = many;
	e.n_xattrs = ENV_XATTRS_MAX + 1;
	assert_int_equal(env_manifest_add(&m, &e), -E2BIG);
	e.n_xattrs = ENV_XATTRS_MAX;
	assert_int_equal(env_manifest_add(&m, &e), 0);
	e.xattrs = &(struct env_xattr){.name = "user.big", .value = big, .len = sizeof(big)};
	e.n_xattrs = 1;
	assert_int_equal(env_manifest_add(&m, &e), -E2BIG);
	for (size_t i = 0; i < ARRAY_SIZE(heavy); i++)
		heavy[i] = (struct env_xattr){
			.name = names[i], .value = big, .len = ENV_XATTR_VALUE_MAX};
	e.xattrs = heavy;
	e.n_xattrs = ARRAY_SIZE(heavy); /* 8 x 64 KiB: over the entry's 256 KiB */
	assert_int_equal(env_manifest_add(&m, &e), -E2BIG);
	e.n_xattrs = 3; /* under the entry's bound: until the manifest's */
	before = m.xattr_bytes;
	per = 3 * (strlen("user.0") + ENV_XATTR_VALUE_MAX);
	while (env_manifest_add(&m, &e) == 0)
		added++;
	assert_true(added > 0);
	assert_int_equal(added, (ENV_XATTR_TOTAL_BYTES - before) / per);
	e.xattrs = &(struct env_xattr){.name = "nons", .value = "v", .len = 1};
	e.n_xattrs = 1;
	assert_int_equal(env_manifest_add(&m, &e), -EINVAL);
	e.xattrs = &(struct env_xattr){.name = "user.", .value = "v", .len = 1};
	assert_int_equal(env_manifest_add(&m, &e), -EINVAL);
	e.xattrs = (struct env_xattr[]){{.name = "user.a", .value = "1", .len = 1},
					{.name = "user.a", .value = "2", .len = 1}};
	e.n_xattrs = 2;
	assert_int_equal(env_manifest_add(&m, &e), -EINVAL);
	env_manifest_finish(&m);

	/* The decoder: a hard link with xattrs of its own; too many on an entry; a value over
	 * the kernel's size. */
	sample(&m);
	own_xattrs(&m.entries[2], 1, 1);
	expect_refused(&m);
	sample(&m);
	own_xattrs(&m.entries[1], ENV_XATTRS_MAX + 1, 1);
	expect_refused(&m);
	sample(&m);
	own_xattrs(&m.entries[1], 1, ENV_XATTR_VALUE_MAX + 1);
	expect_refused(&m);
}

static void test_ids_and_paths(void **state)
{
	(void)state;
	assert_true(env_id_valid("c00000001"));
	assert_true(env_id_valid("env_1.x-y"));
	assert_false(env_id_valid(""));
	assert_false(env_id_valid(".tmp-c1"));
	assert_false(env_id_valid("a/b"));
	assert_false(
		env_id_valid("0123456789012345678901234567890123456789012345678901234567890123"));
	assert_true(env_path_valid("a/b/c"));
	assert_true(env_path_valid("..a/b..")); /* names, not parents */
	assert_false(env_path_valid("a/../b"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_opaque_without_xattrs),
		cmocka_unit_test(test_xattr_bounds),
		cmocka_unit_test(test_ids_and_paths),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
