/* SPDX-License-Identifier: MIT */
/*
 * cuMemGetInfo answers (shim-meminfo.c): what the engine was told is recorded and reported to
 * the supervisor (PROTO_MEM_INFO); a shadow answers with its primary's recorded answers, in
 * order (BELAYER_SHADOW_MEM_INFO), so it sizes its KV cache like its primary (review
 * finding 6).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

/* After a successful real cuMemGetInfo on device dev (-1: unknown): in a shadow, replaces
 * *free_bytes and *total_bytes with its primary's answer to the same call if there is one
 * (its primary: the primary rank of the shadow's rank, else the one primary rank that ran on
 * this device's UUID);
 * then records what the engine gets and queues its report. Never blocks. */
void meminfo_answer(int dev, size_t *free_bytes, size_t *total_bytes);
/* The connection thread: the message of a queued report (id from the queue). */
bool meminfo_build(uint64_t id, struct proto_msg *ret);
/* The connection thread, on a new session: every recorded answer again. */
int meminfo_announce_all(int (*send)(const struct proto_msg *m));
/* One primary answer a shadow is given: that of primary rank `rank`'s call number `seq` on
 * the device `device_uuid`. */
struct meminfo_given {
	int32_t rank;
	uint8_t device_uuid[PROTO_UUID_LEN];
	uint32_t seq;
	uint64_t free, total;
};

/* Parses a BELAYER_SHADOW_MEM_INFO value, "RANK:GPU-UUID:FREE:TOTAL[,…]" (decimal rank and
 * bytes, the UUID as nvidia-smi writes it; each rank's entries for a device in the order of
 * its calls): 0, or -EINVAL with nothing kept. Exposed for the unit test. */
int meminfo_parse(const char *s, struct meminfo_given *ret, size_t cap, size_t *ret_n);
void meminfo_reset_after_fork(void);
