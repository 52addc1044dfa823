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

#include <systemd/sd-bus.h>

#include "log.h"
#include "supervisor-engines.h"
#include "supervisor-events.h"
#include "supervisor-footprint.h"
#include "supervisor-journal.h"
#include "supervisor-promote.h"
#include "supervisor-shadow.h"
#include "supervisor-workers.h"
#include "sv-recovery.h"

#define KILL_WAIT_MS 5000

static void journal_sync(struct supervisor *s, struct sv_engine *e);

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
	if (role == ROLE_SHADOW) {
		/* "RANK:GPU-UUID:FREE:TOTAL," at most 95 characters each */
		char mem[ENG_MEM_INFO_MAX * 96];

		if (meminfo_env(e, mem, sizeof(mem)) > 0)
			(void)setenv("BELAYER_SHADOW_MEM_INFO", mem, 1);
	}
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
	if (role == ROLE_PRIMARY)
		meminfo_forget(s, e); /* a new group: its answers come anew */
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
	/* Read before it could exit: a restarted supervisor adopts it only if this matches. */
	ret->starttime = process_starttime(pid);
	ret->port = port;
	ret->role = role;
	ret->started_ms = now_ms();
	/* A probe in flight went to the group this one replaces: its answer, even read after
	 * this, says nothing of the new primary (a 200 the old one sent before it died, read
	 * at the next tick, made a cold restart "ready" before the new engine listened). */
	if (role == ROLE_PRIMARY)
		engines_probe_reset(e);
	e->n_launches++;
	supervisor_emit(s, EVENT_ENGINE, (uint32_t)pid, port,
			"engine \"%s\" %s started on port %u: %s", e->cfg->name,
			worker_role_to_string(role), port, line + 5);
	/* At once, not at the next tick: a supervisor that crashes now must not launch it again
	 * (after a promotion this also records the swap of the groups). */
	journal_sync(s, e);
	return 0;
}

void engines_kill_proc(struct eng_proc *p)
{
	if (p->pid <= 0)
		return;
	/* The group, adopted or not: p->pid is cleared as soon as its leader exits
	 * (proc_reap()), so the pgid is not one reused since. */
	(void)kill(-p->pid, SIGKILL);
	if (p->pidfd >= 0) {
		struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};

		(void)syscall(SYS_pidfd_send_signal, p->pidfd, SIGKILL, NULL, 0);
		(void)poll(&pf, 1, KILL_WAIT_MS);
	}
	/* An adopted leader is not our child: its new parent (init or a subreaper) reaps it. */
	if (!p->adopted)
		(void)waitpid(p->pid, NULL, WNOHANG);
	p->pidfd = safe_close(p->pidfd);
	p->pid = 0;
	p->adopted = false;
}

/* Reaps p if it exited. Returns true then. */
static bool proc_reap(struct eng_proc *p, int *ret_status)
{
	siginfo_t si = {0};

	if (p->pid <= 0)
		return false;
	if (p->adopted) {
		/* Not our child (waitid() would say ECHILD): its pidfd says when it exited, the
		 * status goes to its new parent. */
		if (p->pidfd >= 0 &&
		    poll(&(struct pollfd){.fd = p->pidfd, .events = POLLIN}, 1, 0) == 0)
			return false;
		*ret_status = -1;
		p->pidfd = safe_close(p->pidfd);
		p->pid = 0;
		p->adopted = false;
		return true;
	}
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
			if (e->shadow_deferred) {
				e->shadow_deferred = false;
				if (e->shadow.pid <= 0)
					(void)engines_launch(s, e, e->cfg->shadow, ROLE_SHADOW,
							     e->primary_port == e->cfg->port
								     ? e->cfg->shadow_port
								     : e->cfg->port,
							     &e->shadow);
			}
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

/* ---- journal and adoption ------------------------------------------------------------- */

static struct eng_proc *slot_proc(struct sv_engine *e, int slot)
{
	return slot == 0 ? &e->primary : &e->shadow;
}

/* Journals e's groups that changed since the last record. */
static void journal_sync(struct supervisor *s, struct sv_engine *e)
{
	for (int slot = 0; slot < 2; slot++) {
		const struct eng_proc *p = slot_proc(e, slot);
		struct eng_journaled *j = &e->journaled[slot];
		struct journal_record rec = {.op = JOURNAL_ENGINE};

		if (j->pid == p->pid &&
		    (p->pid == 0 || (j->starttime == p->starttime && j->port == p->port)))
			continue;
		*j = (struct eng_journaled){
			.pid = p->pid, .starttime = p->starttime, .port = p->port};
		if (!s->journal)
			continue;
		rec.pid = (uint32_t)j->pid;
		rec.starttime = j->starttime;
		rec.port = j->port;
		rec.role = slot == 0 ? ROLE_PRIMARY : ROLE_SHADOW;
		snprintf(rec.engine_id, sizeof(rec.engine_id), "%s", e->cfg->name);
		(void)journal_append(s->journal, &rec);
	}
}

static int engines_alloc(struct supervisor *s)
{
	if (s->engines)
		return 0;
	s->engines = calloc(1, sizeof(*s->engines));
	if (!s->engines)
		return -ENOMEM;
	s->engines->n = s->config.n_engines;
	for (size_t i = 0; i < s->engines->n; i++) {
		struct sv_engine *e = &s->engines->e[i];

		e->cfg = &s->config.engines[i];
		e->primary.pidfd = e->shadow.pidfd = e->probe.fd = -1;
	}
	return 0;
}

int engines_restore_record(struct supervisor *s, const struct journal_record *rec)
{
	struct sv_engine *e;
	int r;

	if ((rec->op != JOURNAL_ENGINE && rec->op != JOURNAL_MEM_INFO &&
	     rec->op != JOURNAL_MEM_INFO_GONE) ||
	    s->config.n_engines == 0)
		return 0;
	r = engines_alloc(s);
	if (r < 0)
		return r;
	e = engines_find(s, rec->engine_id);
	if (!e)
		return 0; /* no longer configured: its processes are none of ours */
	if (rec->op != JOURNAL_ENGINE) {
		meminfo_restore_record(e, rec);
		return 0;
	}
	e->journaled[rec->role == ROLE_SHADOW] = (struct eng_journaled){
		.pid = (pid_t)rec->pid, .starttime = rec->starttime, .port = rec->port};
	return 0;
}

size_t engines_journal_records(struct supervisor *s, struct journal_record *recs, size_t max)
{
	size_t n = 0;

	for (size_t i = 0; s->engines && i < s->engines->n; i++)
		for (int slot = 0; slot < 2; slot++) {
			const struct eng_journaled *j = &s->engines->e[i].journaled[slot];

			if (j->pid == 0 || n == max)
				continue;
			recs[n] =
				(struct journal_record){.op = JOURNAL_ENGINE,
							.pid = (uint32_t)j->pid,
							.starttime = j->starttime,
							.port = j->port,
							.role = slot ? ROLE_SHADOW : ROLE_PRIMARY};
			snprintf(recs[n].engine_id, sizeof(recs[n].engine_id), "%s",
				 s->engines->e[i].cfg->name);
			n++;
		}
	for (size_t i = 0; s->engines && i < s->engines->n; i++)
		n += meminfo_journal_records(&s->engines->e[i], recs + n, max - n);
	return n;
}

size_t engines_journal_count(const struct supervisor *s)
{
	size_t n = 2 * CONFIG_ENGINES_MAX; /* the groups */

	for (size_t i = 0; s->engines && i < s->engines->n; i++)
		n += s->engines->e[i].mem_info.n;
	return n;
}

unsigned engines_adopted(const struct sv_engine *e)
{
	return (unsigned)e->primary.adopted + (unsigned)e->shadow.adopted;
}

/* Live workers of e in process group pgid: they are the group's ranks, with its role (the
 * journal may hold a promoted rank's role from before its promotion). */
static uint32_t group_members(struct supervisor *s, struct sv_engine *e, enum worker_role role,
			      pid_t pgid)
{
	uint32_t n = 0;

	for (struct sv_worker *w = s->reg.workers; w; w = w->next) {
		if (w->state == WORKER_DEAD || strcmp(worker_engine(w), e->cfg->name) != 0 ||
		    getpgid(w->pid) != pgid)
			continue;
		w->pgid = pgid;
		w->role = role;
		/* A zombie (its pidfd readable) is no rank: its death is about to be seen. */
		if (w->pidfd < 0 ||
		    poll(&(struct pollfd){.fd = w->pidfd, .events = POLLIN}, 1, 0) == 0)
			n++;
	}
	return n;
}

/* Takes over the group the journal names for slot if its leader still runs. */
static bool adopt(struct supervisor *s, struct sv_engine *e, int slot)
{
	const struct eng_journaled *j = &e->journaled[slot];
	enum worker_role role = slot == 0 ? ROLE_PRIMARY : ROLE_SHADOW;
	struct eng_proc *p = slot_proc(e, slot);
	uint32_t ranks;
	int fd;

	if (j->pid <= 0)
		return false;
	/* The start time tells the leader from a process that got its pid since. */
	fd = j->starttime != 0 && process_starttime(j->pid) == j->starttime
		     ? (int)syscall(SYS_pidfd_open, j->pid, 0)
		     : -ESRCH;
	/* A readable pidfd: exited, a zombie its new parent has not reaped yet. */
	if (fd < 0 || poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, 0) != 0) {
		if (fd >= 0)
			(void)safe_close(fd);
		supervisor_emit(s, EVENT_ENGINE, (uint32_t)j->pid, j->port,
				"engine \"%s\": the previous supervisor's %s group (leader %d) is "
				"gone",
				e->cfg->name, worker_role_to_string(role), j->pid);
		return false;
	}
	*p = (struct eng_proc){.pid = j->pid,
			       .pidfd = fd,
			       .starttime = j->starttime,
			       .port = j->port,
			       .role = role,
			       .started_ms = now_ms(),
			       .adopted = true};
	ranks = group_members(s, e, role, j->pid);
	/* A rank died while no supervisor watched: the group is broken, no hello will mend it. */
	if (role == ROLE_PRIMARY && ranks < e->cfg->tp)
		e->adopt_broken = true;
	supervisor_emit(s, EVENT_ENGINE, (uint32_t)j->pid, j->port,
			"engine \"%s\" %s adopted: process group %d on port %u, %u of %u ranks "
			"alive, waiting for their hellos",
			e->cfg->name, worker_role_to_string(role), j->pid, j->port, ranks,
			e->cfg->tp);
	return true;
}

/* SIGKILLs the live workers of e with role (ranks of a group that is being replaced, which
 * nothing else would stop), marking their deaths as no news. Called before the replacement
 * is launched. */
static void kill_strays(struct supervisor *s, struct sv_engine *e, enum worker_role role)
{
	for (struct sv_worker *w = s->reg.workers; w; w = w->next)
		if (w->state != WORKER_DEAD && w->role == role &&
		    strcmp(worker_engine(w), e->cfg->name) == 0) {
			w->replaced = true;
			if (w->pidfd >= 0)
				(void)syscall(SYS_pidfd_send_signal, w->pidfd, SIGKILL, NULL, 0);
		}
}

static void engine_start_one(struct supervisor *s, struct sv_engine *e)
{
	const struct sv_engine_config *c = e->cfg;
	bool primary = adopt(s, e, 0), shadow = c->shadow[0] && adopt(s, e, 1);

	if (shadow && primary && e->shadow.port == e->primary.port) {
		engines_kill_proc(&e->shadow); /* cannot both hold one port */
		shadow = false;
	}
	if (!shadow)
		kill_strays(s, e, ROLE_SHADOW);
	if (primary) {
		e->primary_port = e->primary.port;
	} else {
		/* Ranks of a launched group whose leader is gone (an external primary is not
		 * ours to stop). */
		if (strcmp(c->primary, "external") != 0)
			kill_strays(s, e, ROLE_PRIMARY);
		/* The port the adopted shadow does not hold. */
		e->primary_port = shadow && e->shadow.port == c->port ? c->shadow_port : c->port;
		if (strcmp(c->primary, "external") != 0)
			(void)engines_launch(s, e, c->primary, ROLE_PRIMARY, e->primary_port,
					     &e->primary);
	}
	/* A shadow behind a primary that is starting waits for it to be ready: it then starts
	 * on the primary's recorded cuMemGetInfo answers (all of them), and it does not change
	 * the free memory the primary's own profiling sees, which vLLM assumes. */
	if (!shadow && c->shadow[0] && !primary)
		e->shadow_deferred = true;
	else if (!shadow && c->shadow[0])
		(void)engines_launch(s, e, c->shadow, ROLE_SHADOW,
				     e->primary_port == c->port ? c->shadow_port : c->port,
				     &e->shadow);
	if (primary || shadow)
		e->adopt_deadline_ms = now_ms() + s->config.resync_grace * 1000;
	journal_sync(s, e);
}

/* Whether every rank of the group in p said hello since the restart. */
static bool group_confirmed(struct supervisor *s, struct sv_engine *e, const struct eng_proc *p)
{
	uint32_t n = 0;

	for (struct sv_worker *w = s->reg.workers; w; w = w->next)
		n += w->state == WORKER_ALIVE && w->role == p->role && w->pgid == p->pid &&
		     strcmp(worker_engine(w), e->cfg->name) == 0;
	return n >= e->cfg->tp;
}

/* The adopted groups' ranks had until adopt_deadline_ms to say hello again: a primary group
 * that did not is recovered as if it died, a shadow group that did not is replaced. */
static void adopt_check(struct supervisor *s, struct sv_engine *e)
{
	bool p_ok = !e->primary.adopted || group_confirmed(s, e, &e->primary);
	bool s_ok = !e->shadow.adopted || group_confirmed(s, e, &e->shadow);
	uint32_t port;

	if (!e->adopt_deadline_ms)
		return;
	if (e->rec) {
		/* A death of an adopted rank started one already. */
		e->adopt_deadline_ms = 0;
		e->adopt_broken = false;
		return;
	}
	if (p_ok && s_ok) {
		e->adopt_deadline_ms = 0;
		supervisor_emit(s, EVENT_ENGINE, 0, e->primary_port,
				"engine \"%s\": every adopted rank said hello again", e->cfg->name);
		return;
	}
	if (!p_ok && e->adopt_broken) {
		e->adopt_broken = false;
		supervisor_emit(s, EVENT_RECOVERY, (uint32_t)e->primary.pid, 0,
				"engine \"%s\": a rank of the adopted primary group died while no "
				"supervisor ran; recovering it",
				e->cfg->name);
		promote_start(s, e, "adopt", e->primary.pid, 0);
		return;
	}
	if (now_ms() < e->adopt_deadline_ms)
		return;
	e->adopt_deadline_ms = 0;
	if (!s_ok) {
		supervisor_emit(s, EVENT_ENGINE, (uint32_t)e->shadow.pid, 0,
				"engine \"%s\": the adopted shadow group did not say hello within "
				"resync_grace; replacing it",
				e->cfg->name);
		engines_kill_proc(&e->shadow);
		kill_strays(s, e, ROLE_SHADOW);
		port = e->primary_port == e->cfg->port ? e->cfg->shadow_port : e->cfg->port;
		(void)engines_launch(s, e, e->cfg->shadow, ROLE_SHADOW, port, &e->shadow);
	}
	if (!p_ok) {
		supervisor_emit(s, EVENT_RECOVERY, (uint32_t)e->primary.pid, 0,
				"engine \"%s\": the adopted primary group did not say hello within "
				"resync_grace; recovering it as dead",
				e->cfg->name);
		promote_start(s, e, "adopt", e->primary.pid, 0);
	}
}

int engines_start(struct supervisor *s)
{
	int r;

	if (s->config.n_engines == 0)
		return 0;
	r = engines_alloc(s);
	if (r < 0)
		return r;
	for (size_t i = 0; i < s->engines->n; i++)
		engine_start_one(s, &s->engines->e[i]);
	return 0;
}

/* Whether systemd is restarting this service now (the unit's job is a restart, which systemd
 * runs as a stop before it becomes a start): the engines are then left for the next supervisor
 * to adopt. Asked over the system bus (DBUS_SYSTEM_BUS_ADDRESS where set); any doubt, no
 * manager, no answer within 2 s: no, and the engines are stopped. */
static bool systemd_restarting(void)
{
	_cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL;
	_cleanup_(sd_bus_message_unrefp) sd_bus_message *unit_reply = NULL, *job_reply = NULL;
	_cleanup_(sd_bus_error_free) sd_bus_error err = SD_BUS_ERROR_NULL;
	_cleanup_free_ char *type = NULL;
	const char *unit, *job;
	uint32_t job_id;

	if (!getenv("INVOCATION_ID")) /* not run by systemd as a service */
		return false;
	if (sd_bus_open_system(&bus) < 0 || sd_bus_set_method_call_timeout(bus, 2000000) < 0)
		return false;
	if (sd_bus_call_method(bus, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
			       "org.freedesktop.systemd1.Manager", "GetUnitByPID", &err,
			       &unit_reply, "u", (uint32_t)getpid()) < 0 ||
	    sd_bus_message_read(unit_reply, "o", &unit) < 0 ||
	    sd_bus_get_property(bus, "org.freedesktop.systemd1", unit,
				"org.freedesktop.systemd1.Unit", "Job", &err, &job_reply,
				"(uo)") < 0 ||
	    sd_bus_message_read(job_reply, "(uo)", &job_id, &job) < 0 || job_id == 0 ||
	    sd_bus_get_property_string(bus, "org.freedesktop.systemd1", job,
				       "org.freedesktop.systemd1.Job", "JobType", &err,
				       &type) < 0) {
		if (sd_bus_error_is_set(&err))
			log_debug("Asking systemd for this unit's job: %s", err.message);
		return false;
	}
	return strcmp(type, "restart") == 0 || strcmp(type, "try-restart") == 0;
}

void engines_stop(struct supervisor *s)
{
	bool leave;

	if (!s->engines)
		return;
	leave = systemd_restarting();
	for (size_t i = 0; i < s->engines->n; i++) {
		struct sv_engine *e = &s->engines->e[i];

		promote_free(e);
		probe_reset(&e->probe);
		if (!leave) {
			engines_kill_proc(&e->primary);
			engines_kill_proc(&e->shadow);
			continue;
		}
		/* Journaled: the restarted supervisor adopts them. */
		if (e->primary.pid > 0 || e->shadow.pid > 0)
			log_info("Engine %s: systemd restarts the supervisor; leaving its groups "
				 "(primary %d, shadow %d) running for the next one to adopt.",
				 e->cfg->name, e->primary.pid, e->shadow.pid);
		e->primary.pidfd = safe_close(e->primary.pidfd);
		e->shadow.pidfd = safe_close(e->shadow.pidfd);
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
		adopt_check(s, e);
		promote_tick(s, e);
		promote_record_checksums(s, e);
		canary_record(s, e);
		journal_sync(s, e);
	}
	footprint_tick(s);
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

	if (!e || w->replaced)
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
		/* The rest of the group dies with it: those deaths are no news. */
		kill_strays(s, e, ROLE_SHADOW);
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
	/* An adopted group that lost a rank while no supervisor ran: the recovery adopt_check()
	 * is about to start, whichever comes first. */
	promote_start(s, e, e->adopt_broken ? "adopt" : "exit", w->pid, hint);
}

size_t recovery_engines_n(struct supervisor *s)
{
	return s->engines ? s->engines->n : 0;
}

struct sv_engine *recovery_engine(struct supervisor *s, size_t i)
{
	return &s->engines->e[i];
}

const struct sv_engine_config *engine_config(const struct sv_engine *e)
{
	return e->cfg;
}

void engine_upstream(const struct sv_engine *e, struct engine_upstream *ret)
{
	*ret = (struct engine_upstream){
		.port = e->primary_port,
		.ready = e->primary_ready,
		.recovering = e->rec != NULL,
		.n_recoveries = e->n_recoveries,
	};
}
