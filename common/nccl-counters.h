/* SPDX-License-Identifier: MIT */
/*
 * The progress counters of one NCCL communicator, in a memfd the shim creates and writes and
 * the supervisor maps read-only (PROTO_NCCL_COMM carries it). One writer per field, plain
 * 64-bit atomics: the supervisor reads them without any lock or message, so a process that is
 * stopped, hung or dead still shows exactly where it stopped.
 *
 * Sequence numbers count operations on this communicator in the order the process issued
 * them: every rank of a communicator issues the same collectives in the same order (NCCL
 * requires it), so rank r's coll_enqueued == N means it reached the N-th collective. Point to
 * point operations differ per rank and are counted apart (p2p_*), informative only.
 */
#pragma once

#include <stdint.h>

#define NCCL_COUNTERS_MAGIC   0x4c43434e5942ull /* "BYNCCL" */
#define NCCL_COUNTERS_VERSION 1
#define NCCL_COUNTERS_SIZE    4096 /* the memfd's size, sealed */

enum nccl_comm_state {
	NCCL_COMM_LIVE = 0,
	NCCL_COMM_FINALIZED = 1,
	NCCL_COMM_ENDED = 2, /* destroyed or aborted */
};

struct nccl_counters {
	uint64_t magic;
	uint32_t version;
	uint32_t state;		 /* enum nccl_comm_state */
	uint64_t coll_enqueued;	 /* collectives issued (the call was entered) */
	uint64_t coll_completed; /* collectives whose completion event fired, in order */
	uint64_t p2p_enqueued;
	uint64_t p2p_completed;
	uint64_t enqueue_ns;  /* CLOCK_MONOTONIC of the last collective issued */
	uint64_t complete_ns; /* CLOCK_MONOTONIC of the last completion observed */
	uint32_t in_call;     /* threads inside a real NCCL operation call now */
	uint32_t last_op;     /* enum nccl_op of the last collective issued */
	uint64_t last_bytes;  /* its payload, bytes per rank */
	uint64_t untracked;   /* operations whose completion could not be tracked (no event:
			       * stream capture, event creation failed): counted complete */
};

enum nccl_op {
	NCCL_OP_NONE = 0,
	NCCL_OP_ALL_REDUCE,
	NCCL_OP_BROADCAST,
	NCCL_OP_REDUCE,
	NCCL_OP_ALL_GATHER,
	NCCL_OP_REDUCE_SCATTER,
	NCCL_OP_SEND,
	NCCL_OP_RECV,
	_NCCL_OP_MAX,
};

static inline const char *nccl_op_name(uint32_t op)
{
	static const char *const names[_NCCL_OP_MAX] = {
		"none",	      "all_reduce",	"broadcast", "reduce",
		"all_gather", "reduce_scatter", "send",	     "recv",
	};

	return op < _NCCL_OP_MAX ? names[op] : "unknown";
}
