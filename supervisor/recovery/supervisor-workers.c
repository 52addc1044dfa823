/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-nccl.h"
#include "supervisor-checks.h"
#include "supervisor-engines.h"
#include "supervisor-events.h"
#include "supervisor-fdstore.h"
#include "supervisor-journal.h"
#include "supervisor-workers.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

uint64_t process_starttime(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long st = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	(void)safe_close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* The command name may hold spaces and parentheses: fields resume after the last ')'. */
	p = strrchr(buf, ')');
	if (!p)
		return 0;
	/* After ')': field 3 (state) ... field 22 (starttime), 20 fields on. */
	for (int field = 2; field < 22 && p; field++)
		p = strchr(p + 1, ' ');
	if (!p || sscanf(p + 1, "%llu", &st) != 1)
		return 0;
	return st;
}

static int pidfd_for(const struct sv_client *c, pid_t pid)
{
	socklen_t len = sizeof(int);
	int fd = -1;

	/* SO_PEERPIDFD (Linux 6.5) names the very process that connected, immune to pid reuse. */
	if (c && getsockopt(c->fd, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0)
		return fd;
	fd = (int)syscall(SYS_pidfd_open, pid, 0);
	return fd >= 0 ? fd : negative_errno();
}

static void journal_worker(struct supervisor *s, const struct sv_worker *w)
{
	struct journal_record rec = {.op = JOURNAL_WORKER};

	rec.pid = (uint32_t)w->pid;
	rec.uid = (uint32_t)w->uid;
	rec.gid = (uint32_t)w->gid;
	rec.starttime = w->starttime;
	snprintf(rec.engine_id, sizeof(rec.engine_id), "%s", worker_engine(w));
	rec.role = w->role;
	rec.rank = w->rank;
	(void)journal_append(s->journal, &rec);
}

void workers_rank_from_comm(struct supervisor *s, struct sv_worker *w, int32_t rank,
			    uint32_t nranks, uint32_t tp)
{
	/* One rank alone tells nothing (and a split whose rank is not known yet says 1); with
	 * the engine's tensor-parallel size known, only a communicator of that size is its TP
	 * group (a world or pipeline group numbers the ranks otherwise). */
	if (w->rank_from_comm || nranks < 2 || (tp > 0 && nranks != tp) || rank < 0)
		return;
	w->rank_from_comm = true;
	if (w->rank == rank)
		return;
	log_debug("pid %d: rank %d from its communicator of %u ranks (hello said %d)", w->pid, rank,
		  nranks, w->rank);
	w->rank = rank;
	journal_worker(s, w);
	meminfo_rank_changed(s, w->pid, rank);
}

static void region_record(const struct sv_region *rg, struct journal_record *rec)
{
	memset(rec, 0, sizeof(*rec));
	rec->op = JOURNAL_REGION;
	rec->pid = (uint32_t)rg->owner->pid;
	rec->region.id = rg->id;
	memcpy(rec->region.device_uuid, rg->device_uuid, PROTO_UUID_LEN);
	rec->region.va = rg->va;
	rec->region.size = rg->size;
	rec->region.cls = rg->cls;
	rec->region.order = rg->order;
	rec->region.weights_version = rg->weights_version;
	rec->region.fd = -1;
	rec->checksum = rg->checksum;
	rec->checksum_version = rg->checksum_version;
}

void workers_journal_region(struct supervisor *s, const struct sv_region *rg)
{
	struct journal_record rec;

	region_record(rg, &rec);
	(void)journal_append(s->journal, &rec);
}

static void journal_simple(struct supervisor *s, enum journal_op op, pid_t pid, uint64_t id)
{
	struct journal_record rec = {.op = op};

	rec.pid = (uint32_t)pid;
	rec.region.id = id;
	(void)journal_append(s->journal, &rec);
}

static void watch(struct supervisor *s, struct sv_worker *w)
{
	if (w->pidfd >= 0 && s->hooks && s->hooks->watch_worker)
		(void)s->hooks->watch_worker(s, w);
}

static void unwatch(struct supervisor *s, struct sv_worker *w)
{
	if (w->watch && s->hooks && s->hooks->unwatch_worker)
		s->hooks->unwatch_worker(s, w);
	w->watch = NULL;
	w->pidfd = safe_close(w->pidfd);
}

void workers_region_drop(struct supervisor *s, struct sv_region *rg)
{
	fdstore_remove(s, rg);
	journal_simple(s, JOURNAL_REGION_GONE, rg->owner->pid, rg->id);
	registry_region_remove(&s->reg, rg);
}

void workers_forget(struct supervisor *s, struct sv_worker *w)
{
	unwatch(s, w);
	if (w->client)
		w->client->worker = NULL;
	for (struct sv_region *rg = w->regions; rg; rg = rg->next)
		fdstore_remove(s, rg);
	journal_simple(s, JOURNAL_WORKER_GONE, w->pid, 0);
	registry_worker_remove(&s->reg, w);
}

int workers_hello(struct supervisor *s, struct sv_client *c, const struct proto_hello *h)
{
	pid_t pid = c->cred.pid;
	uint64_t st = process_starttime(pid), now = now_ms();
	struct sv_worker *w = NULL;
	int r;

	if ((pid_t)h->pid != pid)
		/* A shim in another pid namespace sees another number; SO_PEERCRED is the truth. */
		log_debug("Hello from pid %d says pid %u (pid namespace?); using %d.", pid, h->pid,
			  pid);

	for (struct sv_worker *it = s->reg.workers; it; it = it->next)
		if (it->pid == pid && it->state != WORKER_DEAD && it->starttime == st)
			w = it;
	if (w) {
		/* A new session of a worker we know: its re-announce confirms each region; what it
		 * does not re-announce within the grace was released while we could not hear. */
		if (w->client && w->client != c)
			w->client->worker = NULL;
		for (struct sv_region *rg = w->regions; rg; rg = rg->next)
			rg->confirmed = false;
		w->resync_deadline_ms = now + s->config.resync_grace * 1000;
		if (w->state == WORKER_UNCONFIRMED)
			w->since_ms = now;
		w->state = WORKER_ALIVE;
		if (w->pidfd < 0) {
			w->pidfd = pidfd_for(c, pid);
			watch(s, w);
		}
	} else {
		w = registry_worker_add(&s->reg, pid, c->cred.uid, c->cred.gid, h->engine_id);
		if (!w)
			return -ENOMEM;
		w->starttime = st;
		w->since_ms = now;
		w->state = WORKER_ALIVE;
		r = pidfd_for(c, pid);
		if (r < 0) {
			/* Gone already (or no pidfd support): nothing of it can be watched. */
			registry_worker_remove(&s->reg, w);
			return log_debug_errno(r, "No pidfd for pid %d: %m", pid);
		}
		w->pidfd = r;
		watch(s, w);
	}
	r = registry_worker_set_engine(&s->reg, w, h->engine_id);
	if (r < 0)
		return r;
	w->role = h->role;
	/* A rank its communicator told outranks the environment's (a promoted shadow's hello). */
	if (!w->rank_from_comm)
		w->rank = h->rank;
	w->n_devices = MIN(h->n_devices, (uint32_t)PROTO_MAX_DEVICES);
	memcpy(w->device_uuid, h->device_uuid, sizeof(w->device_uuid));
	w->client = c;
	c->worker = w;
	journal_worker(s, w);
	supervisor_emit(s, EVENT_WORKER_HELLO, (uint32_t)pid, 0,
			"engine \"%s\" %s rank %d, %u devices", worker_engine(w),
			worker_role_to_string(w->role), w->rank, w->n_devices);
	engines_worker_hello(s, w);
	return 0;
}

static void expire_worker(struct supervisor *s, struct sv_worker *w, enum expire_reason why)
{
	static const char *const reasons[] = {"retention timeout", "memory budget", "resync"};
	uint64_t n = w->n_regions, bytes = w->bytes;

	s->metrics.regions_expired[why] += n;
	supervisor_emit(s, EVENT_REGION_EXPIRED, (uint32_t)w->pid, 0,
			"%" PRIu64 " regions (%" PRIu64 " bytes) released: %s", n, bytes,
			reasons[why]);
	workers_forget(s, w);
}

static void enforce_budget(struct supervisor *s)
{
	uint64_t retained;

	if (s->config.memory_budget == 0)
		return;
	for (;;) {
		struct sv_worker *oldest = NULL;

		registry_totals(&s->reg, REGION_RETAINED, NULL, &retained);
		if (retained <= s->config.memory_budget)
			return;
		for (struct sv_worker *w = s->reg.workers; w; w = w->next)
			if (w->state == WORKER_DEAD && w->n_regions > 0 &&
			    (!oldest || w->since_ms < oldest->since_ms))
				oldest = w;
		if (!oldest)
			return;
		/* A whole worker at a time: part of an engine's memory recovers nothing. */
		expire_worker(s, oldest, EXPIRE_BUDGET);
	}
}

void supervisor_worker_died(struct supervisor *s, struct sv_worker *w)
{
	uint64_t now = now_ms(), retained = 0;
	struct sv_region *rg, *next;

	if (w->state == WORKER_DEAD)
		return;
	unwatch(s, w);
	w->state = WORKER_DEAD;
	w->since_ms = now;
	s->metrics.worker_exits++;
	for (rg = w->regions; rg; rg = next) {
		next = rg->next;
		if (rg->fd < 0) {
			/* Known from the journal only: its memory died with the process. */
			s->metrics.regions_lost++;
			workers_region_drop(s, rg);
			continue;
		}
		rg->state = REGION_RETAINED;
		rg->since_ms = now;
		retained += rg->size;
	}
	supervisor_emit(s, EVENT_WORKER_EXIT, (uint32_t)w->pid, 0,
			"engine \"%s\" rank %d exited; %u regions (%" PRIu64 " bytes) retained",
			worker_engine(w), w->rank, w->n_regions, retained);
	/* Its communicators' peers (diagnosis; peers outside configured engines stopped). */
	nccl_worker_died(s, w);
	/* A configured engine's primary: recovery starts (it may forget w). */
	engines_worker_died(s, w);
	{
		struct sv_worker *it = s->reg.workers;

		while (it && it != w)
			it = it->next;
		if (!it)
			return; /* forgotten by the recovery (its memory released) */
	}
	if (w->n_regions == 0) {
		workers_forget(s, w);
		return;
	}
	journal_simple(s, JOURNAL_DEAD, w->pid, 0);
	/* Nothing writes this memory any more: its checksum now is what a recovery compares. A
	 * configured engine's recovery compares the checksums taken while it lived instead, and
	 * must not queue behind reading all of its memory. */
	if (!engines_recovering(s, w))
		checks_record_content(s, w);
	enforce_budget(s);
}

void workers_tick(struct supervisor *s)
{
	uint64_t now = now_ms();
	struct sv_worker *w, *next;

	for (w = s->reg.workers; w; w = next) {
		next = w->next;
		if (w->state == WORKER_DEAD) {
			if (s->config.retention_timeout &&
			    now - w->since_ms >= s->config.retention_timeout * 1000)
				expire_worker(s, w, EXPIRE_TIMEOUT);
			continue;
		}
		if (!w->resync_deadline_ms || now < w->resync_deadline_ms)
			continue;
		w->resync_deadline_ms = 0;
		if (w->state == WORKER_UNCONFIRMED) {
			/* Alive, but its shim never came back: we hold none of its memory. */
			s->metrics.regions_expired[EXPIRE_RESYNC] += w->n_regions;
			supervisor_emit(s, EVENT_REGION_EXPIRED, (uint32_t)w->pid, 0,
					"no hello within the resync grace; forgetting %u regions",
					w->n_regions);
			workers_forget(s, w);
			continue;
		}
		for (struct sv_region *rg = w->regions, *rn; rg; rg = rn) {
			rn = rg->next;
			if (rg->confirmed)
				continue;
			s->metrics.regions_expired[EXPIRE_RESYNC]++;
			supervisor_emit(s, EVENT_REGION_EXPIRED, (uint32_t)w->pid, rg->id,
					"not re-announced within the resync grace");
			workers_region_drop(s, rg);
		}
	}
	enforce_budget(s);
	if (s->journal && journal_size(s->journal) > s->config.journal_max_size)
		(void)workers_journal_compact(s);
}

int workers_restore_record(void *userdata, const struct journal_record *rec)
{
	struct supervisor *s = userdata;
	struct sv_worker *w = registry_worker_find(&s->reg, (pid_t)rec->pid);
	struct sv_region *rg;
	int r;

	switch (rec->op) {
	case JOURNAL_WORKER:
		if (w && w->starttime != rec->starttime) {
			/* The pid was reused since: the old record is history. */
			registry_worker_remove(&s->reg, w);
			w = NULL;
		}
		if (!w) {
			w = registry_worker_add(&s->reg, (pid_t)rec->pid, rec->uid, rec->gid,
						rec->engine_id);
			if (!w)
				return -ENOMEM;
		}
		r = registry_worker_set_engine(&s->reg, w, rec->engine_id);
		if (r < 0)
			return r;
		w->starttime = rec->starttime;
		w->role = rec->role;
		w->rank = rec->rank;
		w->state = WORKER_UNCONFIRMED;
		return 0;
	case JOURNAL_REGION:
		if (!w)
			return 0;
		rg = registry_region_find(w, rec->region.id);
		if (rg)
			registry_region_update(&s->reg, rg, &rec->region, 0);
		else
			rg = registry_region_add(&s->reg, w, &rec->region, 0);
		if (!rg)
			return -ENOMEM;
		rg->checksum = rec->checksum;
		rg->checksum_version = rec->checksum_version;
		return 0;
	case JOURNAL_REGION_GONE:
		if (w && (rg = registry_region_find(w, rec->region.id)))
			registry_region_remove(&s->reg, rg);
		return 0;
	case JOURNAL_DEAD:
		if (w)
			w->state = WORKER_DEAD;
		return 0;
	case JOURNAL_WORKER_GONE:
		if (w)
			registry_worker_remove(&s->reg, w);
		return 0;
	case JOURNAL_ENGINE:
	case JOURNAL_MEM_INFO:
	case JOURNAL_MEM_INFO_GONE:
		return engines_restore_record(s, rec);
	}
	return 0;
}

void workers_restore_finish(struct supervisor *s)
{
	uint64_t now = now_ms();
	struct sv_worker *w, *next;

	for (w = s->reg.workers; w; w = next) {
		next = w->next;
		w->since_ms = now;
		if (w->state != WORKER_DEAD && process_starttime(w->pid) == w->starttime &&
		    w->starttime != 0) {
			int fd = pidfd_for(NULL, w->pid);

			if (fd >= 0) {
				w->pidfd = fd;
				w->state = WORKER_UNCONFIRMED;
				w->resync_deadline_ms = now + s->config.resync_grace * 1000;
				for (struct sv_region *rg = w->regions; rg; rg = rg->next) {
					rg->confirmed = false;
					rg->since_ms = now;
				}
				watch(s, w);
				supervisor_emit(
					s, EVENT_RESTORED, (uint32_t)w->pid, 0,
					"engine \"%s\": alive, waiting for %u regions to be "
					"re-announced",
					worker_engine(w), w->n_regions);
				continue;
			}
		}
		/* The owner is gone. Regions whose fd came back from the fd store are retained as
		 * if it had died just now; the others were held by the supervisor that died, and
		 * their memory went with it. */
		w->state = WORKER_DEAD;
		for (struct sv_region *rg = w->regions, *rn; rg; rg = rn) {
			rn = rg->next;
			rg->since_ms = now;
			if (rg->fd >= 0) {
				rg->state = REGION_RETAINED;
				continue;
			}
			s->metrics.regions_lost++;
			supervisor_emit(s, EVENT_REGION_LOST, (uint32_t)w->pid, rg->id,
					"engine \"%s\": owner gone while the supervisor was down",
					worker_engine(w));
			registry_region_remove(&s->reg, rg);
		}
		if (w->n_regions == 0) {
			registry_worker_remove(&s->reg, w);
			continue;
		}
		supervisor_emit(s, EVENT_RESTORED, (uint32_t)w->pid, 0,
				"engine \"%s\": owner gone, %u regions retained from the fd store",
				worker_engine(w), w->n_regions);
	}
	(void)workers_journal_compact(s);
}

int workers_journal_compact(struct supervisor *s)
{
	_cleanup_free_ struct journal_record *recs = NULL;
	size_t n = 0, cap = 0;
	int r;

	if (!s->journal)
		return 0;
	for (struct sv_worker *w = s->reg.workers; w; w = w->next)
		cap += 2 + w->n_regions;
	cap += engines_journal_count(s); /* the engines' groups and answers */
	recs = calloc(cap, sizeof(*recs));
	if (!recs)
		return -ENOMEM;
	for (struct sv_worker *w = s->reg.workers; w; w = w->next) {
		struct journal_record *rec = &recs[n++];

		rec->op = JOURNAL_WORKER;
		rec->pid = (uint32_t)w->pid;
		rec->uid = (uint32_t)w->uid;
		rec->gid = (uint32_t)w->gid;
		rec->starttime = w->starttime;
		snprintf(rec->engine_id, sizeof(rec->engine_id), "%s", worker_engine(w));
		rec->role = w->role;
		rec->rank = w->rank;
		for (struct sv_region *rg = w->regions; rg; rg = rg->next)
			region_record(rg, &recs[n++]);
		if (w->state == WORKER_DEAD) {
			recs[n].op = JOURNAL_DEAD;
			recs[n++].pid = (uint32_t)w->pid;
		}
	}
	n += engines_journal_records(s, recs + n, cap - n);
	r = journal_rewrite(s->journal, recs, n);
	if (r == 0)
		log_debug("Journal compacted: %zu records, %" PRIu64 " bytes.", n,
			  journal_size(s->journal));
	return r;
}
