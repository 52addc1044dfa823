/* SPDX-License-Identifier: MIT */
/*
 * Adoption after a supervisor crash: the real supervisor launches the engine stand-in (TP=2,
 * under libbelayer.so, on the emulated GPU) as primary and shadow, is SIGKILLed, and started
 * again on the same state directory. The engine's processes keep running; the new supervisor
 * must take them over (no new process, the same port answering with the engine's real
 * tokens) and recover them as its own when a rank dies later. Stopping it stops them too: the
 * teardown finds no emulated GPU memory left.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "belayer-emu.h"
#include "proto.h"
#include "sv-engine.h"
#include "sv-test.h"
#include "test-util.h"
#include "util.h"

static struct sv sv;
static char weights[PATH_MAX];
static uint32_t baseline[ENGINE_TOKENS]; /* greedy tokens of a failure-free engine */
static uint32_t expected[ENGINE_TOKENS]; /* what the engine must answer now (baseline by default) */
static uint16_t port_a, port_b;

/* Starts the supervisor with engine t (TP=2, primary and shadow); a restart keeps the ports
 * and the state directory of the previous one. */
static void start_with(bool restart, const char *extra)
{
	const char *const more[] = {extra, NULL};

	if (!restart) {
		port_a = sv_free_port();
		port_b = sv_free_port();
	}
	engine_start(&sv, weights, port_a, port_b, NULL, more);
}

static void start(bool restart)
{
	start_with(restart, NULL);
}

static int setup(void **state)
{
	engine_setup(&sv, weights, sizeof(weights), baseline);
	memcpy(expected, baseline, sizeof(expected));
	return 0;
}

static int teardown(void **state)
{
	return engine_teardown(&sv);
}

/* Exited (gone, or a zombie its new parent has not reaped yet). */
static bool process_gone(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	bool gone;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return true;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	gone = p && (p[2] == 'Z' || p[2] == 'X');
	fclose(f);
	return gone;
}

/* Alive workers of engine t (any role). */
static int alive_workers(void)
{
	struct proto_msg m[32];
	int n = ctl_collect(&sv, CTL_WORKERS, 0, CTL_ACT_NONE, -1, m, ARRAY_SIZE(m)), alive = 0;

	for (int i = 0; i < n; i++)
		alive += m[i].type == PROTO_WORKER_INFO && m[i].worker_info.state == WORKER_ALIVE &&
			 strcmp(m[i].worker_info.engine_id, "t") == 0;
	return alive;
}

/* Until every rank (primary 0, 1, shadow 0, 1) said hello to the restarted supervisor. */
static void wait_ranks(pid_t want[4])
{
	uint64_t deadline = mono_ms() + ENGINE_READY_MS;

	for (;;) {
		pid_t got[4] = {engine_worker_pid(&sv, ROLE_PRIMARY, 0),
				engine_worker_pid(&sv, ROLE_PRIMARY, 1),
				engine_worker_pid(&sv, ROLE_SHADOW, 0),
				engine_worker_pid(&sv, ROLE_SHADOW, 1)};

		if (got[0] && got[1] && got[2] && got[3]) {
			for (int i = 0; i < 4; i++)
				assert_int_equal(got[i], want[i]);
			return;
		}
		if (mono_ms() > deadline)
			fail_msg("the engine's ranks did not say hello again within %d ms",
				 ENGINE_READY_MS);
		(void)poll(NULL, 0, 20);
	}
}

/* Starts the engine, waits until a failure would be promoted, ends the supervisor with sig and
 * returns the ranks' pids (primary 0, 1, shadow 0, 1), still serving. */
static void run_then_end(pid_t pids[4], int sig)
{
	start(false);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	assert_int_equal(engine_metric(&sv, "belayer_engine_launches_total", NULL), 2);
	assert_int_equal(engine_metric(&sv, "belayer_engine_adopted", NULL), 0);
	pids[0] = engine_worker_pid(&sv, ROLE_PRIMARY, 0);
	pids[1] = engine_worker_pid(&sv, ROLE_PRIMARY, 1);
	pids[2] = engine_worker_pid(&sv, ROLE_SHADOW, 0);
	pids[3] = engine_worker_pid(&sv, ROLE_SHADOW, 1);
	for (int i = 0; i < 4; i++)
		assert_true(pids[i] > 0);
	(void)sv_kill(&sv, sig);
	/* The engine does not depend on its supervisor: it keeps serving. */
	for (int i = 0; i < 4; i++)
		assert_false(process_gone(pids[i]));
	{
		uint32_t got[ENGINE_TOKENS];

		assert_int_equal(engine_generate(port_a, got), 0);
		assert_memory_equal(got, expected, sizeof(got));
	}
}

static void run_then_crash(pid_t pids[4])
{
	run_then_end(pids, SIGKILL);
}

/* The restarted supervisor adopts primary and shadow: nothing launched, the same processes
 * serve on the same port; a primary rank killed afterwards is promoted onto the adopted
 * shadow, exactly as if this supervisor had launched them. */
static void adopts_then_promotes(void **state)
{
	pid_t pids[4];
	uint64_t t0, t_hello, t_ready;

	run_then_crash(pids);
	t0 = mono_ms();
	start(true);
	assert_int_equal(engine_metric(&sv, "belayer_engine_adopted", NULL), 2);
	wait_ranks(pids);
	t_hello = mono_ms();
	engine_wait_serving(&sv, expected);
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_a);
	t_ready = mono_ms();
	engine_wait_promotable(&sv);
	print_message("restart -> every rank said hello %" PRIu64 " ms, ready %" PRIu64
		      " ms, promotable %" PRIu64 " ms\n",
		      t_hello - t0, t_ready - t0, mono_ms() - t0);
	/* Nothing was launched, and no other process of the engine said hello. */
	assert_int_equal(engine_metric(&sv, "belayer_engine_launches_total", NULL), 0);
	assert_int_equal(alive_workers(), 4);
	assert_int_equal(engine_metric(&sv, "belayer_recovery_last_seq", NULL), 0);

	assert_int_equal(kill(pids[1], SIGKILL), 0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
	/* Served by the adopted shadow group, on its port. */
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_b);
	assert_int_equal(engine_worker_pid(&sv, ROLE_PRIMARY, 0), pids[2]);
	assert_int_equal(engine_worker_pid(&sv, ROLE_PRIMARY, 1), pids[3]);
	/* A new shadow behind it, the one process group launched since the restart; it parks
	 * and a second failure is promoted onto it. */
	assert_int_equal(engine_metric(&sv, "belayer_engine_launches_total", NULL), 1);
	engine_wait_promotable(&sv);
	assert_int_equal(kill(pids[2], SIGKILL), 0);
	assert_int_equal(engine_wait_recovery(&sv, 2), 2);
	engine_wait_serving(&sv, expected);
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_a);
}

/* The shadow group died while no supervisor ran: the primary is adopted, only a new shadow is
 * launched, and it parks behind the adopted primary. */
static void launches_only_what_is_missing(void **state)
{
	pid_t pids[4];

	run_then_crash(pids);
	assert_int_equal(kill(pids[2], SIGKILL), 0);
	assert_int_equal(kill(pids[3], SIGKILL), 0);
	/* Reparented, not ours to reap: wait until they are gone from the pid's point of view. */
	for (uint64_t deadline = mono_ms() + ENGINE_READY_MS;
	     !process_gone(pids[2]) || !process_gone(pids[3]);)
		assert_true(mono_ms() < deadline);
	start(true);
	assert_int_equal(engine_metric(&sv, "belayer_engine_adopted", NULL), 1);
	assert_int_equal(engine_metric(&sv, "belayer_engine_launches_total", NULL), 1);
	engine_wait_serving(&sv, expected);
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_a);
	assert_int_equal(engine_worker_pid(&sv, ROLE_PRIMARY, 0), pids[0]);
	assert_int_equal(engine_worker_pid(&sv, ROLE_PRIMARY, 1), pids[1]);
	engine_wait_promotable(&sv);
	assert_int_equal(kill(pids[0], SIGKILL), 0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_b);
}

/* Issue 22: both groups size their KV cache from free memory (as in test-promote's
 * shadow_sized_by_free_memory). The shadow group dies while no supervisor runs; the restarted
 * one adopts the primary and launches a shadow at once, before the primary's shims said hello
 * again: only the journal has the primary's cuMemGetInfo answers then. On its own figures the
 * shadow finds no room for a KV cache and exits; given the journaled answers it sizes itself
 * like the primary, parks, and a kill is promoted onto it. */
static void shadow_after_restart_sized_like_primary(void **state)
{
	static char primary[PATH_MAX * 2 + 256];
	const char *const more[] = {primary, NULL};
	pid_t pids[4];

	port_a = sv_free_port();
	port_b = sv_free_port();
	snprintf(primary, sizeof(primary),
		 "engine.t.primary=%s --model %s --port {port} --tp 2 "
		 "--gpu-memory-utilization 0.05",
		 ENGINE_PATH, weights);
	engine_start(&sv, weights, port_a, port_b, "--gpu-memory-utilization 0.05", more);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	for (int i = 0; i < 4; i++)
		pids[i] = engine_worker_pid(&sv, i < 2 ? ROLE_PRIMARY : ROLE_SHADOW, i % 2);
	(void)sv_kill(&sv, SIGKILL);
	assert_int_equal(kill(pids[2], SIGKILL), 0);
	assert_int_equal(kill(pids[3], SIGKILL), 0);
	for (uint64_t deadline = mono_ms() + ENGINE_READY_MS;
	     !process_gone(pids[2]) || !process_gone(pids[3]);)
		assert_true(mono_ms() < deadline);
	engine_start(&sv, weights, port_a, port_b, "--gpu-memory-utilization 0.05", more);
	assert_int_equal(engine_metric(&sv, "belayer_engine_adopted", NULL), 1);
	assert_int_equal(engine_metric(&sv, "belayer_engine_launches_total", NULL), 1);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	/* The shadow launched at the restart parked: none had to replace it (one started without
	 * the answers finds no KV cache, exits, and only its replacement, started once the
	 * primary's shims re-announced them, would park). */
	assert_int_equal(engine_metric(&sv, "belayer_engine_launches_total", NULL), 1);
	assert_int_equal(kill(pids[0], SIGKILL), 0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_b);
}

/* The trigger of the last recovery, from `belayerctl status --json`. */
static void assert_trigger(const char *want)
{
	const char *argv[] = {BELAYERCTL_PATH, "status", "--json", NULL};
	char needle[64], *out = NULL;

	snprintf(needle, sizeof(needle), "\"trigger\": \"%s\"", want);
	assert_int_equal(run_tool(&sv, argv, &out), 0);
	if (!out || !strstr(out, needle))
		fail_msg("belayerctl status --json does not say %s", needle);
	free(out);
}

/* A primary rank died while no supervisor ran: the adopted group is broken, and recovered at
 * once (its dead rank's memory went with the supervisor that held it: a cold restart). */
static void rank_dead_while_down_recovered(void **state)
{
	pid_t pids[4];

	run_then_crash(pids);
	assert_int_equal(kill(pids[1], SIGKILL), 0);
	for (uint64_t deadline = mono_ms() + ENGINE_READY_MS; !process_gone(pids[1]);)
		assert_true(mono_ms() < deadline);
	start(true);
	assert_int_equal(engine_wait_recovery(&sv, 1), 3);
	assert_trigger("adopt");
	engine_wait_serving(&sv, expected);
	assert_true(process_gone(pids[0]));
}

/* A rank that does not say hello again within resync_grace (stopped: alive, silent) counts as
 * dead: the adopted primary group is recovered when the grace ends, not before. */
static void silent_rank_counts_as_dead(void **state)
{
	pid_t pids[4];
	uint64_t t0;

	run_then_crash(pids);
	assert_int_equal(kill(pids[1], SIGSTOP), 0);
	t0 = mono_ms();
	start_with(true, "retention.resync_grace=2s");
	assert_int_equal(engine_metric(&sv, "belayer_engine_adopted", NULL), 2);
	assert_int_equal(engine_wait_recovery(&sv, 1), 3);
	assert_true(mono_ms() - t0 >= 2000);
	assert_trigger("adopt");
	engine_wait_serving(&sv, expected);
	assert_true(process_gone(pids[1]));
}

/* ---- under systemd: a restart job leaves the engines, a stop job stops them -------------- */

static pid_t bus_pid, manager_pid;
static char job_file[PATH_MAX];

static void write_job(const char *type)
{
	FILE *f = fopen(job_file, "we");

	assert_non_null(f);
	fprintf(f, "%s\n", type);
	assert_int_equal(fclose(f), 0);
}

/* A private bus (dbus-daemon) with fake-systemd on it, named as the system bus for the
 * supervisors started from now on, which also believe they run as a systemd service. */
static void fake_systemd_start(const char *job)
{
	char conf[PATH_MAX], sock[PATH_MAX], addr[PATH_MAX + 16], line[64] = "";
	uint64_t deadline = mono_ms() + SV_WAIT_MS;
	int out[2];
	FILE *f;

	/* A skip under BELAYER_TEST_NO_SKIP=1 (CI) is a failure, as for every precondition. */
	TEST_REQUIRE(DBUS_DAEMON_PATH[0], "dbus-daemon not installed (package dbus-daemon)");
	snprintf(conf, sizeof(conf), "%s/bus.conf", sv.dir);
	snprintf(sock, sizeof(sock), "%s/bus", sv.dir);
	snprintf(job_file, sizeof(job_file), "%s/job", sv.dir);
	write_job(job);
	f = fopen(conf, "we");
	assert_non_null(f);
	fprintf(f,
		"<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration "
		"1.0//EN\" "
		"\"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n"
		"<busconfig><type>custom</type><listen>unix:path=%s</listen>"
		"<auth>EXTERNAL</auth><policy context=\"default\"><allow user=\"*\"/>"
		"<allow own=\"*\"/><allow send_destination=\"*\"/><allow receive_sender=\"*\"/>"
		"</policy></busconfig>\n",
		sock);
	assert_int_equal(fclose(f), 0);
	bus_pid = fork();
	assert_true(bus_pid >= 0);
	if (bus_pid == 0) {
		execl(DBUS_DAEMON_PATH, DBUS_DAEMON_PATH, "--config-file", conf, "--nofork",
		      "--nopidfile", (char *)NULL);
		_exit(127);
	}
	while (access(sock, F_OK) != 0) {
		assert_true(mono_ms() < deadline);
		(void)poll(NULL, 0, 10);
	}
	snprintf(addr, sizeof(addr), "unix:path=%s", sock);
	setenv("DBUS_SYSTEM_BUS_ADDRESS", addr, 1);
	setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef", 1);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	manager_pid = fork();
	assert_true(manager_pid >= 0);
	if (manager_pid == 0) {
		dup2(out[1], STDOUT_FILENO);
		execl(FAKE_SYSTEMD_PATH, FAKE_SYSTEMD_PATH, job_file, (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	{
		struct pollfd pf = {.fd = out[0], .events = POLLIN};

		assert_int_equal(poll(&pf, 1, SV_WAIT_MS), 1);
		assert_true(read(out[0], line, sizeof(line) - 1) > 0);
	}
	close(out[0]);
	assert_non_null(strstr(line, "ready"));
}

static int fake_systemd_teardown(void **state)
{
	int st;

	unsetenv("DBUS_SYSTEM_BUS_ADDRESS");
	unsetenv("INVOCATION_ID");
	if (manager_pid > 0) {
		(void)kill(manager_pid, SIGKILL);
		(void)waitpid(manager_pid, &st, 0);
	}
	if (bus_pid > 0) {
		(void)kill(bus_pid, SIGKILL);
		(void)waitpid(bus_pid, &st, 0);
	}
	manager_pid = bus_pid = 0;
	return teardown(state);
}

/* `systemctl restart`: the unit's job is a restart when SIGTERM comes; the engines are left
 * running, and the next supervisor adopts them. `systemctl stop` (a stop job): everything it
 * owns stops, the adopted groups too. */
static void systemd_restart_leaves_engines(void **state)
{
	pid_t pids[4];
	int st;

	fake_systemd_start("restart");
	run_then_end(pids, SIGTERM);
	start(true);
	assert_int_equal(engine_metric(&sv, "belayer_engine_adopted", NULL), 2);
	wait_ranks(pids);
	engine_wait_serving(&sv, expected);
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_a);
	assert_int_equal(engine_metric(&sv, "belayer_engine_launches_total", NULL), 0);

	write_job("stop");
	st = sv_kill(&sv, SIGTERM);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	for (int i = 0; i < 4; i++)
		for (uint64_t deadline = mono_ms() + ENGINE_READY_MS; !process_gone(pids[i]);)
			assert_true(mono_ms() < deadline);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(adopts_then_promotes, setup, teardown),
		cmocka_unit_test_setup_teardown(launches_only_what_is_missing, setup, teardown),
		cmocka_unit_test_setup_teardown(rank_dead_while_down_recovered, setup, teardown),
		cmocka_unit_test_setup_teardown(silent_rank_counts_as_dead, setup, teardown),
		cmocka_unit_test_setup_teardown(shadow_after_restart_sized_like_primary, setup,
						teardown),
		cmocka_unit_test_setup_teardown(systemd_restart_leaves_engines, setup,
						fake_systemd_teardown),
	};

	/* SV_TEST_FILTER=name runs one test (cmocka's glob). */
	if (getenv("SV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("SV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
