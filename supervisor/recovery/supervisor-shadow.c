/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "log.h"
#include "supervisor-client.h"
#include "supervisor-events.h"
#include "supervisor-footprint.h"
#include "supervisor-shadow.h"

int shadow_on_region(struct supervisor *s, struct sv_client *c, const struct proto_shadow_region *r)
{
	struct sv_worker *w = c->worker;
	struct sv_shadow_region *sr = NULL;

	if (!w)
		return client_refuse(s, c, REJECT_NO_HELLO, EPROTO, PROTO_SHADOW_REGION,
				     "hello first");
	if (w->role != ROLE_SHADOW)
		return client_refuse(s, c, REJECT_BAD_MESSAGE, EPERM, PROTO_SHADOW_REGION,
				     "only a shadow has scratch-backed regions");
	if (!layout_class_counts(r->cls))
		return client_refuse(s, c, REJECT_BAD_MESSAGE, EINVAL, PROTO_SHADOW_REGION,
				     "region %" PRIu64 ": class %s is not part of a layout", r->id,
				     region_class_to_string(r->cls));
	for (uint32_t i = 0; i < w->n_shadow_regions; i++)
		if (w->shadow_regions[i].id == r->id)
			sr = &w->shadow_regions[i];
	if (!sr) {
		if (w->n_shadow_regions >= s->config.max_regions_per_worker)
			return client_refuse(s, c, REJECT_REGION_LIMIT, EDQUOT, PROTO_SHADOW_REGION,
					     "more than %u regions",
					     s->config.max_regions_per_worker);
		if (w->n_shadow_regions == w->cap_shadow_regions) {
			uint32_t cap = w->cap_shadow_regions ? 2 * w->cap_shadow_regions : 16;
			struct sv_shadow_region *n = realloc(w->shadow_regions, cap * sizeof(*n));

			if (!n)
				return client_send_error(s, c, ENOMEM, PROTO_SHADOW_REGION,
							 "out of memory");
			w->shadow_regions = n;
			w->cap_shadow_regions = cap;
		}
		sr = &w->shadow_regions[w->n_shadow_regions++];
	}
	*sr = (struct sv_shadow_region){
		.id = r->id, .va = r->va, .size = r->size, .order = r->order, .cls = r->cls};
	memcpy(sr->device_uuid, r->device_uuid, PROTO_UUID_LEN);
	/* A layout that changes after parking is parked again with a new hash. */
	w->parked = false;
	return 0;
}

int shadow_on_parked(struct supervisor *s, struct sv_client *c, const struct proto_shadow_parked *p)
{
	struct sv_worker *w = c->worker;
	struct sv_engine *e;

	if (!w)
		return client_refuse(s, c, REJECT_NO_HELLO, EPROTO, PROTO_SHADOW_PARKED,
				     "hello first");
	if (w->role != ROLE_SHADOW)
		return client_refuse(s, c, REJECT_BAD_MESSAGE, EPERM, PROTO_SHADOW_PARKED,
				     "only a shadow parks");
	w->parked = true;
	w->layout_n = p->n_entries;
	w->layout_hash = p->hash;
	footprint_restart(w); /* what it holds parked, not what it held while starting */
	supervisor_emit(s, EVENT_SHADOW_PARKED, (uint32_t)w->pid, p->hash,
			"engine \"%s\" shadow rank %d parked: %u regions, layout %016" PRIx64,
			worker_engine(w), worker_rank(w), p->n_entries, p->hash);
	e = engines_find(s, worker_engine(w));
	if (e)
		shadow_sync(s, e);
	return 0;
}

static int cmp_region(const void *a, const void *b)
{
	const struct sv_region *x = *(const struct sv_region *const *)a,
			       *y = *(const struct sv_region *const *)b;

	return x->order < y->order ? -1 : x->order > y->order;
}

static int cmp_shadow(const void *a, const void *b)
{
	const struct sv_shadow_region *x = *(const struct sv_shadow_region *const *)a,
				      *y = *(const struct sv_shadow_region *const *)b;

	return x->order < y->order ? -1 : x->order > y->order;
}

/* p's weights + kv regions by creation order into ret (malloc'ed). */
static size_t primary_regions(const struct sv_worker *p, struct sv_region ***ret)
{
	struct sv_region **v;
	size_t n = 0;

	*ret = NULL;
	v = calloc(p->n_regions ? p->n_regions : 1, sizeof(*v));
	if (!v)
		return 0;
	for (struct sv_region *rg = p->regions; rg; rg = rg->next)
		if (layout_class_counts(rg->cls))
			v[n++] = rg;
	qsort(v, n, sizeof(*v), cmp_region);
	*ret = v;
	return n;
}

static size_t shadow_regions(const struct sv_worker *sh, struct sv_shadow_region ***ret)
{
	struct sv_shadow_region **v =
		calloc(sh->n_shadow_regions ? sh->n_shadow_regions : 1, sizeof(*v));

	*ret = v;
	if (!v)
		return 0;
	for (uint32_t i = 0; i < sh->n_shadow_regions; i++)
		v[i] = &sh->shadow_regions[i];
	qsort(v, sh->n_shadow_regions, sizeof(*v), cmp_shadow);
	return sh->n_shadow_regions;
}

uint64_t shadow_primary_layout(const struct sv_worker *w, uint32_t *ret_n)
{
	uint64_t h = LAYOUT_HASH_INIT;
	struct sv_region **v;
	size_t n = primary_regions(w, &v);

	for (size_t i = 0; i < n; i++)
		h = layout_hash_update(h, v[i]->cls, v[i]->size);
	free(v);
	if (ret_n)
		*ret_n = (uint32_t)n;
	return h;
}

int shadow_layout_check(const struct sv_worker *p, const struct sv_worker *sh, char *msg,
			size_t cap)
{
	uint64_t h, hs = LAYOUT_HASH_INIT;
	struct sv_shadow_region **v;
	uint32_t n;
	size_t ns;

	if (!sh->parked) {
		snprintf(msg, cap, "shadow rank %d (pid %d) is not parked", worker_rank(sh),
			 sh->pid);
		return -EAGAIN;
	}
	h = shadow_primary_layout(p, &n);
	if (n == 0) {
		snprintf(msg, cap, "primary rank %d (pid %d) announced no weights/kv regions",
			 worker_rank(p), p->pid);
		return -ENODATA;
	}
	/* What the shadow said it parked with must be what it described region by region. */
	ns = shadow_regions(sh, &v);
	for (size_t i = 0; i < ns; i++)
		hs = layout_hash_update(hs, v[i]->cls, v[i]->size);
	free(v);
	if (ns != sh->layout_n || hs != sh->layout_hash) {
		snprintf(msg, cap,
			 "shadow rank %d: parked layout (%u, %016" PRIx64
			 ") disagrees with its regions (%zu, %016" PRIx64 ")",
			 worker_rank(sh), sh->layout_n, sh->layout_hash, ns, hs);
		return -EBADE;
	}
	if (n != sh->layout_n || h != sh->layout_hash) {
		snprintf(msg, cap,
			 "rank %d layouts differ: primary %u regions %016" PRIx64
			 ", shadow %u regions %016" PRIx64,
			 worker_rank(p), n, h, sh->layout_n, sh->layout_hash);
		return -EBADE;
	}
	snprintf(msg, cap, "rank %d: %u regions, layout %016" PRIx64, worker_rank(p), n, h);
	return 0;
}

int shadow_send_maps(struct supervisor *s, struct sv_worker *p, struct sv_worker *sh, bool force)
{
	struct sv_shadow_region **sv = NULL;
	struct sv_region **pv = NULL;
	size_t np, ns;
	int sent = 0, r = 0;

	if (!sh->client)
		return -ENOTCONN;
	np = primary_regions(p, &pv);
	ns = shadow_regions(sh, &sv);
	if (!pv || !sv || np != ns) {
		r = -EBADE;
		goto out;
	}
	for (size_t i = 0; i < np; i++) {
		struct proto_msg m = {.type = PROTO_PROMOTE_MAP};

		if (pv[i]->fd < 0 || pv[i]->size != sv[i]->size || pv[i]->cls != sv[i]->cls) {
			r = -EBADE;
			goto out;
		}
		if (!force && sv[i]->map_pid == (uint32_t)p->pid && sv[i]->map_id == pv[i]->id &&
		    sv[i]->map_wver == pv[i]->weights_version)
			continue;
		m.promote_map = (struct proto_promote_map){
			.shadow_id = sv[i]->id,
			.primary_pid = (uint32_t)p->pid,
			.primary_id = pv[i]->id,
			.size = pv[i]->size,
			.weights_version = pv[i]->weights_version,
			.fd = pv[i]->fd,
		};
		r = client_send(s, sh->client, &m);
		if (r < 0)
			goto out;
		sv[i]->map_pid = (uint32_t)p->pid;
		sv[i]->map_id = pv[i]->id;
		sv[i]->map_wver = pv[i]->weights_version;
		sent++;
	}
out:
	free(pv);
	free(sv);
	return r < 0 ? r : sent;
}

void shadow_sync(struct supervisor *s, struct sv_engine *e)
{
	struct sv_worker *p[64] = {NULL}, *sh[64] = {NULL};
	size_t tp = MIN((size_t)e->cfg->tp, ARRAY_SIZE(p));
	char msg[PROTO_MAX_STR + 1];

	/* Not during a recovery: it sends its own maps. */
	if (e->rec)
		return;
	(void)engines_workers(s, e, ROLE_PRIMARY, p, tp);
	(void)engines_workers(s, e, ROLE_SHADOW, sh, tp);
	for (size_t r = 0; r < tp; r++) {
		int n;

		if (!p[r] || !sh[r] || !sh[r]->parked ||
		    shadow_layout_check(p[r], sh[r], msg, sizeof(msg)) < 0)
			continue;
		n = shadow_send_maps(s, p[r], sh[r], false);
		if (n > 0)
			log_debug("Engine %s rank %zu: %d early maps to shadow pid %d.",
				  e->cfg->name, r, n, sh[r]->pid);
	}
}

void shadow_primary_announced(struct supervisor *s, struct sv_worker *w)
{
	struct sv_engine *e;

	if (w->role != ROLE_PRIMARY || !(e = engines_find(s, worker_engine(w))))
		return;
	shadow_sync(s, e);
}

void shadow_worker_info(struct supervisor *s, const struct sv_worker *w, struct proto_msg *m)
{
	struct proto_worker_info *i = &m->worker_info;
	struct sv_engine *e = engines_find(s, worker_engine(w));

	if (w->role == ROLE_SHADOW) {
		i->layout_hash = w->layout_hash;
		i->layout_n = w->layout_n;
		i->parked = w->parked;
	} else if (w->n_regions) {
		i->layout_hash = shadow_primary_layout(w, &i->layout_n);
	}
	if (!e || w->state == WORKER_DEAD)
		return;
	if (w->role == ROLE_PRIMARY) {
		i->port = e->primary_port;
		i->ready = e->primary_ready;
		i->canary_version = e->canary.recorded ? e->canary.version + 1 : 0;
	} else if (e->shadow.pid > 0 && w->pgid == e->shadow.pid) {
		i->port = e->shadow.port;
	}
}

bool shadow_release(struct sv_worker *w, uint64_t id)
{
	for (uint32_t i = 0; i < w->n_shadow_regions; i++)
		if (w->shadow_regions[i].id == id) {
			w->shadow_regions[i] = w->shadow_regions[--w->n_shadow_regions];
			w->parked = false; /* it parks again with its new layout */
			return true;
		}
	return false;
}

void shadow_forget_maps(struct sv_worker *w)
{
	for (uint32_t i = 0; i < w->n_shadow_regions; i++) {
		w->shadow_regions[i].map_pid = 0;
		w->shadow_regions[i].map_id = 0;
		w->shadow_regions[i].map_wver = 0;
	}
}
