/* SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "supervisor-registry.h"
#include "util.h"

const char *worker_engine(const struct sv_worker *w)
{
	return w->group ? w->group->engine_id : "";
}

struct sv_worker *registry_worker_find(struct sv_registry *reg, pid_t pid)
{
	for (struct sv_worker *w = reg->workers; w; w = w->next)
		if (w->pid == pid)
			return w;
	return NULL;
}

static struct sv_group *group_get(struct sv_registry *reg, const char *engine_id)
{
	struct sv_group *g;

	for (g = reg->groups; g; g = g->next)
		if (strcmp(g->engine_id, engine_id) == 0)
			break;
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g)
			return NULL;
		snprintf(g->engine_id, sizeof(g->engine_id), "%s", engine_id);
		g->next = reg->groups;
		reg->groups = g;
	}
	g->n_workers++;
	return g;
}

static void group_put(struct sv_registry *reg, struct sv_group *g)
{
	if (!g || --g->n_workers > 0)
		return;
	for (struct sv_group **p = &reg->groups; *p; p = &(*p)->next)
		if (*p == g) {
			*p = g->next;
			break;
		}
	free(g);
}

struct sv_worker *registry_worker_add(struct sv_registry *reg, pid_t pid, uid_t uid, gid_t gid,
				      const char *engine_id)
{
	struct sv_worker *w = calloc(1, sizeof(*w)), **tail;

	if (!w)
		return NULL;
	w->group = group_get(reg, engine_id ? engine_id : "");
	if (!w->group) {
		free(w);
		return NULL;
	}
	w->pid = pid;
	w->uid = uid;
	w->gid = gid;
	w->rank = -1;
	w->pidfd = -1;
	/* Appended, so listings come out in arrival order. */
	for (tail = &reg->workers; *tail; tail = &(*tail)->next)
		;
	*tail = w;
	return w;
}

int registry_worker_set_engine(struct sv_registry *reg, struct sv_worker *w, const char *engine_id)
{
	struct sv_group *g;

	if (strcmp(worker_engine(w), engine_id) == 0)
		return 0;
	g = group_get(reg, engine_id);
	if (!g)
		return -ENOMEM;
	group_put(reg, w->group);
	w->group = g;
	return 0;
}

void registry_worker_remove(struct sv_registry *reg, struct sv_worker *w)
{
	while (w->regions)
		registry_region_remove(reg, w->regions);
	for (struct sv_worker **p = &reg->workers; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			break;
		}
	group_put(reg, w->group);
	if (reg->worker_removed)
		reg->worker_removed(w);
	(void)safe_close(w->pidfd);
	free(w->shadow_regions);
	free(w);
}

struct sv_region *registry_region_find(struct sv_worker *w, uint64_t id)
{
	for (struct sv_region *rg = w->regions; rg; rg = rg->next)
		if (rg->id == id)
			return rg;
	return NULL;
}

static void region_fill(struct sv_region *rg, const struct proto_region *r)
{
	rg->id = r->id;
	memcpy(rg->device_uuid, r->device_uuid, PROTO_UUID_LEN);
	rg->va = r->va;
	rg->size = r->size;
	rg->cls = r->cls;
	rg->order = r->order;
	if (rg->weights_version != r->weights_version)
		rg->checksum_version = 0; /* new contents: the old checksum says nothing */
	rg->weights_version = r->weights_version;
}

struct sv_region *registry_region_add(struct sv_registry *reg, struct sv_worker *w,
				      const struct proto_region *r, uint64_t now_ms)
{
	struct sv_region *rg = calloc(1, sizeof(*rg)), **tail;

	if (!rg)
		return NULL;
	rg->owner = w;
	rg->fd = -1;
	region_fill(rg, r);
	registry_region_update(reg, rg, r, now_ms);
	for (tail = &w->regions; *tail; tail = &(*tail)->next)
		;
	*tail = rg;
	w->n_regions++;
	w->bytes += rg->size;
	return rg;
}

void registry_region_update(struct sv_registry *reg, struct sv_region *rg,
			    const struct proto_region *r, uint64_t now_ms)
{
	struct sv_worker *w = rg->owner;

	if (rg->fd >= 0)
		reg->n_fds--;
	rg->fd = safe_close(rg->fd);
	if (r->fd >= 0) {
		rg->fd = r->fd;
		reg->n_fds++;
	}
	w->bytes -= rg->size;
	region_fill(rg, r);
	w->bytes += rg->size;
	rg->confirmed = true;
	if (rg->fd < 0)
		rg->state = REGION_PENDING;
	else
		rg->state = w->state == WORKER_DEAD ? REGION_RETAINED : REGION_OWNED;
	rg->since_ms = now_ms;
}

void registry_region_remove(struct sv_registry *reg, struct sv_region *rg)
{
	struct sv_worker *w = rg->owner;

	for (struct sv_region **p = &w->regions; *p; p = &(*p)->next)
		if (*p == rg) {
			*p = rg->next;
			break;
		}
	w->n_regions--;
	w->bytes -= rg->size;
	if (rg->fd >= 0)
		reg->n_fds--;
	(void)safe_close(rg->fd);
	free(rg);
}

void registry_totals(const struct sv_registry *reg, int state, uint64_t *ret_count,
		     uint64_t *ret_bytes)
{
	uint64_t n = 0, bytes = 0;

	for (const struct sv_worker *w = reg->workers; w; w = w->next)
		for (const struct sv_region *rg = w->regions; rg; rg = rg->next)
			if (state < 0 || rg->state == (enum region_state)state) {
				n++;
				bytes += rg->size;
			}
	if (ret_count)
		*ret_count = n;
	if (ret_bytes)
		*ret_bytes = bytes;
}

void registry_finish(struct sv_registry *reg)
{
	while (reg->workers)
		registry_worker_remove(reg, reg->workers);
}

void region_to_info(const struct sv_region *rg, uint64_t now_ms, struct proto_msg *ret)
{
	struct proto_region_info *i = &ret->region_info;

	memset(ret, 0, sizeof(*ret));
	ret->type = PROTO_REGION_INFO;
	i->pid = (uint32_t)rg->owner->pid;
	snprintf(i->engine_id, sizeof(i->engine_id), "%s", worker_engine(rg->owner));
	i->id = rg->id;
	memcpy(i->device_uuid, rg->device_uuid, PROTO_UUID_LEN);
	i->va = rg->va;
	i->size = rg->size;
	i->cls = rg->cls;
	i->order = rg->order;
	i->weights_version = rg->weights_version;
	i->state = rg->state;
	i->age_ms = now_ms - MIN(now_ms, rg->since_ms);
	i->checksum = rg->checksum;
	i->checksum_version = rg->checksum_version;
}

void worker_to_info(const struct sv_worker *w, uint64_t now_ms, struct proto_msg *ret)
{
	struct proto_worker_info *i = &ret->worker_info;

	memset(ret, 0, sizeof(*ret));
	ret->type = PROTO_WORKER_INFO;
	i->pid = (uint32_t)w->pid;
	i->uid = (uint32_t)w->uid;
	snprintf(i->engine_id, sizeof(i->engine_id), "%s", worker_engine(w));
	i->role = w->role;
	i->rank = w->rank;
	i->n_devices = w->n_devices;
	memcpy(i->device_uuid, w->device_uuid, sizeof(i->device_uuid));
	i->state = w->state;
	i->n_regions = w->n_regions;
	i->bytes = w->bytes;
	i->age_ms = now_ms - MIN(now_ms, w->since_ms);
}
