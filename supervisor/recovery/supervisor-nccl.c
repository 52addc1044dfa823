/* SPDX-License-Identifier: MIT */
/*
 * Communicator registry and hang detector (see supervisor-nccl.h). The counters are read
 * straight from the shims' memfds (mapped read-only, sealed against shrinking so a lying
 * client cannot fault us), once per poll interval: nothing is asked of the workers, so a
 * stopped or hung process is observed exactly as it stands.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "nccl-counters.h"
#include "supervisor-client.h"
#include "supervisor-engines.h"
#include "supervisor-events.h"
#include "supervisor-nccl.h"
#include "supervisor-promote.h"
#include "supervisor-workers.h"

#define MAX_COMMS_PER_WORKER 256
#define MAX_COMMS	     4096
#define MAX_MEMBERS	     256
#define ORPHAN_KEEP_MS	     60000 /* a dead rank's record, for the diagnosis of its peers */

struct comm {
	struct comm *next;
	pid_t pid;
	struct sv_worker *w; /* NULL once the registry dropped it (dead ranks only) */
	uint64_t id, hash, parent_id;
	int32_t rank, cuda_dev;
	uint32_t nranks;
	enum nccl_origin origin;
	const struct nccl_counters *ctr;
	bool ended, dead, declared;
	uint64_t dead_ms;
	uint64_t seen_enq, seen_cpl, progress_ms;
};

struct diag {
	uint64_t seq; /* 1, 2, ...: diagnoses so far */
	uint64_t ts_us, hash, coll, peer_coll, waited_ms;
	int32_t rank;
	pid_t pid;
	char cause[16];
	char msg[PROTO_MAX_STR + 1];
};

static struct comm *comms;
static size_t n_comms;
static struct diag last;
static bool ticking;  /* nccl_tick runs: a death it causes is evaluated by it, not again */
static bool seen_any; /* a communicator was ever announced: status reports NCCL from then on */

static uint64_t rd(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void comm_free(struct comm *c)
{
	if (c->ctr)
		(void)munmap((void *)c->ctr, NCCL_COUNTERS_SIZE);
	free(c);
}

static void comm_unlink(struct comm *c)
{
	for (struct comm **p = &comms; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			n_comms--;
			break;
		}
	comm_free(c);
}

static struct comm *comm_find(pid_t pid, uint64_t id)
{
	for (struct comm *c = comms; c; c = c->next)
		if (c->pid == pid && c->id == id && !c->dead)
			return c;
	return NULL;
}

int nccl_on_comm(struct supervisor *s, struct sv_client *cl, struct proto_nccl_comm *m)
{
	struct sv_worker *w = cl->worker;
	const struct nccl_counters *ctr;
	struct comm *c;
	struct stat st;
	size_t mine = 0;
	int seals;

	if (!w)
		return client_refuse(s, cl, REJECT_NO_HELLO, EPROTO, PROTO_NCCL_COMM,
				     "hello first");
	seals = fcntl(m->fd, F_GET_SEALS);
	if (fstat(m->fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < NCCL_COUNTERS_SIZE ||
	    seals < 0 || !(seals & F_SEAL_SHRINK) || m->rank >= (int32_t)m->nranks)
		return client_send_error(s, cl, EINVAL, PROTO_NCCL_COMM,
					 "communicator %" PRIu64
					 ": counters must be a sealed memfd of %d bytes, rank < n",
					 m->id, NCCL_COUNTERS_SIZE);
	for (c = comms; c; c = c->next)
		if (c->w == w && !c->dead)
			mine++;
	c = comm_find(w->pid, m->id);
	if (!c && (mine >= MAX_COMMS_PER_WORKER || n_comms >= MAX_COMMS))
		return client_send_error(s, cl, EDQUOT, PROTO_NCCL_COMM, "too many communicators");
	ctr = mmap(NULL, NCCL_COUNTERS_SIZE, PROT_READ, MAP_SHARED, m->fd, 0);
	if (ctr == MAP_FAILED)
		return client_send_error(s, cl, errno, PROTO_NCCL_COMM,
					 "cannot map the counters: %s", strerror(errno));
	if (rd(&ctr->magic) != NCCL_COUNTERS_MAGIC) {
		(void)munmap((void *)ctr, NCCL_COUNTERS_SIZE);
		return client_send_error(s, cl, EINVAL, PROTO_NCCL_COMM, "bad counters magic");
	}
	if (!c) {
		c = calloc(1, sizeof(*c));
		if (!c) {
			(void)munmap((void *)ctr, NCCL_COUNTERS_SIZE);
			return client_send_error(s, cl, ENOMEM, PROTO_NCCL_COMM, "out of memory");
		}
		c->next = comms;
		comms = c;
		n_comms++;
	} else if (c->ctr)
		(void)munmap((void *)c->ctr, NCCL_COUNTERS_SIZE);
	c->pid = w->pid;
	c->w = w;
	c->id = m->id;
	c->hash = m->hash;
	c->parent_id = m->parent_id;
	c->rank = m->rank;
	c->nranks = m->nranks;
	c->cuda_dev = m->cuda_dev;
	c->origin = m->origin;
	c->ctr = ctr;
	c->ended = false;
	c->seen_enq = rd(&ctr->coll_enqueued);
	c->seen_cpl = rd(&ctr->coll_completed);
	c->progress_ms = now_ms();
	seen_any = true;
	{
		const struct sv_engine *e = engines_find(s, worker_engine(w));

		workers_rank_from_comm(s, w, m->rank, m->nranks, e ? e->cfg->tp : 0);
	}
	log_debug("pid %d: communicator %" PRIu64 " (%s) hash %016" PRIx64 " rank %d/%u dev %d",
		  w->pid, m->id, nccl_origin_to_string(m->origin), m->hash, m->rank, m->nranks,
		  m->cuda_dev);
	return 0;
}

int nccl_on_comm_end(struct supervisor *s, struct sv_client *cl,
		     const struct proto_nccl_comm_end *m)
{
	struct comm *c;

	if (!cl->worker)
		return client_refuse(s, cl, REJECT_NO_HELLO, EPROTO, PROTO_NCCL_COMM_END,
				     "hello first");
	c = comm_find(cl->worker->pid, m->id);
	if (!c)
		return 0; /* announced before a reconnect we did not see: nothing to drop */
	if (m->how == NCCL_END_FINALIZE)
		return 0; /* still usable until destroyed; its counters say finalized */
	comm_unlink(c);
	return 0;
}

void nccl_worker_removed(struct sv_worker *w)
{
	for (struct comm *c = comms, *next; c; c = next) {
		next = c->next;
		if (c->w != w)
			continue;
		if (c->dead)
			c->w = NULL; /* kept a while for its peers' diagnosis */
		else
			comm_unlink(c);
	}
}

void nccl_finish(void)
{
	while (comms)
		comm_unlink(comms);
}

/* 'R', 'S', 'D', 'T', 't', 'Z', ...; 0 when the process is gone. */
static char proc_state(pid_t pid)
{
	char path[64], buf[512], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	(void)close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : 0;
}

static bool stopped(pid_t pid)
{
	char st = proc_state(pid);

	return st == 'T' || st == 't';
}

static bool in_flight(const struct comm *c)
{
	return !c->dead && rd(&c->ctr->coll_enqueued) > rd(&c->ctr->coll_completed);
}

/* Whether pid is blocked in a collective of a communicator other than hash, with no
 * progress there for at least bound ms. */
static bool blocked_elsewhere(pid_t pid, uint64_t hash, uint64_t now, uint64_t bound)
{
	for (struct comm *c = comms; c; c = c->next)
		if (c->pid == pid && c->hash != hash && !c->ended && in_flight(c) &&
		    now - c->progress_ms >= bound)
			return true;
	return false;
}

/* The process group of pid: every process sharing a communicator with it, transitively. */
static size_t group_pids(pid_t seed, pid_t *pids, size_t cap)
{
	size_t n = 0;

	pids[n++] = seed;
	for (size_t i = 0; i < n; i++)
		for (struct comm *c = comms; c; c = c->next) {
			if (c->pid != pids[i] || c->ended)
				continue;
			for (struct comm *d = comms; d; d = d->next) {
				bool have = false;

				if (d->hash != c->hash || d->ended)
					continue;
				for (size_t k = 0; k < n && !have; k++)
					have = pids[k] == d->pid;
				if (!have && n < cap)
					pids[n++] = d->pid;
			}
		}
	return n;
}

static struct sv_worker *live_worker(struct supervisor *s, pid_t pid)
{
	for (struct sv_worker *w = s->reg.workers; w; w = w->next)
		if (w->pid == pid && w->state != WORKER_DEAD)
			return w;
	return NULL;
}

/* Stops the inferred group of culprit: configured engines through their recovery, the other
 * processes by SIGKILL. dead: the culprit already died (its engine's recovery, if any, is
 * started by the death itself). Writes what was done into act. */
/* Whether pid is stuck: a member of the hung communicator, or in a collective of another
 * communicator that has not progressed for hang_timeout. */
static bool stuck(struct supervisor *s, pid_t pid, struct comm **m, size_t n, uint64_t now)
{
	for (size_t i = 0; i < n; i++)
		if (m[i]->pid == pid)
			return true;
	for (struct comm *c = comms; c; c = c->next)
		if (c->pid == pid && !c->ended && in_flight(c) &&
		    now - c->progress_ms >= s->config.nccl_hang_timeout_ms)
			return true;
	return false;
}

static void stop_group(struct supervisor *s, struct comm **m, size_t nm, pid_t culprit, bool dead,
		       uint64_t detect_ns, char *act, size_t cap)
{
	pid_t pids[MAX_MEMBERS];
	size_t n = group_pids(culprit, pids, MAX_MEMBERS), len = 0;
	unsigned killed = 0, engines = 0, spared = 0;
	uint64_t now = now_ms();

	act[0] = 0;
	for (size_t i = 0; i < n; i++) {
		struct sv_worker *w = live_worker(s, pids[i]);
		struct sv_engine *e;

		if (!w)
			continue;
		e = engines_find(s, worker_engine(w));
		if (e && w->role == ROLE_PRIMARY) {
			if (dead && !strstr(act, "recover:")) {
				/* The death itself starts (or started) the engine's recovery. */
				len += (size_t)snprintf(act + len, len < cap ? cap - len : 0,
							"%srecover:%s", len ? "," : "",
							e->cfg->name);
			} else if (!dead && !e->rec) {
				promote_start(s, e, "nccl_hang", culprit, detect_ns);
				engines++;
				len += (size_t)snprintf(act + len, len < cap ? cap - len : 0,
							"%srecover:%s", len ? "," : "",
							e->cfg->name);
			}
			continue;
		}
		/* Outside configured engines only what is stuck is stopped: a process that shares
		 * another communicator with the group (a trainer's weight-sync group) but still
		 * progresses is left alone; it is stopped if it blocks on the group later. */
		if (!stuck(s, w->pid, m, nm, now)) {
			spared++;
			continue;
		}
		if (w->pidfd >= 0)
			(void)syscall(SYS_pidfd_send_signal, w->pidfd, SIGKILL, NULL, 0);
		else
			(void)kill(w->pid, SIGKILL);
		killed++;
	}
	if (killed)
		len += (size_t)snprintf(act + len, len < cap ? cap - len : 0, "%skilled:%u",
					len ? "," : "", killed);
	if (spared)
		(void)snprintf(act + len, len < cap ? cap - len : 0, "%sspared:%u", len ? "," : "",
			       spared);
	if (!act[0])
		(void)snprintf(act, cap, "%s", engines ? "" : "none");
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void declare(struct supervisor *s, struct comm **m, size_t n, struct comm *culprit,
		    const char *cause, uint64_t waited_ms, bool dead)
{
	uint64_t max_enq = 0, coll;
	char act[160];
	pid_t who = culprit ? culprit->pid : m[0]->pid;

	for (size_t i = 0; i < n; i++) {
		m[i]->declared = true;
		max_enq = MAX(max_enq, rd(&m[i]->ctr->coll_enqueued));
	}
	coll = culprit ? rd(&culprit->ctr->coll_enqueued) : max_enq;
	if (s->config.nccl_recover)
		stop_group(s, m, n, who, dead, mono_ns() - waited_ms * 1000000ull, act,
			   sizeof(act));
	else
		snprintf(act, sizeof(act), "report_only");
	last.seq++;
	last.ts_us = now_realtime_us();
	last.hash = m[0]->hash;
	last.rank = culprit ? culprit->rank : -1;
	last.pid = culprit ? culprit->pid : 0;
	last.coll = coll;
	last.peer_coll = max_enq;
	last.waited_ms = waited_ms;
	snprintf(last.cause, sizeof(last.cause), "%s", cause);
	snprintf(last.msg, sizeof(last.msg),
		 "nccl hang: comm=%016" PRIx64 " nranks=%u rank=%d pid=%d cause=%s coll=%" PRIu64
		 " peer_coll=%" PRIu64 " op=%s waited_ms=%" PRIu64 " action=%s",
		 m[0]->hash, m[0]->nranks, last.rank, (int)last.pid, cause, coll, max_enq,
		 nccl_op_name(culprit ? __atomic_load_n(&culprit->ctr->last_op, __ATOMIC_RELAXED)
				      : 0),
		 waited_ms, act[0] ? act : "-");
	supervisor_emit(s, EVENT_NCCL, (uint32_t)last.pid, m[0]->hash, "%s", last.msg);
}

/* Evaluates the group of communicator hash h (members m[0..n)). */
static void evaluate(struct supervisor *s, struct comm **m, size_t n, uint64_t now)
{
	uint64_t hang = s->config.nccl_hang_timeout_ms, stall = s->config.nccl_stall_timeout_ms;
	uint64_t progress = 0, ranks_seen = 0;
	struct comm *culprit = NULL, *dead = NULL;
	bool any_flight = false, all_flight = true, waits_on_idle = false;
	uint32_t nranks = m[0]->nranks;

	for (size_t i = 0; i < n; i++) {
		char st;

		if (m[i]->declared)
			return;
		/* A death the pidfd did not tell us about (a worker the registry lost). */
		if (!m[i]->dead && (!m[i]->w || m[i]->w->state == WORKER_DEAD ||
				    (st = proc_state(m[i]->pid)) == 0 || st == 'Z')) {
			m[i]->dead = true;
			m[i]->dead_ms = now;
		}
		progress = MAX(progress, m[i]->progress_ms);
		if (m[i]->dead && !dead)
			dead = m[i];
		if (in_flight(m[i]))
			any_flight = true;
		else
			all_flight = false;
	}
	if (!any_flight)
		return;
	if (dead) {
		declare(s, m, n, dead, "dead", now - dead->dead_ms, true);
		return;
	}
	ranks_seen = n;
	if (ranks_seen < nranks)
		return; /* a rank we do not know (no shim there): cannot tell idle from hung */
	if (now - progress < MIN(hang, stall))
		return;
	for (size_t i = 0; i < n; i++) {
		if (stopped(m[i]->pid)) {
			culprit = m[i];
			break;
		}
		if (!in_flight(m[i])) {
			if (blocked_elsewhere(m[i]->pid, m[i]->hash, now, hang))
				culprit = culprit ?: m[i];
			else
				waits_on_idle = true;
		}
	}
	if (culprit && now - progress >= hang) {
		declare(s, m, n, culprit, stopped(culprit->pid) ? "stopped" : "blocked_elsewhere",
			now - progress, false);
		return;
	}
	if (waits_on_idle)
		return; /* the others wait for a rank that is busy elsewhere or idle: by design */
	if (all_flight && now - progress >= stall) {
		/* Everyone is inside the collective, nobody finishes: blame the least advanced. */
		for (size_t i = 0; i < n; i++)
			if (!culprit ||
			    rd(&m[i]->ctr->coll_completed) < rd(&culprit->ctr->coll_completed))
				culprit = m[i];
		declare(s, m, n, culprit, "stalled", now - progress, false);
	}
}

void nccl_tick(struct supervisor *s)
{
	struct comm *m[MAX_MEMBERS];
	uint64_t now = now_ms();

	if (ticking)
		return;
	ticking = true;

	/* Progress, and records nobody needs any more. */
	for (struct comm *c = comms, *next; c; c = next) {
		uint64_t e, d;

		next = c->next;
		if (c->dead && !c->w && now - c->dead_ms > ORPHAN_KEEP_MS) {
			comm_unlink(c);
			continue;
		}
		if (rd(&c->ctr->magic) != NCCL_COUNTERS_MAGIC)
			continue;
		e = rd(&c->ctr->coll_enqueued);
		d = rd(&c->ctr->coll_completed);
		if (e != c->seen_enq || d != c->seen_cpl) {
			c->seen_enq = e;
			c->seen_cpl = d;
			c->progress_ms = now;
			c->declared = false; /* it moves again: a new hang would be a new one */
		}
		c->ended = __atomic_load_n(&c->ctr->state, __ATOMIC_ACQUIRE) == NCCL_COMM_ENDED;
	}
	/* Per communicator hash: the members seen so far are those before the first of it. */
	for (struct comm *c = comms; c; c = c->next) {
		size_t n = 0;
		bool first = true;

		if (c->ended)
			continue;
		for (struct comm *d = comms; d != c; d = d->next)
			if (d->hash == c->hash && !d->ended) {
				first = false;
				break;
			}
		if (!first)
			continue;
		for (struct comm *d = c; d && n < MAX_MEMBERS; d = d->next)
			if (d->hash == c->hash && !d->ended)
				m[n++] = d;
		evaluate(s, m, n, now);
	}
	ticking = false;
}

void nccl_worker_died(struct supervisor *s, struct sv_worker *w)
{
	uint64_t now = now_ms();
	bool any = false;

	for (struct comm *c = comms; c; c = c->next)
		if (c->w == w && !c->dead) {
			c->dead = true;
			c->dead_ms = now;
			any = true;
		}
	if (any)
		nccl_tick(s);
}

int nccl_status_events(struct supervisor *s, struct sv_client *cl, uint32_t *ret_n)
{
	struct proto_msg m = {.type = PROTO_EVENT};
	uint64_t enq = 0, cpl = 0;
	size_t live = 0;

	if (!seen_any)
		return 0; /* a node without NCCL: its status stays as it was */
	for (struct comm *c = comms; c; c = c->next)
		if (!c->dead && !c->ended) {
			live++;
			enq += rd(&c->ctr->coll_enqueued);
			cpl += rd(&c->ctr->coll_completed);
		}
	m.event.ts_us = now_realtime_us();
	m.event.kind = EVENT_NCCL;
	snprintf(m.event.message, sizeof(m.event.message),
		 "nccl communicators=%zu enqueued=%" PRIu64 " completed=%" PRIu64 " hangs=%" PRIu64
		 " hang_timeout_ms=%" PRIu64 " stall_timeout_ms=%" PRIu64,
		 live, enq, cpl, last.seq, s->config.nccl_hang_timeout_ms,
		 s->config.nccl_stall_timeout_ms);
	if (client_send(s, cl, &m) < 0)
		return -ECONNRESET;
	(*ret_n)++;
	if (!last.seq)
		return 0;
	m.event.ts_us = last.ts_us;
	m.event.pid = (uint32_t)last.pid;
	m.event.id = last.hash;
	snprintf(m.event.message, sizeof(m.event.message), "%s", last.msg);
	if (client_send(s, cl, &m) < 0)
		return -ECONNRESET;
	(*ret_n)++;
	return 0;
}
