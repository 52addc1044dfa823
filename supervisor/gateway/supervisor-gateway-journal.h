/* SPDX-License-Identifier: MIT */
/*
 * The gateway's token-prefix journal (DESIGN §1.3): per in-flight request, its prompt tokens
 * and every token generated so far with its logprob, in memory, bounded by a token count.
 * Enough to resubmit the request to a recovered worker as prompt + generated-so-far with the
 * remaining budget. Dropped when the request completes.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gw_journal {
	uint32_t *prompt;
	size_t nprompt;
	uint32_t *gen;
	float *lp; /* logprob of gen[i]; NAN when the engine did not say */
	size_t ngen, cap;
	size_t max; /* prompt + generated tokens kept at most */
};

/* max: the bound on prompt + generated tokens. */
void gw_journal_init(struct gw_journal *j, size_t max);
/* Copies the prompt; -E2BIG past the bound. */
int gw_journal_set_prompt(struct gw_journal *j, const uint32_t *tok, size_t n);
/* Appends one generated token; -E2BIG past the bound (the request is then not resumable). */
int gw_journal_append(struct gw_journal *j, uint32_t tok, float lp);
/* Frees the tokens (the journal can be reused after gw_journal_init). */
void gw_journal_finish(struct gw_journal *j);
