/* SPDX-License-Identifier: MIT */
/*
 * What the gateway understands of a token-in/token-out request (SGLang POST /generate with
 * input_ids, OpenAI/vLLM POST /v1/completions with a token-id or text prompt, POST
 * /v1/chat/completions): the request as the client sent it, the body each upstream attempt
 * gets (the first: the client's plus the fields that make the engine report token ids and
 * logprobs; a resumed one: prompt = original prompt + tokens generated so far, the remaining
 * budget, the seed policy's seed), and the rewrite of every response event into what one
 * uninterrupted request would have returned (fields the client did not ask for stripped, counts
 * and ids of the first attempt kept).
 *
 * Text and chat prompts: their token ids are the engine's to make (tokenizer, chat template).
 * The first attempt asks for them (vLLM's return_token_ids) and the journal learns the prompt
 * from the first response's prompt_token_ids. A chat stream resumes through /v1/completions
 * with that token-id prompt (the chat template is in it), its events turned back into chat
 * chunks. An engine that does not return the ids (an older vLLM ignores the field) leaves the
 * request unresumable once anything reached the client, as a passthrough request is.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "supervisor-gateway-journal.h"

struct evbuffer;
struct json_object;

enum gw_api {
	GW_GENERATE,	/* SGLang /generate */
	GW_COMPLETIONS, /* OpenAI /v1/completions */
	GW_CHAT,	/* OpenAI /v1/chat/completions */
};

/* What a resumed sampled request gets as its seed. */
enum gw_seed {
	/* seed' = mix64(seed, tokens generated): a fresh, reproducible stream. The continuation
	 * is a valid sample but not the failure-free run's tokens. */
	GW_SEED_DERIVED = 0,
	/* seed' = seed + n * 0x9e3779b97f4a7c15: exact for an engine whose per-request
	 * generator is that Weyl counter advanced once per sampled token (the engine stand-in);
	 * wrong for any other. */
	GW_SEED_ADVANCE = 1,
	/* the client's seed again: reproducible, not the failure-free run's tokens either */
	GW_SEED_SAME = 2,
};

struct gw_call {
	enum gw_api api;
	struct json_object *body; /* the client's request */
	bool stream;
	bool want_ids; /* completions: the client asked return_token_ids */
	bool want_lp;  /* the client asked logprobs / return_logprob */
	uint64_t max_new;
	int64_t seed;
	bool seeded;
	struct gw_journal j;
	bool finished;	   /* a finish_reason arrived */
	uint32_t attempts; /* upstream bodies built so far */
	uint32_t base_gen; /* tokens generated before the attempt in flight */
	/* completions: the first attempt's id and created time, kept across attempts */
	char id[96];
	int64_t created;
	bool have_id;
	bool prompt_ids_sent;
	/* text and chat prompts */
	bool learn_prompt;  /* the prompt's ids come with the first response */
	bool prompt_known;  /* ... and came */
	bool max_unknown;   /* no budget asked: the engine's default (what the context leaves) */
	bool unresumable;   /* the engine gave no token ids, or the journal bound was crossed */
	bool sent;	    /* an event reached the client */
	bool as_completion; /* chat: the attempt in flight is /v1/completions of the prompt ids */
	int top_logprobs;   /* chat */
};

/* Parses the client's body. 0; -ENOTSUP: not a token-id request of api (the gateway passes
 * it through unresumable); -EBADMSG: malformed (err says why, for a 400); -E2BIG: the prompt
 * exceeds the journal bound (max_tokens). */
int gw_call_parse(struct gw_call *c, enum gw_api api, const char *body, size_t len,
		  size_t max_tokens, char *err, size_t errcap);
void gw_call_finish(struct gw_call *c);
/* The next attempt's body (malloc'ed JSON): the first, or a resumed one. -ENOMEM. */
int gw_call_upstream_body(struct gw_call *c, enum gw_seed seed, char **ret, size_t *ret_len);
/* Tokens still to generate. */
uint64_t gw_call_remaining(const struct gw_call *c);
/* The path the next attempt goes to: the client's, or /v1/completions for a resumed chat. */
const char *gw_call_upstream_uri(const struct gw_call *c, const char *client_uri);
/* After a failed attempt: whether a next one can continue the client's reply (nothing
 * reached the client yet, or the journal holds the prompt and every token sent). */
bool gw_call_resumable(const struct gw_call *c);
/* One response object of the attempt in flight (an SSE event's data, or a whole non-stream
 * body): journals its tokens and appends the client's version to out (an SSE event when
 * streaming, the JSON body otherwise). -EBADMSG: not a response the gateway understands;
 * -E2BIG: the journal bound was crossed. */
int gw_call_on_response(struct gw_call *c, const char *data, size_t len, struct evbuffer *out);
