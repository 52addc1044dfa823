/* SPDX-License-Identifier: MIT */
/*
 * Host implementations of the engine's kernels for the emulated driver, loaded through
 * BELAYER_EMU_KERNELS. Each translates the device addresses of its argument struct into the
 * emulator's host views (device memory is not host-dereferenceable) and runs the same
 * per-element body as the GPU (engine-kernels.h) over every element, in order. An address
 * the launch's process has not mapped makes the kernel do nothing, as an illegal address
 * would abort the kernel on a GPU.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "belayer-emu.h"
#include "engine-kernels.h"

static bool tr(kptr_t *p, uint64_t len)
{
	void *h;

	if (len == 0)
		return true;
	h = belayer_emu_translate((CUdeviceptr)*p, (size_t)len);
	if (!h)
		return false;
	*p = (kptr_t)(uintptr_t)h;
	return true;
}

#define FL(n) ((uint64_t)(n) * sizeof(float))
#define UL(n) ((uint64_t)(n) * sizeof(uint32_t))

static bool prep_embed(struct k_embed *a)
{
	return tr(&a->embed, FL((uint64_t)a->vocab * a->hidden)) &&
	       tr(&a->pos_embed, FL((uint64_t)a->max_pos * a->hidden)) &&
	       tr(&a->tokens, UL(a->ntok)) && tr(&a->positions, UL(a->ntok)) &&
	       tr(&a->x, FL((uint64_t)a->ntok * a->hidden));
}

static bool prep_ple(struct k_ple *a)
{
	return tr(&a->table, FL((uint64_t)a->row_count * a->hidden)) &&
	       tr(&a->tokens, UL(a->ntok)) && tr(&a->prev_tokens, UL(a->ntok)) &&
	       tr(&a->out, FL((uint64_t)a->ntok * a->hidden)) && a->rows > 0;
}

static bool prep_rmsnorm(struct k_rmsnorm *a)
{
	return tr(&a->x, FL((uint64_t)a->ntok * a->hidden)) && tr(&a->w, FL(a->hidden)) &&
	       tr(&a->y, FL((uint64_t)a->ntok * a->hidden));
}

static bool prep_matmul_rows(struct k_matmul_rows *a)
{
	uint32_t rows = a->x_idx ? a->x_rows : a->ntok;

	return tr(&a->w, FL((uint64_t)a->out * a->in)) && tr(&a->x, FL((uint64_t)rows * a->in)) &&
	       (!a->x_idx || tr(&a->x_idx, UL(a->ntok))) &&
	       tr(&a->y, FL((uint64_t)a->ntok * a->out));
}

static bool prep_matmul_cols(struct k_matmul_cols *a)
{
	return a->nparts > 0 && tr(&a->wt, FL((uint64_t)a->in * a->out)) &&
	       tr(&a->x, FL((uint64_t)a->ntok * a->in)) &&
	       tr(&a->y, FL((uint64_t)a->ntok * a->out));
}

static bool prep_add(struct k_add *a)
{
	return tr(&a->x, FL(a->n)) && tr(&a->y, FL(a->n));
}

static bool prep_kv_write(struct k_kv_write *a)
{
	/* the arena's extent is not in the arguments: bound it by the largest slot written */
	uint64_t blocks = 0;
	const uint32_t *slots;

	if (!tr(&a->slots, UL(a->ntok)) || a->block_size == 0)
		return false;
	slots = (const uint32_t *)(uintptr_t)a->slots;
	for (uint32_t t = 0; t < a->ntok; t++)
		if (slots[t] / a->block_size + 1 > blocks)
			blocks = slots[t] / a->block_size + 1;
	return tr(&a->arena, FL(blocks * a->layers * 2 * a->block_size * a->width)) &&
	       tr(&a->k, FL((uint64_t)a->ntok * a->width)) &&
	       tr(&a->v, FL((uint64_t)a->ntok * a->width));
}

static bool prep_attention(struct k_attention *a)
{
	uint64_t width = (uint64_t)a->heads * a->head_dim;

	return a->block_size > 0 && a->num_blocks > 0 && a->head_dim > 0 &&
	       tr(&a->q, FL(a->ntok * width)) &&
	       tr(&a->arena, FL((uint64_t)a->num_blocks * a->layers * 2 * a->block_size * width)) &&
	       tr(&a->block_tables, UL((uint64_t)a->nrows * a->max_blocks)) &&
	       tr(&a->rows, UL(a->ntok)) && tr(&a->positions, UL(a->ntok)) &&
	       tr(&a->out, FL(a->ntok * width));
}

static bool prep_fill(struct k_fill *a)
{
	return tr(&a->w, FL(a->n));
}

#define HOST_KERNEL(name, type)                                                                   \
	static void host_##name(const struct belayer_emu_launch *l, void **params)                \
	{                                                                                         \
		struct type a = *(const struct type *)params[0];                                  \
		uint64_t threads = (uint64_t)l->grid[0] * l->grid[1] * l->grid[2] * l->block[0] * \
				   l->block[1] * l->block[2];                                     \
		uint64_t n = name##_count(&a);                                                    \
                                                                                                  \
		if (!prep_##type(&a))                                                             \
			return;                                                                   \
		if (threads < n)                                                                  \
			n = threads; /* threads past the grid do not exist */                     \
		for (uint64_t i = 0; i < n; i++)                                                  \
			name##_at(&a, i);                                                         \
	}
#define prep_k_embed	   prep_embed
#define prep_k_ple	   prep_ple
#define prep_k_rmsnorm	   prep_rmsnorm
#define prep_k_matmul_rows prep_matmul_rows
#define prep_k_matmul_cols prep_matmul_cols
#define prep_k_add	   prep_add
#define prep_k_kv_write	   prep_kv_write
#define prep_k_attention   prep_attention
#define prep_k_fill	   prep_fill
ENGINE_KERNELS(HOST_KERNEL)

#define REGISTER(name, type) (void)belayer_emu_register_kernel(#name, host_##name);
__attribute__((constructor)) static void register_kernels(void)
{
	ENGINE_KERNELS(REGISTER)
}
