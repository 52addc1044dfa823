/* SPDX-License-Identifier: MIT */
/*
 * PROTO_IMAGE_REQUEST (issue 20): belayerctl image list|import|rm|gc. Every operation runs on
 * the environment lane of the offload threads: an import of a several-GiB image takes minutes
 * and even a list takes the store's lock, which an import holds. The store's lock, not the
 * loop, orders them against environment creations (which import on the same lane).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "supervisor-client.h"
#include "supervisor-env-ctl.h"
#include "supervisor-metrics.h"
#include "supervisor-offload.h"
#include "sv-image.h"
#include "supervisor.h"

struct image_job {
	struct sv_job job;
	uint64_t client;
	struct proto_image_request q;
	char state_dir[PATH_MAX];
	int r;
	char why[IMAGE_ERROR_MAX];
	struct image_info *infos;
	size_t n;
	struct image_import_stats stats;
	uint64_t removed;
};

static void job_run(struct supervisor *s, struct sv_job *jb)
{
	struct image_job *j = (struct image_job *)jb;
	struct image_store *st;
	struct image_ref ref;
	char envs[PATH_MAX + 8];

	(void)s;
	snprintf(envs, sizeof(envs), "%s/envs", j->state_dir);
	j->r = image_store_open(j->state_dir, envs, &st);
	if (j->r < 0) {
		snprintf(j->why, sizeof(j->why), "cannot open the image store");
		return;
	}
	switch (j->q.op) {
	case IMAGE_OP_LIST:
		j->r = image_store_list(st, &j->infos, &j->n);
		break;
	case IMAGE_OP_IMPORT:
		j->r = image_ref_parse(j->q.ref, &ref);
		if (j->r < 0) {
			snprintf(j->why, sizeof(j->why),
				 "not oci:DIR[:TAG] or docker-archive:FILE[:REF]");
			break;
		}
		j->infos = calloc(1, sizeof(*j->infos));
		if (!j->infos) {
			j->r = -ENOMEM;
			break;
		}
		j->r = image_store_import(st, &ref, j->q.name, j->infos, &j->stats, j->why,
					  sizeof(j->why));
		j->n = j->r >= 0;
		break;
	case IMAGE_OP_RM:
		j->r = image_store_remove(st, j->q.ref, j->why, sizeof(j->why));
		break;
	case IMAGE_OP_GC:
		j->r = image_store_gc(st, &j->removed);
		break;
	default:
		j->r = -EOPNOTSUPP;
	}
	image_store_close(st);
}

static void job_done(struct supervisor *s, struct sv_job *jb)
{
	struct image_job *j = (struct image_job *)jb;
	struct sv_client *c = j->client ? client_by_serial(s, j->client) : NULL;
	const char *op = image_op_to_string(j->q.op);
	struct proto_msg m = {.type = PROTO_END};

	if (j->r < 0) {
		log_warning_errno(j->r, "Image %s %s failed: %m%s%s", op, j->q.ref,
				  j->why[0] ? ": " : "", j->why);
		if (c)
			(void)client_send_error(s, c, -j->r, PROTO_IMAGE_REQUEST,
						"image %s failed: %s%s%s", op, strerror(-j->r),
						j->why[0] ? ": " : "", j->why);
		return;
	}
	if (j->q.op == IMAGE_OP_IMPORT)
		log_info("Image %s imported as %s: %" PRIu64 " layers unpacked, %" PRIu64
			 " in the store already, %" PRIu64 " ms.",
			 j->q.ref, j->infos[0].id, j->stats.layers_unpacked, j->stats.layers_cached,
			 j->stats.usec / 1000);
	else if (j->q.op != IMAGE_OP_LIST)
		log_info("Image %s %s done.", op, j->q.ref);
	if (!c)
		return;
	for (size_t i = 0; i < j->n; i++) {
		struct proto_msg info = {.type = PROTO_IMAGE_INFO};

		snprintf(info.image_info.id, sizeof(info.image_info.id), "%s", j->infos[i].id);
		snprintf(info.image_info.name, sizeof(info.image_info.name), "%s",
			 j->infos[i].name);
		info.image_info.n_layers = (uint32_t)j->infos[i].n_layers;
		if (j->q.op == IMAGE_OP_IMPORT) {
			info.image_info.unpacked = j->stats.layers_unpacked;
			info.image_info.cached = j->stats.layers_cached;
			info.image_info.entries = j->stats.entries;
			info.image_info.bytes = j->stats.bytes;
			info.image_info.us = j->stats.usec;
		}
		if (client_send(s, c, &info) < 0)
			return;
	}
	m.end.in_reply_to = PROTO_IMAGE_REQUEST;
	m.end.count =
		j->q.op == IMAGE_OP_GC ? (uint32_t)MIN(j->removed, UINT32_MAX) : (uint32_t)j->n;
	(void)client_send(s, c, &m);
}

static void job_free(struct sv_job *jb)
{
	struct image_job *j = (struct image_job *)jb;

	free(j->infos);
	free(j);
}

int images_dispatch(struct supervisor *s, struct sv_client *c, const struct proto_image_request *q)
{
	struct image_job *j;

	if (q->op != IMAGE_OP_LIST && c->cred.uid != 0 && c->cred.uid != s->uid)
		return client_refuse(s, c, REJECT_UNAUTHORIZED, EPERM, PROTO_IMAGE_REQUEST,
				     "image %s needs root", image_op_to_string(q->op));
	if ((q->op == IMAGE_OP_IMPORT || q->op == IMAGE_OP_RM) && !q->ref[0])
		return client_send_error(s, c, EINVAL, PROTO_IMAGE_REQUEST,
					 "image %s: which image?", image_op_to_string(q->op));
	j = calloc(1, sizeof(*j));
	if (!j)
		return client_send_error(s, c, ENOMEM, PROTO_IMAGE_REQUEST, "out of memory");
	j->job.lane = OFFLOAD_ENV;
	j->job.run = job_run;
	j->job.done = job_done;
	j->job.free = job_free;
	j->client = c->serial;
	j->q = *q;
	snprintf(j->state_dir, sizeof(j->state_dir), "%s", s->config.state_dir);
	offload_submit(s, &j->job);
	return 0;
}
