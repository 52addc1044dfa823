/* SPDX-License-Identifier: MIT */
/*
 * A shadow must size itself like its primary. vLLM (determine_available_memory) and SGLang
 * (profile_max_num_token) size the KV cache from cuMemGetInfo: total x utilisation minus what
 * is used. Started next to a primary that holds most of the device, a shadow sees almost no
 * free memory and computes another (tiny, or no) KV cache, so its layout never matches. So
 * the shim records every answer an engine gets (device, call number, free, total) and reports
 * it; the supervisor gives a shadow its primary's answers in BELAYER_SHADOW_MEM_INFO, and the
 * shadow's shim answers the n-th call on a device with the primary's n-th answer there. The
 * control flow and the KV size are then the primary's by construction.
 * Why the environment: the answers must be there before the engine's first call, and a hook
 * must never wait for the supervisor; the environment is read once, at the first call.
 * Beyond what was recorded, a shadow passes the device's own answers through, with one log
 * line.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "shim-conn-queue.h"
#include "shim-meminfo.h"
#include "shim-regions.h"
#include "shim-role.h"
#include "util.h"

#define MAX_ENV_ENTRIES (PROTO_MAX_MEM_INFO * PROTO_MAX_DEVICES)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* what the engine was told, per device, in call order */
static struct proto_mem_info told[PROTO_MAX_DEVICES][PROTO_MAX_MEM_INFO];
static uint32_t n_told[PROTO_MAX_DEVICES];
/* a shadow's: the primary's answers, each with its device and call number */
static struct proto_mem_info *given;
static size_t n_given;
static bool given_read, passed_logged;

int meminfo_parse(const char *s, struct proto_mem_info *ret, size_t cap, size_t *ret_n)
{
	uint32_t seq[PROTO_MAX_DEVICES] = {};
	size_t n = 0;

	if (!s)
		return -EINVAL;
	while (*s) {
		unsigned long long v[3];
		char *end;

		for (int k = 0; k < 3; k++) {
			if (*s < '0' || *s > '9')
				return -EINVAL;
			errno = 0;
			v[k] = strtoull(s, &end, 10);
			if (errno || end == s || *end != (k < 2 ? ':' : *end))
				return -EINVAL;
			s = k < 2 ? end + 1 : end;
		}
		if (*s == ',' && s[1])
			s++;
		else if (*s)
			return -EINVAL; /* another character, or a trailing comma */
		if (v[0] >= PROTO_MAX_DEVICES || v[1] > v[2] || n >= cap ||
		    seq[v[0]] >= PROTO_MAX_MEM_INFO || v[2] > SIZE_MAX)
			return -EINVAL;
		ret[n++] = (struct proto_mem_info){
			.device = (uint32_t)v[0], .seq = seq[v[0]]++, .free = v[1], .total = v[2]};
	}
	*ret_n = n;
	return 0;
}

static void read_given_locked(void)
{
	const char *e;
	size_t n = 0;

	given_read = true;
	e = secure_getenv("BELAYER_SHADOW_MEM_INFO");
	if (!e || !*e)
		return;
	given = calloc(MAX_ENV_ENTRIES, sizeof(*given));
	if (!given || strlen(e) > 64 * MAX_ENV_ENTRIES ||
	    meminfo_parse(e, given, MAX_ENV_ENTRIES, &n) < 0) {
		log_warning("BELAYER_SHADOW_MEM_INFO is not DEV:FREE:TOTAL[,…]: this shadow's "
			    "cuMemGetInfo answers the device's own figures, ignoring.");
		free(given);
		given = NULL;
		passed_logged = true;
		return;
	}
	n_given = n;
}

static bool substitute_locked(int dev, uint32_t seq, size_t *free_bytes, size_t *total_bytes)
{
	if (!given_read)
		read_given_locked();
	for (size_t i = 0; i < n_given; i++)
		if ((int)given[i].device == dev && given[i].seq == seq) {
			*free_bytes = (size_t)given[i].free;
			*total_bytes = (size_t)given[i].total;
			return true;
		}
	if (!passed_logged) {
		passed_logged = true;
		log_warning("Shadow: no recorded primary answer for cuMemGetInfo #%" PRIu32
			    " on device %d: answering the device's own figures (logged once), "
			    "so this shadow may size itself unlike its primary.",
			    seq, dev);
	}
	return false;
}

void meminfo_answer(int dev, size_t *free_bytes, size_t *total_bytes)
{
	uint32_t seq;
	bool report;

	if (dev < 0 || dev >= PROTO_MAX_DEVICES)
		return;
	pthread_mutex_lock(&lock);
	seq = n_told[dev];
	if (shim_role() == ROLE_SHADOW)
		(void)substitute_locked(dev, seq, free_bytes, total_bytes);
	report = seq < PROTO_MAX_MEM_INFO;
	if (report) {
		told[dev][seq] = (struct proto_mem_info){.device = (uint32_t)dev,
							 .seq = seq,
							 .free = *free_bytes,
							 .total = *total_bytes};
		n_told[dev]++;
	}
	pthread_mutex_unlock(&lock);
	if (!report)
		return;
	regions_lock();
	if (conn_active_locked())
		conn_enqueue_locked(CONN_MEM_INFO, (uint64_t)dev << 32 | seq);
	regions_unlock();
}

bool meminfo_build(uint64_t id, struct proto_msg *ret)
{
	uint32_t dev = (uint32_t)(id >> 32), seq = (uint32_t)id;
	bool ok;

	if (dev >= PROTO_MAX_DEVICES || seq >= PROTO_MAX_MEM_INFO)
		return false;
	pthread_mutex_lock(&lock);
	ok = seq < n_told[dev];
	if (ok) {
		*ret = (struct proto_msg){.type = PROTO_MEM_INFO};
		ret->mem_info = told[dev][seq];
	}
	pthread_mutex_unlock(&lock);
	return ok;
}

int meminfo_announce_all(int (*send)(const struct proto_msg *m))
{
	for (uint32_t dev = 0; dev < PROTO_MAX_DEVICES; dev++)
		for (uint32_t seq = 0; seq < PROTO_MAX_MEM_INFO; seq++) {
			struct proto_msg m;
			int r;

			if (!meminfo_build((uint64_t)dev << 32 | seq, &m))
				break;
			r = send(&m);
			if (r < 0)
				return r;
		}
	return 0;
}

void meminfo_reset_after_fork(void)
{
	/* a new process: its engine's calls count from the start (the shadow's answers stay) */
	pthread_mutex_init(&lock, NULL);
	memset(n_told, 0, sizeof(n_told));
}
