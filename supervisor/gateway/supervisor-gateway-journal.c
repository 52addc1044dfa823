/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor-gateway-journal.h"

void gw_journal_init(struct gw_journal *j, size_t max)
{
	*j = (struct gw_journal){.max = max};
}

int gw_journal_set_prompt(struct gw_journal *j, const uint32_t *tok, size_t n)
{
	uint32_t *p;

	if (n > j->max)
		return -E2BIG;
	p = malloc((n ? n : 1) * sizeof(*p));
	if (!p)
		return -ENOMEM;
	memcpy(p, tok, n * sizeof(*p));
	free(j->prompt);
	j->prompt = p;
	j->nprompt = n;
	return 0;
}

int gw_journal_append(struct gw_journal *j, uint32_t tok, float lp)
{
	if (j->nprompt + j->ngen + 1 > j->max)
		return -E2BIG;
	if (j->ngen == j->cap) {
		/* Doubling: a long generation costs O(log n) reallocations, not one per token. */
		size_t cap = j->cap ? j->cap * 2 : 64;
		uint32_t *g;
		float *l;

		if (cap > j->max)
			cap = j->max;
		g = realloc(j->gen, cap * sizeof(*g));
		if (!g)
			return -ENOMEM;
		j->gen = g;
		l = realloc(j->lp, cap * sizeof(*l));
		if (!l)
			return -ENOMEM;
		j->lp = l;
		j->cap = cap;
	}
	j->gen[j->ngen] = tok;
	j->lp[j->ngen] = lp;
	j->ngen++;
	return 0;
}

void gw_journal_finish(struct gw_journal *j)
{
	free(j->prompt);
	free(j->gen);
	free(j->lp);
	gw_journal_init(j, j->max);
}
