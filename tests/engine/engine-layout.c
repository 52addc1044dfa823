/* SPDX-License-Identifier: MIT */
/* The model's tensors and config, shared by the engine and gen-weights (no GPU here). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-kernels.h"
#include "engine-model.h"
#include "log.h"
#include "util.h"

struct layout_builder {
	struct tensor_desc *t;
	size_t n;
};

static void add(struct layout_builder *b, const char *name, uint64_t rows, uint64_t cols,
		enum tensor_split split, float scale, float offset)
{
	struct tensor_desc *d = &b->t[b->n++];

	snprintf(d->name, sizeof(d->name), "%s", name);
	d->rows = rows;
	d->cols = cols;
	d->split = split;
	d->scale = scale;
	d->offset = offset;
}

int model_layout(const struct model_config *c, struct tensor_desc **ret, size_t *ret_n)
{
	struct layout_builder b;
	float sh = 1.0f / sqrtf((float)c->hidden), sf = 1.0f / sqrtf((float)c->ffn);
	char name[64];

	b.n = 0;
	b.t = calloc(4 + 9 * (size_t)c->layers, sizeof(*b.t));
	if (!b.t)
		return -ENOMEM;
	add(&b, "model.embed_tokens.weight", c->vocab, c->hidden, SPLIT_NONE, 1.0f, 0.0f);
	add(&b, "model.embed_positions.weight", c->max_pos, c->hidden, SPLIT_NONE, 0.5f, 0.0f);
	for (uint32_t l = 0; l < c->layers; l++) {
#define L(suffix) (snprintf(name, sizeof(name), "model.layers.%u.%s", l, suffix), name)
		add(&b, L("input_layernorm.weight"), 1, c->hidden, SPLIT_NONE, 0.1f, 1.0f);
		add(&b, L("self_attn.q_proj.weight"), c->hidden, c->hidden, SPLIT_ROWS, sh * 4, 0);
		add(&b, L("self_attn.k_proj.weight"), c->hidden, c->hidden, SPLIT_ROWS, sh * 4, 0);
		add(&b, L("self_attn.v_proj.weight"), c->hidden, c->hidden, SPLIT_ROWS, sh, 0);
		add(&b, L("self_attn.o_proj.weight_t"), c->hidden, c->hidden, SPLIT_ROWS, sh, 0);
		add(&b, L("post_attention_layernorm.weight"), 1, c->hidden, SPLIT_NONE, 0.1f, 1.0f);
		add(&b, L("mlp.up_proj.weight"), c->ffn, c->hidden, SPLIT_ROWS, sh, 0);
		add(&b, L("mlp.down_proj.weight_t"), c->ffn, c->hidden, SPLIT_ROWS, sf, 0);
		add(&b, L("per_layer_embed.weight"), c->ple_rows, c->hidden, SPLIT_ROWS, 0.5f, 0);
#undef L
	}
	add(&b, "model.norm.weight", 1, c->hidden, SPLIT_NONE, 0.1f, 1.0f);
	add(&b, "lm_head.weight", c->vocab, c->hidden, SPLIT_NONE, sh * 8, 0.0f);
	*ret = b.t;
	*ret_n = b.n;
	return 0;
}

uint64_t model_bytes(const struct model_config *c)
{
	uint64_t h = c->hidden;

	return 4 * (2 * (uint64_t)c->vocab * h + (uint64_t)c->max_pos * h + h +
		    c->layers * (2 * h + 4 * h * h + 2 * (uint64_t)c->ffn * h +
				 (uint64_t)c->ple_rows * h));
}

uint32_t model_ple_rows_for_size(const struct model_config *c, uint64_t size)
{
	struct model_config z = *c;
	uint64_t base, rows;

	z.ple_rows = 0;
	base = model_bytes(&z);
	rows = size > base ? (size - base) / (4ull * c->hidden * c->layers) : 0;
	rows &= ~7ull; /* divisible by every TP degree up to 8 */
	if (rows < 8)
		rows = 8;
	return rows > UINT32_MAX - 8 ? (UINT32_MAX & ~7u) : (uint32_t)rows;
}

int model_config_check(const struct model_config *c, uint32_t tp)
{
	if (c->vocab < 2 || c->vocab > (1u << 20) || c->hidden < 8 || c->hidden > 4096 ||
	    c->layers < 1 || c->layers > 64 || c->heads < 1 || c->hidden % c->heads ||
	    c->hidden / c->heads > 256 || c->ffn < 2 || c->ffn > 65536 || c->max_pos < 2 ||
	    c->max_pos > 65536 || c->ple_rows < 1)
		return log_error_errno(-EINVAL, "Invalid model config");
	if (tp < 1 || c->heads % tp || c->ffn % tp || c->ple_rows % tp ||
	    (tp == 1 && (c->heads % 2 || c->ffn % 2)))
		return log_error_errno(
			-EINVAL, "Model (heads %u, ffn %u, ple rows %u) does not split %u ways",
			c->heads, c->ffn, c->ple_rows, tp);
	return 0;
}

static int parse_u32(const char *s, uint32_t *ret)
{
	char *end;
	unsigned long v;

	if (!s || !*s)
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v > UINT32_MAX)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

int model_config_from_metadata(const char *(*get)(void *ud, const char *key), void *ud,
			       struct model_config *ret)
{
	static const struct {
		const char *key;
		size_t off;
	} keys[] = {
		{"vocab_size", offsetof(struct model_config, vocab)},
		{"hidden_size", offsetof(struct model_config, hidden)},
		{"num_hidden_layers", offsetof(struct model_config, layers)},
		{"num_attention_heads", offsetof(struct model_config, heads)},
		{"intermediate_size", offsetof(struct model_config, ffn)},
		{"max_position_embeddings", offsetof(struct model_config, max_pos)},
		{"per_layer_embed_rows", offsetof(struct model_config, ple_rows)},
	};

	for (size_t i = 0; i < ARRAY_SIZE(keys); i++)
		if (parse_u32(get(ud, keys[i].key), (uint32_t *)((char *)ret + keys[i].off)) < 0)
			return log_error_errno(-EBADMSG, "Model metadata: missing or bad \"%s\"",
					       keys[i].key);
	return 0;
}

/* The seed of tensor i's values: the generator uses the same, so a dummy model from seed s
 * equals the file gen-weights writes from seed s. */
uint64_t model_tensor_seed(uint64_t seed, size_t i)
{
	return mix64(seed ^ (0x5851f42d4c957f2dull * (i + 1)));
}
