/* SPDX-License-Identifier: MIT */
/* supervisor-config: defaults, parsing of every key type, errors, unknown keys. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "supervisor-config.h"
#include "test-util.h"
#include "util.h"

static void defaults_are_documented_values(void **state)
{
	struct sv_config c;

	config_init_defaults(&c);
	assert_string_equal(c.socket, "/run/belayer/supervisor.sock");
	assert_int_equal(c.socket_mode, 0660);
	assert_int_equal(c.max_message_size, 65536);
	assert_int_equal(c.retention_timeout, 600);
	assert_int_equal(c.memory_budget, 0);
	assert_int_equal(c.max_queued_bytes, 8u << 20);
	assert_true(c.journal);
	assert_int_equal(c.http_port, 0);
	assert_string_equal(c.http_address, "127.0.0.1");
	assert_true(id_list_contains(&c.fatal_xids, 79));
	assert_true(id_list_contains(&c.fatal_xids, 48));
	assert_false(id_list_contains(&c.fatal_xids, 31 + 1000));
	assert_int_equal(c.content_method, CONTENT_AUTO);
}

static void values_parse_by_type(void **state)
{
	struct sv_config c;

	config_init_defaults(&c);
	assert_int_equal(config_set(&c, "retention", "timeout", "90s"), 0);
	assert_int_equal(c.retention_timeout, 90);
	assert_int_equal(config_set(&c, NULL, "retention.timeout", "2h"), 0);
	assert_int_equal(c.retention_timeout, 7200);
	assert_int_equal(config_set(&c, "retention", "memory_budget", "3G"), 0);
	assert_int_equal(c.memory_budget, 3ull << 30);
	assert_int_equal(config_set(&c, "retention", "memory_budget", "512MiB"), 0);
	assert_int_equal(c.memory_budget, 512ull << 20);
	assert_int_equal(config_set(&c, "supervisor", "socket_mode", "0600"), 0);
	assert_int_equal(c.socket_mode, 0600);
	assert_int_equal(config_set(&c, "journal", "enabled", "off"), 0);
	assert_false(c.journal);
	assert_int_equal(config_set(&c, "security", "allowed_uids", "0, root,1000"), 0);
	assert_int_equal(c.allowed_uids.n, 3);
	assert_true(id_list_contains(&c.allowed_uids, 1000));
	assert_int_equal(config_set(&c, "health", "fatal_xids", "79"), 0);
	assert_int_equal(c.fatal_xids.n, 1);
	assert_int_equal(config_set(&c, "health", "content_method", "driver"), 0);
	assert_int_equal(c.content_method, CONTENT_DRIVER);
}

static void bad_values_refused(void **state)
{
	struct sv_config c;

	config_init_defaults(&c);
	assert_int_equal(config_set(&c, "limits", "max_connections", "0"), -ERANGE);
	assert_int_equal(config_set(&c, "limits", "max_connections", "many"), -EINVAL);
	assert_int_equal(config_set(&c, "limits", "max_message_size", "70000"), -ERANGE);
	assert_int_equal(config_set(&c, "retention", "timeout", "5 parsecs"), -EINVAL);
	assert_int_equal(config_set(&c, "retention", "memory_budget", "99999999999T"), -ERANGE);
	assert_int_equal(config_set(&c, "supervisor", "socket_mode", "999"), -EINVAL);
	assert_int_equal(config_set(&c, "journal", "enabled", "perhaps"), -EINVAL);
	assert_int_equal(config_set(&c, "health", "fatal_xids", "79,x"), -EINVAL);
	assert_int_equal(config_set(&c, "security", "allowed_uids", "no-such-user-belayer"),
			 -ENOENT);
	assert_int_equal(config_set(&c, "nosuch", "key", "1"), -ENOENT);
	assert_int_equal(config_set(&c, NULL, "nodot", "1"), -ENOENT);
	/* Failed sets leave the value alone. */
	assert_int_equal(c.max_connections, 256);
}

static void file_loads_and_warns_on_unknown_keys(void **state)
{
	char *dir = test_mkdtemp("belayer-conf");
	char path[512];
	struct sv_config c;
	FILE *f;

	snprintf(path, sizeof(path), "%s/belayer.conf", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fprintf(f, "# comment\n[limits]\nmax_connections = 12\nfrobnicate = yes\n"
		   "; another comment\n[metrics]\nhttp_port = 9400\n");
	fclose(f);
	config_init_defaults(&c);
	assert_int_equal(config_load(&c, path, false), 0);
	assert_int_equal(c.max_connections, 12);
	assert_int_equal(c.http_port, 9400);

	f = fopen(path, "w");
	fprintf(f, "[limits]\nmax_fds = -3\n");
	fclose(f);
	assert_int_equal(config_load(&c, path, false), -EINVAL);

	unlink(path);
	assert_int_equal(config_load(&c, path, true), 0);
	assert_int_equal(config_load(&c, path, false), -ENOENT);
	test_rmtree(dir);
	free(dir);
}

/* libinih's line buffer is 200 bytes: a longer line is refused with its number, not split. */
static void long_line_named(void **state)
{
	char *dir = test_mkdtemp("belayer-conf");
	char path[512], cmd[400];
	struct sv_config c;
	FILE *f;

	snprintf(path, sizeof(path), "%s/belayer.conf", dir);
	memset(cmd, 'x', sizeof(cmd) - 1);
	cmd[sizeof(cmd) - 1] = '\0';
	f = fopen(path, "w");
	assert_non_null(f);
	fprintf(f, "[limits]\nmax_connections = 12\n[engine.big]\nprimary = %.180s\n", cmd);
	fclose(f);
	config_init_defaults(&c);
	assert_int_equal(config_load(&c, path, false), 0);

	f = fopen(path, "w");
	fprintf(f, "[limits]\nmax_connections = 12\n[engine.big]\nprimary = %s\n", cmd);
	fclose(f);
	config_init_defaults(&c);
	assert_int_equal(config_load(&c, path, false), -E2BIG);
	unlink(path);
	test_rmtree(dir);
	free(dir);
}

static void entries_round_trip(void **state)
{
	struct sv_config a, b;
	const char *section, *key, *doc;
	char value[256];
	size_t n = 0;

	config_init_defaults(&a);
	assert_int_equal(config_set(&a, "retention", "timeout", "45s"), 0);
	assert_int_equal(config_set(&a, "security", "fetch_gids", "5,6"), 0);
	config_init_defaults(&b);
	/* What config_entry prints, config_set takes back to the same configuration. */
	for (size_t i = 0; config_entry(&a, i, &section, &key, value, sizeof(value), &doc); i++) {
		assert_true(strlen(doc) > 10);
		assert_int_equal(config_set(&b, section, key, value), 0);
		n++;
	}
	assert_true(n >= 25);
	assert_memory_equal(&a, &b, sizeof(a));
}

static void engine_sections(void **state)
{
	char *dir = test_mkdtemp("belayer-conf");
	struct sv_config c, d;
	const struct sv_engine_config *e;
	const char *section, *key;
	char path[512], value[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/belayer.conf", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fprintf(f, "[engine.llm]\nprimary = serve --port {port}\nshadow = serve --port {port} "
		   "--load-format dummy\ntp = 2\nverify = full\nliveness_timeout = 1500ms\n"
		   "[engine.other]\nport = 9000\n");
	fclose(f);
	config_init_defaults(&c);
	assert_int_equal(config_load(&c, path, false), 0);
	assert_int_equal(c.n_engines, 2);
	e = config_engine(&c, "llm");
	assert_non_null(e);
	assert_string_equal(e->primary, "serve --port {port}");
	assert_int_equal(e->tp, 2);
	assert_int_equal(e->verify, VERIFY_FULL);
	assert_int_equal(e->liveness_timeout_ms, 1500);
	assert_int_equal(e->promote_timeout_ms, 10000); /* the default */
	assert_string_equal(e->health_url, "http://127.0.0.1:{port}/health");
	e = config_engine(&c, "other");
	assert_non_null(e);
	assert_string_equal(e->primary, "external");
	assert_int_equal(e->port, 9000);
	assert_int_equal(e->verify, VERIFY_SAMPLED);

	/* -o engine.NAME.key=value, durations with units. */
	assert_int_equal(config_set(&c, NULL, "engine.llm.probe_interval", "2s"), 0);
	assert_int_equal(config_engine(&c, "llm")->probe_interval_ms, 2000);
	assert_int_equal(config_set(&c, NULL, "engine.llm.ready_timeout", "3m"), 0);
	assert_int_equal(config_engine(&c, "llm")->ready_timeout_ms, 180000);
	assert_int_equal(config_set(&c, NULL, "engine.llm.verify", "most"), -EINVAL);
	assert_int_equal(config_set(&c, NULL, "engine.llm.tp", "0"), -ERANGE);
	assert_int_equal(config_set(&c, NULL, "engine.llm.frobnicate", "1"), -ENOENT);
	/* An unknown key does not create an engine. */
	assert_int_equal(config_set(&c, NULL, "engine.ghost.frobnicate", "1"), -ENOENT);
	assert_null(config_engine(&c, "ghost"));
	for (int i = 2; i < CONFIG_ENGINES_MAX; i++) {
		char name[32];

		snprintf(name, sizeof(name), "engine.e%d", i);
		assert_int_equal(config_set(&c, name, "tp", "1"), 0);
	}
	assert_int_equal(config_set(&c, "engine.onetoomany", "tp", "1"), -E2BIG);

	/* config_entry lists the engines' keys; they read back to the same configuration. */
	config_init_defaults(&d);
	for (size_t i = 0; config_entry(&c, i, &section, &key, value, sizeof(value), NULL); i++)
		assert_int_equal(config_set(&d, section, key, value), 0);
	assert_memory_equal(&c, &d, sizeof(c));
	test_rmtree(dir);
	free(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(defaults_are_documented_values),
		cmocka_unit_test(values_parse_by_type),
		cmocka_unit_test(bad_values_refused),
		cmocka_unit_test(file_loads_and_warns_on_unknown_keys),
		cmocka_unit_test(long_line_named),
		cmocka_unit_test(entries_round_trip),
		cmocka_unit_test(engine_sections),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
