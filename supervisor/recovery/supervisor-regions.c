/* SPDX-License-Identifier: MIT */
/* Regions as workers announce, release and fetch them (PROTO_REGION_*). */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "supervisor-client.h"
#include "supervisor-events.h"
#include "supervisor-fdstore.h"
#include "supervisor-regions.h"
#include "supervisor-shadow.h"
#include "supervisor-workers.h"

static int on_announce(struct supervisor *s, struct sv_client *c, struct proto_region *r)
{
	struct sv_worker *w = c->worker;
	struct sv_region *rg;
	struct stat st;

	if (!w)
		return client_refuse(s, c, REJECT_NO_HELLO, EPROTO, PROTO_REGION_ANNOUNCE,
				     "hello first");
	/* A memory handle is a memfd, a device file or an anonymous inode; never a socket, a
	 * pipe or a directory (which would let a peer park arbitrary objects with us). */
	if (fstat(r->fd, &st) < 0 || S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode) ||
	    S_ISDIR(st.st_mode))
		return client_refuse(s, c, REJECT_BAD_MESSAGE, EBADF, PROTO_REGION_ANNOUNCE,
				     "region %" PRIu64 ": the fd is not a memory handle", r->id);
	/* A file-backed handle must hold what it claims, or the retained bytes are a lie. */
	if (S_ISREG(st.st_mode) && (uint64_t)st.st_size < r->size)
		return client_refuse(s, c, REJECT_BAD_MESSAGE, EINVAL, PROTO_REGION_ANNOUNCE,
				     "region %" PRIu64 ": the fd holds %" PRIu64
				     " bytes, not %" PRIu64,
				     r->id, (uint64_t)st.st_size, r->size);
	rg = registry_region_find(w, r->id);
	if (!rg) {
		if (w->n_regions >= s->config.max_regions_per_worker)
			return client_refuse(s, c, REJECT_REGION_LIMIT, EDQUOT,
					     PROTO_REGION_ANNOUNCE,
					     "region %" PRIu64 ": more than %u regions", r->id,
					     s->config.max_regions_per_worker);
		if (s->reg.n_fds >= s->config.max_fds)
			return client_refuse(s, c, REJECT_FD_LIMIT, ENFILE, PROTO_REGION_ANNOUNCE,
					     "region %" PRIu64 ": the supervisor holds max_fds=%u",
					     r->id, s->config.max_fds);
		rg = registry_region_add(&s->reg, w, r, now_ms());
		if (!rg)
			return client_send_error(s, c, ENOMEM, PROTO_REGION_ANNOUNCE,
						 "out of memory");
	} else {
		registry_region_update(&s->reg, rg, r, now_ms());
	}
	r->fd = -1; /* the registry's now */
	s->metrics.regions_announced++;
	workers_journal_region(s, rg);
	fdstore_put(s, rg);
	supervisor_emit(s, EVENT_REGION_ANNOUNCE, (uint32_t)w->pid, rg->id,
			"%s %" PRIu64 " bytes at 0x%" PRIx64 ", weights version %" PRIu64,
			region_class_to_string(rg->cls), rg->size, rg->va, rg->weights_version);
	shadow_primary_announced(s, w);
	return 0;
}

static int on_release(struct supervisor *s, struct sv_client *c,
		      const struct proto_region_release *r)
{
	struct sv_region *rg;

	if (!c->worker)
		return client_refuse(s, c, REJECT_NO_HELLO, EPROTO, PROTO_REGION_RELEASE,
				     "hello first");
	rg = registry_region_find(c->worker, r->id);
	if (!rg && shadow_release(c->worker, r->id))
		return 0;
	if (!rg) {
		/* Benign: a region we refused, or one dropped in a resync. Not held against the
		 * peer's error budget. */
		s->metrics.rejected[REJECT_NOT_FOUND]++;
		return client_send_error(s, c, ENOENT, PROTO_REGION_RELEASE,
					 "region %" PRIu64 " unknown", r->id);
	}
	s->metrics.regions_released++;
	supervisor_emit(s, EVENT_REGION_RELEASE, (uint32_t)c->worker->pid, r->id, "released");
	workers_region_drop(s, rg);
	return 0;
}

/* May this peer have this region's memory? Same engine group (declared in its hello), and
 * the owner's uid or one the configuration lets share it. */
static int fetch_allowed(struct supervisor *s, struct sv_client *c, const struct sv_region *rg)
{
	const struct sv_worker *owner = rg->owner;

	if (!c->worker)
		return -EPROTO;
	if (!worker_engine(owner)[0] || strcmp(worker_engine(c->worker), worker_engine(owner)) != 0)
		return -EPERM;
	if (c->cred.uid == owner->uid || id_list_contains(&s->config.fetch_uids, c->cred.uid) ||
	    id_list_contains(&s->config.fetch_gids, c->cred.gid))
		return 0;
	return -EACCES;
}

static int on_fetch(struct supervisor *s, struct sv_client *c, const struct proto_region_fetch *f)
{
	struct proto_msg reply = {.type = PROTO_REGION_FD};
	struct sv_region *rg = NULL;
	int r;

	if (!c->worker)
		return client_refuse(s, c, REJECT_NO_HELLO, EPROTO, PROTO_REGION_FETCH,
				     "hello first: the fetcher's engine group decides");
	/* A pid can be a dead worker's and, reused, a live one's: the retained region wins. */
	for (struct sv_worker *w = s->reg.workers; w; w = w->next)
		if (w->pid == (pid_t)f->pid) {
			struct sv_region *it = registry_region_find(w, f->id);

			if (it && (!rg || it->state == REGION_RETAINED))
				rg = it;
		}
	if (!rg)
		return client_refuse(s, c, REJECT_NOT_FOUND, ENOENT, PROTO_REGION_FETCH,
				     "no region %" PRIu64 " of pid %u", f->id, f->pid);
	r = fetch_allowed(s, c, rg);
	if (r < 0) {
		supervisor_emit(
			s, EVENT_REFUSED, (uint32_t)c->cred.pid, f->id,
			"fetch of pid %u's region refused: uid %u engine \"%s\" vs owner uid "
			"%u engine \"%s\"",
			f->pid, c->cred.uid, worker_engine(c->worker), rg->owner->uid,
			worker_engine(rg->owner));
		return client_refuse(s, c, REJECT_UNAUTHORIZED, -r, PROTO_REGION_FETCH,
				     "region %" PRIu64 " of pid %u: not yours", f->id, f->pid);
	}
	if (rg->fd < 0)
		return client_send_error(s, c, EAGAIN, PROTO_REGION_FETCH,
					 "region %" PRIu64 " not re-announced yet", f->id);
	reply.region_fd.pid = (uint32_t)rg->owner->pid;
	reply.region_fd.region = (struct proto_region){
		.id = rg->id,
		.va = rg->va,
		.size = rg->size,
		.cls = rg->cls,
		.order = rg->order,
		.weights_version = rg->weights_version,
		.fd = rg->fd,
	};
	memcpy(reply.region_fd.region.device_uuid, rg->device_uuid, PROTO_UUID_LEN);
	r = client_send(s, c, &reply);
	if (r < 0)
		return r;
	s->metrics.regions_fetched++;
	supervisor_emit(s, EVENT_REGION_FETCH, rg->owner->pid, rg->id, "sent to pid %d (uid %u)",
			c->cred.pid, c->cred.uid);
	return 0;
}

int regions_on_message(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	switch (m->type) {
	case PROTO_REGION_ANNOUNCE:
		return on_announce(s, c, &m->region);
	case PROTO_REGION_RELEASE:
		return on_release(s, c, &m->release);
	case PROTO_REGION_FETCH:
		return on_fetch(s, c, &m->fetch);
	default:
		return -EOPNOTSUPP;
	}
}
