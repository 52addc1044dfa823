/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zlib.h>

#include "log.h"
#include "supervisor-canary.h"
#include "supervisor-client.h"
#include "supervisor-events.h"
#include "supervisor-health.h"
#include "supervisor-offload.h"
#include "supervisor-promote.h"
#include "supervisor-shadow.h"
#include "supervisor-workers.h"

#define MAX_RANKS     64
#define OWNER_WAIT_MS 5000
#define SAMPLE_BYTES  (64u << 10)
#define SAMPLE_STRIDE (16u << 20)

static const char *const phase_names[_PHASE_MAX] = {
	[PHASE_DETECT] = "detect",   [PHASE_OWNER] = "owner",	[PHASE_HEALTH] = "health",
	[PHASE_CONTENT] = "content", [PHASE_LAYOUT] = "layout", [PHASE_REMAP] = "remap",
	[PHASE_CANARY] = "canary",   [PHASE_READY] = "ready",
};

const char *rec_phase_to_string(enum rec_phase p)
{
	return (unsigned)p < _PHASE_MAX ? phase_names[p] : NULL;
}

struct sv_recovery {
	uint64_t seq;
	uint32_t tp;
	bool cold;		     /* falling back: waits for the cold primary's probe */
	bool job_pending;	     /* the health + content job runs */
	uint64_t start_ns;	     /* the failure (kill, hang onset) when known, else detection */
	uint64_t end_ns[_PHASE_MAX]; /* monotonic end of each phase that ran; 0: did not */
	uint64_t deadline_ms;	     /* remap (DONE) or cold readiness */
	pid_t primary[MAX_RANKS];    /* dead (or to be killed) primary ranks */
	pid_t shadow[MAX_RANKS];
	bool done[MAX_RANKS];
	uint32_t n_done;
	uint64_t wver; /* the weights version handed over (the dead primaries' highest) */
	bool canary;   /* every rank remapped; the canary runs */
};

/* ---- the record, events ------------------------------------------------------------------ */

static void phase_end(struct sv_recovery *rec, enum rec_phase p)
{
	rec->end_ns[p] = now_ns();
}

/* Durations from the end times: a phase that did not run lasted 0. */
static void record_fill(struct sv_engine *e, struct sv_recovery *rec)
{
	struct recovery_record *l = &e->last;
	uint64_t prev = rec->start_ns, last = rec->start_ns;

	for (int p = 0; p < _PHASE_MAX; p++) {
		l->phase_us[p] = 0;
		if (!rec->end_ns[p])
			continue;
		l->phase_us[p] = (rec->end_ns[p] - MIN(prev, rec->end_ns[p])) / 1000;
		prev = rec->end_ns[p];
		last = MAX(last, rec->end_ns[p]);
	}
	l->total_us = (last - rec->start_ns) / 1000;
}

static void summary_text(const struct sv_engine *e, char *buf, size_t cap)
{
	const struct recovery_record *l = &e->last;
	size_t off;

	/* Machine-readable: key=value pairs, durations in microseconds. */
	off = (size_t)snprintf(buf, cap, "engine=%s seq=%" PRIu64 " outcome=%s trigger=%s",
			       e->cfg->name, l->seq, promote_outcome(e), l->trigger);
	for (int p = 0; p < _PHASE_MAX && off < cap; p++)
		off += (size_t)snprintf(buf + off, cap - off, " %s_us=%" PRIu64, phase_names[p],
					l->phase_us[p]);
	if (off < cap)
		snprintf(buf + off, cap - off, " total_us=%" PRIu64, l->total_us);
}

const char *promote_outcome(const struct sv_engine *e)
{
	const struct recovery_record *l = &e->last;

	if (!l->seq)
		return "none";
	if (e->rec && e->rec->seq == l->seq)
		return "running";
	return !l->finished ? "failed" : l->promoted ? "promoted" : "cold_restart";
}

static void emit_summary(struct supervisor *s, struct sv_engine *e)
{
	char buf[PROTO_MAX_STR + 1];

	summary_text(e, buf, sizeof(buf));
	supervisor_emit(s, EVENT_RECOVERY, (uint32_t)e->last.dead_pid, e->last.seq, "%s", buf);
}

int promote_status_events(struct supervisor *s, struct sv_client *c, uint32_t *ret_n)
{
	for (size_t i = 0; s->engines && i < s->engines->n; i++) {
		struct sv_engine *e = &s->engines->e[i];
		struct proto_msg m = {.type = PROTO_EVENT};

		if (!e->last.seq)
			continue;
		m.event = (struct proto_event){.ts_us = e->last.started_us,
					       .kind = EVENT_RECOVERY,
					       .pid = (uint32_t)e->last.dead_pid,
					       .id = e->last.seq};
		summary_text(e, m.event.message, sizeof(m.event.message));
		if (client_send(s, c, &m) < 0)
			return -ECONNRESET;
		(*ret_n)++;
		if (!e->last.reason[0])
			continue;
		snprintf(m.event.message, sizeof(m.event.message), "engine=%s reason=%s",
			 e->cfg->name, e->last.reason);
		if (client_send(s, c, &m) < 0)
			return -ECONNRESET;
		(*ret_n)++;
	}
	return 0;
}

static void rec_log(struct supervisor *s, struct sv_engine *e, const char *fmt, ...) _printf_(3, 4);

static void rec_log(struct supervisor *s, struct sv_engine *e, const char *fmt, ...)
{
	char msg[PROTO_MAX_STR + 1];
	va_list ap;

	va_start(ap, fmt);
	(void)vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	supervisor_emit(s, EVENT_RECOVERY, (uint32_t)e->last.dead_pid, e->last.seq,
			"engine \"%s\" recovery %" PRIu64 ": %s", e->cfg->name, e->last.seq, msg);
}

void promote_free(struct sv_engine *e)
{
	free(e->rec);
	e->rec = NULL;
}

/* ---- stopping processes ------------------------------------------------------------------ */

/* SIGKILLs every live worker of e with role (and the launched group), waits for each pidfd,
 * and marks them dead. Returns 0, or -ETIMEDOUT when one would not die. */
static int stop_workers(struct supervisor *s, struct sv_engine *e, enum worker_role role)
{
	struct sv_worker *w, *next;
	uint64_t deadline = now_ms() + OWNER_WAIT_MS;
	int r = 0;

	if (role == ROLE_PRIMARY && e->primary.pid > 0)
		(void)kill(-e->primary.pid, SIGKILL);
	if (role == ROLE_SHADOW && e->shadow.pid > 0)
		(void)kill(-e->shadow.pid, SIGKILL);
	for (w = s->reg.workers; w; w = w->next)
		if (w->state != WORKER_DEAD && w->role == role && w->pidfd >= 0 &&
		    strcmp(worker_engine(w), e->cfg->name) == 0)
			(void)syscall(SYS_pidfd_send_signal, w->pidfd, SIGKILL, NULL, 0);
	for (w = s->reg.workers; w; w = next) {
		struct pollfd pf;
		uint64_t now;

		next = w->next;
		if (w->state == WORKER_DEAD || w->role != role ||
		    strcmp(worker_engine(w), e->cfg->name) != 0)
			continue;
		if (w->pidfd >= 0) {
			pf = (struct pollfd){.fd = w->pidfd, .events = POLLIN};
			now = now_ms();
			if (poll(&pf, 1, (int)(deadline > now ? deadline - now : 0)) != 1) {
				r = -ETIMEDOUT;
				continue;
			}
		}
		/* Re-entry through engines_worker_died() sees the recovery and stays out. */
		supervisor_worker_died(s, w);
	}
	return r;
}

/* Drops the dead workers of e (with role, or any when role < 0): their retained memory goes. */
static void forget_dead(struct supervisor *s, struct sv_engine *e, int role)
{
	for (struct sv_worker *w = s->reg.workers, *next; w; w = next) {
		next = w->next;
		if (w->state == WORKER_DEAD && (role < 0 || (int)w->role == role) &&
		    strcmp(worker_engine(w), e->cfg->name) == 0)
			workers_forget(s, w);
	}
}

static void start_shadow(struct supervisor *s, struct sv_engine *e)
{
	uint32_t port = e->primary_port == e->cfg->port ? e->cfg->shadow_port : e->cfg->port;

	if (!e->cfg->shadow[0] || e->shadow.pid > 0)
		return;
	(void)engines_launch(s, e, e->cfg->shadow, ROLE_SHADOW, port, &e->shadow);
}

/* ---- outcomes ---------------------------------------------------------------------------- */

static void finish(struct supervisor *s, struct sv_engine *e, bool promoted)
{
	struct sv_recovery *rec = e->rec;

	if (!rec->end_ns[PHASE_READY])
		phase_end(rec, PHASE_READY);
	record_fill(e, rec);
	e->last.promoted = promoted;
	e->last.finished = true;
	s->metrics.recoveries[promoted ? RECOVERY_PROMOTED : RECOVERY_COLD_RESTART]++;
	promote_free(e);
	emit_summary(s, e);
	start_shadow(s, e);
}

static void fail(struct supervisor *s, struct sv_engine *e, const char *why)
{
	struct sv_recovery *rec = e->rec;

	record_fill(e, rec);
	e->last.promoted = false;
	e->last.finished = false;
	snprintf(e->last.reason, sizeof(e->last.reason), "%s", why);
	s->metrics.recoveries[RECOVERY_FAILED]++;
	rec_log(s, e, "failed: %s", why);
	promote_free(e);
	emit_summary(s, e);
}

/* Falls back to a cold restart: everything of the engine stops, the dead primaries' memory is
 * released, the cold command starts. Never returns to promotion. */
static void cold(struct supervisor *s, struct sv_engine *e, const char *fmt, ...) _printf_(3, 4);

static void cold(struct supervisor *s, struct sv_engine *e, const char *fmt, ...)
{
	struct sv_recovery *rec = e->rec;
	const char *cmd = e->cfg->cold_restart[0] ? e->cfg->cold_restart : e->cfg->primary;
	va_list ap;

	if (rec->cold)
		return;
	rec->cold = true;
	va_start(ap, fmt);
	(void)vsnprintf(e->last.reason, sizeof(e->last.reason), fmt, ap);
	va_end(ap);
	rec_log(s, e, "cold restart: %s", e->last.reason);
	(void)stop_workers(s, e, ROLE_PRIMARY);
	(void)stop_workers(s, e, ROLE_SHADOW);
	engines_kill_proc(&e->primary);
	engines_kill_proc(&e->shadow);
	forget_dead(s, e, -1);
	if (strcmp(cmd, "external") == 0) {
		fail(s, e,
		     "cold restart impossible: the primary is external and no cold_restart "
		     "command is configured");
		return;
	}
	e->primary_ready = false;
	e->probe_fail_since_ms = 0;
	canary_forget(e); /* recorded from a group that is gone: the cold one answers anew */
	if (e->primary_port == 0)
		e->primary_port = e->cfg->port;
	if (engines_launch(s, e, cmd, ROLE_PRIMARY, e->primary_port, &e->primary) < 0) {
		fail(s, e, "the cold restart command could not be started");
		return;
	}
	rec->deadline_ms = now_ms() + e->cfg->ready_timeout_ms;
}

void promote_primary_ready(struct supervisor *s, struct sv_engine *e)
{
	if (e->rec && e->rec->cold)
		finish(s, e, false);
}

static void promoted(struct supervisor *s, struct sv_engine *e)
{
	struct sv_recovery *rec = e->rec;

	for (uint32_t r = 0; r < rec->tp; r++) {
		struct sv_worker *w = registry_worker_find(&s->reg, rec->shadow[r]);

		if (!w)
			continue;
		w->role = ROLE_PRIMARY;
		w->promoted = true; /* its shim says hello again, as a primary */
		w->committing = false;
		w->parked = false;
	}
	/* Serving from here on (its HTTP server has been up since before the failure); what
	 * follows is bookkeeping. */
	phase_end(rec, PHASE_READY);
	/* The promoted ranks hold the memory now (imported handles) and announce it themselves. */
	forget_dead(s, e, ROLE_PRIMARY);
	engines_kill_proc(&e->primary); /* dead already: reaped here */
	engines_probe_reset(e);
	e->primary = e->shadow;
	e->shadow = (struct eng_proc){.pidfd = -1};
	e->primary.role = ROLE_PRIMARY;
	e->primary_port = e->primary.port ? e->primary.port : e->primary_port;
	/* The shadow's HTTP server has been up since before the failure: it serves now. */
	e->primary_ready = true;
	e->ready_ms = now_ms();
	e->probe_fail_since_ms = 0;
	e->probe_ok_ms = now_ms();
	rec_log(s, e, "promoted %u ranks, serving on port %u", rec->tp, e->primary_port);
	finish(s, e, true);
}

/* ---- health + content, off the loop ------------------------------------------------------ */

struct content_item {
	pid_t pid;
	uint64_t id, size, wver;
	uint8_t dev[PROTO_UUID_LEN];
	int fd;
	uint64_t want;
	uint64_t sum;
	int error;
};

struct promote_job {
	struct sv_job job;
	struct sv_engine *e;
	uint64_t seq; /* the recovery it belongs to; 0: a live-checksum recording */
	bool gpu;     /* run the NVML check */
	enum verify_mode mode;
	uint64_t gpu_done_ns, content_done_ns;
	size_t n_results;
	struct health_result results[16];
	size_t n_items;
	struct content_item *items;
};

static void pjob_free(struct sv_job *j)
{
	struct promote_job *pj = (struct promote_job *)j;

	for (size_t i = 0; i < pj->n_items; i++)
		(void)safe_close(pj->items[i].fd);
	free(pj->items);
	free(pj);
}

/* CRC32 of 64 KiB every 16 MiB and of the last 64 KiB: a flipped page is caught with
 * probability sampled/total; the full check catches every flip. Needs the fd readable as a
 * file (the emulator's memfds); otherwise the full driver read stands in. */
/* CRC of len bytes at at into *crc; -ENOTTY when fd cannot be read as a file. */
static int sample_at(int fd, uint64_t at, size_t len, uLong *crc)
{
	static uint8_t buf[SAMPLE_BYTES];
	ssize_t n = pread(fd, buf, len, (off_t)at);

	if (n < 0 && (errno == ESPIPE || errno == EINVAL || errno == EBADF))
		return -ENOTTY;
	if (n != (ssize_t)len)
		return n < 0 ? negative_errno() : -EIO;
	*crc = crc32(*crc, buf, (uInt)len);
	return 0;
}

static int checksum_sampled(struct supervisor *s, const struct content_item *it, uint64_t *ret)
{
	uLong crc = crc32(0L, Z_NULL, 0);
	uint64_t off, last = 0;
	int r = 0;

	/* 64 KiB at 0, 16 MiB, 32 MiB, ... then the last 64 KiB. */
	for (off = 0; off < it->size && r == 0; off += SAMPLE_STRIDE) {
		r = sample_at(it->fd, off, (size_t)MIN((uint64_t)SAMPLE_BYTES, it->size - off),
			      &crc);
		last = off;
	}
	if (r == 0 && it->size > SAMPLE_BYTES && it->size - SAMPLE_BYTES > last)
		r = sample_at(it->fd, it->size - SAMPLE_BYTES, SAMPLE_BYTES, &crc);
	if (r == -ENOTTY)
		return health_content_checksum(s->config.content_method, s->config.cuda_library,
					       it->fd, it->size, it->dev, ret);
	if (r < 0)
		return r;
	*ret = crc;
	return 0;
}

/* Offload thread. */
static void pjob_run(struct supervisor *s, struct sv_job *j)
{
	struct promote_job *pj = (struct promote_job *)j;

	if (pj->gpu) {
		if (!s->gpu)
			s->gpu = health_gpu_new(s->config.nvml_library, &s->config.fatal_xids);
		pj->n_results =
			health_gpu_check_fast(s->gpu, -1, pj->results, ARRAY_SIZE(pj->results));
		pj->gpu_done_ns = now_ns();
	}
	for (size_t i = 0; i < pj->n_items; i++) {
		struct content_item *it = &pj->items[i];

		if (pj->mode == VERIFY_SAMPLED)
			it->error = checksum_sampled(s, it, &it->sum);
		else
			it->error = health_content_checksum(s->config.content_method,
							    s->config.cuda_library, it->fd,
							    it->size, it->dev, &it->sum);
	}
	pj->content_done_ns = now_ns();
}

static void record_done(struct supervisor *s, struct promote_job *pj)
{
	for (size_t i = 0; i < pj->n_items; i++) {
		struct content_item *it = &pj->items[i];
		struct sv_worker *w = registry_worker_find(&s->reg, it->pid);
		struct sv_region *rg = w ? registry_region_find(w, it->id) : NULL;

		if (!rg)
			continue;
		rg->live_sum_pending = false;
		/* Only while the owner lives and the version did not move under the read. */
		if (it->error < 0 || w->state == WORKER_DEAD || rg->weights_version != it->wver)
			continue;
		rg->live_sum = it->sum;
		rg->live_sum_version = it->wver + 1;
		rg->live_sum_mode = (int)pj->mode;
		s->metrics.live_checksums++;
	}
}

static void layout_and_remap(struct supervisor *s, struct sv_engine *e);

/* Loop thread. */
static void pjob_done(struct supervisor *s, struct sv_job *j)
{
	struct promote_job *pj = (struct promote_job *)j;
	struct sv_engine *e = pj->e;
	struct sv_recovery *rec;

	if (pj->seq == 0) {
		record_done(s, pj);
		return;
	}
	rec = e->rec;
	if (!rec || rec->seq != pj->seq || rec->cold)
		return;
	rec->job_pending = false;
	rec->end_ns[PHASE_HEALTH] = pj->gpu_done_ns;
	for (size_t i = 0; i < pj->n_results; i++) {
		const struct health_result *r = &pj->results[i];

		s->metrics.verdicts[HEALTH_GPU][r->verdict]++;
		/* Unknown is not good enough to hand memory over: never wrong. */
		if (r->verdict != VERDICT_OK) {
			cold(s, e, "GPU %d health %s: %s", r->dev,
			     health_verdict_to_string(r->verdict), r->message);
			return;
		}
	}
	if (pj->n_results == 0) {
		cold(s, e, "GPU health: no device answered");
		return;
	}
	/* The periodic check may have consumed an XID this job no longer sees. */
	if (s->gpu_verdict == VERDICT_FAILED) {
		cold(s, e, "GPU health: the last periodic check failed: %s", s->gpu_message);
		return;
	}
	rec_log(s, e, "GPU health ok (%zu devices)", pj->n_results);
	rec->end_ns[PHASE_CONTENT] = e->cfg->verify == VERIFY_NONE ? 0 : pj->content_done_ns;
	for (size_t i = 0; i < pj->n_items; i++) {
		const struct content_item *it = &pj->items[i];

		s->metrics.verdicts[HEALTH_CONTENT][it->error < 0	  ? VERDICT_UNKNOWN
						    : it->sum == it->want ? VERDICT_OK
									  : VERDICT_FAILED]++;
		if (it->error < 0) {
			cold(s, e, "content: region %" PRIu64 " of pid %d unreadable: %s", it->id,
			     it->pid, strerror(-it->error));
			return;
		}
		if (it->sum != it->want) {
			cold(s, e,
			     "content (%s): region %" PRIu64 " of pid %d, weights version %" PRIu64
			     ": checksum %08" PRIx64 ", recorded %08" PRIx64,
			     verify_mode_to_string(pj->mode), it->id, it->pid, it->wver, it->sum,
			     it->want);
			return;
		}
	}
	if (e->cfg->verify != VERIFY_NONE)
		rec_log(s, e, "content (%s) ok: %zu weights regions match",
			verify_mode_to_string(pj->mode), pj->n_items);
	layout_and_remap(s, e);
}

static struct promote_job *pjob_new(struct sv_engine *e, uint64_t seq)
{
	struct promote_job *pj = calloc(1, sizeof(*pj));

	if (!pj)
		return NULL;
	pj->job.run = pjob_run;
	pj->job.done = pjob_done;
	pj->job.free = pjob_free;
	pj->e = e;
	pj->seq = seq;
	pj->mode = e->cfg->verify;
	return pj;
}

static int item_add(struct promote_job *pj, size_t cap, const struct sv_worker *w,
		    const struct sv_region *rg)
{
	struct content_item *it;

	if (pj->n_items >= cap)
		return -E2BIG;
	it = &pj->items[pj->n_items];
	it->fd = fcntl(rg->fd, F_DUPFD_CLOEXEC, 3);
	if (it->fd < 0)
		return negative_errno();
	it->pid = w->pid;
	it->id = rg->id;
	it->size = rg->size;
	it->wver = rg->weights_version;
	it->want = rg->live_sum;
	memcpy(it->dev, rg->device_uuid, PROTO_UUID_LEN);
	pj->n_items++;
	return 0;
}

void promote_record_checksums(struct supervisor *s, struct sv_engine *e)
{
	struct promote_job *pj = NULL;
	uint64_t now = now_ms();
	size_t cap = 0;

	/* Not before the engine serves: the initial load writes the weights without moving their
	 * version, so only readiness says the bytes are final. */
	if (e->rec || e->cfg->verify == VERIFY_NONE || !e->cfg->shadow[0] || !e->primary_ready ||
	    now - e->ready_ms < e->cfg->checksum_settle_ms)
		return;
	for (int pass = 0; pass < 2; pass++) {
		for (struct sv_worker *w = s->reg.workers; w; w = w->next) {
			if (w->state != WORKER_ALIVE || w->role != ROLE_PRIMARY ||
			    strcmp(worker_engine(w), e->cfg->name) != 0)
				continue;
			for (struct sv_region *rg = w->regions; rg; rg = rg->next) {
				if (rg->cls != REGION_WEIGHTS || rg->fd < 0 ||
				    rg->live_sum_pending ||
				    (rg->live_sum_version == rg->weights_version + 1 &&
				     rg->live_sum_mode == (int)e->cfg->verify) ||
				    now - rg->since_ms < e->cfg->checksum_settle_ms)
					continue;
				if (pass == 0) {
					cap++;
					continue;
				}
				if (item_add(pj, cap, w, rg) == 0)
					rg->live_sum_pending = true;
			}
		}
		if (pass == 0) {
			if (cap == 0)
				return;
			pj = pjob_new(e, 0);
			if (!pj || !(pj->items = calloc(cap, sizeof(*pj->items)))) {
				free(pj);
				return;
			}
		}
	}
	offload_submit(s, &pj->job);
}

/* ---- the steps --------------------------------------------------------------------------- */

static void layout_and_remap(struct supervisor *s, struct sv_engine *e)
{
	struct sv_recovery *rec = e->rec;
	char msg[PROTO_MAX_STR + 1];

	for (uint32_t r = 0; r < rec->tp; r++) {
		struct sv_worker *p = registry_worker_find(&s->reg, rec->primary[r]);
		struct sv_worker *sh = registry_worker_find(&s->reg, rec->shadow[r]);

		if (!p || !sh || sh->state == WORKER_DEAD) {
			cold(s, e, "layout: rank %u has no %s any more", r,
			     p ? "shadow" : "primary");
			return;
		}
		if (shadow_layout_check(p, sh, msg, sizeof(msg)) < 0) {
			cold(s, e, "layout: %s", msg);
			return;
		}
	}
	phase_end(rec, PHASE_LAYOUT);
	rec_log(s, e, "layout ok on %u ranks", rec->tp);

	for (uint32_t r = 0; r < rec->tp; r++) {
		struct sv_worker *p = registry_worker_find(&s->reg, rec->primary[r]);
		struct sv_worker *sh = registry_worker_find(&s->reg, rec->shadow[r]);
		struct proto_msg m = {.type = PROTO_PROMOTE_COMMIT};
		uint64_t wver = 0;
		int n;

		n = shadow_send_maps(s, p, sh, false);
		if (n < 0) {
			cold(s, e, "remap: maps to shadow rank %u failed: %s", r, strerror(-n));
			return;
		}
		for (struct sv_region *rg = p->regions; rg; rg = rg->next)
			if (rg->cls == REGION_WEIGHTS)
				wver = MAX(wver, rg->weights_version);
		rec->wver = MAX(rec->wver, wver);
		m.promote_commit = (struct proto_promote_commit){.n_regions = sh->layout_n,
								 .hash = sh->layout_hash,
								 .weights_version = wver};
		if (client_send(s, sh->client, &m) < 0) {
			cold(s, e, "remap: commit to shadow rank %u failed", r);
			return;
		}
		sh->committing = true;
	}
	rec->deadline_ms = now_ms() + e->cfg->promote_timeout_ms;
}

void promote_start(struct supervisor *s, struct sv_engine *e, const char *trigger, pid_t dead_pid,
		   uint64_t detect_ns)
{
	struct sv_worker *p[MAX_RANKS] = {NULL}, *sh[MAX_RANKS];
	struct sv_recovery *rec;
	struct promote_job *pj;
	uint32_t tp = MIN(e->cfg->tp, (uint32_t)MAX_RANKS);
	size_t n_items = 0;
	int r;

	if (e->rec)
		return;
	rec = calloc(1, sizeof(*rec));
	if (!rec) {
		log_error("Engine %s: out of memory for a recovery.", e->cfg->name);
		return;
	}
	e->rec = rec;
	rec->seq = ++e->n_recoveries;
	rec->tp = tp;
	rec->end_ns[PHASE_DETECT] = now_ns();
	rec->start_ns = detect_ns && detect_ns <= rec->end_ns[PHASE_DETECT]
				? detect_ns
				: rec->end_ns[PHASE_DETECT];
	memset(&e->last, 0, sizeof(e->last));
	e->last.seq = rec->seq;
	e->last.started_us = now_realtime_us();
	e->last.dead_pid = dead_pid;
	snprintf(e->last.trigger, sizeof(e->last.trigger), "%s", trigger);
	rec_log(s, e, "started (%s, pid %d)", trigger, dead_pid);

	/* Owner: every primary rank stopped and proven gone. NCCL groups cannot be partially
	 * recovered, and nothing may write the memory we are about to hand over. */
	r = stop_workers(s, e, ROLE_PRIMARY);
	if (r < 0) {
		cold(s, e, "owner: a primary rank did not die within %d ms of SIGKILL",
		     OWNER_WAIT_MS);
		return;
	}
	/* The dead primaries, newest first per rank. */
	for (struct sv_worker *w = s->reg.workers; w; w = w->next) {
		int32_t rk = worker_rank(w);

		if (w->role != ROLE_PRIMARY || w->state != WORKER_DEAD || (uint32_t)rk >= tp ||
		    strcmp(worker_engine(w), e->cfg->name) != 0)
			continue;
		if (!p[rk] || w->since_ms > p[rk]->since_ms)
			p[rk] = w;
	}
	for (uint32_t i = 0; i < tp; i++) {
		struct health_result hr;

		if (!p[i]) {
			phase_end(rec, PHASE_OWNER);
			cold(s, e, "owner: primary rank %u left no memory to take over", i);
			return;
		}
		rec->primary[i] = p[i]->pid;
		(void)health_owner_check(s, p[i], &hr);
		s->metrics.verdicts[HEALTH_OWNER][hr.verdict]++;
		if (hr.verdict != VERDICT_OK) {
			phase_end(rec, PHASE_OWNER);
			cold(s, e, "owner: %s", hr.message);
			return;
		}
	}
	phase_end(rec, PHASE_OWNER);

	/* Only now (the owners are gone) decide whether a shadow can take over at all. */
	for (struct sv_worker *w = s->reg.workers; w; w = w->next)
		if ((uint32_t)worker_rank(w) >= tp && strcmp(worker_engine(w), e->cfg->name) == 0) {
			cold(s, e, "%s pid %d says rank %d, but tp = %u",
			     worker_role_to_string(w->role), w->pid, w->rank, tp);
			return;
		}
	if (!e->cfg->shadow[0]) {
		cold(s, e, "no shadow configured");
		return;
	}
	if (engines_workers(s, e, ROLE_SHADOW, sh, tp) < tp) {
		cold(s, e, "the shadow group is not complete");
		return;
	}
	for (uint32_t i = 0; i < tp; i++) {
		if (!sh[i]->parked) {
			cold(s, e, "shadow rank %u (pid %d) is not parked yet", i, sh[i]->pid);
			return;
		}
		rec->shadow[i] = sh[i]->pid;
	}

	/* Health and content: one job off the loop. */
	pj = pjob_new(e, rec->seq);
	if (!pj) {
		cold(s, e, "out of memory");
		return;
	}
	pj->gpu = true;
	if (e->cfg->verify != VERIFY_NONE) {
		for (uint32_t i = 0; i < tp; i++)
			n_items += p[i]->n_regions;
		pj->items = calloc(n_items ? n_items : 1, sizeof(*pj->items));
		if (!pj->items) {
			pjob_free(&pj->job);
			cold(s, e, "out of memory");
			return;
		}
		for (uint32_t i = 0; i < tp; i++)
			for (struct sv_region *rg = p[i]->regions; rg; rg = rg->next) {
				if (rg->cls != REGION_WEIGHTS)
					continue;
				if (rg->live_sum_version != rg->weights_version + 1 ||
				    rg->live_sum_mode != (int)e->cfg->verify) {
					pjob_free(&pj->job);
					cold(s, e,
					     "content: no %s checksum recorded for region %" PRIu64
					     " of rank %u at weights version %" PRIu64
					     " (written within checksum_settle of the failure?)",
					     verify_mode_to_string(e->cfg->verify), rg->id, i,
					     rg->weights_version);
					return;
				}
				if (rg->fd < 0 || item_add(pj, n_items, p[i], rg) < 0) {
					pjob_free(&pj->job);
					cold(s, e, "content: region %" PRIu64 " has no fd", rg->id);
					return;
				}
			}
	}
	rec->job_pending = true;
	offload_submit(s, &pj->job);
}

/* Every rank remapped: the canary, before the group is marked primary and gets traffic. */
static void remapped(struct supervisor *s, struct sv_engine *e)
{
	struct sv_recovery *rec = e->rec;
	char why[PROTO_MAX_STR + 1];

	phase_end(rec, PHASE_REMAP);
	if (!canary_enabled(s, e)) {
		promoted(s, e);
		return;
	}
	rec->canary = true;
	rec->deadline_ms = now_ms() + s->config.canary_timeout_ms + 1000;
	/* Its verdict may come back inside (no offload threads): through promote_canary_done. */
	if (canary_check(s, e, rec->seq, e->shadow.port, rec->wver, why, sizeof(why)) < 0)
		cold(s, e, "%s", why);
}

void promote_canary_done(struct supervisor *s, struct sv_engine *e, uint64_t seq, bool ok,
			 const char *why)
{
	struct sv_recovery *rec = e->rec;

	if (!rec || rec->seq != seq || rec->cold || !rec->canary)
		return;
	rec->canary = false;
	phase_end(rec, PHASE_CANARY);
	if (!ok) {
		cold(s, e, "%s", why);
		return;
	}
	rec_log(s, e, "%s", why);
	promoted(s, e);
}

void promote_on_done(struct supervisor *s, struct sv_worker *w, const struct proto_promote_done *d)
{
	struct sv_engine *e = engines_find(s, worker_engine(w));
	struct sv_recovery *rec = e ? e->rec : NULL;
	uint32_t r;

	if (!rec || rec->cold || !w->committing) {
		log_debug("PROMOTE_DONE from pid %d outside a promotion, ignoring.", w->pid);
		return;
	}
	for (r = 0; r < rec->tp; r++)
		if (rec->shadow[r] == w->pid)
			break;
	if (r == rec->tp)
		return;
	w->committing = false;
	if (d->code != 0) {
		cold(s, e, "remap on shadow rank %u failed: %s (%s)", r, strerror(d->code),
		     d->message);
		return;
	}
	if (!rec->done[r]) {
		rec->done[r] = true;
		rec->n_done++;
	}
	rec_log(s, e, "shadow rank %u remapped %u regions in %" PRIu64 " us", r, d->n_regions,
		d->ns / 1000);
	if (rec->n_done == rec->tp)
		remapped(s, e);
}

void promote_worker_died(struct supervisor *s, struct sv_engine *e, struct sv_worker *w)
{
	struct sv_recovery *rec = e->rec;

	if (rec->cold) {
		/* The cold primary died before it served: nothing else to fall back to. */
		if (w->role == ROLE_PRIMARY && !e->primary_ready && e->primary.pid > 0 &&
		    w->pgid == e->primary.pid)
			fail(s, e, "the cold-restarted primary died before it was ready");
		return;
	}
	for (uint32_t r = 0; r < rec->tp; r++)
		if (rec->shadow[r] == w->pid) {
			cold(s, e, "shadow rank %u (pid %d) died during the promotion", r, w->pid);
			return;
		}
}

void promote_tick(struct supervisor *s, struct sv_engine *e)
{
	struct sv_recovery *rec = e->rec;

	if (!rec || !rec->deadline_ms || now_ms() < rec->deadline_ms)
		return;
	if (rec->cold) {
		fail(s, e,
		     "the cold-restarted primary did not answer its probe within ready_timeout");
		return;
	}
	if (rec->canary)
		cold(s, e, "canary: no verdict within canary_timeout");
	else
		cold(s, e, "remap: not every shadow rank reported done within promote_timeout");
}

bool promote_armed(struct supervisor *s, const struct sv_engine *e)
{
	struct sv_worker *p[MAX_RANKS], *sh[MAX_RANKS];
	uint32_t tp = MIN(e->cfg->tp, (uint32_t)MAX_RANKS);
	char msg[PROTO_MAX_STR + 1];

	if (e->rec || !e->cfg->shadow[0] || !e->primary_ready ||
	    engines_workers(s, e, ROLE_PRIMARY, p, tp) < tp ||
	    engines_workers(s, e, ROLE_SHADOW, sh, tp) < tp)
		return false;
	for (uint32_t i = 0; i < tp; i++) {
		if (shadow_layout_check(p[i], sh[i], msg, sizeof(msg)) < 0)
			return false;
		if (e->cfg->verify == VERIFY_NONE)
			continue;
		for (const struct sv_region *rg = p[i]->regions; rg; rg = rg->next)
			if (rg->cls == REGION_WEIGHTS &&
			    (rg->live_sum_version != rg->weights_version + 1 ||
			     rg->live_sum_mode != (int)e->cfg->verify))
				return false;
	}
	return canary_armed(s, e);
}
