/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench recovery: the shadow-promotion path. The supervisor launches the engine from
 * an [engine.bench] section (primary + shadow group, verify = sampled or full); the bench
 * drives it through its HTTP API and reads the supervisor through belayerctl --json: its
 * "promotable" gauge before the kill, then the recovery's summary event (outcome and phase
 * durations).
 */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-measure.h"
#include "bench-recovery.h"
#include "log.h"
#include "proto.h"
#include "util.h"

#define CTL_OUT_MAX	   (4u << 20)
#define SETTLE_MS	   60000
#define SETPRIV		   "/usr/bin/setpriv" /* util-linux */
#define CTL_MS		   15000	      /* one belayerctl query (it gives up after 10 s) */
#define CHECKSUM_SETTLE_MS 100		      /* [engine.bench] checksum_settle */
#define FOLLOW_MS	   10000	      /* the supervisor answers a subscription at once */

/* Runs belayerctl --json --socket S ARGS within CTL_MS; its stdout as JSON (one document). */
static int ctl_json(const struct rec_paths *p, const struct rec_world *w, const char *const *args,
		    struct json_object **ret)
{
	char *argv[16] = {(char *)p->ctl, "--json",   "--timeout",
			  "10",		  "--socket", (char *)w->socket};
	int fds[2], status, n = 6, r = 0;
	_cleanup_free_ char *buf = NULL;
	pid_t parent = getpid(), pid;
	int bound = rec_bound_ms(CTL_MS);
	uint64_t end = rec_now_ns() + (uint64_t)bound * 1000000u;
	size_t len = 0;

	for (; args && *args && n < 15; args++)
		argv[n++] = (char *)*args;
	argv[n] = NULL;
	if (pipe2(fds, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return -errno;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY | O_CLOEXEC);

		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
			_exit(127);
		if (dup2(fds[1], STDOUT_FILENO) < 0 || null < 0 || dup2(null, STDERR_FILENO) < 0)
			_exit(127);
		execv(argv[0], argv);
		_exit(127);
	}
	close(fds[1]);
	buf = malloc(CTL_OUT_MAX + 1);
	while (buf && len < CTL_OUT_MAX) {
		struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
		uint64_t now = rec_now_ns();
		ssize_t k;

		if (now >= end) {
			r = log_error_errno(ETIMEDOUT, "belayerctl %s did not answer within %d ms",
					    argv[6] ? argv[6] : "", bound);
			(void)kill(pid, SIGKILL);
			break;
		}
		k = poll(&pfd, 1, (int)((end - now) / 1000000u) + 1);
		if (k <= 0)
			continue;
		k = read(fds[0], buf + len, CTL_OUT_MAX - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		len += (size_t)k;
	}
	close(fds[0]);
	if (waitpid(pid, &status, 0) < 0 || !buf)
		return -ECHILD;
	if (r < 0)
		return r;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return -EIO;
	buf[len] = '\0';
	*ret = json_tokener_parse(buf);
	return *ret ? 0 : -EBADMSG;
}

static int64_t jint(struct json_object *o, const char *key, int64_t def)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v))
		return def;
	if (json_object_is_type(v, json_type_boolean))
		return json_object_get_boolean(v);
	return json_object_get_int64(v);
}

static const char *jstr(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : "";
}

/* belayerctl workers: an array of workers, or an object holding one. */
static struct json_object *workers_array(struct json_object *o)
{
	struct json_object *v;

	if (json_object_is_type(o, json_type_array))
		return o;
	return json_object_object_get_ex(o, "workers", &v) ? v : NULL;
}

/* Primary pids by rank (alive); with c, also what the parked shadow ranks hold (the largest
 * rank's), and *ret_measured false while the supervisor reports the field but has not measured
 * every shadow rank yet. */
static int read_workers(const struct rec_paths *p, const struct rec_world *w, pid_t *primary,
			struct rec_case *c, bool *ret_measured)
{
	static const char *const args[] = {"workers", NULL};
	struct json_object *o = NULL, *arr;
	int r = ctl_json(p, w, args, &o);

	if (r < 0)
		return r;
	for (unsigned i = 0; i < w->tp; i++)
		primary[i] = -1;
	arr = workers_array(o);
	for (size_t i = 0; arr && i < json_object_array_length(arr); i++) {
		struct json_object *x = json_object_array_get_idx(arr, i);
		/* a worker that does not say its rank (-1) is rank 0, as for the supervisor */
		int64_t rank = MAX(jint(x, "rank", 0), 0);

		if (strcmp(jstr(x, "engine"), "bench") == 0 &&
		    strcmp(jstr(x, "state"), "alive") == 0 &&
		    strcmp(jstr(x, "role"), "primary") == 0 && rank >= 0 && rank < w->tp)
			primary[rank] = (pid_t)jint(x, "pid", -1);
		if (c && strcmp(jstr(x, "engine"), "bench") == 0 &&
		    strcmp(jstr(x, "state"), "alive") == 0 &&
		    strcmp(jstr(x, "role"), "shadow") == 0) {
			struct json_object *v;

			if (!json_object_object_get_ex(x, "device_bytes", &v))
				continue; /* a supervisor that does not measure it */
			if (!v) {
				*ret_measured = false;
				continue;
			}
			c->shadow_device = MAX(c->shadow_device, jint(x, "device_bytes", -1));
			c->shadow_rss = MAX(c->shadow_rss, jint(x, "rss_bytes", -1));
			c->shadow_pss = MAX(c->shadow_pss, jint(x, "pss_bytes", -1));
			c->shadow_shmem = MAX(c->shadow_shmem, jint(x, "pss_shmem_bytes", -1));
		}
	}
	json_object_put(o);
	return 0;
}

/* The supervisor's belayer_engine_promotable{engine="bench"} gauge (-1: not exported). */
static int read_promotable(const struct rec_paths *p, const struct rec_world *w, int *ret)
{
	static const char *const args[] = {"status", NULL};
	struct json_object *o = NULL, *metrics, *labels;
	int r = ctl_json(p, w, args, &o);

	if (r < 0)
		return r;
	*ret = -1;
	if (json_object_object_get_ex(o, "metrics", &metrics))
		for (size_t i = 0; i < json_object_array_length(metrics); i++) {
			struct json_object *m = json_object_array_get_idx(metrics, i);

			if (strcmp(jstr(m, "name"), "belayer_engine_promotable") == 0 &&
			    json_object_object_get_ex(m, "labels", &labels) &&
			    strcmp(jstr(labels, "engine"), "bench") == 0)
				*ret = (int)jint(m, "value", 0);
		}
	json_object_put(o);
	return 0;
}

/*
 * Waits until a failure now would be promoted: the supervisor's promotable gauge (parked
 * shadow group with the primary's layout, weights checksums recorded at the current weights
 * version); and the primary's pids by rank.
 */
static int wait_armed(const struct rec_paths *p, const struct rec_world *w, pid_t *primary,
		      struct rec_case *c)
{
	int bound = rec_bound_ms(SETTLE_MS);
	uint64_t end = rec_now_ns() + (uint64_t)bound * 1000000u;

	for (;;) {
		unsigned alive = 0;
		bool measured = true;
		int promotable = 0, r;

		c->shadow_device = c->shadow_rss = c->shadow_pss = c->shadow_shmem = -1;
		r = read_workers(p, w, primary, c, &measured);

		r = r ?: read_promotable(p, w, &promotable);
		for (unsigned i = 0; r == 0 && i < w->tp; i++)
			alive += primary[i] > 0;
		if (r == 0 && promotable < 0)
			return log_error_errno(ENOTSUP, "No belayer_engine_promotable metric");
		if (r == 0 && promotable == 1 && alive == w->tp && measured)
			return 0;
		if (rec_now_ns() >= end)
			return log_error_errno(ETIMEDOUT, "Not promotable within %d ms (%s)", bound,
					       w->dir);
		/* Polled (belayerctl is the interface); the supervisor's own waits are events. */
		if (rec_pidfd_wait(w->sup_pidfd, 20) == 0)
			return log_error_errno(ECHILD, "The supervisor exited (%s)", w->dir);
	}
}

/*
 * The supervisor's event stream, subscribed in this process over its control socket (the
 * protocol belayerctl events speaks). The subscription is complete when the supervisor's END
 * (after the replayed history) arrives: every later event reaches us. A follower that only
 * started subscribing (a belayerctl child) could miss a promotion that ends in under a
 * millisecond after the kill, and the bench then waited for its summary forever.
 */
struct follower {
	int fd;
	char reason[160]; /* of the last cold restart */
};

static int follow_start(const struct rec_world *w, struct follower *f)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct proto_msg m = {.type = PROTO_CTL};
	int bound = rec_bound_ms(FOLLOW_MS), r;
	uint64_t end = rec_now_ns() + (uint64_t)bound * 1000000u;

	*f = (struct follower){.fd = -1};
	if (strlen(w->socket) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, w->socket, strlen(w->socket));
	f->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (f->fd < 0)
		return log_error_errno(errno, "socket: %m");
	if (connect(f->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return log_error_errno(errno, "Cannot reach the supervisor at %s: %m", w->socket);
	m.ctl.cmd = CTL_EVENTS;
	m.ctl.dev = -1;
	r = proto_send(f->fd, &m, 0);
	if (r < 0)
		return log_error_errno(r, "Subscribing to the events failed: %m");
	for (;;) {
		struct pollfd pfd = {.fd = f->fd, .events = POLLIN};
		uint64_t now = rec_now_ns();

		if (now >= end)
			return log_error_errno(ETIMEDOUT,
					       "The supervisor did not confirm the event "
					       "subscription within %d ms (%s)",
					       bound, w->dir);
		r = poll(&pfd, 1, (int)((end - now) / 1000000u) + 1);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r <= 0)
			continue;
		r = proto_recv(f->fd, &m, 0);
		if (r < 0)
			return log_error_errno(r, "Reading the event subscription's reply: %m");
		bool done = m.type == PROTO_END, refused = m.type == PROTO_ERROR;

		proto_msg_finish(&m);
		if (refused)
			return log_error_errno(EPROTO, "The supervisor refused the subscription");
		if (done)
			return 0;
	}
}

static void follow_stop(struct follower *f)
{
	f->fd = safe_close(f->fd);
}

/* One recovery event's message: the cold restart's reason, or the summary. */
static bool follow_event(struct follower *f, const char *m, char *outcome, size_t size, double *ph)
{
	static const char *const keys[PH_COUNT] = {
		[PH_DETECT] = "detect_us=", [PH_OWNER] = "owner_us=",
		[PH_HEALTH] = "health_us=", [PH_CONTENT] = "content_us=",
		[PH_LAYOUT] = "layout_us=", [PH_REMAP] = "remap_us=",
		[PH_CANARY] = "canary_us=", [PH_READY] = "ready_us="};
	const char *v = strstr(m, " outcome="), *cr = strstr(m, ": cold restart: ");

	if (strncmp(m, "engine \"bench\" ", 15) == 0 && cr)
		snprintf(f->reason, sizeof(f->reason), "%s", cr + 16);
	if (strncmp(m, "engine=bench ", 13) != 0 || !v)
		return false;
	snprintf(outcome, size, "%.*s", (int)strcspn(v + 9, " "), v + 9);
	for (int i = 0; i < PH_COUNT; i++) {
		const char *x = keys[i] ? strstr(m, keys[i]) : NULL;

		ph[i] = x ? strtod(x + strlen(keys[i]), NULL) / 1000.0 : -1;
	}
	return true;
}

/*
 * Reads events until the recovery's summary event ("engine=bench seq=N outcome=promoted|
 * cold_restart|failed trigger=... detect_us=... ... total_us=..."): the outcome and the
 * phase durations (ms) it carries. Bounded by timeout_ms (and the run's --timeout).
 */
static int follow_recovery(struct follower *f, int timeout_ms, char *outcome, size_t size,
			   double *ph)
{
	int bound = rec_bound_ms(timeout_ms);
	uint64_t end = rec_now_ns() + (uint64_t)bound * 1000000u;

	for (;;) {
		struct pollfd pfd = {.fd = f->fd, .events = POLLIN};
		struct proto_msg m;
		uint64_t now = rec_now_ns();
		bool done = false;
		int r;

		if (now >= end)
			return log_error_errno(ETIMEDOUT, "No recovery summary event within %d ms",
					       bound);
		r = poll(&pfd, 1, (int)((end - now) / 1000000u) + 1);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r <= 0)
			continue;
		r = proto_recv(f->fd, &m, 0);
		if (r < 0)
			return log_error_errno(r, "The event stream ended: %m");
		if (m.type == PROTO_EVENT && m.event.kind == EVENT_RECOVERY)
			done = follow_event(f, m.event.message, outcome, size, ph);
		proto_msg_finish(&m);
		if (done)
			return 0;
	}
}

bool rec_shadow_supported(const struct rec_paths *p)
{
	char cmd[8400], line[256];
	bool found = false;
	FILE *f;

	/* A supervisor that knows [engine.NAME] sections prints one back. */
	snprintf(cmd, sizeof(cmd),
		 "timeout -s KILL 10 '%s' -c /dev/null -o engine.probe.tp=1 --dump-config 2>&1",
		 p->supervisor);
	f = popen(cmd, "re");
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "[engine.probe]", 14) == 0)
			found = true;
	return pclose(f) == 0 && found;
}

int rec_run_shadow(const struct rec_paths *p, const char *wfile, const char *ufile,
		   const char *verify, struct rec_case *c)
{
	return rec_run_shadow_fault(p, wfile, ufile, verify, REC_FAULT_KILL, "", c);
}

/*
 * The command the supervisor starts for the engine: a script beside the weights that execs the
 * engine with the case's fixed arguments, under setpriv --pdeathsig KILL where there is one, so
 * the supervisor's engine groups die with it (and it dies with the bench: rec_spawn); a bench
 * killed by SIGKILL, which runs no handler, leaves no engine behind. The supervisor itself
 * keeps its engines across its own restarts, so this is the bench's choice. A script, not a
 * command line in the configuration: the supervisor's config lines are short (libinih: 200
 * characters), and the weights may be under a long $TMPDIR.
 */
static int engine_wrapper(const struct rec_paths *p, const char *wfile, unsigned tp, char *ret,
			  size_t size)
{
	const char *slash = strrchr(wfile, '/');
	bool pdeath = access(SETPRIV, X_OK) == 0;
	FILE *f;

	if (!slash)
		return -EINVAL;
	snprintf(ret, size, "%.*s/engine", (int)(slash - wfile), wfile);
	f = fopen(ret, "we");
	if (!f)
		return log_error_errno(errno, "%s: %m", ret);
	fprintf(f, "#!/bin/sh\nexec %s%s'%s' --model '%s' --tp %u --kv-cache-bytes 64M \"$@\"\n",
		pdeath ? SETPRIV : "", pdeath ? " --pdeathsig KILL " : "", p->engine, wfile, tp);
	if (fchmod(fileno(f), 0700) < 0 || fclose(f) != 0)
		return log_error_errno(errno, "%s: %m", ret);
	return 0;
}

/* Drives one collective into the engine in a child: a /generate that blocks until the
 * group is stopped (it is the request a hung engine never answers). */
static pid_t drive_request(uint16_t port)
{
	pid_t parent = getpid(), pid = fork();

	if (pid == 0) {
		struct rec_answers a;

		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
			_exit(127);

		(void)rec_answers_get(port, &a);
		_exit(0);
	}
	return pid;
}

int rec_run_shadow_fault(const struct rec_paths *p, const char *wfile, const char *ufile,
			 const char *verify, enum rec_fault fault, const char *extra_config,
			 struct rec_case *c)
{
	pid_t driver = -1;
	struct rec_world w = {};
	struct rec_engine e = {.pid = -1, .pidfd = -1}, promoted = {.pid = -1, .pidfd = -1};
	struct rec_answers v0 = {}, v1 = {}, after = {};
	struct follower fl = {.fd = -1};
	pid_t primary[REC_MAX_TP];
	uint16_t port, shadow_port;
	uint64_t t_kill, t_detect, t_ready;
	char config[12000], outcome[64] = "", engine[4200] = "";
	double sup_ph[PH_COUNT];
	bool ok_promoted;
	int victim_fd = -1, r;

	r = rec_free_port(&port);
	r = r ?: rec_free_port(&shadow_port);
	if (r < 0)
		return r;
	r = r ?: engine_wrapper(p, wfile, c->tp, engine, sizeof(engine));
	if (r < 0)
		return r;
	snprintf(config, sizeof(config),
		 "[engine.bench]\n"
		 "primary = %s --port {port}\n"
		 "shadow = %s --port {port} --load-format dummy --seed 1\n"
		 "env = LD_PRELOAD=%s\n"
		 "tp = %u\nport = %u\nshadow_port = %u\nverify = %s\nprobe_interval = 20ms\n"
		 "checksum_settle = %ums\n%s",
		 engine, engine, p->shim, c->tp, port, shadow_port, verify, CHECKSUM_SETTLE_MS,
		 extra_config ? extra_config : "");
	r = rec_world_open(&w, p, c->tp, c->bytes, config);
	if (r < 0)
		goto out;
	/* The supervisor started the group; the bench only talks to its port. */
	e.port = port;
	r = rec_engine_wait_ready(&e, REC_READY_MS, NULL);
	if (r < 0) {
		log_error_errno(r, "The supervisor's primary did not become ready (%s): %m", w.dir);
		goto out;
	}
	r = rec_answers_get(port, &v0);
	r = r ?: rec_update_weights(port, ufile);
	r = r ?: rec_answers_get(port, &v1);
	if (r == 0 && rec_answers_equal(&v0, &v1))
		r = log_error_errno(EPROTO, "The weight update did not change the answers");
	r = r ?: wait_armed(p, &w, primary, c);
	r = r ?: follow_start(&w, &fl);
	if (r < 0)
		goto out;
	victim_fd = rec_pidfd_open(primary[c->tp - 1]);
	if (victim_fd < 0) {
		r = victim_fd;
		goto out;
	}
	t_kill = rec_now_ns();
	if (fault == REC_FAULT_STOP) {
		/* The rank stops; the next request puts its peers into a collective it never
		 * joins. Detection is the supervisor's (the NCCL hang detector), measured by it
		 * from the group's last progress. */
		(void)kill(primary[c->tp - 1], SIGSTOP);
		driver = drive_request(port);
		r = follow_recovery(&fl, REC_READY_MS, outcome, sizeof(outcome), sup_ph);
		t_detect = t_kill + (uint64_t)(sup_ph[PH_DETECT] > 0 ? sup_ph[PH_DETECT] * 1e6 : 0);
	} else {
		(void)kill(primary[c->tp - 1], SIGKILL);
		r = rec_pidfd_wait(victim_fd, 10000);
		t_detect = rec_now_ns();
		r = r ?: follow_recovery(&fl, REC_READY_MS, outcome, sizeof(outcome), sup_ph);
	}
	ok_promoted = strcmp(outcome, "promoted") == 0;
	if (r == 0 && !ok_promoted && strcmp(outcome, "cold_restart") != 0)
		r = log_error_errno(EIO, "The recovery ended '%s' (%s)", outcome, w.dir);
	if (r < 0) {
		log_error_errno(r, "No end of the recovery in the event stream (%s): %m", w.dir);
		goto out;
	}
	/* Promoted: the shadow group serves on its own port; cold: the primary's port again. */
	promoted.port = ok_promoted ? shadow_port : port;
	r = rec_engine_wait_ready(&promoted, REC_READY_MS, NULL);
	t_ready = rec_now_ns();
	if (r < 0) {
		log_error_errno(r, "Not serving after the recovery (%s): %m", w.dir);
		goto out;
	}
	/*
	 * The bench's own clock for detect (as on the cold path) and for the total; the
	 * supervisor's for the checks and the remap in between; "ready" is the rest: the
	 * supervisor's last steps, the client seeing /health and its first /generate.
	 */
	for (int k = 0; k < PH_COUNT; k++)
		c->ph[k] = k > PH_DETECT && k < PH_LOAD ? sup_ph[k] : -1;
	c->ph[PH_DETECT] = bench_ms_between(t_kill, t_detect);
	c->total_ms = bench_ms_between(t_kill, t_ready);
	{
		double rest = c->total_ms;

		for (int k = 0; k < PH_READY; k++)
			if (c->ph[k] > 0)
				rest -= c->ph[k];
		c->ph[PH_READY] = rest > 0 ? rest : 0;
	}
	r = rec_answers_get(promoted.port, &after);
	if (r < 0)
		goto out;
	c->equal_prefailure = rec_answers_equal(&after, &v1);
	c->equal_v0 = rec_answers_equal(&after, &v0);
	c->version_after = after.weights_version;
	c->ok = true;
	if (!ok_promoted)
		snprintf(c->note, sizeof(c->note), "cold restart: %s", fl.reason);
out:
	if (r < 0)
		snprintf(c->note, sizeof(c->note), "failed: %s", strerror(-r));
	safe_close(victim_fd);
	if (driver > 0) {
		(void)kill(driver, SIGKILL);
		(void)waitpid(driver, NULL, 0);
	}
	follow_stop(&fl);
	/* The supervisor stops the groups it launched. */
	rec_world_close(&w);
	if (engine[0])
		(void)unlink(engine);
	return r;
}
