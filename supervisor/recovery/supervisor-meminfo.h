/* SPDX-License-Identifier: MIT */
/*
 * A primary's cuMemGetInfo answers (PROTO_MEM_INFO), kept per engine and handed to its next
 * shadows in BELAYER_SHADOW_MEM_INFO, so that a shadow that sizes its KV cache from free
 * memory (vLLM's determine_available_memory, SGLang's profile_max_num_token) computes its
 * primary's size (review finding 6; the shim's side: shim/shim-meminfo.c).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "proto.h"

struct supervisor;
struct sv_client;
struct sv_engine;

/* Per device ordinal, in call order; n[dev]: how many leading calls are known. */
struct eng_mem_info {
	struct proto_mem_info a[PROTO_MAX_DEVICES][PROTO_MAX_MEM_INFO];
	uint32_t n[PROTO_MAX_DEVICES];
};

int meminfo_on_message(struct supervisor *s, struct sv_client *c, const struct proto_mem_info *m);
/* Forgets e's answers (a new primary group answers anew). */
void meminfo_forget(struct sv_engine *e);
/* The environment value for e's shadow, "DEV:FREE:TOTAL,…", into buf: its length, 0 when
 * nothing is known (or it does not fit). */
size_t meminfo_env(const struct sv_engine *e, char *buf, size_t cap);
