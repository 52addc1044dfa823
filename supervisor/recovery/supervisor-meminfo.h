/* SPDX-License-Identifier: MIT */
/*
 * A primary's cuMemGetInfo answers (PROTO_MEM_INFO), kept per engine and handed to its next
 * shadows in BELAYER_SHADOW_MEM_INFO, so that a shadow that sizes its KV cache from free
 * memory (vLLM's determine_available_memory, SGLang's profile_max_num_token) computes its
 * primary's size (review finding 6; the shim's side: shim/shim-meminfo.c). Keyed by the
 * rank and the device UUID (CUDA_VISIBLE_DEVICES renumbers ordinals per process: under Ray
 * every rank's device is its 0), and journaled (JOURNAL_MEM_INFO), so that a shadow launched
 * by a restarted supervisor still gets them.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"

struct supervisor;
struct sv_client;
struct sv_engine;
struct journal_record;

/* The most answers an engine keeps: PROTO_MAX_MEM_INFO calls of 8 ranks (or devices). */
#define ENG_MEM_INFO_MAX (PROTO_MAX_MEM_INFO * 8)

struct eng_mem_answer {
	pid_t pid; /* the primary rank that got it (0: replayed from the journal) */
	int32_t rank;
	uint8_t device_uuid[PROTO_UUID_LEN];
	uint32_t seq;
	uint64_t free, total;
};

struct eng_mem_info {
	struct eng_mem_answer a[ENG_MEM_INFO_MAX];
	uint32_t n;
};

int meminfo_on_message(struct supervisor *s, struct sv_client *c, const struct proto_mem_info *m);
/* Forgets e's answers (a new primary group answers anew), and journals that. */
void meminfo_forget(struct supervisor *s, struct sv_engine *e);
/* The rank of primary pid changed (its TP communicator says which it is): its answers move. */
void meminfo_rank_changed(struct supervisor *s, pid_t pid, int32_t rank);
/* The environment value for e's shadow, "RANK:GPU-UUID:FREE:TOTAL,…" (each rank's leading
 * calls on a device that are all known, in order), into buf: its length, 0 when nothing is
 * known (or it does not fit). */
size_t meminfo_env(const struct sv_engine *e, char *buf, size_t cap);
/* Journal replay (JOURNAL_MEM_INFO, JOURNAL_MEM_INFO_GONE) and compaction. */
void meminfo_restore_record(struct sv_engine *e, const struct journal_record *rec);
size_t meminfo_journal_records(const struct sv_engine *e, struct journal_record *recs, size_t max);
