/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-engines.h"
#include "supervisor-events.h"
#include "supervisor-promote.h"
#include "supervisor-shadow.h"

#define KILL_WAIT_MS 5000

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int32_t worker_rank(const struct sv_worker *w)
{
	/* A single-rank engine's shim may not know its rank: it is rank 0. */
	return w->rank < 0 ? 0 : w->rank;
}

struct sv_engine *engines_find(struct supervisor *s, const char *name)
{
	if (!s->engines || !name)
		return NULL;
	for (size_t i = 0; i < s->engines->n; i++)
		if (strcmp(s->engines->e[i].cfg->name, name) == 0)
			return &s->engines->e[i];
	return NULL;
}

size_t engines_workers(struct supervisor *s, const struct sv_engine *e, enum worker_role role,
		       struct sv_worker **ret, size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < max; i++)
		ret[i] = NULL;
	for (struct sv_worker *w = s->reg.workers; w; w = w->next) {
		int32_t r = worker_rank(w);

		if (w->state == WORKER_DEAD || w->role != role ||
		    strcmp(worker_engine(w), e->cfg->name) != 0 || (size_t)r >= max)
			continue;
		if (!ret[r])
			n++;
		ret[r] = w;
	}
	return n;
}

/* "{port}" -> port, into buf. */
static int expand(const char *in, uint32_t port, char *buf, size_t cap)
{
	size_t off = 0;

	for (const char *p = in; *p; p++) {
		int n;

		if (strncmp(p, "{port}", 6) == 0) {
			n = snprintf(buf + off, cap - off, "%u", port);
			p += 5;
		} else {
			n = snprintf(buf + off, cap - off, "%c", *p);
		}
		if (n < 0 || (size_t)n >= cap - off)
			return -ENAMETOOLONG;
		off += (size_t)n;
	}
	buf[off] = '\0';
	return 0;
}

/* In the child, before exec: the engine's environment. */
static void child_env(struct supervisor *s, const struct sv_engine *e, enum worker_role role)
{
	char env[CONFIG_COMMAND_MAX], *save = NULL, *tok;

	snprintf(env, sizeof(env), "%s", e->cfg->env);
	for (tok = strtok_r(env, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
		char *eq = strchr(tok, '=');

		if (!eq || eq == tok)
			continue;
		*eq = '\0';
		(void)setenv(tok, eq + 1, 1);
	}
	(void)setenv("BELAYER_ENGINE_ID", e->cfg->name, 1);
	(void)setenv("BELAYER_ROLE", worker_role_to_string(role), 1);
	(void)setenv("BELAYER_SOCKET", s->config.socket, 1);
	if (e->cfg->devices[0])
		(void)setenv("CUDA_VISIBLE_DEVICES", e->cfg->devices, 1);
}

int engines_launch(struct supervisor *s, struct sv_engine *e, const char *cmd,
		   enum worker_role role, uint32_t port, struct eng_proc *ret)
{
	char line[CONFIG_COMMAND_MAX + 16];
	sigset_t all;
	pid_t pid;
	int r, fd;

	memset(ret, 0, sizeof(*ret));
	ret->pidfd = -1;
	snprintf(line, sizeof(line), "exec ");
	r = expand(cmd, port, line + 5, sizeof(line) - 5);
	if (r < 0)
		return log_error_errno(r, "Engine %s: command too long after expansion.",
				       e->cfg->name);
	pid = fork();
	if (pid < 0)
		return log_error_errno(negative_errno(), "Engine %s: fork failed: %m",
				       e->cfg->name);
	if (pid == 0) {
		/* Its own process group: its TP ranks join it, and it is stopped as a whole. */
		(void)setpgid(0, 0);
		sigemptyset(&all);
		(void)sigprocmask(SIG_SETMASK, &all, NULL);
		signal(SIGPIPE, SIG_DFL);
		child_env(s, e, role);
		/* Only stdio goes along: the supervisor's sockets and region fds are cloexec. */
		execl("/bin/sh", "sh", "-c", line, (char *)NULL);
		_exit(127);
	}
	(void)setpgid(pid, pid); /* both sides: no race with the first kill */
	fd = (int)syscall(SYS_pidfd_open, pid, 0);
	ret->pid = pid;
	ret->pidfd = fd;
	ret->port = port;
	ret->role = role;
	ret->started_ms = now_ms();
	supervisor_emit(s, EVENT_ENGINE, (uint32_t)pid, port,
			"engine \"%s\" %s started on port %u: %s", e->cfg->name,
			worker_role_to_string(role), port, line + 5);
	return 0;
}

void engines_kill_proc(struct eng_proc *p)
{
	if (p->pid <= 0)
		return;
	(void)kill(-p->pid, SIGKILL);
	if (p->pidfd >= 0) {
		struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};

		(void)syscall(SYS_pidfd_send_signal, p->pidfd, SIGKILL, NULL, 0);
		(void)poll(&pf, 1, KILL_WAIT_MS);
	}
	(void)waitpid(p->pid, NULL, WNOHANG);
	p->pidfd = safe_close(p->pidfd);
	p->pid = 0;
}

/* Reaps p if it exited. Returns true then. */
static bool proc_reap(struct eng_proc *p, int *ret_status)
{
	siginfo_t si = {0};

	if (p->pid <= 0)
		return false;
	if (waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOHANG) < 0) {
		if (errno != ECHILD)
			return false;
	} else if (si.si_pid == 0) {
		return false;
	}
	*ret_status = si.si_status;
	p->pidfd = safe_close(p->pidfd);
	p->pid = 0;
	return true;
}

/* ---- probe: HTTP GET health_url, non-blocking, one at a time per engine ----------------- */

static void probe_reset(struct eng_probe *pr)
{
	pr->fd = safe_close(pr->fd);
	pr->sent = false;
	pr->n = 0;
}

void engines_probe_reset(struct sv_engine *e)
{
	probe_reset(&e->probe);
	e->next_probe_ms = 0;
}

static int probe_start(struct sv_engine *e)
{
	char url[256], host[64];
	struct sockaddr_in sa = {.sin_family = AF_INET};
	unsigned port = 80;
	const char *p, *slash;
	int fd;

	if (expand(e->cfg->health_url, e->primary_port, url, sizeof(url)) < 0 ||
	    strncmp(url, "http://", 7) != 0)
		return -EINVAL;
	p = url + 7;
	slash = strchr(p, '/');
	if (!slash)
		slash = p + strlen(p);
	if ((size_t)(slash - p) >= sizeof(host))
		return -EINVAL;
	memcpy(host, p, (size_t)(slash - p));
	host[slash - p] = '\0';
	if (strchr(host, ':')) {
		port = (unsigned)strtoul(strchr(host, ':') + 1, NULL, 10);
		*strchr(host, ':') = '\0';
	}
	if (strcmp(host, "localhost") == 0)
		snprintf(host, sizeof(host), "127.0.0.1");
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1 || port == 0 || port > 65535)
		return -EINVAL;
	sa.sin_port = htons((uint16_t)port);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return negative_errno();
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
		(void)safe_close(fd);
		return -ECONNREFUSED;
	}
	e->probe.fd = fd;
	e->probe.started_ms = now_ms();
	e->probe.sent = false;
	e->probe.n = 0;
	return 0;
}

/* 1: answered 200, 0: still going, -errno: failed. */
static int probe_step(struct sv_engine *e)
{
	struct eng_probe *pr = &e->probe;
	struct pollfd pf = {.fd = pr->fd, .events = pr->sent ? POLLIN : POLLOUT};
	char url[256], req[384];
	const char *path;
	ssize_t n;
	int err = 0;
	socklen_t len = sizeof(err);

	if (poll(&pf, 1, 0) <= 0)
		return now_ms() - pr->started_ms > MAX(e->cfg->probe_interval_ms, 200) ? -ETIMEDOUT
										       : 0;
	if (!pr->sent) {
		if (getsockopt(pr->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err)
			return -ECONNREFUSED;
		(void)expand(e->cfg->health_url, e->primary_port, url, sizeof(url));
		path = strchr(url + 7, '/');
		snprintf(req, sizeof(req),
			 "GET %s HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n",
			 path ? path : "/");
		if (send(pr->fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req))
			return -EIO;
		pr->sent = true;
		return 0;
	}
	n = recv(pr->fd, pr->buf + pr->n, sizeof(pr->buf) - 1 - pr->n, 0);
	if (n < 0)
		return errno == EAGAIN ? 0 : -EIO;
	pr->n += (size_t)n;
	pr->buf[pr->n] = '\0';
	if (pr->n >= 12 || n == 0) {
		/* "HTTP/1.x 200" is all we need. */
		if (pr->n >= 12 && strncmp(pr->buf, "HTTP/1.", 7) == 0 &&
		    strncmp(pr->buf + 9, "200", 3) == 0)
			return 1;
		return -EPROTO;
	}
	return 0;
}

static void engine_probe(struct supervisor *s, struct sv_engine *e)
{
	uint64_t now = now_ms();
	int r;

	if (!e->cfg->health_url[0] || e->primary_port == 0)
		return;
	if (e->probe.fd < 0) {
		if (now < e->next_probe_ms)
			return;
		e->next_probe_ms = now + e->cfg->probe_interval_ms;
		r = probe_start(e);
		if (r == -EINVAL) {
			log_warning("Engine %s: health_url %s is not http://IPV4:PORT/PATH, "
				    "ignoring.",
				    e->cfg->name, e->cfg->health_url);
			e->next_probe_ms = UINT64_MAX;
			return;
		}
	}
	r = e->probe.fd >= 0 ? probe_step(e) : -ECONNREFUSED;
	if (r == 0)
		return;
	probe_reset(&e->probe);
	if (r > 0) {
		e->probe_ok_ms = now;
		e->probe_fail_since_ms = 0;
		if (!e->primary_ready) {
			e->primary_ready = true;
			e->ready_ms = now;
			supervisor_emit(s, EVENT_ENGINE, 0, e->primary_port,
					"engine \"%s\" ready on port %u", e->cfg->name,
					e->primary_port);
			promote_primary_ready(s, e);
		}
		return;
	}
	if (!e->probe_fail_since_ms)
		e->probe_fail_since_ms = now;
	/* Hung: it served, and has not answered for liveness_timeout while its process lives. */
	if (e->primary_ready && !e->rec && e->cfg->liveness_timeout_ms &&
	    now - e->probe_fail_since_ms >= e->cfg->liveness_timeout_ms) {
		struct sv_worker *p[64];
		size_t tp = MIN((size_t)e->cfg->tp, ARRAY_SIZE(p));

		if (engines_workers(s, e, ROLE_PRIMARY, p, tp) == 0)
			return;
		supervisor_emit(s, EVENT_RECOVERY, 0, 0,
				"engine \"%s\": no answer from %s for %" PRIu64
				" ms while its process lives: hung, killing its primary group",
				e->cfg->name, e->cfg->health_url, now - e->probe_fail_since_ms);
		promote_start(s, e, "liveness", p[0] ? p[0]->pid : 0,
			      e->probe_fail_since_ms * 1000000);
	}
}

static void engine_start_one(struct supervisor *s, struct sv_engine *e)
{
	const struct sv_engine_config *c = e->cfg;

	e->primary_port = c->port;
	if (strcmp(c->primary, "external") != 0)
		(void)engines_launch(s, e, c->primary, ROLE_PRIMARY, c->port, &e->primary);
	if (c->shadow[0])
		(void)engines_launch(s, e, c->shadow, ROLE_SHADOW, c->shadow_port, &e->shadow);
}

int engines_start(struct supervisor *s)
{
	if (s->config.n_engines == 0)
		return 0;
	s->engines = calloc(1, sizeof(*s->engines));
	if (!s->engines)
		return -ENOMEM;
	s->engines->n = s->config.n_engines;
	for (size_t i = 0; i < s->engines->n; i++) {
		struct sv_engine *e = &s->engines->e[i];

		e->cfg = &s->config.engines[i];
		e->primary.pidfd = e->shadow.pidfd = e->probe.fd = -1;
		engine_start_one(s, e);
	}
	return 0;
}

void engines_stop(struct supervisor *s)
{
	if (!s->engines)
		return;
	for (size_t i = 0; i < s->engines->n; i++) {
		struct sv_engine *e = &s->engines->e[i];

		promote_free(e);
		engines_kill_proc(&e->primary);
		engines_kill_proc(&e->shadow);
		probe_reset(&e->probe);
	}
	free(s->engines);
	s->engines = NULL;
}

void engines_tick(struct supervisor *s)
{
	if (!s->engines)
		return;
	for (size_t i = 0; i < s->engines->n; i++) {
		struct sv_engine *e = &s->engines->e[i];
		int status;

		/* Our children: reap them (their workers' deaths arrive through pidfds). */
		if (proc_reap(&e->primary, &status))
			supervisor_emit(s, EVENT_ENGINE, 0, 0,
					"engine \"%s\" primary process group leader exited (%d)",
					e->cfg->name, status);
		if (proc_reap(&e->shadow, &status))
			supervisor_emit(s, EVENT_ENGINE, 0, 0,
					"engine \"%s\" shadow process group leader exited (%d)",
					e->cfg->name, status);
		engine_probe(s, e);
		promote_tick(s, e);
		promote_record_checksums(s, e);
	}
}

void engines_worker_hello(struct supervisor *s, struct sv_worker *w)
{
	struct sv_engine *e = engines_find(s, worker_engine(w));

	w->pgid = getpgid(w->pid);
	shadow_forget_maps(w);
	if (!e)
		return;
	if (w->role == ROLE_PRIMARY)
		shadow_sync(s, e);
}

bool engines_recovering(struct supervisor *s, const struct sv_worker *w)
{
	struct sv_engine *e = engines_find(s, worker_engine(w));

	return e && e->rec;
}

void engines_note_kill(struct supervisor *s, struct sv_worker *w)
{
	struct sv_engine *e = engines_find(s, worker_engine(w));

	if (e && w->role == ROLE_PRIMARY)
		e->kill_hint_ns = now_ns();
}

void engines_worker_died(struct supervisor *s, struct sv_worker *w)
{
	struct sv_engine *e = engines_find(s, worker_engine(w));
	uint64_t hint;

	if (!e)
		return;
	if (e->rec) {
		promote_worker_died(s, e, w);
		return;
	}
	if (w->role != ROLE_PRIMARY) {
		/* A shadow rank died: the rest of its group is useless (one NCCL group), so the
		 * whole group is replaced. Nothing to recover. */
		if (!e->cfg->shadow[0])
			return;
		engines_kill_proc(&e->shadow);
		if (now_ms() < e->shadow_backoff_ms) {
			supervisor_emit(s, EVENT_ENGINE, (uint32_t)w->pid, 0,
					"engine \"%s\": shadow died again within 10 s; not "
					"restarting it",
					e->cfg->name);
			return;
		}
		e->shadow_backoff_ms = now_ms() + 10000;
		(void)engines_launch(s, e, e->cfg->shadow, ROLE_SHADOW,
				     e->primary_port == e->cfg->port ? e->cfg->shadow_port
								     : e->cfg->port,
				     &e->shadow);
		return;
	}
	hint = e->kill_hint_ns;
	e->kill_hint_ns = 0;
	promote_start(s, e, "exit", w->pid, hint);
}
