/* SPDX-License-Identifier: MIT */
/*
 * The engine process: options, the rank's model, and on rank 0 the scheduler (continuous
 * batching over a paged KV arena), the control plane to the other ranks and the HTTP server.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>
#include <nccl.h>

#include "engine-model.h"

struct engine_options {
	const char *model;	 /* safetensors path (--model) */
	const char *served_name; /* --served-model-name */
	const char *host;
	uint16_t port;
	uint32_t tp, rank;
	bool dummy; /* --load-format dummy */
	uint64_t dummy_seed;
	double gpu_util;   /* --gpu-memory-utilization */
	uint64_t kv_bytes; /* --kv-cache-bytes, 0: from gpu_util */
	uint32_t max_num_seqs, block_size, max_batched_tokens;
	bool debug_endpoints;
	uint32_t debug_drop;		  /* --debug-drop-requests: token requests still to cut */
	uint32_t debug_cut;		  /* --debug-cut-replies: non-stream replies still to cut */
	bool debug_no_ids;		  /* --debug-no-token-ids: return_token_ids ignored */
	uint32_t debug_drop_reused;	  /* --debug-drop-reused: reused connections still to cut */
	uint32_t debug_listen_delay_ms;	  /* --debug-listen-delay: ready, but listening later */
	ncclUniqueId tp_id;		  /* followers: the TP group's id (--nccl-id) */
	struct model_config dummy_config; /* --load-format dummy without --model */
	bool no_rank_env;		  /* --no-rank-env: ranks get no RANK/LOCAL_RANK */
	bool one_visible_device; /* --one-visible-device: each rank sees only its device, as 0 */
	bool custom_all_reduce;	 /* --custom-all-reduce: IPC buffers, as vLLM's */
	bool cuda_graph;	 /* --cuda-graph: decode steps from CUDA graphs */
	bool nccl_nonblocking;	 /* --nccl-nonblocking: config.blocking = 0 */
	bool index_tables; /* --index-tables: block table, slot mapping as large allocations */
	bool index_first;  /* --index-tables-first: those before the weights, as vLLM's */
	bool tags;	   /* --belayer-tags: weights and KV tagged for the shim */
	bool sleep_mode;   /* --enable-sleep-mode: weights and KV as vLLM's CuMemAllocator */
};

struct request;
/* Called after each step that gave req new tokens (and once when it finished). */
typedef void (*request_emit_fn)(struct request *req);

struct request {
	struct request *next; /* waiting queue */
	uint64_t id;
	uint32_t *tok;	/* prompt then generated tokens */
	float *logprob; /* per generated token */
	uint32_t nprompt, ntok, max_new, emitted;
	float temperature;
	uint64_t rng;
	uint32_t *blocks, nblocks;
	uint32_t computed; /* tokens whose KV is in the cache */
	int row;	   /* block-table row while running, -1 waiting */
	bool finished, cancelled;
	uint64_t weights_version; /* at the first step */
	request_emit_fn emit;
	/* Releases user when the request goes away unfinished (client gone, shutdown). */
	void (*release_user)(struct request *req);
	void *user;
};

struct engine {
	struct engine_options o;
	struct model m;
	/* rank 0 */
	struct event_base *base;
	struct evhttp *http;
	struct event *step_ev;
	struct request **running; /* by row, max_num_seqs */
	uint32_t nrunning;
	struct request *waiting, **waiting_tail;
	uint32_t *free_blocks, nfree;
	uint64_t next_id;
	float *logits;
	uint32_t *step_host; /* host copy of the step inputs */
	bool paused;
	uint64_t steps;
	/* the peer ports of the connections token requests came on (tests: keep-alive reuse) */
	uint16_t token_peers[1024];
	uint32_t n_token_peers;
	char *model_path;
	int64_t started; /* the HTTP server's start: the model card's created */
	/* the weight-update group with a trainer (update_weights_from_distributed) */
	ncclComm_t update_comm;
	CUdeviceptr staging;
	uint64_t staging_bytes;
};

/* ---- engine-sched.c (rank 0) ---- */
int sched_init(struct engine *e);
/* Frees the scheduler's state and every request it holds (at exit). */
void sched_finish(struct engine *e);
/* Validated request: queues it and schedules a step. Takes ownership of req. */
void sched_submit(struct engine *e, struct request *req);
/* Releases a request that the scheduler does not hold (never submitted). */
void request_free(struct request *req);
/* Runs one step of every running request (admitting waiting ones first): 0 or -errno. */
int sched_step(struct engine *e);
bool sched_busy(const struct engine *e);
/* Makes sure a step runs soon when there is work. */
void sched_kick(struct engine *e);

/* ---- engine-ctl.c: what rank 0 tells every rank, and what each rank does ---- */
enum ctl_op {
	CTL_STEP = 1,
	CTL_LOAD_FILE,
	CTL_GROUP_INIT,
	CTL_UPDATE_DIST,
	CTL_EXIT,
	CTL_SLEEP, /* count: the level */
	CTL_WAKE,  /* count: the pools, a bit each */
};

#define CTL_MAX_TENSORS 1024

struct ctl {
	uint32_t op;
	uint32_t ntok, nrows, nsample;
	uint32_t world, rank_offset, count;
	uint16_t idx[CTL_MAX_TENSORS];
	uint8_t nccl_id[NCCL_UNIQUE_ID_BYTES];
	char path[1024];
};

/* Rank 0: sends c (and for CTL_STEP the step inputs in e->step_host) to every rank and
 * executes it itself. Returns this rank's result. */
int ctl_run(struct engine *e, struct ctl *c);
/* Other ranks: receive and execute until CTL_EXIT. */
int ctl_follow(struct engine *e);
/* Allocates the device buffer control messages travel in. */
int ctl_init(struct engine *e);

/* ---- engine-http.c ---- */
int http_start(struct engine *e);

/* engine-sleep.c: vLLM's /sleep, /wake_up, /is_sleeping */
void http_on_sleep(struct evhttp_request *hreq, void *arg);
void http_on_wake_up(struct evhttp_request *hreq, void *arg);
void http_on_is_sleeping(struct evhttp_request *hreq, void *arg);

/* engine-car.c: --custom-all-reduce's IPC buffers, shared by the TP ranks before the KV probe. */
int car_init(struct engine *e);
