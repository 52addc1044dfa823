/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench recovery: the processes of a run (supervisor, engine stand-in, gen-weights),
 * each case in its own temporary directory with its own emulated GPU state, and the engine's
 * HTTP API (health, generate, weight update).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench-recovery.h"
#include "bench.h"
#include "engine-client.h"
#include "log.h"
#include "util.h"

#define KV_BYTES "64M"
#define HTTP_MS	 10000
/* The prompts whose answers are compared across failures (ids below every test vocabulary). */
static const int32_t prompts[REC_NPROMPTS][6] = {
	{1, 2, 3, 4, 5, -1},
	{17, 300, 42, -1},
	{1000, 7, 7, 7, 9, 2},
	{4000, 1, -1},
};

/* The world being measured and the weights directory, for the signal handler. */
static struct rec_world *volatile current_world;
static char guard_dir[4096];

const char *const rec_phase_names[PH_COUNT] = {
	[PH_DETECT] = "detect",	  [PH_OWNER] = "owner",	  [PH_HEALTH] = "health",
	[PH_CONTENT] = "content", [PH_LAYOUT] = "layout", [PH_REMAP] = "remap",
	[PH_CANARY] = "canary",	  [PH_LOAD] = "load",	  [PH_READY] = "ready",
};

uint64_t rec_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t deadline_ns;

void rec_deadline_set(unsigned seconds)
{
	deadline_ns = seconds ? rec_now_ns() + (uint64_t)seconds * 1000000000u : 0;
}

int rec_bound_ms(int want_ms)
{
	uint64_t now = rec_now_ns();
	int64_t left;

	if (!deadline_ns)
		return want_ms;
	left = now >= deadline_ns ? 0 : (int64_t)((deadline_ns - now) / 1000000u);
	return left < want_ms ? (int)left : want_ms;
}

bool rec_deadline_passed(void)
{
	return deadline_ns && rec_now_ns() >= deadline_ns;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

pid_t rec_spawn(char *const argv[], char *const env[], const char *out_path)
{
	pid_t parent = getpid(), pid = fork();

	if (pid != 0)
		return pid < 0 ? -errno : pid;
	/* A bench killed by ^C or a crash takes its engines and supervisor with it. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
		_exit(127);
	int fd = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
		      0600);
	if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
		_exit(127);
	for (size_t i = 0; env && env[i]; i++)
		if (putenv(env[i]) < 0)
			_exit(127);
	execv(argv[0], argv);
	_exit(127);
}

int rec_pidfd_open(pid_t pid)
{
	int fd = (int)syscall(SYS_pidfd_open, pid, 0);

	return fd < 0 ? -errno : fd;
}

int rec_pidfd_wait(int pidfd, int timeout_ms)
{
	struct pollfd p = {.fd = pidfd, .events = POLLIN};
	int r;

	do
		r = poll(&p, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	return r == 0 ? -ETIMEDOUT : 0;
}

int rec_run_wait(char *const argv[], char *const env[], const char *out, int timeout_ms)
{
	pid_t pid = rec_spawn(argv, env, out);
	int status, fd, r;

	if (pid < 0)
		return (int)pid;
	fd = rec_pidfd_open(pid);
	r = fd < 0 ? fd : rec_pidfd_wait(fd, timeout_ms);
	if (r < 0)
		(void)kill(pid, SIGKILL);
	safe_close(fd);
	if (waitpid(pid, &status, 0) < 0)
		return -errno;
	if (r < 0)
		return log_error_errno(r, "%s did not finish in time: %m", argv[0]);
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

int rec_wait_port(uint16_t port, int timeout_ms)
{
	uint64_t deadline = rec_now_ns() + (uint64_t)timeout_ms * 1000000;

	while (rec_now_ns() < deadline) {
		int fd = client_connect(port);

		if (fd >= 0) {
			close(fd);
			return 0;
		}
		(void)poll(NULL, 0, 20);
	}
	return -ETIMEDOUT;
}

static void plot_remove(struct rec_plot *pl)
{
	(void)unlink(pl->dat);
	(void)unlink(pl->gp);
	(void)rmdir(pl->dir);
}

int rec_plot_open(struct rec_plot *pl)
{
	int r;

	*pl = (struct rec_plot){.dir = "/tmp/belayer-bench-plot.XXXXXX"};
	if (!mkdtemp(pl->dir))
		return -errno;
	snprintf(pl->dat, sizeof(pl->dat), "%s/data", pl->dir);
	snprintf(pl->gp, sizeof(pl->gp), "%s/plot.gp", pl->dir);
	pl->data = fopen(pl->dat, "we");
	pl->script = pl->data ? fopen(pl->gp, "we") : NULL;
	if (!pl->script) {
		r = -errno;
		if (pl->data)
			fclose(pl->data);
		plot_remove(pl);
		return r;
	}
	return 0;
}

int rec_plot_run(struct rec_plot *pl)
{
	char *argv[] = {"/usr/bin/gnuplot", pl->gp, NULL};
	int r;

	fclose(pl->data);
	fclose(pl->script);
	r = rec_run_wait(argv, NULL, NULL, 60000);
	plot_remove(pl);
	return r;
}

void rec_paths_init(struct rec_paths *p, const struct bench_args *a, const char *build)
{
	snprintf(p->engine, sizeof(p->engine), "%s/tests/engine/belayer-test-engine", build);
	snprintf(p->gen, sizeof(p->gen), "%s/tests/engine/gen-weights", build);
	snprintf(p->kernels, sizeof(p->kernels), "%s/tests/engine/libengine-kernels-host.so",
		 build);
	snprintf(p->supervisor, sizeof(p->supervisor), "%s/supervisor/belayer-supervisor", build);
	snprintf(p->ctl, sizeof(p->ctl), "%s/tools/belayerctl/belayerctl", build);
	p->shim = a->shim;
	p->driver = a->driver;
}

int rec_gen_weights(const struct rec_paths *p, const char *out, uint64_t bytes, unsigned seed)
{
	char size[32], sd[16];
	/* the model shape of tests/engine/coldstart.sh: the bytes are per-layer tables */
	char *argv[] = {(char *)p->gen, "--out",     (char *)out, "--size",
			size,		"--seed",    sd,	  "--hidden",
			"128",		"--heads",   "4",	  "--ffn",
			"512",		"--layers",  "4",	  "--vocab",
			"4096",		"--max-pos", "1024",	  NULL};

	snprintf(size, sizeof(size), "%" PRIu64 "K", bytes >> 10);
	snprintf(sd, sizeof(sd), "%u", seed);
	return rec_run_wait(argv, NULL, NULL, rec_bound_ms(REC_READY_MS));
}

int rec_free_port(uint16_t *ret)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	_cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) < 0)
		return -errno;
	*ret = ntohs(a.sin_port);
	return 0;
}

static int rmtree(const char *dir)
{
	char *argv[] = {"/bin/rm", "-rf", (char *)dir, NULL};

	return rec_run_wait(argv, NULL, NULL, 60000);
}

int rec_world_open(struct rec_world *w, const struct rec_paths *p, unsigned tp,
		   uint64_t weights_bytes, const char *config)
{
	const char *tmp = getenv("TMPDIR");
	char state[4200], cfg[4200], log_path[4200], emu[4200];
	struct stat st;
	int r;

	*w = (struct rec_world){.sup_pid = -1, .sup_pidfd = -1, .tp = tp};
	snprintf(w->dir, sizeof(w->dir), "%s/belayer-bench-recovery.XXXXXX", tmp ? tmp : "/tmp");
	if (!mkdtemp(w->dir))
		return log_error_errno(errno, "mkdtemp: %m");
	current_world = w;
	snprintf(w->socket, sizeof(w->socket), "%s/sup.sock", w->dir);
	snprintf(state, sizeof(state), "%s/state", w->dir);
	snprintf(cfg, sizeof(cfg), "%s/belayer.conf", w->dir);
	snprintf(log_path, sizeof(log_path), "%s/supervisor.log", w->dir);
	snprintf(emu, sizeof(emu), "%s/emu", w->dir);
	if (mkdir(emu, 0700) < 0)
		return log_error_errno(errno, "mkdir %s: %m", emu);
	/*
	 * Device memory is host memory on the emulator (memfds): room per device for its share
	 * of the primary's weights, the same retained after the kill, a cold restart's copy, the
	 * KV arenas and slack.
	 */
	snprintf(w->emu_mem, sizeof(w->emu_mem), "%" PRIu64 "M",
		 MAX((3 * weights_bytes / tp) >> 20, 1024) + 1024);
	{
		FILE *f = fopen(cfg, "we");

		if (!f)
			return log_error_errno(errno, "%s: %m", cfg);
		fprintf(f, "[health]\ninterval = 0\n%s", config ? config : "");
		if (fclose(f) != 0)
			return log_error_errno(errno, "%s: %m", cfg);
	}

	char env_lib[4200], env_kern[4200], env_emu[8400], env_dev[64], env_mem[64];
	char *env[] = {env_lib, env_kern, env_emu, env_dev, env_mem, "BELAYER_LOG_LEVEL=info",
		       NULL};
	snprintf(env_lib, sizeof(env_lib), "LD_LIBRARY_PATH=%s", p->driver ? p->driver : "");
	snprintf(env_kern, sizeof(env_kern), "BELAYER_EMU_KERNELS=%s", p->kernels);
	snprintf(env_emu, sizeof(env_emu), "BELAYER_EMU_DIR=%s", emu);
	snprintf(env_dev, sizeof(env_dev), "BELAYER_EMU_DEVICES=%u", MAX(tp, 2u));
	snprintf(env_mem, sizeof(env_mem), "BELAYER_EMU_MEM=%s", w->emu_mem);
	char *argv[] = {(char *)p->supervisor, "-c",  cfg, "--socket", w->socket,
			"--state-dir",	       state, NULL};
	w->sup_pid = rec_spawn(argv, env, log_path);
	if (w->sup_pid < 0)
		return log_error_errno((int)w->sup_pid, "Failed to start %s: %m", p->supervisor);
	w->sup_pidfd = rec_pidfd_open(w->sup_pid);
	if (w->sup_pidfd < 0)
		return log_error_errno(w->sup_pidfd, "pidfd_open: %m");
	/* Listening once the socket exists (it is bound before it is announced READY). */
	for (int i = 0; i < 5000; i++) {
		if (stat(w->socket, &st) == 0 && S_ISSOCK(st.st_mode))
			return 0;
		r = rec_pidfd_wait(w->sup_pidfd, 2);
		if (r == 0)
			return log_error_errno(ECHILD, "The supervisor exited at start; see %s",
					       log_path);
	}
	return log_error_errno(ETIMEDOUT, "The supervisor did not listen on %s", w->socket);
}

/*
 * SIGKILLs every child of this process that is still there and reaps them. The bench is a
 * child subreaper (rec_guard_install), so engine groups a supervisor launched and left behind
 * (it was killed, or failed to stop them) are children of ours by then. Async-signal-safe:
 * the signal handler calls it too.
 */
static void kill_children(void)
{
	char path[64], buf[4096];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int)getpid());
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		for (ssize_t i = 0; n > 0 && i < n;) {
			long pid = 0;

			while (i < n && (buf[i] < '0' || buf[i] > '9'))
				i++;
			while (i < n && buf[i] >= '0' && buf[i] <= '9')
				pid = pid * 10 + (buf[i++] - '0');
			if (pid > 0)
				(void)kill((pid_t)pid, SIGKILL);
		}
	}
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

static void stop_supervisor(struct rec_world *w, int timeout_ms)
{
	if (w->sup_pid <= 0)
		return;
	/* SIGTERM: the supervisor stops the engine groups it launched, then exits. */
	(void)kill(w->sup_pid, SIGTERM);
	if (w->sup_pidfd < 0 || rec_pidfd_wait(w->sup_pidfd, timeout_ms) < 0)
		(void)kill(w->sup_pid, SIGKILL);
	(void)waitpid(w->sup_pid, NULL, 0);
	w->sup_pid = -1;
}

/* ^C, SIGTERM (timeout(1)), SIGHUP: stop the world, leave nothing running, exit. */
static void rm_rf_signal_safe(char *dir)
{
	char *argv[] = {"/bin/rm", "-rf", dir, NULL};
	pid_t pid;

	if (!dir[0])
		return;
	pid = fork();
	if (pid == 0) {
		execv(argv[0], argv);
		_exit(127);
	}
	if (pid > 0)
		(void)waitpid(pid, NULL, 0);
}

static void on_signal(int sig)
{
	struct rec_world *w = current_world;

	if (w) {
		stop_supervisor(w, 5000);
		kill_children();
		rm_rf_signal_safe(w->dir);
	}
	kill_children();
	rm_rf_signal_safe(guard_dir);
	_exit(128 + sig);
}

void rec_guard_dir(const char *dir)
{
	guard_dir[0] = '\0';
	if (dir && strlen(dir) < sizeof(guard_dir))
		memcpy(guard_dir, dir, strlen(dir) + 1);
}

int rec_guard_install(void)
{
	struct sigaction sa = {.sa_handler = on_signal};

	if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		return -errno;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0 ||
	    sigaction(SIGHUP, &sa, NULL) < 0)
		return -errno;
	return 0;
}

void rec_world_close(struct rec_world *w)
{
	stop_supervisor(w, 10000);
	current_world = NULL;
	kill_children();
	w->sup_pidfd = safe_close(w->sup_pidfd);
	if (w->dir[0] && getenv("BELAYER_BENCH_KEEP") == NULL)
		(void)rmtree(w->dir);
	w->dir[0] = '\0';
}

int rec_engine_spawn(const struct rec_world *w, const struct rec_paths *p, const char *weights,
		     uint16_t port, struct rec_engine *ret)
{
	char env_pre[4200], env_lib[4200], env_kern[4200], env_emu[8400], env_dev[64], env_mem[64],
		env_sock[4300], port_s[16], tp_s[16], log_path[4200];
	char *env[] = {env_pre, env_lib, env_kern, env_emu,
		       env_dev, env_mem, env_sock, "BELAYER_ENGINE_ID=bench",
		       NULL};
	char *argv[] = {(char *)p->engine,
			"--model",
			(char *)weights,
			"--port",
			port_s,
			"--tp",
			tp_s,
			"--kv-cache-bytes",
			KV_BYTES,
			NULL};

	snprintf(env_pre, sizeof(env_pre), "LD_PRELOAD=%s", p->shim);
	snprintf(env_lib, sizeof(env_lib), "LD_LIBRARY_PATH=%s", p->driver ? p->driver : "");
	snprintf(env_kern, sizeof(env_kern), "BELAYER_EMU_KERNELS=%s", p->kernels);
	snprintf(env_emu, sizeof(env_emu), "BELAYER_EMU_DIR=%s/emu", w->dir);
	snprintf(env_dev, sizeof(env_dev), "BELAYER_EMU_DEVICES=%u", MAX(w->tp, 2u));
	snprintf(env_mem, sizeof(env_mem), "BELAYER_EMU_MEM=%s", w->emu_mem);
	snprintf(env_sock, sizeof(env_sock), "BELAYER_SOCKET=%s", w->socket);
	snprintf(port_s, sizeof(port_s), "%u", port);
	snprintf(tp_s, sizeof(tp_s), "%u", w->tp);
	snprintf(log_path, sizeof(log_path), "%s/engine.log", w->dir);

	*ret = (struct rec_engine){
		.pid = rec_spawn(argv, env, log_path), .pidfd = -1, .port = port};
	if (ret->pid < 0)
		return log_error_errno((int)ret->pid, "Failed to start the engine: %m");
	ret->pidfd = rec_pidfd_open(ret->pid);
	return ret->pidfd < 0 ? ret->pidfd : 0;
}

void rec_engine_kill(struct rec_engine *e)
{
	if (e->pid > 0) {
		(void)kill(e->pid, SIGKILL);
		(void)waitpid(e->pid, NULL, 0);
	}
	e->pid = -1;
	e->pidfd = safe_close(e->pidfd);
}

pid_t rec_engine_rank_pid(const struct rec_engine *e, unsigned rank)
{
	char path[64], buf[256];
	_cleanup_fclose_ FILE *f = NULL;
	char *save = NULL, *tok;

	if (rank == 0)
		return e->pid;
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", e->pid, e->pid);
	f = fopen(path, "re");
	if (!f || !fgets(buf, sizeof(buf), f))
		return -ENOENT;
	tok = strtok_r(buf, " \n", &save);
	for (unsigned i = 1; tok && i < rank; i++)
		tok = strtok_r(NULL, " \n", &save);
	return tok ? (pid_t)atoi(tok) : -ENOENT;
}

static int generate(uint16_t port, unsigned prompt, int32_t *ids, int64_t *version)
{
	struct http_response resp = {};
	char body[256];
	size_t n = 0;
	int r;

	n += (size_t)snprintf(body + n, sizeof(body) - n, "{\"input_ids\":[");
	for (unsigned i = 0; i < 6 && prompts[prompt][i] >= 0; i++)
		n += (size_t)snprintf(body + n, sizeof(body) - n, "%s%d", i ? "," : "",
				      prompts[prompt][i]);
	snprintf(body + n, sizeof(body) - n,
		 "],\"sampling_params\":{\"max_new_tokens\":%d,\"temperature\":0}}",
		 REC_NEW_TOKENS);
	r = client_request(port, "POST", "/generate", body, rec_bound_ms(HTTP_MS), &resp);
	if (r < 0)
		return r;
	r = resp.status == 200 ? 0 : -EIO;
	if (r == 0 && ids) {
		struct json_object *o = json_tokener_parse(resp.body), *out, *meta, *v;

		r = -EBADMSG;
		if (o && json_object_object_get_ex(o, "output_ids", &out) &&
		    json_object_is_type(out, json_type_array) &&
		    json_object_array_length(out) == REC_NEW_TOKENS) {
			for (size_t i = 0; i < REC_NEW_TOKENS; i++)
				ids[i] = json_object_get_int(json_object_array_get_idx(out, i));
			*version = -1;
			if (json_object_object_get_ex(o, "meta_info", &meta) &&
			    json_object_object_get_ex(meta, "weights_version", &v))
				*version = json_object_get_int64(v);
			r = 0;
		}
		json_object_put(o);
	}
	http_response_free(&resp);
	return r;
}

int rec_engine_wait_ready(const struct rec_engine *e, int timeout_ms, uint64_t *health_ns)
{
	uint64_t end = rec_now_ns() + (uint64_t)rec_bound_ms(timeout_ms) * 1000000u;

	/* Polled: no event says when a restarting engine's port opens. */
	while (rec_now_ns() < end) {
		struct http_response resp = {};
		int r = client_request(e->port, "GET", "/health", NULL, rec_bound_ms(HTTP_MS),
				       &resp);
		bool ok = r == 0 && resp.status == 200;

		http_response_free(&resp);
		if (ok) {
			if (health_ns)
				*health_ns = rec_now_ns();
			return generate(e->port, 0, NULL, NULL);
		}
		if (e->pidfd >= 0 && rec_pidfd_wait(e->pidfd, 0) == 0)
			return -ECHILD;
		sleep_ms(1);
	}
	return -ETIMEDOUT;
}

int rec_answers_get(uint16_t port, struct rec_answers *ret)
{
	for (unsigned i = 0; i < REC_NPROMPTS; i++) {
		int r = generate(port, i, ret->ids[i], &ret->weights_version);

		if (r < 0)
			return r;
	}
	return 0;
}

bool rec_answers_equal(const struct rec_answers *a, const struct rec_answers *b)
{
	return memcmp(a->ids, b->ids, sizeof(a->ids)) == 0;
}

int rec_update_weights(uint16_t port, const char *path)
{
	struct http_response resp = {};
	struct json_object *o = json_object_new_object();
	int r;

	json_object_object_add(o, "model_path", json_object_new_string(path));
	r = client_request(port, "POST", "/update_weights_from_disk", json_object_to_json_string(o),
			   rec_bound_ms(REC_READY_MS), &resp);
	json_object_put(o);
	if (r == 0 && resp.status != 200)
		r = log_error_errno(EIO, "update_weights_from_disk: %d %s", resp.status,
				    resp.body ? resp.body : "");
	http_response_free(&resp);
	return r;
}
