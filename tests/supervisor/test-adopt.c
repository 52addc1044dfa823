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
#include "sv-test.h"
#include "test-util.h"
#include "util.h"

#define READY_MS   60000
#define MAX_TOKENS 8

static struct sv sv;
static char weights[PATH_MAX];
static uint32_t baseline[MAX_TOKENS]; /* greedy tokens of a failure-free engine */
static uint32_t expected[MAX_TOKENS]; /* what the engine must answer now (baseline by default) */
static uint16_t port_a, port_b;

static const char *const prompt = "[5,17,3,99,42]";

/* POST /generate (greedy); 0 and the tokens, or -errno when nothing serves on port. */
static int generate(uint16_t port, uint32_t out[MAX_TOKENS])
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons(port)};
	char body[256], req[512], resp[8192], *p;
	size_t n = 0;
	ssize_t k;
	int fd, r = 0;

	snprintf(body, sizeof(body),
		 "{\"input_ids\":%s,\"sampling_params\":{\"max_new_tokens\":%d,"
		 "\"temperature\":0}}",
		 prompt, MAX_TOKENS);
	snprintf(req, sizeof(req),
		 "POST /generate HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n"
		 "Content-Length: %zu\r\n\r\n%s",
		 strlen(body), body);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return -ECONNREFUSED;
	}
	/* Bounded: a hung engine must fail the read, not the test run. */
	for (;;) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};

		if (poll(&pf, 1, 10000) != 1) {
			r = -ETIMEDOUT;
			break;
		}
		k = read(fd, resp + n, sizeof(resp) - 1 - n);
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	close(fd);
	resp[n] = '\0';
	if (r < 0)
		return r;
	if (strncmp(resp, "HTTP/1.1 200", 12) != 0 && strncmp(resp, "HTTP/1.0 200", 12) != 0)
		return -EIO;
	p = strstr(resp, "\"output_ids\":[");
	if (!p)
		return -EBADMSG;
	p += strlen("\"output_ids\":[");
	for (int i = 0; i < MAX_TOKENS; i++) {
		out[i] = (uint32_t)strtoul(p, &p, 10);
		if (*p == ',')
			p++;
	}
	return 0;
}

/* The engine's metric (engine="t" plus more labels). */
static uint64_t engine_metric(const char *name, const char *more)
{
	char labels[96];

	snprintf(labels, sizeof(labels), "engine=\"t\"%s%s", more ? "," : "", more ? more : "");
	return metric(&sv, name, labels);
}

/* Workers of engine t with role and rank (rank -1 means 0), alive. */
static pid_t worker_pid(enum worker_role role, int rank)
{
	struct proto_msg m[32];
	int n = ctl_collect(&sv, CTL_WORKERS, 0, CTL_ACT_NONE, -1, m, ARRAY_SIZE(m));

	for (int i = 0; i < n; i++) {
		const struct proto_worker_info *w = &m[i].worker_info;

		if (m[i].type == PROTO_WORKER_INFO && w->state == WORKER_ALIVE && w->role == role &&
		    (w->rank < 0 ? 0 : w->rank) == rank && strcmp(w->engine_id, "t") == 0)
			return (pid_t)w->pid;
	}
	return 0;
}

/* Until the engine serves the baseline tokens on the port the supervisor names. */
static void wait_serving_correctly(void)
{
	uint64_t deadline = mono_ms() + READY_MS;
	uint32_t got[MAX_TOKENS];

	for (;;) {
		uint16_t port = (uint16_t)engine_metric("belayer_engine_port", NULL);

		if (engine_metric("belayer_engine_ready", NULL) == 1 &&
		    engine_metric("belayer_recovery_last_outcome", NULL) != 1 &&
		    generate(port, got) == 0) {
			assert_memory_equal(got, expected, sizeof(got));
			return;
		}
		if (mono_ms() > deadline)
			fail_msg("engine t does not serve within %d ms", READY_MS);
		(void)poll(NULL, 0, 20);
	}
}

/* Until a failure now would be promoted (the supervisor's own verdict, a metric). */
static void wait_promotable(void)
{
	uint64_t deadline = mono_ms() + READY_MS;

	while (engine_metric("belayer_engine_promotable", NULL) != 1) {
		if (mono_ms() > deadline)
			fail_msg("engine t not promotable within %d ms", READY_MS);
		(void)poll(NULL, 0, 20);
	}
}

/* Waits for recovery seq to end; returns its outcome (2 promoted, 3 cold restart). */
static uint64_t wait_recovery(uint64_t seq)
{
	uint64_t deadline = mono_ms() + READY_MS, o;

	while (engine_metric("belayer_recovery_last_seq", NULL) < seq ||
	       (o = engine_metric("belayer_recovery_last_outcome", NULL)) == 1) {
		if (mono_ms() > deadline)
			fail_msg("recovery %" PRIu64 " did not end within %d ms", seq, READY_MS);
		(void)poll(NULL, 0, 20);
	}
	assert_int_not_equal(o, 4); /* failed: nothing serves */
	return o;
}

/* Starts the supervisor with engine t (TP=2, primary and shadow); a restart keeps the ports
 * and the state directory of the previous one. */
static void start_with(bool restart, const char *extra)
{
	static char primary[PATH_MAX * 2 + 256], shadow[PATH_MAX * 2 + 256], env[PATH_MAX + 64],
		port[32], sport[32];
	const char *settings[] = {primary,
				  shadow,
				  env,
				  port,
				  sport,
				  "engine.t.tp=2",
				  "engine.t.probe_interval=50ms",
				  "engine.t.checksum_settle=200ms",
				  extra,
				  NULL};

	if (!restart) {
		port_a = sv_free_port();
		port_b = sv_free_port();
	}
	snprintf(primary, sizeof(primary),
		 "engine.t.primary=%s --model %s --port {port} --tp 2 --kv-cache-bytes 16M",
		 ENGINE_PATH, weights);
	snprintf(shadow, sizeof(shadow),
		 "engine.t.shadow=%s --model %s --port {port} --tp 2 --load-format dummy --seed 1 "
		 "--kv-cache-bytes 16M",
		 ENGINE_PATH, weights);
	snprintf(env, sizeof(env), "engine.t.env=LD_PRELOAD=%s BELAYER_PARK_QUIET_MS=300",
		 SHIM_PATH);
	snprintf(port, sizeof(port), "engine.t.port=%u", port_a);
	snprintf(sport, sizeof(sport), "engine.t.shadow_port=%u", port_b);
	sv_start(&sv, settings);
}

static void start(bool restart)
{
	start_with(restart, NULL);
}

/* Greedy tokens of a failure-free engine (no shim, no supervisor) with weights file w. */
static void failure_free_tokens(const char *w, uint32_t out[MAX_TOKENS])
{
	char port[16];
	uint16_t p = sv_free_port();
	uint64_t deadline = mono_ms() + READY_MS;
	pid_t pid;
	int st;

	snprintf(port, sizeof(port), "%u", p);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execl(ENGINE_PATH, ENGINE_PATH, "--model", w, "--port", port, "--tp", "2",
		      "--kv-cache-bytes", "16M", (char *)NULL);
		_exit(127);
	}
	while (generate(p, out) != 0) {
		assert_true(mono_ms() < deadline);
		assert_int_equal(waitpid(pid, &st, WNOHANG), 0);
		(void)poll(NULL, 0, 20);
	}
	kill(pid, SIGTERM);
	waitpid(pid, &st, 0);
}

static int setup(void **state)
{
	static bool have_baseline;

	sv_setup(&sv);
	setenv("BELAYER_EMU_KERNELS", KERNELS_PATH, 1);
	setenv("BELAYER_EMU_DEVICES", "4", 1);
	snprintf(weights, sizeof(weights), "%s/w.safetensors", sv.dir);
	{
		const char *argv[] = {GEN_PATH, "--out",  weights, "--size",
				      "24M",	"--seed", "1",	   NULL};
		assert_int_equal(run_tool(&sv, argv, NULL), 0);
	}
	if (!have_baseline) {
		failure_free_tokens(weights, baseline);
		have_baseline = true;
	}
	memcpy(expected, baseline, sizeof(expected));
	return 0;
}

/* Stops the supervisor (it stops the engines it launched) and checks that no emulated GPU
 * memory is left: every allocation of this run died with its holders. */
static int teardown(void **state)
{
	uint64_t deadline = mono_ms() + 15000, bytes = 0;
	int64_t live = -1;

	if (sv.pid > 0)
		(void)sv_kill(&sv, SIGTERM);
	while (mono_ms() < deadline) {
		live = belayer_emu_live_allocations(-1, &bytes);
		if (live == 0)
			break;
		(void)poll(NULL, 0, 20);
	}
	sv_teardown(&sv);
	if (live != 0)
		fail_msg("%" PRId64 " emulated allocations (%" PRIu64 " bytes) leaked", live,
			 bytes);
	return 0;
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
	uint64_t deadline = mono_ms() + READY_MS;

	for (;;) {
		pid_t got[4] = {worker_pid(ROLE_PRIMARY, 0), worker_pid(ROLE_PRIMARY, 1),
				worker_pid(ROLE_SHADOW, 0), worker_pid(ROLE_SHADOW, 1)};

		if (got[0] && got[1] && got[2] && got[3]) {
			for (int i = 0; i < 4; i++)
				assert_int_equal(got[i], want[i]);
			return;
		}
		if (mono_ms() > deadline)
			fail_msg("the engine's ranks did not say hello again within %d ms",
				 READY_MS);
		(void)poll(NULL, 0, 20);
	}
}

/* Starts the engine, waits until a failure would be promoted, ends the supervisor with sig and
 * returns the ranks' pids (primary 0, 1, shadow 0, 1), still serving. */
static void run_then_end(pid_t pids[4], int sig)
{
	start(false);
	wait_serving_correctly();
	wait_promotable();
	assert_int_equal(engine_metric("belayer_engine_launches_total", NULL), 2);
	assert_int_equal(engine_metric("belayer_engine_adopted", NULL), 0);
	pids[0] = worker_pid(ROLE_PRIMARY, 0);
	pids[1] = worker_pid(ROLE_PRIMARY, 1);
	pids[2] = worker_pid(ROLE_SHADOW, 0);
	pids[3] = worker_pid(ROLE_SHADOW, 1);
	for (int i = 0; i < 4; i++)
		assert_true(pids[i] > 0);
	(void)sv_kill(&sv, sig);
	/* The engine does not depend on its supervisor: it keeps serving. */
	for (int i = 0; i < 4; i++)
		assert_false(process_gone(pids[i]));
	{
		uint32_t got[MAX_TOKENS];

		assert_int_equal(generate(port_a, got), 0);
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
	assert_int_equal(engine_metric("belayer_engine_adopted", NULL), 2);
	wait_ranks(pids);
	t_hello = mono_ms();
	wait_serving_correctly();
	assert_int_equal(engine_metric("belayer_engine_port", NULL), port_a);
	t_ready = mono_ms();
	wait_promotable();
	print_message("restart -> every rank said hello %" PRIu64 " ms, ready %" PRIu64
		      " ms, promotable %" PRIu64 " ms\n",
		      t_hello - t0, t_ready - t0, mono_ms() - t0);
	/* Nothing was launched, and no other process of the engine said hello. */
	assert_int_equal(engine_metric("belayer_engine_launches_total", NULL), 0);
	assert_int_equal(alive_workers(), 4);
	assert_int_equal(engine_metric("belayer_recovery_last_seq", NULL), 0);

	assert_int_equal(kill(pids[1], SIGKILL), 0);
	assert_int_equal(wait_recovery(1), 2);
	wait_serving_correctly();
	/* Served by the adopted shadow group, on its port. */
	assert_int_equal(engine_metric("belayer_engine_port", NULL), port_b);
	assert_int_equal(worker_pid(ROLE_PRIMARY, 0), pids[2]);
	assert_int_equal(worker_pid(ROLE_PRIMARY, 1), pids[3]);
	/* A new shadow behind it, the one process group launched since the restart; it parks
	 * and a second failure is promoted onto it. */
	assert_int_equal(engine_metric("belayer_engine_launches_total", NULL), 1);
	wait_promotable();
	assert_int_equal(kill(pids[2], SIGKILL), 0);
	assert_int_equal(wait_recovery(2), 2);
	wait_serving_correctly();
	assert_int_equal(engine_metric("belayer_engine_port", NULL), port_a);
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
	for (uint64_t deadline = mono_ms() + READY_MS;
	     !process_gone(pids[2]) || !process_gone(pids[3]);)
		assert_true(mono_ms() < deadline);
	start(true);
	assert_int_equal(engine_metric("belayer_engine_adopted", NULL), 1);
	assert_int_equal(engine_metric("belayer_engine_launches_total", NULL), 1);
	wait_serving_correctly();
	assert_int_equal(engine_metric("belayer_engine_port", NULL), port_a);
	assert_int_equal(worker_pid(ROLE_PRIMARY, 0), pids[0]);
	assert_int_equal(worker_pid(ROLE_PRIMARY, 1), pids[1]);
	wait_promotable();
	assert_int_equal(kill(pids[0], SIGKILL), 0);
	assert_int_equal(wait_recovery(1), 2);
	wait_serving_correctly();
	assert_int_equal(engine_metric("belayer_engine_port", NULL), port_b);
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
	for (uint64_t deadline = mono_ms() + READY_MS; !process_gone(pids[1]);)
		assert_true(mono_ms() < deadline);
	start(true);
	assert_int_equal(wait_recovery(1), 3);
	assert_trigger("adopt");
	wait_serving_correctly();
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
	assert_int_equal(engine_metric("belayer_engine_adopted", NULL), 2);
	assert_int_equal(wait_recovery(1), 3);
	assert_true(mono_ms() - t0 >= 2000);
	assert_trigger("adopt");
	wait_serving_correctly();
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

	if (!DBUS_DAEMON_PATH[0]) {
		print_message("dbus-daemon not installed (package dbus-daemon)\n");
		skip();
	}
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
	assert_int_equal(engine_metric("belayer_engine_adopted", NULL), 2);
	wait_ranks(pids);
	wait_serving_correctly();
	assert_int_equal(engine_metric("belayer_engine_port", NULL), port_a);
	assert_int_equal(engine_metric("belayer_engine_launches_total", NULL), 0);

	write_job("stop");
	st = sv_kill(&sv, SIGTERM);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	for (int i = 0; i < 4; i++)
		for (uint64_t deadline = mono_ms() + READY_MS; !process_gone(pids[i]);)
			assert_true(mono_ms() < deadline);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(adopts_then_promotes, setup, teardown),
		cmocka_unit_test_setup_teardown(launches_only_what_is_missing, setup, teardown),
		cmocka_unit_test_setup_teardown(rank_dead_while_down_recovered, setup, teardown),
		cmocka_unit_test_setup_teardown(silent_rank_counts_as_dead, setup, teardown),
		cmocka_unit_test_setup_teardown(systemd_restart_leaves_engines, setup,
						fake_systemd_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
