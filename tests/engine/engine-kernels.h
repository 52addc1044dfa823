/* SPDX-License-Identifier: MIT */
/*
 * The engine's kernels: one argument struct per kernel, shared by the CUDA C source
 * (engine-kernels.cu, compiled to PTX) and the host implementations registered with the
 * emulated driver (engine-kernels-host.c). Each kernel takes its struct by value as its only
 * parameter, so both sides read the same bytes. Device pointers are plain 64-bit addresses.
 * Every kernel computes in float32 with a fixed summation order, one output element per
 * thread, so a run is deterministic on each platform.
 */
#pragma once

#include <math.h>
#include <stdint.h>

typedef uint64_t kptr_t; /* a device address (CUdeviceptr) */

#define KERNEL_THREADS 256u /* threads per block for every launch */

#ifdef __CUDACC__
#define KFN __host__ __device__ static inline
#else
#define KFN static inline
#endif

/* x[t] = embed[tokens[t]] + pos_embed[positions[t]] */
struct k_embed {
	kptr_t embed, pos_embed, tokens, positions, x;
	uint32_t ntok, hidden, vocab, max_pos;
};

/* Per-layer embedding rows (Gemma-3n style): row = ple_row(tok, prev, layer) % rows; out[t]
 * = the row when this rank holds it (rows [row_begin, row_begin + row_count)), else 0. */
struct k_ple {
	kptr_t table, tokens, prev_tokens, out;
	uint32_t ntok, hidden, layer, rows, row_begin, row_count;
};

/* y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w */
struct k_rmsnorm {
	kptr_t x, w, y;
	uint32_t ntok, hidden;
	float eps;
};

/* Column-parallel linear: y[t][o] = sum_i w[o][i] * x[t][i] (w is [out][in]); relu optional.
 * x rows may be gathered: row t of x is x_idx[t] when x_idx != 0. */
struct k_matmul_rows {
	kptr_t w, x, x_idx, y;
	uint32_t ntok, in, out, relu, x_rows; /* x_rows: rows of x (ntok unless gathered) */
};

/* Row-parallel linear: y[t][o] = sum_i x[t][i] * wt[i][o] (wt is [in][out]), the sum over i
 * computed in nparts equal chunks added in order: with nparts = 2 at TP=1 it equals the
 * all-reduce of two TP=2 ranks computing one chunk each. */
struct k_matmul_cols {
	kptr_t wt, x, y;
	uint32_t ntok, in, out, nparts;
};

/* x += y over n floats */
struct k_add {
	kptr_t x, y;
	uint32_t n;
};

/* Writes k and v of every token into the paged KV arena at slots[t] (block * block_size +
 * offset). Arena layout: [block][layer][k|v][block_size][heads_local * head_dim] floats. */
struct k_kv_write {
	kptr_t arena, slots, k, v;
	uint32_t ntok, layer, layers, block_size, width;
};

/* Causal attention over the KV cache of the token's whole prefix: for token t of batch row
 * rows[t] at position positions[t], head h, softmax(q.k / sqrt(d)) v over positions
 * 0..positions[t], the blocks found in block_tables[rows[t]][0..max_blocks). */
struct k_attention {
	kptr_t q, arena, block_tables, rows, positions, out;
	uint32_t ntok, layer, layers, block_size, heads, head_dim, max_blocks, num_blocks, nrows;
};

/* w[i] = uniform(-scale, scale) + offset from a counter-based hash of (seed, i): the dummy
 * load format initialises weights on the device. */
struct k_fill {
	kptr_t w;
	uint64_t n, seed, first; /* w[i] is element first + i of the full tensor */
	float scale, offset;
};

/* The per-layer-embedding row of a token, the same integer math on both sides. */
KFN uint32_t ple_row(uint32_t tok, uint32_t prev, uint32_t layer, uint32_t rows)
{
	uint32_t h = tok * 2654435761u ^ (prev + 0x9e37u) * 40503u ^ (layer + 1u) * 2246822519u;

	h ^= h >> 15;
	h *= 2246822519u;
	h ^= h >> 13;
	return h % rows;
}

/* splitmix64: the generator's and the dummy fill's value stream. */
KFN uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

KFN float uniform_at(uint64_t seed, uint64_t i, float scale, float offset)
{
	/* 24 random bits -> [-1, 1): exact in float32 on every platform */
	float u = (float)(mix64(seed * 0x100000001b3ull + i) >> 40) / 8388608.0f - 1.0f;

	return u * scale + offset;
}

/* ---- Kernel bodies: element i of the launch, on the GPU (thread i) and on the host (loop).
 * Pointers in the struct are device addresses on a GPU, the emulator's host views here. ---- */
#define F(p) ((float *)(uintptr_t)(p))
#define U(p) ((uint32_t *)(uintptr_t)(p))

KFN void engine_embed_at(const struct k_embed *a, uint64_t i)
{
	uint32_t t, j, tok, pos;

	t = (uint32_t)(i / a->hidden);
	j = (uint32_t)(i % a->hidden);
	tok = U(a->tokens)[t] % a->vocab;
	pos = U(a->positions)[t] % a->max_pos;
	F(a->x)
	[i] = F(a->embed)[(uint64_t)tok * a->hidden + j] +
	      F(a->pos_embed)[(uint64_t)pos * a->hidden + j];
}

KFN void engine_ple_at(const struct k_ple *a, uint64_t i)
{
	uint32_t t, j, row;

	t = (uint32_t)(i / a->hidden);
	j = (uint32_t)(i % a->hidden);
	row = ple_row(U(a->tokens)[t], U(a->prev_tokens)[t], a->layer, a->rows);
	F(a->out)
	[i] = row >= a->row_begin && row - a->row_begin < a->row_count
		      ? F(a->table)[(uint64_t)(row - a->row_begin) * a->hidden + j]
		      : 0.0f;
}

KFN void engine_rmsnorm_at(const struct k_rmsnorm *a, uint64_t i)
{
	const float *x;
	float ss = 0.0f;

	x = F(a->x) + (i / a->hidden) * a->hidden;
	for (uint32_t k = 0; k < a->hidden; k++)
		ss += x[k] * x[k];
	F(a->y)
	[i] = x[i % a->hidden] / sqrtf(ss / (float)a->hidden + a->eps) * F(a->w)[i % a->hidden];
}

KFN void engine_matmul_rows_at(const struct k_matmul_rows *a, uint64_t i)
{
	uint32_t t, o;
	const float *w, *x;
	float s = 0.0f;

	t = (uint32_t)(i / a->out);
	o = (uint32_t)(i % a->out);
	w = F(a->w) + (uint64_t)o * a->in;
	x = F(a->x) + (uint64_t)(a->x_idx ? U(a->x_idx)[t] : t) * a->in;
	for (uint32_t k = 0; k < a->in; k++)
		s += w[k] * x[k];
	F(a->y)[i] = a->relu && s < 0.0f ? 0.0f : s;
}

KFN void engine_matmul_cols_at(const struct k_matmul_cols *a, uint64_t i)
{
	uint32_t t, o, chunk;
	const float *x;
	float total = 0.0f;

	t = (uint32_t)(i / a->out);
	o = (uint32_t)(i % a->out);
	x = F(a->x) + (uint64_t)t * a->in;
	chunk = a->in / a->nparts;
	for (uint32_t p = 0; p < a->nparts; p++) {
		float s = 0.0f;

		for (uint32_t k = p * chunk; k < (p + 1) * chunk; k++)
			s += x[k] * F(a->wt)[(uint64_t)k * a->out + o];
		total = p == 0 ? s : total + s;
	}
	F(a->y)[i] = total;
}

KFN void engine_add_at(const struct k_add *a, uint64_t i)
{
	F(a->x)[i] += F(a->y)[i];
}

KFN void engine_kv_write_at(const struct k_kv_write *a, uint64_t i)
{
	uint32_t t, j, slot, blk, off;
	uint64_t base;

	t = (uint32_t)(i / a->width);
	j = (uint32_t)(i % a->width);
	slot = U(a->slots)[t];
	blk = slot / a->block_size;
	off = slot % a->block_size;
	base = (((uint64_t)blk * a->layers + a->layer) * 2) * a->block_size;
	F(a->arena)[(base + off) * a->width + j] = F(a->k)[i];
	F(a->arena)[(base + a->block_size + off) * a->width + j] = F(a->v)[i];
}

KFN void engine_attention_at(const struct k_attention *a, uint64_t i)
{
	uint32_t t, h, pos, width;
	const float *q;
	const uint32_t *bt;
	float *out, scale, m = -3.0e38f, sum = 0.0f;

	t = (uint32_t)(i / a->heads);
	h = (uint32_t)(i % a->heads);
	width = a->heads * a->head_dim;
	pos = U(a->positions)[t];
	q = F(a->q) + (uint64_t)t * width + h * a->head_dim;
	out = F(a->out) + (uint64_t)t * width + h * a->head_dim;
	bt = U(a->block_tables) + (uint64_t)U(a->rows)[t] * a->max_blocks;
	scale = 1.0f / sqrtf((float)a->head_dim);
	for (uint32_t d = 0; d < a->head_dim; d++)
		out[d] = 0.0f;
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t p = 0; p <= pos && p / a->block_size < a->max_blocks; p++) {
			uint32_t blk = bt[p / a->block_size] % a->num_blocks;
			uint64_t base =
				(((uint64_t)blk * a->layers + a->layer) * 2) * a->block_size;
			const float *k =
				F(a->arena) + (base + p % a->block_size) * width + h * a->head_dim;
			const float *v = k + (uint64_t)a->block_size * width;
			float s = 0.0f;

			for (uint32_t d = 0; d < a->head_dim; d++)
				s += q[d] * k[d];
			s *= scale;
			if (pass == 0) {
				m = s > m ? s : m;
			} else {
				float e = expf(s - m);

				sum += e;
				for (uint32_t d = 0; d < a->head_dim; d++)
					out[d] += e * v[d];
			}
		}
	}
	for (uint32_t d = 0; d < a->head_dim; d++)
		out[d] /= sum;
}

KFN void engine_fill_at(const struct k_fill *a, uint64_t i)
{
	F(a->w)[i] = uniform_at(a->seed, a->first + i, a->scale, a->offset);
}

/* Elements (threads) of each launch. */
KFN uint64_t engine_embed_count(const struct k_embed *a)
{
	return (uint64_t)a->ntok * a->hidden;
}
KFN uint64_t engine_ple_count(const struct k_ple *a)
{
	return (uint64_t)a->ntok * a->hidden;
}
KFN uint64_t engine_rmsnorm_count(const struct k_rmsnorm *a)
{
	return (uint64_t)a->ntok * a->hidden;
}
KFN uint64_t engine_matmul_rows_count(const struct k_matmul_rows *a)
{
	return (uint64_t)a->ntok * a->out;
}
KFN uint64_t engine_matmul_cols_count(const struct k_matmul_cols *a)
{
	return (uint64_t)a->ntok * a->out;
}
KFN uint64_t engine_add_count(const struct k_add *a)
{
	return a->n;
}
KFN uint64_t engine_kv_write_count(const struct k_kv_write *a)
{
	return (uint64_t)a->ntok * a->width;
}
KFN uint64_t engine_attention_count(const struct k_attention *a)
{
	return (uint64_t)a->ntok * a->heads;
}
KFN uint64_t engine_fill_count(const struct k_fill *a)
{
	return a->n;
}

/* X(entry name, argument struct) for every kernel */
#define ENGINE_KERNELS(X)                    \
	X(engine_embed, k_embed)             \
	X(engine_ple, k_ple)                 \
	X(engine_rmsnorm, k_rmsnorm)         \
	X(engine_matmul_rows, k_matmul_rows) \
	X(engine_matmul_cols, k_matmul_cols) \
	X(engine_add, k_add)                 \
	X(engine_kv_write, k_kv_write)       \
	X(engine_attention, k_attention)     \
	X(engine_fill, k_fill)
