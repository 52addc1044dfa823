/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine-alloc.h"
#include "engine-gpu.h"
#include "engine-kernels.h"
#include "engine-model.h"
#include "engine-safetensors.h"
#include "log.h"
#include "util.h"

#define RMS_EPS	   1e-5f
#define LOAD_CHUNK (64u << 20) /* host staging per H2D copy, like a loader's pinned buffer */

void step_layout(const struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample,
		 struct step_layout *ret)
{
	uint64_t o = 0;

	ret->tokens = o, o += 4ull * ntok;
	ret->prev = o, o += 4ull * ntok;
	ret->positions = o, o += 4ull * ntok;
	ret->rows = o, o += 4ull * ntok;
	ret->slots = o, o += 4ull * ntok;
	ret->block_tables = o, o += 4ull * nrows * m->max_blocks;
	ret->sample = o, o += 4ull * nsample;
	ret->total = o;
}

static int alloc(enum dev_pool pool, CUdeviceptr *p, uint64_t bytes, const char *what)
{
	int r = dev_alloc(pool, p, bytes);

	if (r < 0)
		return log_error_errno(r, "Allocating %" PRIu64 " bytes for %s: %m", bytes, what);
	return 0;
}

int model_create(struct model *m, const struct model_config *c, uint32_t tp, uint32_t rank)
{
	_cleanup_free_ struct tensor_desc *desc = NULL;
	size_t n;
	int r;

	r = model_config_check(c, tp);
	if (r < 0)
		return r;
	m->c = *c;
	m->tp = tp;
	m->rank = rank;
	m->heads_local = c->heads / tp;
	m->ffn_local = c->ffn / tp;
	m->width_local = m->heads_local * (c->hidden / c->heads);
	r = model_layout(c, &desc, &n);
	if (r < 0)
		return r;
	m->w = calloc(n, sizeof(*m->w));
	if (!m->w)
		return -ENOMEM;
	m->nw = n;
	for (size_t i = 0; i < n; i++) {
		struct weight *w = &m->w[i];

		w->d = desc[i];
		w->local_rows = w->d.split == SPLIT_ROWS ? w->d.rows / tp : w->d.rows;
		w->row_begin = w->d.split == SPLIT_ROWS ? w->local_rows * rank : 0;
		w->bytes = w->local_rows * w->d.cols * sizeof(float);
		/* one caching-allocator block per tensor, in the weights' own pool */
		r = alloc(DEV_POOL_WEIGHTS, &w->ptr, w->bytes, w->d.name);
		if (r < 0)
			return r;
	}
	return 0;
}

int model_create_unsharded(const struct model_config *c, struct weight **ret, size_t *ret_n)
{
	struct model m = {};
	int r = model_create(&m, c, 1, 0);

	if (r < 0)
		return r;
	*ret = m.w;
	*ret_n = m.nw;
	return 0;
}

int model_find(const struct model *m, const char *name)
{
	for (size_t i = 0; i < m->nw; i++)
		if (strcmp(m->w[i].d.name, name) == 0)
			return (int)i;
	return -ENOENT;
}

static const char *meta_get(void *ud, const char *key)
{
	return st_meta(ud, key);
}

int model_load_file(struct model *m, const char *path)
{
	struct st_file f;
	struct model_config c;
	_cleanup_free_ char *buf = NULL;
	int r;

	r = st_open(path, &f);
	if (r < 0)
		return r;
	r = model_config_from_metadata(meta_get, &f, &c);
	if (r < 0)
		goto out;
	if (memcmp(&c, &m->c, sizeof(c)) != 0) {
		r = log_error_errno(-EINVAL, "%s: model config differs from the loaded model",
				    path);
		goto out;
	}
	buf = malloc(LOAD_CHUNK);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < m->nw; i++) {
		const struct weight *w = &m->w[i];
		const struct st_tensor *t = st_find(&f, w->d.name);
		uint64_t off, done = 0;

		if (!t || strcmp(t->dtype, "F32") != 0 ||
		    t->end - t->begin != w->d.rows * w->d.cols * sizeof(float)) {
			r = log_error_errno(-EBADMSG,
					    "%s: tensor %s missing or not F32[%" PRIu64 ", %" PRIu64
					    "]",
					    path, w->d.name, w->d.rows, w->d.cols);
			goto out;
		}
		off = t->begin + w->row_begin * w->d.cols * sizeof(float);
		while (done < w->bytes) {
			size_t len = (size_t)MIN((uint64_t)LOAD_CHUNK, w->bytes - done);
			ssize_t n = pread(f.fd, buf, len, (off_t)(off + done));
			CUresult cr;

			if (n != (ssize_t)len) {
				r = log_error_errno(n < 0 ? -errno : -EIO, "%s: short read of %s",
						    path, w->d.name);
				goto out;
			}
			cr = gpu.cuMemcpyHtoD(w->ptr + done, buf, len);
			if (cr != CUDA_SUCCESS) {
				r = log_error_errno(gpu_errno(cr), "H2D of %s failed: %s",
						    w->d.name, gpu_strerror(cr));
				goto out;
			}
			done += len;
		}
	}
	r = 0;
out:
	st_close(&f);
	return r;
}

int model_load_dummy(struct model *m, uint64_t seed)
{
	for (size_t i = 0; i < m->nw; i++) {
		const struct weight *w = &m->w[i];
		/* the shard's elements are elements [row_begin * cols, ...) of the full tensor */
		struct k_fill a = {
			.w = w->ptr,
			.n = w->local_rows * w->d.cols,
			.seed = model_tensor_seed(seed, i),
			.first = w->row_begin * w->d.cols,
			.scale = w->d.scale,
			.offset = w->d.offset,
		};
		int r;

		r = gpu_launch("engine_fill", a.n, &a);
		if (r < 0)
			return r;
	}
	return gpu_sync();
}

int model_alloc_activations(struct model *m, uint32_t max_tokens, uint32_t max_rows,
			    uint32_t block_size)
{
	uint64_t h = m->c.hidden, t = max_tokens;
	struct step_layout sl;
	int r = 0;

	m->max_tokens = max_tokens;
	m->max_rows = max_rows;
	m->block_size = block_size;
	m->max_blocks = (m->c.max_pos + block_size - 1) / block_size;
	step_layout(m, max_tokens, max_rows, max_rows, &sl);
	m->step_bytes = sl.total;
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->x, 4 * t * h, "activations");
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->h, 4 * t * h, "activations");
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->q, 4 * t * m->width_local, "activations");
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->k, 4 * t * m->width_local, "activations");
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->v, 4 * t * m->width_local, "activations");
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->att, 4 * t * m->width_local, "activations");
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->o, 4 * t * h, "activations");
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->up, 4 * t * m->ffn_local, "activations");
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->logits, 4ull * max_rows * m->c.vocab, "logits");
	r = r ?: alloc(DEV_POOL_DEFAULT, &m->step, m->step_bytes, "step inputs");
	return r;
}

uint64_t model_block_bytes(const struct model *m, uint32_t block_size)
{
	return (uint64_t)m->c.layers * 2 * block_size * m->width_local * sizeof(float);
}

int model_alloc_kv(struct model *m, uint32_t block_size, uint32_t num_blocks)
{
	m->block_size = block_size;
	m->block_bytes = model_block_bytes(m, m->block_size);
	m->num_blocks = num_blocks;
	m->kv_bytes = m->block_bytes * num_blocks;
	/* One block right after the cuMemGetInfo probe, as vLLM sizes its cache. Its own pool
	 * gives it a segment of its own, as vLLM's GiB-sized KV tensors always get (no cached
	 * free block is that large); the tests' few MiB of KV would otherwise fit the rest of an
	 * activation segment. */
	return alloc(DEV_POOL_KV, &m->kv, m->kv_bytes, "the KV cache");
}

static int allreduce(struct model *m, CUdeviceptr buf, uint64_t n)
{
	ncclResult_t nr;

	if (m->tp == 1)
		return 0;
	nr = gpu.ncclAllReduce((const void *)buf, (void *)buf, n, ncclFloat, ncclSum, m->comm,
			       gpu_stream());
	nr = gpu_nccl_wait(m->comm, nr);
	if (nr != ncclSuccess)
		return log_error_errno(-EIO, "ncclAllReduce failed: %s",
				       gpu.ncclGetErrorString(nr));
	return 0;
}

#define W(name) (m->w[widx(m, name)].ptr)
static size_t widx(const struct model *m, const char *name)
{
	int i = model_find(m, name);

	return i < 0 ? 0 : (size_t)i; /* names come from model_layout: always found */
}

/* Every launch of a step, on the engine's stream: what a decode graph captures. */
static int forward_launch(struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample)
{
	const struct model_config *c = &m->c;
	uint32_t hd = c->hidden / c->heads, nparts = m->tp == 1 ? 2 : 1;
	uint64_t nh = (uint64_t)ntok * c->hidden;
	struct step_layout sl;
	char name[96];
	int r = 0;

	step_layout(m, ntok, nrows, nsample, &sl);
#define LN(l, s) (snprintf(name, sizeof(name), "model.layers.%u.%s", l, s), name)
	{
		struct k_embed a = {.embed = W("model.embed_tokens.weight"),
				    .pos_embed = W("model.embed_positions.weight"),
				    .tokens = m->step + sl.tokens,
				    .positions = m->step + sl.positions,
				    .x = m->x,
				    .ntok = ntok,
				    .hidden = c->hidden,
				    .vocab = c->vocab,
				    .max_pos = c->max_pos};
		r = r ?: gpu_launch("engine_embed", engine_embed_count(&a), &a);
	}
	for (uint32_t l = 0; l < c->layers && r == 0; l++) {
		const struct weight *ple = &m->w[widx(m, LN(l, "per_layer_embed.weight"))];
		struct k_ple pa = {.table = ple->ptr,
				   .tokens = m->step + sl.tokens,
				   .prev_tokens = m->step + sl.prev,
				   .out = m->o,
				   .ntok = ntok,
				   .hidden = c->hidden,
				   .layer = l,
				   .rows = c->ple_rows,
				   .row_begin = (uint32_t)ple->row_begin,
				   .row_count = (uint32_t)ple->local_rows};
		struct k_add add_o = {.x = m->x, .y = m->o, .n = (uint32_t)nh};
		struct k_rmsnorm n1 = {.x = m->x,
				       .w = W(LN(l, "input_layernorm.weight")),
				       .y = m->h,
				       .ntok = ntok,
				       .hidden = c->hidden,
				       .eps = RMS_EPS};
		struct k_matmul_rows mq = {
			.x = m->h, .ntok = ntok, .in = c->hidden, .out = m->width_local};
		struct k_kv_write kw = {.arena = m->kv,
					.slots = m->slot_map ? m->slot_map : m->step + sl.slots,
					.k = m->k,
					.v = m->v,
					.ntok = ntok,
					.layer = l,
					.layers = c->layers,
					.block_size = m->block_size,
					.width = m->width_local};
		struct k_attention at = {.q = m->q,
					 .arena = m->kv,
					 .block_tables = m->bt ? m->bt : m->step + sl.block_tables,
					 .rows = m->step + sl.rows,
					 .positions = m->step + sl.positions,
					 .out = m->att,
					 .ntok = ntok,
					 .layer = l,
					 .layers = c->layers,
					 .block_size = m->block_size,
					 .heads = m->heads_local,
					 .head_dim = hd,
					 .max_blocks = m->max_blocks,
					 .num_blocks = m->num_blocks,
					 .nrows = nrows};
		struct k_matmul_cols mo = {.wt = W(LN(l, "self_attn.o_proj.weight_t")),
					   .x = m->att,
					   .y = m->o,
					   .ntok = ntok,
					   .in = m->width_local,
					   .out = c->hidden,
					   .nparts = nparts};
		struct k_rmsnorm n2 = n1;
		struct k_matmul_rows mu = {.w = W(LN(l, "mlp.up_proj.weight")),
					   .x = m->h,
					   .y = m->up,
					   .ntok = ntok,
					   .in = c->hidden,
					   .out = m->ffn_local,
					   .relu = 1};
		struct k_matmul_cols md = {.wt = W(LN(l, "mlp.down_proj.weight_t")),
					   .x = m->up,
					   .y = m->o,
					   .ntok = ntok,
					   .in = m->ffn_local,
					   .out = c->hidden,
					   .nparts = nparts};

		/* per-layer embedding: each row lives on one rank, the others add exact zeros */
		r = r ?: gpu_launch("engine_ple", engine_ple_count(&pa), &pa);
		r = r ?: allreduce(m, m->o, nh);
		r = r ?: gpu_launch("engine_add", nh, &add_o);
		/* attention block */
		r = r ?: gpu_launch("engine_rmsnorm", nh, &n1);
		mq.w = W(LN(l, "self_attn.q_proj.weight")), mq.y = m->q;
		r = r ?: gpu_launch("engine_matmul_rows", engine_matmul_rows_count(&mq), &mq);
		mq.w = W(LN(l, "self_attn.k_proj.weight")), mq.y = m->k;
		r = r ?: gpu_launch("engine_matmul_rows", engine_matmul_rows_count(&mq), &mq);
		mq.w = W(LN(l, "self_attn.v_proj.weight")), mq.y = m->v;
		r = r ?: gpu_launch("engine_matmul_rows", engine_matmul_rows_count(&mq), &mq);
		r = r ?: gpu_launch("engine_kv_write", engine_kv_write_count(&kw), &kw);
		r = r ?: gpu_launch("engine_attention", engine_attention_count(&at), &at);
		r = r ?: gpu_launch("engine_matmul_cols", engine_matmul_cols_count(&mo), &mo);
		r = r ?: allreduce(m, m->o, nh);
		r = r ?: gpu_launch("engine_add", nh, &add_o);
		/* MLP block */
		n2.w = W(LN(l, "post_attention_layernorm.weight"));
		r = r ?: gpu_launch("engine_rmsnorm", nh, &n2);
		r = r ?: gpu_launch("engine_matmul_rows", engine_matmul_rows_count(&mu), &mu);
		r = r ?: gpu_launch("engine_matmul_cols", engine_matmul_cols_count(&md), &md);
		r = r ?: allreduce(m, m->o, nh);
		r = r ?: gpu_launch("engine_add", nh, &add_o);
	}
	if (r == 0 && m->rank == 0 && nsample > 0) {
		struct k_rmsnorm nf = {.x = m->x,
				       .w = W("model.norm.weight"),
				       .y = m->h,
				       .ntok = ntok,
				       .hidden = c->hidden,
				       .eps = RMS_EPS};
		struct k_matmul_rows lm = {.w = W("lm_head.weight"),
					   .x = m->h,
					   .x_idx = m->step + sl.sample,
					   .y = m->logits,
					   .ntok = nsample,
					   .in = c->hidden,
					   .out = c->vocab,
					   .x_rows = ntok};

		r = r ?: gpu_launch("engine_rmsnorm", nh, &nf);
		r = r ?: gpu_launch("engine_matmul_rows", engine_matmul_rows_count(&lm), &lm);
	}
#undef LN
	return r;
}

int model_forward(struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample, float *logits)
{
	int r = model_stage_index(m, ntok, nrows, nsample);

	r = r ?: graph_run(m, ntok, nrows, nsample, forward_launch);
	if (r == 0)
		r = forward_launch(m, ntok, nrows, nsample);
	r = r < 0 ? r : gpu_sync();
	r = r < 0 ? r : model_check_index(m, ntok, nrows, nsample);
	if (r == 0 && m->rank == 0 && nsample > 0) {
		CUresult cr = gpu.cuMemcpyDtoH(logits, m->logits, 4ull * nsample * m->c.vocab);

		if (cr != CUDA_SUCCESS)
			r = log_error_errno(gpu_errno(cr), "D2H of logits failed: %s",
					    gpu_strerror(cr));
	}
	return r;
}
