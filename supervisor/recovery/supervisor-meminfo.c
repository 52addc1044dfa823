/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gpu-uuid.h"
#include "log.h"
#include "supervisor-client.h"
#include "supervisor-engines.h"
#include "supervisor-journal.h"
#include "supervisor-meminfo.h"
#include "supervisor-workers.h"

static bool same_key(const struct eng_mem_answer *a, int32_t rank, const uint8_t *uuid)
{
	return a->rank == rank && memcmp(a->device_uuid, uuid, PROTO_UUID_LEN) == 0;
}

static void journal_answer(struct supervisor *s, const struct sv_engine *e,
			   const struct eng_mem_answer *a)
{
	struct journal_record rec = {.op = JOURNAL_MEM_INFO, .rank = a->rank};

	if (!s->journal)
		return;
	snprintf(rec.engine_id, sizeof(rec.engine_id), "%s", e->cfg->name);
	rec.mem_info = (struct proto_mem_info){.seq = a->seq, .free = a->free, .total = a->total};
	memcpy(rec.mem_info.device_uuid, a->device_uuid, PROTO_UUID_LEN);
	(void)journal_append(s->journal, &rec);
}

/* Keeps (or replaces) the answer of a's key and call; false when full. */
static bool store(struct eng_mem_info *mi, const struct eng_mem_answer *a, bool *ret_changed)
{
	for (uint32_t i = 0; i < mi->n; i++)
		if (same_key(&mi->a[i], a->rank, a->device_uuid) && mi->a[i].seq == a->seq) {
			*ret_changed = mi->a[i].free != a->free || mi->a[i].total != a->total;
			mi->a[i] = *a;
			return true;
		}
	if (mi->n == ENG_MEM_INFO_MAX)
		return false;
	mi->a[mi->n++] = *a;
	*ret_changed = true;
	return true;
}

/* Only a primary's answers count: a shadow's are its primary's already (the shim replays
 * them). Keyed by the worker's rank (as the supervisor knows it: hello, then its TP
 * communicator) and the device UUID, which CUDA_VISIBLE_DEVICES cannot renumber. */
int meminfo_on_message(struct supervisor *s, struct sv_client *c, const struct proto_mem_info *m)
{
	struct sv_worker *w = c->worker;
	struct eng_mem_answer a;
	struct sv_engine *e;
	bool changed;

	if (!w)
		return client_refuse(s, c, REJECT_NO_HELLO, EPROTO, PROTO_MEM_INFO, "hello first");
	if (w->role != ROLE_PRIMARY)
		return 0;
	e = engines_find(s, worker_engine(w));
	if (!e)
		return 0; /* not a configured engine: no shadow to give them to */
	a = (struct eng_mem_answer){.pid = w->pid,
				    .rank = worker_rank(w),
				    .seq = m->seq,
				    .free = m->free,
				    .total = m->total};
	memcpy(a.device_uuid, m->device_uuid, PROTO_UUID_LEN);
	if (!store(&e->mem_info, &a, &changed)) {
		log_debug("Engine %s: cuMemGetInfo answers past %d, ignoring.", e->cfg->name,
			  ENG_MEM_INFO_MAX);
		return 0;
	}
	/* a re-announce after a reconnect is journaled already */
	if (changed)
		journal_answer(s, e, &a);
	return 0;
}

void meminfo_forget(struct supervisor *s, struct sv_engine *e)
{
	struct journal_record rec = {.op = JOURNAL_MEM_INFO_GONE};

	if (e->mem_info.n == 0)
		return;
	memset(&e->mem_info, 0, sizeof(e->mem_info));
	if (!s->journal)
		return;
	snprintf(rec.engine_id, sizeof(rec.engine_id), "%s", e->cfg->name);
	(void)journal_append(s->journal, &rec);
}

/* Rare (once per worker whose hello had another rank): the engine's answers are journaled
 * anew, so that a replay does not keep them under the old rank too. */
void meminfo_rank_changed(struct supervisor *s, pid_t pid, int32_t rank)
{
	struct journal_record rec = {.op = JOURNAL_MEM_INFO_GONE};

	for (size_t i = 0; s->engines && i < s->engines->n; i++) {
		struct sv_engine *e = &s->engines->e[i];
		bool moved = false;

		for (uint32_t k = 0; k < e->mem_info.n; k++) {
			struct eng_mem_answer *a = &e->mem_info.a[k];

			if (a->pid == pid && a->rank != rank) {
				a->rank = rank;
				moved = true;
			}
		}
		if (!moved || !s->journal)
			continue;
		snprintf(rec.engine_id, sizeof(rec.engine_id), "%s", e->cfg->name);
		(void)journal_append(s->journal, &rec);
		for (uint32_t k = 0; k < e->mem_info.n; k++)
			journal_answer(s, e, &e->mem_info.a[k]);
	}
}

/* The answer of key (rank, uuid) and call seq, or NULL. */
static const struct eng_mem_answer *find(const struct eng_mem_info *mi, int32_t rank,
					 const uint8_t *uuid, uint32_t seq)
{
	for (uint32_t i = 0; i < mi->n; i++)
		if (same_key(&mi->a[i], rank, uuid) && mi->a[i].seq == seq)
			return &mi->a[i];
	return NULL;
}

size_t meminfo_env(const struct sv_engine *e, char *buf, size_t cap)
{
	const struct eng_mem_info *mi = &e->mem_info;
	size_t off = 0;

	if (cap)
		buf[0] = '\0';
	/* Each key once, at its call 0; then its calls in order while none is missing (a report
	 * lost with a reconnect is sent again: a gap leaves the rest unknown). */
	for (uint32_t i = 0; i < mi->n; i++) {
		const struct eng_mem_answer *k = &mi->a[i], *a;
		char uuid[GPU_UUID_STR_LEN + 1];

		if (k->seq != 0)
			continue;
		gpu_uuid_format(k->device_uuid, uuid);
		for (uint32_t seq = 0; (a = find(mi, k->rank, k->device_uuid, seq)); seq++) {
			int n = snprintf(buf + off, cap - off,
					 "%s%" PRId32 ":%s:%" PRIu64 ":%" PRIu64, off ? "," : "",
					 a->rank, uuid, a->free, a->total);

			if (n < 0 || (size_t)n >= cap - off) {
				buf[0] = '\0';
				return 0;
			}
			off += (size_t)n;
		}
	}
	return off;
}

void meminfo_restore_record(struct sv_engine *e, const struct journal_record *rec)
{
	struct eng_mem_answer a = {.rank = rec->rank,
				   .seq = rec->mem_info.seq,
				   .free = rec->mem_info.free,
				   .total = rec->mem_info.total};
	bool changed;

	if (rec->op == JOURNAL_MEM_INFO_GONE) {
		memset(&e->mem_info, 0, sizeof(e->mem_info));
		return;
	}
	if (rec->op != JOURNAL_MEM_INFO)
		return;
	memcpy(a.device_uuid, rec->mem_info.device_uuid, PROTO_UUID_LEN);
	(void)store(&e->mem_info, &a, &changed);
}

size_t meminfo_journal_records(const struct sv_engine *e, struct journal_record *recs, size_t max)
{
	size_t n = 0;

	for (uint32_t i = 0; i < e->mem_info.n && n < max; i++) {
		const struct eng_mem_answer *a = &e->mem_info.a[i];
		struct journal_record *rec = &recs[n++];

		*rec = (struct journal_record){.op = JOURNAL_MEM_INFO, .rank = a->rank};
		snprintf(rec->engine_id, sizeof(rec->engine_id), "%s", e->cfg->name);
		rec->mem_info =
			(struct proto_mem_info){.seq = a->seq, .free = a->free, .total = a->total};
		memcpy(rec->mem_info.device_uuid, a->device_uuid, PROTO_UUID_LEN);
	}
	return n;
}
