/* SPDX-License-Identifier: MIT */
/*
 * Continuous batching on rank 0: every step carries, for each running request, the tokens
 * whose KV is not yet in the cache (the whole prompt on its first step, then the last
 * sampled token), flattened into one batch with a slot mapping and block tables as vLLM's
 * model runner builds them. Blocks are reserved for a request's whole budget when it is
 * admitted (vLLM allocates lazily and preempts; reserving keeps this engine preemption-free).
 * Sampling runs on the host from the logits of each request's last token.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "engine-alloc.h"
#include "engine-kernels.h"
#include "log.h"
#include "util.h"

int sched_init(struct engine *e)
{
	struct step_layout sl;

	e->running = calloc(e->o.max_num_seqs, sizeof(*e->running));
	e->free_blocks = malloc(sizeof(uint32_t) * e->m.num_blocks);
	e->logits = malloc(sizeof(float) * e->o.max_num_seqs * e->m.c.vocab);
	step_layout(&e->m, e->m.max_tokens, e->m.max_rows, e->m.max_rows, &sl);
	e->step_host = malloc(sl.total);
	if (!e->running || !e->free_blocks || !e->logits || !e->step_host)
		return -ENOMEM;
	/* lowest block ids handed out first */
	for (uint32_t i = 0; i < e->m.num_blocks; i++)
		e->free_blocks[i] = e->m.num_blocks - 1 - i;
	e->nfree = e->m.num_blocks;
	e->waiting_tail = &e->waiting;
	return 0;
}

void sched_finish(struct engine *e)
{
	for (uint32_t i = 0; e->running && i < e->o.max_num_seqs; i++)
		request_free(e->running[i]);
	while (e->waiting) {
		struct request *req = e->waiting;

		e->waiting = req->next;
		request_free(req);
	}
	free(e->running);
	free(e->free_blocks);
	free(e->logits);
	free(e->step_host);
	e->running = NULL;
	e->free_blocks = NULL;
	e->logits = NULL;
	e->step_host = NULL;
}

void request_free(struct request *req)
{
	if (!req)
		return;
	free(req->tok);
	free(req->logprob);
	free(req->blocks);
	if (req->user && req->release_user)
		req->release_user(req); /* the HTTP side of an unfinished request */
	free(req);
}

void sched_submit(struct engine *e, struct request *req)
{
	req->id = ++e->next_id;
	req->row = -1;
	req->next = NULL;
	*e->waiting_tail = req;
	e->waiting_tail = &req->next;
	sched_kick(e);
}

bool sched_busy(const struct engine *e)
{
	return e->nrunning > 0 || e->waiting;
}

void sched_kick(struct engine *e)
{
	/* a zero timeout, not event_active: the loop polls the sockets between two steps */
	static const struct timeval now = {0, 0};

	if (!e->paused && sched_busy(e) && e->step_ev && !dev_asleep(1u << DEV_POOL_KV) &&
	    !event_pending(e->step_ev, EV_TIMEOUT, NULL))
		(void)event_add(e->step_ev, &now);
}

static void release(struct engine *e, struct request *req)
{
	for (uint32_t i = 0; i < req->nblocks; i++)
		e->free_blocks[e->nfree++] = req->blocks[i];
	if (req->row >= 0) {
		e->running[req->row] = NULL;
		e->nrunning--;
	}
	request_free(req);
}

static void admit(struct engine *e)
{
	while (e->waiting && e->nrunning < e->o.max_num_seqs) {
		struct request *req = e->waiting;
		uint32_t need =
			(req->nprompt + req->max_new + e->m.block_size - 1) / e->m.block_size;
		int row = -1;

		if (req->cancelled) {
			e->waiting = req->next;
			if (!e->waiting)
				e->waiting_tail = &e->waiting;
			request_free(req);
			continue;
		}
		if (need > e->nfree)
			return; /* FIFO: wait for blocks to come back */
		for (uint32_t i = 0; i < e->o.max_num_seqs; i++)
			if (!e->running[i]) {
				row = (int)i;
				break;
			}
		req->blocks = malloc(sizeof(uint32_t) * need);
		if (!req->blocks || row < 0)
			return;
		for (uint32_t i = 0; i < need; i++)
			req->blocks[i] = e->free_blocks[--e->nfree];
		req->nblocks = need;
		e->waiting = req->next;
		if (!e->waiting)
			e->waiting_tail = &e->waiting;
		req->row = row;
		req->weights_version = e->m.weights_version;
		e->running[row] = req;
		e->nrunning++;
	}
}

static double rng_uniform(uint64_t *state)
{
	*state += 0x9e3779b97f4a7c15ull;
	return (double)(mix64(*state - 0x9e3779b97f4a7c15ull) >> 11) / 9007199254740992.0;
}

/* Greedy (temperature 0: the lowest-index maximum) or sampled from softmax(logits / T);
 * ret_lp: the log-probability of the token under the distribution sampled from. */
static uint32_t sample(const float *logits, uint32_t vocab, float temperature, uint64_t *rng,
		       float *ret_lp)
{
	double mx = -DBL_MAX, z = 0.0, t = temperature > 0.0f ? temperature : 1.0, u, acc = 0.0;
	uint32_t best = 0;

	for (uint32_t i = 0; i < vocab; i++)
		if (logits[i] > mx) {
			mx = logits[i];
			best = i;
		}
	for (uint32_t i = 0; i < vocab; i++)
		z += exp((logits[i] - mx) / t);
	if (temperature > 0.0f) {
		u = rng_uniform(rng) * z;
		for (uint32_t i = 0; i < vocab; i++) {
			acc += exp((logits[i] - mx) / t);
			if (acc > u) {
				best = i;
				break;
			}
		}
	}
	*ret_lp = (float)((logits[best] - mx) / t - log(z));
	return best;
}

int sched_step(struct engine *e)
{
	struct model *m = &e->m;
	uint32_t ntok = 0, nrows = 0, nsample = 0, bs = m->block_size;
	struct request *batch[e->o.max_num_seqs];
	struct step_layout sl;
	struct ctl c = {.op = CTL_STEP};
	uint32_t *s = e->step_host;
	int r;

	for (uint32_t i = 0; i < e->o.max_num_seqs; i++)
		if (e->running[i] && e->running[i]->cancelled)
			release(e, e->running[i]);
	admit(e);
	for (uint32_t i = 0; i < e->o.max_num_seqs; i++) {
		struct request *req = e->running[i];

		if (!req || req->finished || ntok + (req->ntok - req->computed) > m->max_tokens)
			continue;
		ntok += req->ntok - req->computed;
		batch[nsample++] = req;
		nrows = i + 1;
	}
	if (nsample == 0)
		return 0;
	step_layout(m, ntok, nrows, nsample, &sl);
	memset(s + sl.block_tables / 4, 0, 4ull * nrows * m->max_blocks);
	ntok = 0;
	for (uint32_t k = 0; k < nsample; k++) {
		struct request *req = batch[k];

		for (uint32_t p = req->computed; p < req->ntok; p++, ntok++) {
			s[sl.tokens / 4 + ntok] = req->tok[p];
			s[sl.prev / 4 + ntok] = p ? req->tok[p - 1] : m->c.vocab;
			s[sl.positions / 4 + ntok] = p;
			s[sl.rows / 4 + ntok] = (uint32_t)req->row;
			s[sl.slots / 4 + ntok] = req->blocks[p / bs] * bs + p % bs;
		}
		s[sl.sample / 4 + k] = ntok - 1;
		for (uint32_t j = 0; j < req->nblocks && j < m->max_blocks; j++)
			s[sl.block_tables / 4 + (uint64_t)req->row * m->max_blocks + j] =
				req->blocks[j];
	}
	c.ntok = ntok;
	c.nrows = nrows;
	c.nsample = nsample;
	r = ctl_run(e, &c);
	if (r < 0)
		return r;
	e->steps++;
	for (uint32_t k = 0; k < nsample; k++) {
		struct request *req = batch[k];
		float lp;
		uint32_t tok = sample(e->logits + (uint64_t)k * m->c.vocab, m->c.vocab,
				      req->temperature, &req->rng, &lp);

		req->computed = req->ntok;
		req->logprob[req->ntok - req->nprompt] = lp;
		req->tok[req->ntok++] = tok;
		if (req->ntok - req->nprompt >= req->max_new)
			req->finished = true;
		req->emit(req);
		req->emitted = req->ntok - req->nprompt;
		if (req->finished || req->cancelled)
			release(e, req);
	}
	return 0;
}
