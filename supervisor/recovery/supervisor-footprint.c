/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor-engines.h"
#include "supervisor-footprint.h"
#include "supervisor-health.h"
#include "supervisor-offload.h"

#define FOOTPRINT_MAX 256 /* workers measured per round */

struct fp_item {
	pid_t pid;
	uint64_t starttime;
	uint64_t device, rss, pss, shmem;
	int error; /* of the smaps read */
};

struct fp_job {
	struct sv_job job;
	uint64_t started_ms;
	size_t n;
	int device_error;
	struct fp_item items[FOOTPRINT_MAX];
};

/* One supervisor per process: the round in flight and the next one's time. */
static bool pending;
static uint64_t next_ms;

int footprint_smaps(pid_t pid, uint64_t *ret_rss, uint64_t *ret_pss, uint64_t *ret_shmem)
{
	char path[64], line[256];
	FILE *f;
	int found = 0;

	snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", pid);
	f = fopen(path, "re");
	if (!f)
		return negative_errno();
	*ret_rss = *ret_pss = *ret_shmem = 0;
	while (fgets(line, sizeof(line), f)) {
		static const char *const keys[] = {"Rss:", "Pss:", "Pss_Shmem:"};
		uint64_t *const out[] = {ret_rss, ret_pss, ret_shmem};

		for (size_t k = 0; k < ARRAY_SIZE(keys); k++)
			if (strncmp(line, keys[k], strlen(keys[k])) == 0) {
				*out[k] = strtoull(line + strlen(keys[k]), NULL, 10) * 1024;
				found |= 1 << k;
			}
	}
	fclose(f);
	/* Pss_Shmem came with Linux 5.x; Rss and Pss are what we cannot do without. */
	return (found & 3) == 3 ? 0 : -EBADMSG;
}

/* Offload thread (the serial lane: s->gpu is its alone). */
static void fp_run(struct supervisor *s, struct sv_job *j)
{
	struct fp_job *fj = (struct fp_job *)j;
	pid_t pids[FOOTPRINT_MAX];
	uint64_t bytes[FOOTPRINT_MAX];

	for (size_t i = 0; i < fj->n; i++) {
		struct fp_item *it = &fj->items[i];

		pids[i] = it->pid;
		it->error = footprint_smaps(it->pid, &it->rss, &it->pss, &it->shmem);
	}
	if (!s->gpu)
		s->gpu = health_gpu_new(s->config.nvml_library, &s->config.fatal_xids);
	fj->device_error = health_gpu_process_memory(s->gpu, pids, fj->n, bytes);
	for (size_t i = 0; i < fj->n; i++)
		fj->items[i].device = fj->device_error < 0 ? UINT64_MAX : bytes[i];
}

/* Loop thread. */
static void fp_done(struct supervisor *s, struct sv_job *j)
{
	struct fp_job *fj = (struct fp_job *)j;
	uint64_t now = now_ms();

	pending = false;
	for (size_t i = 0; i < fj->n; i++) {
		const struct fp_item *it = &fj->items[i];
		struct sv_worker *w = registry_worker_find(&s->reg, it->pid);

		/* The same process still (a reused pid is another's memory), and not changed since
		 * this round started. */
		if (!w || w->state == WORKER_DEAD || w->starttime != it->starttime ||
		    fj->started_ms <= w->fp_after_ms)
			continue;
		w->fp_device = it->device;
		w->fp_device_known = it->device != UINT64_MAX;
		if (it->error == 0) {
			w->fp_rss = it->rss;
			w->fp_pss = it->pss;
			w->fp_shmem = it->shmem;
		}
		w->fp_ms = now;
	}
}

static void fp_free(struct sv_job *j)
{
	free(j);
}

void footprint_tick(struct supervisor *s)
{
	uint64_t now = now_ms();
	struct fp_job *fj;

	if (pending || now < next_ms || !s->engines)
		return;
	next_ms = now + FOOTPRINT_MS;
	fj = calloc(1, sizeof(*fj));
	if (!fj)
		return;
	fj->job = (struct sv_job){.run = fp_run, .done = fp_done, .free = fp_free};
	fj->started_ms = now;
	for (struct sv_worker *w = s->reg.workers; w && fj->n < FOOTPRINT_MAX; w = w->next)
		if (w->state != WORKER_DEAD && engines_find(s, worker_engine(w)))
			fj->items[fj->n++] =
				(struct fp_item){.pid = w->pid, .starttime = w->starttime};
	if (!fj->n) {
		free(fj);
		return;
	}
	/* Before: without offload threads the job is done inside offload_submit(). */
	pending = true;
	offload_submit(s, &fj->job);
}

void footprint_restart(struct sv_worker *w)
{
	w->fp_ms = 0;
	w->fp_after_ms = now_ms();
	next_ms = 0;
}

void footprint_worker_info(const struct sv_worker *w, struct proto_msg *m)
{
	struct proto_worker_info *i = &m->worker_info;

	if (w->state == WORKER_DEAD || !w->fp_ms)
		return;
	i->device_used = w->fp_device_known ? w->fp_device + 1 : 0;
	i->rss = w->fp_rss;
	i->pss = w->fp_pss;
	i->pss_shmem = w->fp_shmem;
}
