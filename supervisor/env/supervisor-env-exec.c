/* SPDX-License-Identifier: MIT */
/* `env exec` on the loop: requests, output, exit, timeout (see supervisor-env-exec.h). */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-client.h"
#include "supervisor-env-exec-spawn.h"
#include "supervisor-env-exec.h"
#include "supervisor-env-files.h"
#include "supervisor-env-image.h"
#include "supervisor-env-sandbox.h"
#include "supervisor-env-slots.h"

#define READ_BURST   (4u << 16) /* bytes read from one pipe per wakeup: fair among many execs */
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

struct exec_stream {
	int fd; /* -1: at EOF */
	struct event *ev;
	char *buf; /* what is kept (not streaming) */
	size_t len, cap, seen;
};

struct env_exec {
	struct env_exec *next;
	struct supervisor *s;
	uint64_t client;
	struct env_slot *slot;
	char env[ENV_ID_MAX + 1];
	pid_t pid, ns_pid; /* ours, and in the environment's pid namespace */
	int pidfd;
	struct event *ev_pid, *ev_timer;
	struct exec_stream out[2];
	uint32_t max_output;
	bool stream, exited, timed_out;
	int code, sig;
	uint64_t t0_us;
	uint64_t timeout_us; /* from t0_us */
};

static struct event_base *exec_base;
static struct env_exec *execs;
static unsigned n_execs;

static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

void env_exec_start(struct event_base *base)
{
	exec_base = base;
}

static void send_chunks(struct env_exec *x, struct sv_client *c, uint32_t stream, const char *p,
			size_t n)
{
	while (c && n > 0) {
		struct proto_msg m = {.type = PROTO_ENV_EXEC_OUT};
		size_t k = MIN(n, (size_t)PROTO_EXEC_CHUNK_MAX);

		m.exec_out.stream = stream;
		m.exec_out.data.data = (void *)(uintptr_t)p;
		m.exec_out.data.len = (uint32_t)k;
		if (client_send(x->s, c, &m) < 0)
			return; /* a slow or gone reader: the client code disconnects it */
		p += k;
		n -= k;
	}
}

/* pid's number in its own (innermost) pid namespace: the last of its NSpid line. */
static pid_t ns_pid_of(pid_t pid)
{
	char path[64], line[256];
	pid_t r = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, "NSpid:", 6) == 0) {
			const char *last = strrchr(line, '\t');

			r = last ? (pid_t)atoi(last + 1) : 0;
			break;
		}
	if (f)
		fclose(f);
	return r;
}

/* execve's ENOENT and EACCES as a shell reports them (127, 126, a line on stderr): an agent's
 * tool call reads a status and an output, not a protocol error. */
static void reply_not_run(struct supervisor *s, struct sv_client *c, const char *cmd, int err)
{
	struct proto_msg m = {.type = PROTO_ENV_EXEC_OUT};
	char line[512];
	int n = snprintf(line, sizeof(line), "belayer: %s: %s\n", cmd, strerror(err));

	m.exec_out.stream = 2;
	m.exec_out.data = (struct proto_blob){line, (uint32_t)MIN((size_t)n, sizeof(line) - 1), 0};
	(void)client_send(s, c, &m);
	m = (struct proto_msg){.type = PROTO_ENV_EXEC_DONE};
	m.exec_done.exit_code = err == ENOENT ? 127 : 126;
	(void)client_send(s, c, &m);
}

static void exec_free(struct env_exec *x)
{
	for (struct env_exec **pp = &execs; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			break;
		}
	n_execs--;
	for (int i = 0; i < 2; i++) {
		if (x->out[i].ev)
			event_free(x->out[i].ev);
		(void)safe_close(x->out[i].fd);
		free(x->out[i].buf);
	}
	if (x->ev_pid)
		event_free(x->ev_pid);
	if (x->ev_timer)
		event_free(x->ev_timer);
	(void)safe_close(x->pidfd);
	if (x->slot && x->slot->execs > 0)
		x->slot->execs--;
	free(x);
}

/* The reply, once the command exited and its output ended (or the timeout passed). */
static void exec_finish(struct env_exec *x)
{
	struct sv_client *c = x->client ? client_by_serial(x->s, x->client) : NULL;
	struct proto_msg m = {.type = PROTO_ENV_EXEC_DONE};
	uint64_t us = mono_us() - x->t0_us;

	if (!x->stream)
		for (int i = 0; i < 2; i++)
			send_chunks(x, c, (uint32_t)i + 1, x->out[i].buf, x->out[i].len);
	m.exec_done.exit_code = x->sig ? -1 : x->code;
	m.exec_done.signal = (uint32_t)x->sig;
	m.exec_done.timed_out = x->timed_out;
	m.exec_done.truncated = (x->out[0].seen > x->out[0].len ? 1u : 0) |
				(x->out[1].seen > x->out[1].len ? 2u : 0);
	m.exec_done.wall_us = us;
	m.exec_done.out_bytes = x->out[0].seen;
	m.exec_done.err_bytes = x->out[1].seen;
	m.exec_done.pid = (uint32_t)x->ns_pid;
	if (c)
		(void)client_send(x->s, c, &m);
	log_debug("Environment %s: exec pid %d done in %" PRIu64 " ms (%s %d%s).", x->env,
		  (int)x->pid, us / 1000, x->sig ? "signal" : "exit", x->sig ? x->sig : x->code,
		  x->timed_out ? ", timed out" : "");
	exec_free(x);
}

static void maybe_finish(struct env_exec *x)
{
	if (x->exited && (x->timed_out || (x->out[0].fd < 0 && x->out[1].fd < 0)))
		exec_finish(x);
}

static void stream_close(struct exec_stream *st)
{
	if (st->ev)
		event_free(st->ev);
	st->ev = NULL;
	st->fd = safe_close(st->fd);
}

/* Room for n more bytes, the buffer grown as output comes (256 quiet execs hold no 1 MiB
 * buffers each). */
static int stream_reserve(struct exec_stream *st, size_t n, size_t max)
{
	size_t cap;
	char *b;

	if (st->len + n <= st->cap)
		return 0;
	cap = MIN(MAX(st->cap * 2, st->len + n), max);
	b = realloc(st->buf, cap);
	if (!b)
		return -ENOMEM;
	st->buf = b;
	st->cap = cap;
	return 0;
}

static void on_output(evutil_socket_t fd, short what, void *arg)
{
	struct env_exec *x = arg;
	int i = x->out[0].fd == fd ? 0 : 1;
	struct exec_stream *st = &x->out[i];
	char buf[1 << 16];

	(void)what;
	for (size_t total = 0; total < READ_BURST;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		size_t keep;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			stream_close(st);
			maybe_finish(x);
			return;
		}
		keep = st->len < x->max_output ? MIN((size_t)n, x->max_output - st->len) : 0;
		st->seen += (size_t)n;
		total += (size_t)n;
		if (keep && x->stream) {
			send_chunks(x, client_by_serial(x->s, x->client), (uint32_t)i + 1, buf,
				    keep);
			st->len += keep;
		} else if (keep && stream_reserve(st, keep, x->max_output) >= 0) {
			memcpy(st->buf + st->len, buf, keep);
			st->len += keep;
		}
		/* What is not kept is counted: the reply says truncated. */
	}
}

static void on_exit_cb(evutil_socket_t fd, short what, void *arg)
{
	struct env_exec *x = arg;
	siginfo_t si = {0};

	(void)fd;
	(void)what;
	if (waitid((idtype_t)P_PIDFD, (id_t)x->pidfd, &si, WEXITED | WNOHANG) < 0 || si.si_pid == 0)
		return;
	x->exited = true;
	if (si.si_code == CLD_EXITED)
		x->code = si.si_status;
	else
		x->sig = si.si_status;
	event_free(x->ev_pid);
	x->ev_pid = NULL;
	maybe_finish(x);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct env_exec *x = arg;

	(void)fd;
	(void)what;
	/* libevent's timer runs on its own (cached, possibly coarse) clock and fired here 2 ms
	 * before a 1 s timeout had passed on the clock wall_us is measured with (envexec, once in
	 * CI): the rest is waited for, so a command is never cut before its timeout. */
	{
		uint64_t spent = mono_us() - x->t0_us;

		if (spent < x->timeout_us) {
			uint64_t left = x->timeout_us - spent;
			struct timeval tv = {.tv_sec = (time_t)(left / 1000000),
					     .tv_usec = (suseconds_t)(left % 1000000)};

			if (event_add(x->ev_timer, &tv) == 0)
				return;
		}
	}
	x->timed_out = true;
	/* The group the command leads (it made its own session): the command and what it
	 * started there, `sleep 1000 &` included. Its pid in our namespace is the group's id. */
	(void)kill(-x->pid, SIGKILL);
	if (!x->exited)
		(void)syscall(SYS_pidfd_send_signal, x->pidfd, SIGKILL, NULL, 0);
	maybe_finish(x);
}

/* The command's environment: base (an image's: its Env), else PATH, HOME, LANG defaults,
 * then the request's K=V over it (a key given twice: the last wins). The array is allocated
 * (argv-style), its strings are base's and the request's. */
static char **envp_build(const struct proto_blob *envv, char *const *base, const char **ret_path)
{
	static const char *const defaults[] = {"PATH=" DEFAULT_PATH, "HOME=/root", "LANG=C.UTF-8",
					       "TERM=dumb"};
	size_t nbase = 0, n, k = 0;
	const char *p = envv->data;
	char **envp;

	while (base && base[nbase])
		nbase++;
	n = (base ? nbase : ARRAY_SIZE(defaults)) + envv->count;
	envp = calloc(n + 1, sizeof(char *));
	if (!envp)
		return NULL;
	if (base)
		for (size_t i = 0; i < nbase; i++)
			envp[k++] = base[i];
	else
		for (size_t i = 0; i < ARRAY_SIZE(defaults); i++)
			envp[k++] = (char *)defaults[i];
	for (uint32_t i = 0; i < envv->count; i++, p += strlen(p) + 1) {
		const char *eq = strchr(p, '=');
		size_t klen = eq ? (size_t)(eq - p) : 0;
		size_t j;

		if (!klen) {
			free(envp);
			errno = EINVAL;
			return NULL;
		}
		for (j = 0; j < k; j++)
			if (strncmp(envp[j], p, klen + 1) == 0)
				break;
		envp[j] = (char *)p;
		if (j == k)
			k++;
	}
	envp[k] = NULL;
	*ret_path = DEFAULT_PATH;
	for (size_t j = 0; j < k; j++)
		if (strncmp(envp[j], "PATH=", 5) == 0)
			*ret_path = envp[j] + 5;
	return envp;
}

static char **argv_build(const struct proto_blob *b)
{
	char **argv = calloc((size_t)b->count + 1, sizeof(char *));
	char *p = b->data;

	if (!argv)
		return NULL;
	for (uint32_t i = 0; i < b->count; i++, p += strlen(p) + 1)
		argv[i] = p;
	return argv;
}

/* The client's stdin (a regular file) as a sealed memfd: what the command reads can be
 * neither a host file it could reopen through /proc/self/fd nor changed under it. */
static int stdin_copy(int from)
{
	struct stat st;
	uint64_t n;

	if (fstat(from, &st) < 0)
		return -errno;
	return S_ISREG(st.st_mode) ? env_file_sealed_copy(from, ENV_EXEC_STDIN_MAX, &n) : -EINVAL;
}

static int refuse(struct supervisor *s, struct sv_client *c, int code, const char *what,
		  const char *env)
{
	return client_send_error(s, c, code, PROTO_ENV_EXEC, "env exec %s: %s", env, what);
}

/* The slot of a request that needs a running environment and no job on it; NULL after an
 * error reply. */
struct env_slot *env_slot_ready(struct supervisor *s, struct sv_client *c, const char *env,
				enum proto_type type)
{
	struct env_slot *sl;

	if (!s->envs) {
		(void)client_send_error(s, c, ENOTSUP, type, "environments are off");
		return NULL;
	}
	if (c->cred.uid != 0 && c->cred.uid != s->uid) {
		(void)client_refuse(s, c, REJECT_UNAUTHORIZED, EPERM, type, "%s needs root",
				    proto_type_to_string(type));
		return NULL;
	}
	sl = env_id_valid(env) ? env_slot_find(s->envs, env) : NULL;
	if (!sl || !sl->env) {
		(void)client_send_error(s, c, ENOENT, type, "no environment %s", env);
		return NULL;
	}
	if (sl->busy) {
		(void)client_send_error(s, c, EBUSY, type,
					"%s: a checkpoint, restore or rebuild runs", env);
		return NULL;
	}
	if (sl->env->pid <= 0) {
		(void)client_send_error(s, c, ESRCH, type, "%s is not running (restore it)", env);
		return NULL;
	}
	return sl;
}

int env_exec_dispatch(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	const struct proto_env_exec *q = &m->env_exec;
	_cleanup_free_ char **argv = NULL, **envp = NULL;
	_cleanup_(env_image_run_finish) struct env_image_run image = {0};
	_cleanup_close_ int root = -1, in = -1, init = -1, cg = -1;
	int po[2] = {-1, -1}, pe[2] = {-1, -1}, pidfd = -1, r;
	struct exec_spawn sp = {0};
	struct env_slot *sl;
	struct env_exec *x;
	char why[128];
	pid_t pid;

	sl = env_slot_ready(s, c, q->env, PROTO_ENV_EXEC);
	if (!sl)
		return 0;
	if (!exec_base)
		return refuse(s, c, ENOTSUP, "no event loop", q->env);
	if (n_execs >= ENV_EXEC_MAX)
		return refuse(s, c, EAGAIN, "too many execs running", q->env);
	if (q->timeout_ms > ENV_EXEC_TIMEOUT_MAX_MS || q->max_output > ENV_EXEC_OUTPUT_MAX)
		return refuse(s, c, EINVAL, "timeout at most 24 h, output at most 2 MiB", q->env);
	root = env_files_root(sl->env->pid);
	if (root < 0)
		return refuse(s, c, -root, "cannot reach its root", q->env);
	if (sl->env->image[0]) {
		/* as `docker exec`: the image's Env, WorkingDir and User (with its groups) */
		r = env_image_exec_prepare(sl->env, root, q->user, &image);
		if (r < 0)
			return refuse(s, c, -r,
				      r == -ESRCH     ? "no such user or group"
				      : r == -EBADMSG ? "the user's /etc/passwd entry is malformed"
						      : "cannot read its image's config",
				      q->env);
		sp.uid = image.uid;
		sp.gid = image.gid;
		sp.groups = image.groups;
		sp.n_groups = image.n_groups;
	} else {
		r = env_user_lookup(root, q->user, &sp.uid, &sp.gid);
		if (r < 0)
			return refuse(s, c, -r, "no such user or group", q->env);
	}
	argv = argv_build(&q->argv);
	envp = envp_build(&q->envv, image.envp, &sp.path);
	if (!argv || !envp)
		return refuse(s, c, errno == EINVAL ? EINVAL : ENOMEM,
			      errno == EINVAL ? "--env needs K=V" : "out of memory", q->env);
	in = stdin_copy(q->fd);
	if (in < 0)
		return refuse(s, c, -in, in == -EFBIG ? "stdin over 16 MiB" : "bad stdin", q->env);
	init = (int)syscall(SYS_pidfd_open, sl->env->pid, 0);
	cg = open(sl->env->cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (init < 0 || cg < 0)
		return refuse(s, c, errno, "cannot reach its init or cgroup", q->env);
	x = calloc(1, sizeof(*x));
	if (!x)
		return refuse(s, c, ENOMEM, "out of memory", q->env);
	x->out[0].fd = x->out[1].fd = x->pidfd = -1;
	x->max_output = q->max_output ? q->max_output : ENV_EXEC_OUTPUT_DEFAULT;
	x->stream = q->flags & EXEC_FLAG_STREAM;
	if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0) {
		r = -errno;
		goto fail;
	}
	sp.argv = argv;
	sp.envp = envp;
	sp.cwd = q->cwd[0] ? q->cwd : sl->env->image[0] ? image.workdir : "/";
	sp.init_pidfd = init;
	sp.cgroup_fd = cg;
	sp.stdin_fd = in;
	sp.out_fd = po[1];
	sp.err_fd = pe[1];
	sp.filter = env_sandbox_filter();
	if (!sp.filter) {
		r = -errno;
		goto fail;
	}
	x->t0_us = mono_us();
	r = exec_spawn(sl->env, &sp, &pid, &pidfd, why, sizeof(why));
	po[1] = safe_close(po[1]);
	pe[1] = safe_close(pe[1]);
	if (r < 0 && (r == -ENOENT || r == -EACCES) &&
	    strcmp(why, exec_step_to_string(EXEC_STEP_EXEC)) == 0) {
		reply_not_run(s, c, argv[0], -r);
		goto fail_quiet;
	}
	if (r < 0) {
		(void)client_send_error(s, c, -r, PROTO_ENV_EXEC, "env exec %s: %s%s%s", q->env,
					why[0] ? why : "", why[0] ? ": " : "", strerror(-r));
		goto fail_quiet;
	}
	x->s = s;
	x->client = c->serial;
	x->slot = sl;
	snprintf(x->env, sizeof(x->env), "%s", q->env);
	x->pid = pid;
	x->ns_pid = ns_pid_of(pid);
	x->pidfd = pidfd;
	x->out[0].fd = po[0];
	x->out[1].fd = pe[0];
	po[0] = pe[0] = -1;
	x->next = execs;
	execs = x;
	n_execs++;
	sl->execs++;
	for (int i = 0; i < 2; i++) {
		(void)fcntl(x->out[i].fd, F_SETFL, O_NONBLOCK);
		x->out[i].ev =
			event_new(exec_base, x->out[i].fd, EV_READ | EV_PERSIST, on_output, x);
	}
	x->ev_pid = event_new(exec_base, x->pidfd, EV_READ | EV_PERSIST, on_exit_cb, x);
	x->ev_timer = evtimer_new(exec_base, on_timeout, x);
	{
		uint32_t ms = q->timeout_ms ? q->timeout_ms : ENV_EXEC_TIMEOUT_DEFAULT_MS;
		struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

		x->timeout_us = (uint64_t)ms * 1000;

		/* The loop's cached time is older than the spawn: the timeout counts from now. */
		(void)event_base_update_cache_time(exec_base);

		if (!x->out[0].ev || !x->out[1].ev || !x->ev_pid || !x->ev_timer ||
		    event_add(x->out[0].ev, NULL) < 0 || event_add(x->out[1].ev, NULL) < 0 ||
		    event_add(x->ev_pid, NULL) < 0 || event_add(x->ev_timer, &tv) < 0) {
			/* Nothing would ever end it: kill it now and say so. */
			(void)kill(-pid, SIGKILL);
			(void)waitid((idtype_t)P_PIDFD, (id_t)pidfd, &(siginfo_t){0}, WEXITED);
			x->exited = x->timed_out = true;
			x->sig = SIGKILL;
			exec_finish(x);
		}
	}
	return 0;
fail:
	(void)refuse(s, c, -r, strerror(-r), q->env);
fail_quiet:
	for (int i = 0; i < 2; i++) {
		(void)safe_close(po[i]);
		(void)safe_close(pe[i]);
	}
	free(x->out[0].buf);
	free(x->out[1].buf);
	free(x);
	return 0;
}

void env_exec_stop(struct supervisor *s)
{
	(void)s;
	while (execs) {
		struct env_exec *x = execs;

		(void)kill(-x->pid, SIGKILL);
		if (!x->exited)
			(void)waitid((idtype_t)P_PIDFD, (id_t)x->pidfd, &(siginfo_t){0}, WEXITED);
		x->client = 0;
		x->slot = NULL;
		exec_free(x);
	}
}
