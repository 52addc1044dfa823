/* SPDX-License-Identifier: MIT */
/*
 * The canary before traffic (issue 22 item 3; review finding 5): the layout check compares only
 * the (class, size) list of the swapped regions, and the content check only the retained
 * memory with itself, so nothing before it says that the promoted group computes what the dead
 * primary computed (tensors placed differently inside a segment, engine state derived from the
 * shadow's dummy weights, memory a peer mapped before the swap). So the supervisor asks.
 *
 * While the primary serves, at each weights version (the shims' version of the weights
 * regions, settled for checksum_settle), it sends the engine a fixed prompt (the engine's
 * canary_prompt token ids, canary_tokens new tokens, greedy) and records the token ids of the
 * answer. At a promotion, once every shadow rank has remapped and before the shadow group is
 * marked primary (so before the gateway routes to it), the promoted group gets the same
 * request on its own port; an answer that differs from the one recorded at the same weights
 * version, an error or no answer within canary_timeout is a cold restart with the reason.
 *
 * The request is SGLang's POST /generate (input_ids, sampling_params) or, for a canary_path of
 * any other path, vLLM's POST /v1/completions (a token-id prompt, return_token_ids); the
 * answer compared is the output_ids / token_ids array. It runs off the loop, in a lane of its
 * own: a hung engine holds up neither the loop nor the NVML and checksum jobs.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct supervisor;
struct sv_engine;
struct metrics_collector;

#define CANARY_ANSWER_MAX 512

/* Per engine (struct sv_engine's canary). */
struct eng_canary {
	bool recorded;			/* answer holds the primary's at version */
	uint64_t version;		/* the weights version it was recorded at */
	char answer[CANARY_ANSWER_MAX]; /* "[id,id,...]" */
	bool pending;			/* a recording runs */
	uint64_t retry_ms;		/* no recording before (after a failed one) */
	bool warned;			/* a failed recording was logged */
	uint64_t last_us;		/* duration of the last canary at a promotion */
	/* Outcomes at promotions (belayer_canary_total) and recordings. */
	uint64_t n_pass, n_mismatch, n_error, n_recorded, n_record_errors;
};

/* Whether canaries run at all ([recovery] canary) for e (it has a shadow). */
bool canary_enabled(const struct supervisor *s, const struct sv_engine *e);
/* The weights version of e's live primary group (the highest of its weights regions); *ret_settled
 * false while one of them changed within checksum_settle. */
uint64_t canary_primary_version(struct supervisor *s, const struct sv_engine *e, bool *ret_settled);
/* Records the primary's answer when the weights version it holds has none (engines_tick). */
void canary_record(struct supervisor *s, struct sv_engine *e);
/* Whether an answer is recorded at the primary's current weights version (promote_armed). */
bool canary_armed(struct supervisor *s, const struct sv_engine *e);
/* The recorded answer says nothing of the group launched now (a cold restart). */
void canary_forget(struct sv_engine *e);
/* Starts the canary of recovery seq against the promoted group on port, for weights version
 * wver; its verdict comes back through promote_canary_done(). 0 or -errno (then nothing was
 * started; *why says what is missing). */
int canary_check(struct supervisor *s, struct sv_engine *e, uint64_t seq, uint32_t port,
		 uint64_t wver, char *why, size_t cap);
/* belayer_canary_* metrics of every engine. */
void canary_collect_metrics(struct supervisor *s, struct metrics_collector *col);

/* Helpers, exposed for the unit test: the request's body for path (/generate: SGLang's, else
 * OpenAI completions'), and the token-id array of an HTTP reply (status 200 with output_ids or
 * token_ids) as "[a,b,...]". 0 or -errno (-EBADMSG: no ids; -EPROTO: not a 200). */
int canary_body(const char *path, const uint32_t *ids, size_t n_ids, uint32_t tokens, char *buf,
		size_t cap);
int canary_parse_reply(const char *reply, size_t len, char *ret_answer, size_t cap);
