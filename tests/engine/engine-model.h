/* SPDX-License-Identifier: MIT */
/*
 * The model: a small decoder-only transformer (token + position embeddings, per layer: RMS
 * norm, multi-head attention over the paged KV cache of the whole prefix, RMS norm, ReLU MLP,
 * plus a per-layer embedding table looked up by (token, previous token) like Gemma 3n's
 * per-layer embeddings), final norm, logits over the vocabulary. The per-layer embedding
 * tables are what makes a weights file reach a requested size (256 MiB .. GiBs) while the
 * compute per token stays small: each byte of them is a row some input selects.
 *
 * Tensor parallelism as Megatron/vLLM shard it: q/k/v and up projections split by output
 * rows (heads / intermediate units), o and down projections split by input rows (stored
 * transposed, [in][out], so every shard is one contiguous range of the file), per-layer
 * embedding rows split across ranks; partial sums combined with an NCCL all-reduce.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <nccl.h>

struct model_config {
	uint32_t vocab, hidden, layers, heads, ffn, max_pos, ple_rows;
};

enum tensor_split {
	SPLIT_NONE, /* replicated on every rank */
	SPLIT_ROWS, /* rank r holds rows [r * rows / tp, (r + 1) * rows / tp) */
};

struct tensor_desc {
	char name[64];
	uint64_t rows, cols;
	enum tensor_split split;
	float scale, offset; /* initial values: uniform(-scale, scale) + offset */
};

/* The tensors of a model with config c, in file and load order: 0 or -errno. */
int model_layout(const struct model_config *c, struct tensor_desc **ret, size_t *ret_n);
/* Checks a config for sanity and for tensor parallelism degree tp. */
int model_config_check(const struct model_config *c, uint32_t tp);
/* Per-layer-embedding rows so that the whole file is about size bytes (at least 8). */
uint32_t model_ple_rows_for_size(const struct model_config *c, uint64_t size);
/* Bytes of the tensors' data. */
uint64_t model_bytes(const struct model_config *c);

/* Metadata keys ("__metadata__" of the safetensors file) holding the config. */
int model_config_from_metadata(const char *(*get)(void *ud, const char *key), void *ud,
			       struct model_config *ret);

struct weight {
	struct tensor_desc d;
	uint64_t row_begin, local_rows; /* this rank's shard */
	CUdeviceptr ptr;
	uint64_t bytes;
};

struct model {
	struct model_config c;
	uint32_t tp, rank;
	ncclComm_t comm;
	struct weight *w;
	size_t nw;
	uint32_t heads_local, ffn_local, width_local;
	/* activations for at most max_tokens tokens and max_rows sequences */
	uint32_t max_tokens, max_rows, max_blocks;
	CUdeviceptr x, h, q, k, v, att, o, up, logits;
	/* the step's inputs, one device buffer (see struct step_layout) */
	CUdeviceptr step;
	uint64_t step_bytes;
	/* the paged KV arena */
	CUdeviceptr kv;
	uint64_t kv_bytes, block_bytes;
	uint32_t num_blocks, block_size;
	uint64_t weights_version;
	bool cuda_graph; /* --cuda-graph: decode steps from captured graphs (engine-graph.c) */
	/* --index-tables (engine-index.c): the kernels' block table and slot mapping, 0: the
	 * step buffer's */
	CUdeviceptr bt, slot_map;
	uint64_t bt_bytes, slot_bytes;
};

/* Offsets of the step's arrays in model->step (all uint32). */
struct step_layout {
	uint64_t tokens, prev, positions, rows, slots, block_tables, sample, total;
};
void step_layout(const struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample,
		 struct step_layout *ret);

/* Allocates the weights (a caching-allocator block per tensor) of config c for rank/tp. */
int model_create(struct model *m, const struct model_config *c, uint32_t tp, uint32_t rank);
/* Allocates every tensor whole (a trainer's copy, TP 1): 0 or -errno. */
int model_create_unsharded(const struct model_config *c, struct weight **ret, size_t *ret_n);
/* H2D of every tensor's shard from a safetensors file with the same layout. */
int model_load_file(struct model *m, const char *path);
/* Initialises every tensor on the device with the fill kernel from seed. */
int model_load_dummy(struct model *m, uint64_t seed);
/* Activation and step buffers for max_tokens tokens per step and max_rows sequences. */
int model_alloc_activations(struct model *m, uint32_t max_tokens, uint32_t max_rows,
			    uint32_t block_size);
/* The KV arena: num_blocks blocks of block_size tokens (one block in a segment of its own). */
int model_alloc_kv(struct model *m, uint32_t block_size, uint32_t num_blocks);
/* --index-tables: the block table and slot mapping as large allocations of their own. */
int model_alloc_index(struct model *m, uint32_t max_tokens, uint32_t max_rows, uint32_t block_size);
/* Copies the step's tables there (before the step) and checks they still hold them (after). */
int model_stage_index(struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample);
int model_check_index(struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample);
uint64_t model_block_bytes(const struct model *m, uint32_t block_size);

/* Runs the model on the step already in m->step; on rank 0 the logits of the nsample sampled
 * tokens land in host (nsample * vocab floats). */
int model_forward(struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample, float *logits);
/* engine-graph.c: a decode step from its captured graph, capturing it with launch on first
 * use. 1: done; 0: not a graph step (the caller launches eagerly); -errno. */
int graph_run(struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample,
	      int (*launch)(struct model *, uint32_t, uint32_t, uint32_t));
/* Seed of tensor i of a model generated from seed (gen-weights and the dummy format). */
uint64_t model_tensor_seed(uint64_t seed, size_t i);
/* Index of a tensor by name, or -ENOENT. */
int model_find(const struct model *m, const char *name);
