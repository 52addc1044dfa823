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

static void sample(struct env_manifest *m)
{
	struct env_entry e = {.path = "work", .kind = ENV_ENTRY_DIR, .mode = 0755, .opaque = true};

	memset(m, 0, sizeof(*m));
	strcpy(m->id, "c00000002");
	strcpy(m->parent, "c00000001");
	strcpy(m->env, "env-1");
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
	e = (struct env_entry){
		.path = "work/a", .kind = ENV_ENTRY_REG, .mode = 0644, .size = 12, .data_key = 3};
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
	assert_int_equal(d.prefix_tokens, 4096);
	assert_true(d.prefix_hash == m.prefix_hash);
	assert_int_equal(d.n_entries, 5);
	assert_true(d.entries[0].opaque);
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
		cmocka_unit_test(test_ids_and_paths),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
