/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>

#include "supervisor-policy-predict.h"

#define COST_PRIOR_FIXED_S 0.020
#define COST_PRIOR_S_PER_B (1.0 / 500e6)

static double absd(double x)
{
	return x < 0 ? -x : x;
}

/* An EWMA step; the first sample replaces the prior instead of being averaged with it. */
static double ewma(double old, double sample, double alpha, uint32_t n)
{
	return n == 0 ? sample : old + alpha * (sample - old);
}

void predict_error_init(struct predict_error *e)
{
	*e = (struct predict_error){.mean = 1.0};
}

void predict_error_update(struct predict_error *e, double predicted, double actual, double alpha)
{
	if (!(actual > 0) || predicted < 0)
		return;
	e->mean = ewma(e->mean, absd(predicted - actual) / actual, alpha, e->n);
	e->n++;
}

void bubble_predictor_init(struct bubble_predictor *p, double alpha)
{
	memset(p, 0, sizeof(*p));
	p->alpha = alpha;
	predict_error_init(&p->err);
}

/* The remaining times (s) of the remembered lengths the pending request has not reached yet,
 * into rem (PREDICT_HISTORY entries); their number, or -errno. */
static int remainders(const struct bubble_predictor *p, const struct bubble_input *in, double *rem)
{
	int n = 0;

	if (!(in->decode_tps > 0))
		return -EINVAL;
	if (p->n_lengths == 0)
		return -ENODATA;
	for (uint32_t i = 0; i < p->n_lengths; i++)
		if (p->lengths[i] > in->tokens_generated)
			rem[n++] = (double)(p->lengths[i] - in->tokens_generated) / in->decode_tps;
	return n;
}

int bubble_predict(const struct bubble_predictor *p, const struct bubble_input *in,
		   double *ret_secs)
{
	double rem[PREDICT_HISTORY], sum = 0;
	int n = remainders(p, in, rem);

	if (n < 0)
		return n;
	for (int i = 0; i < n; i++)
		sum += rem[i];
	*ret_secs = n == 0 ? 0 : sum / n;
	return 0;
}

int bubble_prob_exceeds(const struct bubble_predictor *p, const struct bubble_input *in,
			double secs, double *ret_p)
{
	double rem[PREDICT_HISTORY];
	int n = remainders(p, in, rem), longer = 0;

	if (n < 0)
		return n;
	for (int i = 0; i < n; i++)
		longer += rem[i] > secs;
	*ret_p = n == 0 ? 0 : (double)longer / n;
	return 0;
}

void bubble_observe(struct bubble_predictor *p, uint64_t output_tokens, double predicted_secs,
		    double actual_secs)
{
	p->lengths[p->next] = output_tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)output_tokens;
	p->next = (p->next + 1) % PREDICT_HISTORY;
	if (p->n_lengths < PREDICT_HISTORY)
		p->n_lengths++;
	predict_error_update(&p->err, predicted_secs, actual_secs, p->alpha);
}

void cost_predictor_init(struct cost_predictor *p, double alpha)
{
	*p = (struct cost_predictor){
		.fixed_s = COST_PRIOR_FIXED_S,
		.fs_s_per_b = COST_PRIOR_S_PER_B,
		.dump_s_per_b = COST_PRIOR_S_PER_B,
		.alpha = alpha,
	};
	predict_error_init(&p->err);
}

double cost_predict(const struct cost_predictor *p, uint64_t dirty_bytes, uint64_t mem_bytes)
{
	return p->fixed_s + (double)dirty_bytes * p->fs_s_per_b +
	       (double)mem_bytes * p->dump_s_per_b;
}

void cost_observe(struct cost_predictor *p, const struct cost_sample *s, double predicted_s)
{
	double fixed = s->total_s - s->fs_s - s->dump_s;

	/* Rates only from copies big enough to measure: a few bytes' time is all overhead. */
	if (s->fs_bytes >= 4096)
		p->fs_s_per_b = ewma(p->fs_s_per_b, s->fs_s / (double)s->fs_bytes, p->alpha, p->n);
	if (s->criu_bytes >= 4096)
		p->dump_s_per_b =
			ewma(p->dump_s_per_b, s->dump_s / (double)s->criu_bytes, p->alpha, p->n);
	p->fixed_s = ewma(p->fixed_s, fixed > 0 ? fixed : 0, p->alpha, p->n);
	p->n++;
	predict_error_update(&p->err, predicted_s, s->total_s, p->alpha);
}
