/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "supervisor-checks.h"
#include "supervisor-client.h"
#include "supervisor-events.h"
#include "supervisor-health.h"
#include "supervisor-offload.h"
#include "supervisor-workers.h"

#define MAX_RESULTS 128

struct content_item {
	pid_t pid;
	uint64_t id, size, wver;
	uint8_t dev[PROTO_UUID_LEN];
	int fd;	       /* a dup: the region may be released while we read */
	uint64_t want; /* recorded checksum, when have_want */
	bool have_want;
	uint64_t sum;
	int error;
};

struct check_job {
	struct sv_job job;
	uint64_t client; /* serial of the client to reply to; 0: none */
	bool periodic;
	bool gpu;
	int dev;
	size_t n_items;
	struct content_item *items;
	size_t n_results;
	struct health_result results[MAX_RESULTS];
};

static void job_free(struct sv_job *j)
{
	struct check_job *cj = (struct check_job *)j;

	for (size_t i = 0; i < cj->n_items; i++)
		(void)safe_close(cj->items[i].fd);
	free(cj->items);
	free(cj);
}

/* Offload thread. */
static void job_run(struct supervisor *s, struct sv_job *j)
{
	struct check_job *cj = (struct check_job *)j;

	if (cj->gpu) {
		if (!s->gpu)
			s->gpu = health_gpu_new(s->config.nvml_library, &s->config.fatal_xids);
		cj->n_results += health_gpu_check(s->gpu, cj->dev, cj->results + cj->n_results,
						  MAX_RESULTS - cj->n_results);
	}
	for (size_t i = 0; i < cj->n_items; i++) {
		struct content_item *it = &cj->items[i];

		it->error =
			health_content_checksum(s->config.content_method, s->config.cuda_library,
						it->fd, it->size, it->dev, &it->sum);
	}
}

static void add_result(struct check_job *cj, const struct health_result *r)
{
	if (cj->n_results < MAX_RESULTS)
		cj->results[cj->n_results++] = *r;
}

/* Loop thread: apply checksums, count verdicts, reply. */
static void job_done(struct supervisor *s, struct sv_job *j)
{
	struct check_job *cj = (struct check_job *)j;
	struct sv_client *c = cj->client ? client_by_serial(s, cj->client) : NULL;
	struct proto_msg end = {.type = PROTO_END};

	for (size_t i = 0; i < cj->n_items; i++) {
		struct content_item *it = &cj->items[i];
		struct health_result r = {
			.check = HEALTH_CONTENT, .dev = -1, .pid = (uint32_t)it->pid};
		struct sv_worker *w = registry_worker_find(&s->reg, it->pid);
		struct sv_region *rg = w ? registry_region_find(w, it->id) : NULL;

		if (it->error < 0) {
			r.verdict = VERDICT_UNKNOWN;
			snprintf(r.message, sizeof(r.message), "region %" PRIu64 ": unreadable: %s",
				 it->id, strerror(-it->error));
		} else if (it->have_want) {
			r.verdict = it->sum == it->want ? VERDICT_OK : VERDICT_FAILED;
			snprintf(r.message, sizeof(r.message),
				 "region %" PRIu64 " weights version %" PRIu64
				 ": checksum %08" PRIx64 " %s recorded %08" PRIx64,
				 it->id, it->wver, it->sum,
				 it->sum == it->want ? "matches" : "differs from", it->want);
		} else {
			r.verdict = VERDICT_OK;
			snprintf(r.message, sizeof(r.message),
				 "region %" PRIu64 " weights version %" PRIu64
				 ": checksum %08" PRIx64 " recorded",
				 it->id, it->wver, it->sum);
			if (rg && rg->weights_version == it->wver && rg->checksum_version == 0) {
				rg->checksum = it->sum;
				rg->checksum_version = it->wver + 1;
				workers_journal_region(s, rg);
			}
		}
		add_result(cj, &r);
	}

	for (size_t i = 0; i < cj->n_results; i++) {
		const struct health_result *r = &cj->results[i];

		s->metrics.verdicts[r->check][r->verdict]++;
		if (r->check == HEALTH_GPU && cj->periodic) {
			bool changed = s->gpu_verdict != r->verdict ||
				       strcmp(s->gpu_message, r->message) != 0;

			if (changed && (i == 0 || r->verdict != VERDICT_OK)) {
				s->gpu_verdict = r->verdict;
				snprintf(s->gpu_message, sizeof(s->gpu_message), "%s", r->message);
				supervisor_emit(s, EVENT_HEALTH, 0, (uint64_t)(int64_t)r->dev,
						"gpu %d: %s: %s", r->dev,
						health_verdict_to_string(r->verdict), r->message);
			}
		} else if (r->verdict == VERDICT_FAILED) {
			supervisor_emit(s, EVENT_HEALTH, r->pid, 0, "%s check failed: %s",
					health_check_to_string(r->check), r->message);
		}
		if (c) {
			struct proto_msg m = {.type = PROTO_HEALTH_INFO};

			m.health.check = r->check;
			m.health.verdict = r->verdict;
			m.health.dev = r->dev;
			m.health.pid = r->pid;
			snprintf(m.health.message, sizeof(m.health.message), "%s", r->message);
			(void)client_send(s, c, &m);
		}
	}
	if (c) {
		end.end.in_reply_to = PROTO_CTL;
		end.end.count = (uint32_t)cj->n_results;
		(void)client_send(s, c, &end);
	}
}

static struct check_job *job_new(void)
{
	struct check_job *cj = calloc(1, sizeof(*cj));

	if (!cj)
		return NULL;
	cj->job.run = job_run;
	cj->job.done = job_done;
	cj->job.free = job_free;
	cj->dev = -1;
	return cj;
}

static int add_content_items(struct check_job *cj, struct sv_worker *w, bool record_only)
{
	size_t n = 0;

	for (struct sv_region *rg = w->regions; rg; rg = rg->next)
		n += rg->cls == REGION_WEIGHTS && rg->fd >= 0;
	if (n == 0)
		return 0;
	cj->items = calloc(n, sizeof(*cj->items));
	if (!cj->items)
		return -ENOMEM;
	for (struct sv_region *rg = w->regions; rg; rg = rg->next) {
		struct content_item *it;
		bool have = rg->checksum_version == rg->weights_version + 1;

		if (rg->cls != REGION_WEIGHTS || rg->fd < 0 || (record_only && have))
			continue;
		it = &cj->items[cj->n_items];
		it->fd = fcntl(rg->fd, F_DUPFD_CLOEXEC, 3);
		if (it->fd < 0)
			continue;
		it->pid = w->pid;
		it->id = rg->id;
		it->size = rg->size;
		it->wver = rg->weights_version;
		memcpy(it->dev, rg->device_uuid, PROTO_UUID_LEN);
		it->have_want = have;
		it->want = rg->checksum;
		cj->n_items++;
	}
	return 0;
}

void checks_gpu_periodic(struct supervisor *s)
{
	struct check_job *cj = job_new();

	if (!cj)
		return;
	cj->gpu = true;
	cj->periodic = true;
	offload_submit(s, &cj->job);
}

int checks_request(struct supervisor *s, struct sv_client *c, pid_t pid, int dev)
{
	struct check_job *cj = job_new();
	struct sv_worker *w = NULL;

	if (!cj)
		return -ENOMEM;
	if (pid > 0) {
		/* The retained (dead) worker of that pid first: that is what recovery asks about. */
		for (struct sv_worker *it = s->reg.workers; it; it = it->next)
			if (it->pid == pid && (!w || it->state == WORKER_DEAD))
				w = it;
		if (!w) {
			job_free(&cj->job);
			return -ESRCH;
		}
		(void)health_owner_check(s, w, &cj->results[cj->n_results++]);
		if (add_content_items(cj, w, false) < 0) {
			job_free(&cj->job);
			return -ENOMEM;
		}
	}
	cj->gpu = true;
	cj->dev = dev;
	cj->client = c->serial;
	offload_submit(s, &cj->job);
	return 0;
}

void checks_record_content(struct supervisor *s, struct sv_worker *w)
{
	struct check_job *cj = job_new();

	if (!cj)
		return;
	if (add_content_items(cj, w, true) < 0 || cj->n_items == 0) {
		job_free(&cj->job);
		return;
	}
	offload_submit(s, &cj->job);
}
