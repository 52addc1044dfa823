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
 * The answers are keyed by what CUDA_VISIBLE_DEVICES cannot renumber: the worker's rank and
 * the device's UUID. Ray gives every worker its own CUDA_VISIBLE_DEVICES, so every rank's
 * device is its ordinal 0 there; the supervisor pairs a shadow rank with the primary rank of
 * the same number (promotion), so the shadow answers with that rank's answers (on the same
 * UUID, else, for a rank on one device, that device's: it is the rank that pairs); a shim that
 * does not know its rank (no RANK in its environment), or whose rank no primary rank had,
 * takes the answers recorded on its own device's UUID when a single rank ran there.
 * Beyond what was recorded, a shadow passes the device's own answers through, with one log
 * line.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gpu-uuid.h"
#include "log.h"
#include "shim-config.h"
#include "shim-conn-queue.h"
#include "shim-device.h"
#include "shim-meminfo.h"
#include "shim-regions.h"
#include "shim-role.h"
#include "util.h"

/* The most entries a shadow takes: PROTO_MAX_MEM_INFO calls of up to 64 ranks' devices. */
#define MAX_ENV_ENTRIES (PROTO_MAX_MEM_INFO * 64)
/* "RANK:GPU-UUID:FREE:TOTAL," at its longest */
#define MAX_ENTRY_CHARS (10 + 1 + GPU_UUID_STR_LEN + 1 + 20 + 1 + 20 + 1)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* what the engine was told, per device, in call order */
static struct proto_mem_info told[PROTO_MAX_DEVICES][PROTO_MAX_MEM_INFO];
static uint32_t n_told[PROTO_MAX_DEVICES];
/* a shadow's: its primary group's answers */
static struct meminfo_given *given;
static size_t n_given;
static bool given_read, passed_logged, elsewhere_logged;

/* A decimal number at *s followed by one of ends (a NUL there: the string's end). */
static int parse_u64(const char **s, const char *ends, uint64_t *ret)
{
	unsigned long long v;
	char *e;

	if (**s < '0' || **s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(*s, &e, 10);
	if (errno || e == *s || !memchr(ends, *e, strlen(ends) + 1))
		return -EINVAL;
	*s = e;
	*ret = v;
	return 0;
}

int meminfo_parse(const char *s, struct meminfo_given *ret, size_t cap, size_t *ret_n)
{
	size_t n = 0;

	if (!s)
		return -EINVAL;
	while (*s) {
		struct meminfo_given g = {};
		uint64_t rank;
		uint32_t seq = 0;

		if (parse_u64(&s, ":", &rank) < 0 || *s != ':' || rank > INT32_MAX ||
		    strnlen(s + 1, GPU_UUID_STR_LEN + 1) < GPU_UUID_STR_LEN + 1 ||
		    gpu_uuid_parse(s + 1, g.device_uuid) < 0 || s[1 + GPU_UUID_STR_LEN] != ':')
			return -EINVAL;
		s += 1 + GPU_UUID_STR_LEN + 1;
		if (parse_u64(&s, ":", &g.free) < 0 || *s != ':')
			return -EINVAL;
		s++;
		if (parse_u64(&s, ",", &g.total) < 0)
			return -EINVAL;
		if (*s == ',' && s[1])
			s++;
		else if (*s)
			return -EINVAL; /* a trailing comma */
		g.rank = (int32_t)rank;
		for (size_t i = 0; i < n; i++)
			seq += ret[i].rank == g.rank &&
			       memcmp(ret[i].device_uuid, g.device_uuid, PROTO_UUID_LEN) == 0;
		if (g.free > g.total || n >= cap || seq >= PROTO_MAX_MEM_INFO || g.total > SIZE_MAX)
			return -EINVAL;
		g.seq = seq;
		ret[n++] = g;
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
	if (!given ||
	    strnlen(e, MAX_ENTRY_CHARS * MAX_ENV_ENTRIES + 1) > MAX_ENTRY_CHARS * MAX_ENV_ENTRIES ||
	    meminfo_parse(e, given, MAX_ENV_ENTRIES, &n) < 0) {
		log_warning("BELAYER_SHADOW_MEM_INFO is not RANK:GPU-UUID:FREE:TOTAL[,…]: this "
			    "shadow's cuMemGetInfo answers the device's own figures, ignoring.");
		free(given);
		given = NULL;
		passed_logged = true;
		return;
	}
	n_given = n;
}

/* Whose answers: rank's on this device; else rank's only device (the rank pairs, even on
 * another device); rank unknown, or none of the primary ranks' numbers (RANK may be a global
 * rank where the supervisor knows the TP rank): the one rank recorded on this device. Its
 * rank, or -1. */
static int32_t pick_rank_locked(int32_t rank, const uint8_t uuid[PROTO_UUID_LEN], bool *ret_here)
{
	const uint8_t *other = NULL;
	bool several = false, ambiguous = false;
	int32_t found = -1;

	*ret_here = true;
	for (size_t i = 0; i < n_given; i++) {
		const struct meminfo_given *g = &given[i];
		bool here = memcmp(g->device_uuid, uuid, PROTO_UUID_LEN) == 0;

		if (rank >= 0 && g->rank == rank) {
			if (here)
				return rank;
			several |= other && memcmp(other, g->device_uuid, PROTO_UUID_LEN) != 0;
			other = g->device_uuid;
		}
		if (here) {
			ambiguous |= found >= 0 && found != g->rank;
			found = g->rank;
		}
	}
	if (other) {
		*ret_here = false;
		return several ? -1 : rank;
	}
	return ambiguous ? -1 : found; /* ranks that shared the device: which one is ours? */
}

static bool substitute_locked(int dev, uint32_t seq, const uint8_t uuid[PROTO_UUID_LEN],
			      size_t *free_bytes, size_t *total_bytes)
{
	int32_t rank;
	bool here;

	if (!given_read)
		read_given_locked();
	rank = pick_rank_locked(shim_config()->rank, uuid, &here);
	for (size_t i = 0; rank >= 0 && i < n_given; i++) {
		const struct meminfo_given *g = &given[i];

		if (g->rank != rank || g->seq != seq ||
		    (here && memcmp(g->device_uuid, uuid, PROTO_UUID_LEN) != 0))
			continue;
		if (!here && !elsewhere_logged) {
			elsewhere_logged = true;
			log_warning(
				"Shadow rank %" PRId32 " is not on its primary's device: "
				"answering cuMemGetInfo with that device's figures (logged once).",
				rank);
		}
		*free_bytes = (size_t)g->free;
		*total_bytes = (size_t)g->total;
		return true;
	}
	if (!passed_logged) {
		passed_logged = true;
		log_warning("Shadow: no recorded primary answer for cuMemGetInfo #%" PRIu32
			    " on device %d (rank %" PRId32 "): answering the device's own figures "
			    "(logged once), so this shadow may size itself unlike its primary.",
			    seq, dev, shim_config()->rank);
	}
	return false;
}

void meminfo_answer(int dev, size_t *free_bytes, size_t *total_bytes)
{
	uint8_t uuid[PROTO_UUID_LEN];
	uint32_t seq;
	bool report;

	if (dev < 0 || dev >= PROTO_MAX_DEVICES)
		return;
	shim_device_uuid(dev, uuid); /* probed once per device, outside our lock */
	pthread_mutex_lock(&lock);
	seq = n_told[dev];
	if (shim_role() == ROLE_SHADOW)
		(void)substitute_locked(dev, seq, uuid, free_bytes, total_bytes);
	report = seq < PROTO_MAX_MEM_INFO;
	if (report) {
		told[dev][seq] = (struct proto_mem_info){.device = (uint32_t)dev,
							 .seq = seq,
							 .free = *free_bytes,
							 .total = *total_bytes};
		memcpy(told[dev][seq].device_uuid, uuid, PROTO_UUID_LEN);
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
