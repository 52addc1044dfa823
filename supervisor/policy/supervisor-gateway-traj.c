/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor-gateway-traj.h"
#include "supervisor-lru.h"
#include "supervisor.h"

/* The rate window: token events of the last RATE_WINDOW_US to 2 x RATE_WINDOW_US. */
#define RATE_WINDOW_US 500000

struct gw_traj {
	char id[PROTO_MAX_STR + 1]; /* "": free slot */
	uint64_t hash;
	uint64_t seen_us;
	uint64_t seq; /* the pending request's ticket; 0: none in flight */
	uint64_t prompt, gen, mtps;
	/* rate anchors (time, tokens): the window runs from a0 to the latest event */
	bool anchored;
	uint64_t a0_us, a0_gen, a1_us, a1_gen;
	bool have_last;
	uint64_t last_out;
};

struct gateway_trajs {
	uint32_t max;
	uint64_t next_seq;
	struct gw_traj *e;
};

static uint64_t fnv1a(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h;
}

int gateway_traj_id_check(const char *v)
{
	size_t n = 0;

	if (!v)
		return -EINVAL;
	for (; v[n]; n++)
		if (n >= PROTO_MAX_STR || (uint8_t)v[n] < 0x21 || (uint8_t)v[n] > 0x7e)
			return -EINVAL;
	return n ? 0 : -EINVAL;
}

struct gateway_trajs *gateway_trajs_new(uint32_t max)
{
	struct gateway_trajs *t;

	if (!max) {
		errno = EINVAL;
		return NULL;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->max = max;
	t->e = calloc(max, sizeof(*t->e));
	if (!t->e) {
		free(t);
		errno = ENOMEM;
		return NULL;
	}
	return t;
}

void gateway_trajs_free(struct gateway_trajs *t)
{
	if (!t)
		return;
	free(t->e);
	free(t);
}

static struct gw_traj *find(const struct gateway_trajs *t, const char *id)
{
	uint64_t h = fnv1a(id);

	for (uint32_t i = 0; i < t->max; i++)
		if (t->e[i].id[0] && t->e[i].hash == h && strcmp(t->e[i].id, id) == 0)
			return &t->e[i];
	return NULL;
}

/* Found, or a free slot, or the least recently active one, reset. A request still pending on
 * a forgotten entry keeps running; its ticket no longer matches (seq), so it updates nothing. */
static struct gw_traj *get(struct gateway_trajs *t, const char *id)
{
	struct gw_traj *x = find(t, id), *victim;

	if (x)
		return x;
	victim = &t->e[LRU_SLOT(t->e, t->max, id, seen_us)];
	memset(victim, 0, sizeof(*victim));
	snprintf(victim->id, sizeof(victim->id), "%s", id);
	victim->hash = fnv1a(id);
	return victim;
}

static struct gw_traj *of_ticket(const struct gateway_trajs *t, const struct gateway_traj_ticket *k)
{
	struct gw_traj *x;

	if (!t || !k->seq || k->slot >= t->max)
		return NULL;
	x = &t->e[k->slot];
	return x->id[0] && x->seq == k->seq ? x : NULL;
}

int gateway_trajs_begin(struct gateway_trajs *t, const char *id, uint64_t prompt_tokens,
			uint64_t now_us, struct gateway_traj_ticket *ret)
{
	struct gw_traj *x;

	*ret = (struct gateway_traj_ticket){0};
	if (gateway_traj_id_check(id) < 0)
		return -EINVAL;
	x = get(t, id);
	x->seen_us = now_us;
	x->seq = ++t->next_seq;
	x->prompt = prompt_tokens;
	x->gen = 0;
	x->anchored = false;
	*ret = (struct gateway_traj_ticket){.slot = (uint32_t)(x - t->e), .seq = x->seq};
	return 0;
}

void gateway_trajs_attempt(struct gateway_trajs *t, const struct gateway_traj_ticket *k)
{
	struct gw_traj *x = of_ticket(t, k);

	if (x)
		x->anchored = false;
}

void gateway_trajs_progress(struct gateway_trajs *t, const struct gateway_traj_ticket *k,
			    uint64_t generated, uint64_t now_us)
{
	struct gw_traj *x = of_ticket(t, k);

	if (!x || generated <= x->gen)
		return;
	x->gen = generated;
	x->seen_us = now_us;
	if (!x->anchored) {
		/* The first token event of the attempt: the window starts after the prefill. */
		x->anchored = true;
		x->a0_us = x->a1_us = now_us;
		x->a0_gen = x->a1_gen = generated;
		return;
	}
	if (now_us > x->a0_us && generated > x->a0_gen)
		x->mtps = (generated - x->a0_gen) * 1000000000ull / (now_us - x->a0_us);
	if (now_us - x->a1_us >= RATE_WINDOW_US) {
		x->a0_us = x->a1_us;
		x->a0_gen = x->a1_gen;
		x->a1_us = now_us;
		x->a1_gen = generated;
	}
}

void gateway_trajs_end(struct gateway_trajs *t, struct gateway_traj_ticket *k, bool completed,
		       uint64_t generated, uint64_t now_us)
{
	struct gw_traj *x = of_ticket(t, k);

	*k = (struct gateway_traj_ticket){0};
	if (!x)
		return;
	x->seq = 0;
	x->seen_us = now_us;
	x->prompt = x->gen = 0;
	x->anchored = false;
	if (completed) {
		x->have_last = true;
		x->last_out = generated;
	}
}

static void pending_of(const struct gw_traj *x, struct gateway_traj_pending *ret)
{
	*ret = (struct gateway_traj_pending){
		.active = x->seq != 0,
		.prompt_tokens = x->prompt,
		.generated_tokens = x->gen,
		.decode_mtps = x->mtps,
	};
}

int gateway_trajs_get(const struct gateway_trajs *t, const char *id,
		      struct gateway_traj_pending *ret)
{
	const struct gw_traj *x = t && id ? find(t, id) : NULL;

	if (!x)
		return -ENOENT;
	pending_of(x, ret);
	return 0;
}

int gateway_trajs_last_output(const struct gateway_trajs *t, const char *id, uint64_t *ret)
{
	const struct gw_traj *x = t && id ? find(t, id) : NULL;

	if (!x || !x->have_last)
		return -ENOENT;
	*ret = x->last_out;
	return 0;
}

int gateway_trajs_foreach(const struct gateway_trajs *t,
			  int (*cb)(const char *id, const struct gateway_traj_pending *p,
				    void *userdata),
			  void *userdata)
{
	struct gateway_traj_pending p;
	int r;

	for (uint32_t i = 0; t && i < t->max; i++) {
		if (!t->e[i].id[0])
			continue;
		pending_of(&t->e[i], &p);
		r = cb(t->e[i].id, &p, userdata);
		if (r < 0)
			return r;
	}
	return 0;
}

int gateway_traj_pending(struct supervisor *s, const char *trajectory,
			 struct gateway_traj_pending *ret)
{
	return gateway_trajs_get(s->gw_trajs, trajectory, ret);
}

int gateway_traj_last_output(struct supervisor *s, const char *trajectory, uint64_t *ret)
{
	return gateway_trajs_last_output(s->gw_trajs, trajectory, ret);
}
