/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "supervisor-client.h"
#include "supervisor-engines.h"
#include "supervisor-meminfo.h"
#include "supervisor-workers.h"

/* Only a primary's answers count: a shadow's are its primary's already (the shim replays
 * them). Ranks are told apart by the device ordinal of the call, as vLLM's and SGLang's ranks
 * use device local_rank of one CUDA_VISIBLE_DEVICES; ranks that all see their device as 0
 * (Ray sets CUDA_VISIBLE_DEVICES per worker) share one list, the last one's answers winning. */
int meminfo_on_message(struct supervisor *s, struct sv_client *c, const struct proto_mem_info *m)
{
	struct sv_worker *w = c->worker;
	struct sv_engine *e;

	if (!w)
		return client_refuse(s, c, REJECT_NO_HELLO, EPROTO, PROTO_MEM_INFO, "hello first");
	if (w->role != ROLE_PRIMARY)
		return 0;
	e = engines_find(s, worker_engine(w));
	if (!e)
		return 0; /* not a configured engine: no shadow to give them to */
	/* the decoder bounds device and seq */
	e->mem_info.a[m->device][m->seq] = *m;
	/* a gap (a report lost with a reconnect is sent again) leaves the rest unknown */
	if (m->seq == e->mem_info.n[m->device])
		while (e->mem_info.n[m->device] < PROTO_MAX_MEM_INFO &&
		       e->mem_info.a[m->device][e->mem_info.n[m->device]].total)
			e->mem_info.n[m->device]++;
	return 0;
}

void meminfo_forget(struct sv_engine *e)
{
	memset(&e->mem_info, 0, sizeof(e->mem_info));
}

size_t meminfo_env(const struct sv_engine *e, char *buf, size_t cap)
{
	size_t off = 0;

	if (cap)
		buf[0] = '\0';
	for (uint32_t d = 0; d < PROTO_MAX_DEVICES; d++)
		for (uint32_t i = 0; i < e->mem_info.n[d]; i++) {
			const struct proto_mem_info *m = &e->mem_info.a[d][i];
			int n = snprintf(buf + off, cap - off, "%s%" PRIu32 ":%" PRIu64 ":%" PRIu64,
					 off ? "," : "", d, m->free, m->total);

			if (n < 0 || (size_t)n >= cap - off) {
				buf[0] = '\0';
				return 0;
			}
			off += (size_t)n;
		}
	return off;
}
