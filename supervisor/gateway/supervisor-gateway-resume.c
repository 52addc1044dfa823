/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "supervisor-gateway-resume.h"
#include "supervisor-gateway-sse.h"
#include "util.h"

#define WEYL 0x9e3779b97f4a7c15ull

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static int bad(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int bad(char *err, size_t cap, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	(void)vsnprintf(err, cap, fmt, ap);
	va_end(ap);
	return -EBADMSG;
}

static json_object *get(json_object *o, const char *key)
{
	json_object *v = NULL;

	return o && json_object_is_type(o, json_type_object) &&
			       json_object_object_get_ex(o, key, &v)
		       ? v
		       : NULL;
}

/* A present, non-null member. */
static bool has(json_object *o, const char *key)
{
	return get(o, key) != NULL;
}

static bool truthy(json_object *v)
{
	return v && json_object_get_boolean(v);
}

/* The client's seed, when it is an integer. */
static void take_seed(struct gw_call *c, json_object *v)
{
	if (v && json_object_is_type(v, json_type_int)) {
		c->seeded = true;
		c->seed = json_object_get_int64(v);
	}
}

/* A chat request the gateway can resume: one choice, no tools, no structured output (a
 * continuation would restart the engine's tool parser or grammar), no echo. The engine
 * validates the rest. */
static int parse_chat(struct gw_call *c, json_object *o)
{
	static const char *const unresumable[] = {"functions",
						  "structured_outputs",
						  "guided_json",
						  "guided_regex",
						  "guided_choice",
						  "guided_grammar",
						  "guided_decoding_backend",
						  NULL};
	json_object *m = get(o, "messages"), *v;

	if (!m || !json_object_is_type(m, json_type_array) || json_object_array_length(m) == 0)
		return -ENOTSUP;
	if ((v = get(o, "n")) && json_object_get_int64(v) != 1)
		return -ENOTSUP;
	if (truthy(get(o, "echo")))
		return -ENOTSUP;
	v = get(o, "tools");
	if (v && (!json_object_is_type(v, json_type_array) || json_object_array_length(v) > 0))
		return -ENOTSUP;
	for (size_t i = 0; unresumable[i]; i++)
		if (has(o, unresumable[i]))
			return -ENOTSUP;
	v = get(get(o, "response_format"), "type");
	if (has(o, "response_format") && (!v || !json_object_is_type(v, json_type_string) ||
					  strcmp(json_object_get_string(v), "text") != 0))
		return -ENOTSUP;
	c->learn_prompt = true;
	c->stream = truthy(get(o, "stream"));
	/* vLLM: max_completion_tokens or the deprecated max_tokens; neither: what the context
	 * leaves after the prompt */
	v = get(o, "max_completion_tokens");
	if (!v)
		v = get(o, "max_tokens");
	if (v && json_object_is_type(v, json_type_int) && json_object_get_int64(v) > 0)
		c->max_new = (uint64_t)json_object_get_int64(v);
	else if (v)
		return -ENOTSUP; /* the engine's 400 */
	else
		c->max_unknown = true;
	c->want_lp = truthy(get(o, "logprobs"));
	v = get(o, "top_logprobs");
	c->top_logprobs = v && json_object_is_type(v, json_type_int)
				  ? (int)MIN(MAX(json_object_get_int64(v), 0), 1000)
				  : 0;
	c->want_ids = truthy(get(o, "return_token_ids"));
	take_seed(c, get(o, "seed"));
	return 0;
}

int gw_call_parse(struct gw_call *c, enum gw_api api, const char *body, size_t len,
		  size_t max_tokens, char *err, size_t errcap)
{
	const char *pkey = api == GW_GENERATE ? "input_ids" : "prompt";
	json_tokener *tok;
	json_object *o, *ids, *sp, *v;
	uint32_t *p;
	size_t n;
	int r;

	*c = (struct gw_call){.api = api};
	gw_journal_init(&c->j, max_tokens);
	tok = json_tokener_new_ex(64);
	if (!tok)
		return -ENOMEM;
	o = json_tokener_parse_ex(tok, body, (int)len);
	if (!o || json_tokener_get_error(tok) != json_tokener_success ||
	    (size_t)json_tokener_get_parse_end(tok) < len) {
		/* Trailing whitespace is fine; anything else after the object is not. */
		size_t end = o ? json_tokener_get_parse_end(tok) : 0;

		while (o && end < len &&
		       (body[end] == ' ' || body[end] == '\n' || body[end] == '\r' ||
			body[end] == '\t'))
			end++;
		if (!o || end < len) {
			json_tokener_free(tok);
			json_object_put(o);
			return bad(err, errcap, "The request body is not valid JSON");
		}
	}
	json_tokener_free(tok);
	if (!json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		return bad(err, errcap, "The request body must be a JSON object");
	}
	c->body = o;
	if (api == GW_CHAT)
		return parse_chat(c, o);
	ids = get(o, pkey);
	/* A text prompt (completions): its ids come with the first response. Batches (a list of
	 * lists or texts) and n > 1 are not resumable by token prefix: passed through as they
	 * are. */
	c->learn_prompt = api == GW_COMPLETIONS && ids &&
			  json_object_is_type(ids, json_type_string) &&
			  json_object_get_string_len(ids) > 0;
	if (!c->learn_prompt &&
	    (!ids || !json_object_is_type(ids, json_type_array) ||
	     json_object_array_length(ids) == 0 ||
	     !json_object_is_type(json_object_array_get_idx(ids, 0), json_type_int)))
		return -ENOTSUP;
	if ((v = get(o, "n")) && json_object_get_int64(v) != 1)
		return -ENOTSUP;
	if (api == GW_COMPLETIONS && (has(o, "echo") || has(o, "best_of") || has(o, "suffix")))
		return -ENOTSUP;
	if (!c->learn_prompt) {
		n = json_object_array_length(ids);
		if (n > max_tokens)
			return -E2BIG;
		p = calloc(n, sizeof(*p));
		if (!p)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++) {
			json_object *t = json_object_array_get_idx(ids, i);
			int64_t x = json_object_get_int64(t);

			if (!json_object_is_type(t, json_type_int) || x < 0 || x > UINT32_MAX) {
				free(p);
				return bad(err, errcap, "\"%s\"[%zu] is not a token id", pkey, i);
			}
			p[i] = (uint32_t)x;
		}
		r = gw_journal_set_prompt(&c->j, p, n);
		free(p);
		if (r < 0)
			return r;
	}
	c->stream = truthy(get(o, "stream"));
	if (api == GW_GENERATE) {
		sp = get(o, "sampling_params");
		/* not an object: the engine's to refuse (a resumed body could not set its fields) */
		if (sp && !json_object_is_type(sp, json_type_object))
			return -ENOTSUP;
		v = get(sp, "max_new_tokens");
		c->max_new = v ? (uint64_t)json_object_get_int64(v) : 128; /* SGLang's default */
		c->want_lp = truthy(get(o, "return_logprob"));
		v = get(sp, "seed");
		/* SGLang spells it sampling_seed too */
		if (!v)
			v = get(sp, "sampling_seed");
	} else {
		v = get(o, "max_tokens");
		c->max_new = v ? (uint64_t)json_object_get_int64(v) : 16; /* OpenAI's default */
		/* null: vLLM's default, what the context leaves after the prompt */
		c->max_unknown = !v && json_object_object_get_ex(o, "max_tokens", NULL);
		c->want_lp = has(o, "logprobs");
		c->want_ids = truthy(get(o, "return_token_ids"));
		v = get(o, "seed");
	}
	take_seed(c, v);
	return 0;
}

void gw_call_finish(struct gw_call *c)
{
	json_object_put(c->body);
	c->body = NULL;
	gw_journal_finish(&c->j);
}

uint64_t gw_call_remaining(const struct gw_call *c)
{
	return c->max_new > c->j.ngen ? c->max_new - c->j.ngen : 0;
}

const char *gw_call_upstream_uri(const struct gw_call *c, const char *client_uri)
{
	return c->as_completion ? "/v1/completions" : client_uri;
}

bool gw_call_resumable(const struct gw_call *c)
{
	if (!c->sent)
		return true; /* sent again whole */
	return !c->unresumable && c->j.max && (!c->learn_prompt || c->prompt_known);
}

static int64_t resumed_seed(const struct gw_call *c, enum gw_seed mode)
{
	switch (mode) {
	case GW_SEED_ADVANCE:
		return (int64_t)((uint64_t)c->seed + (uint64_t)c->j.ngen * WEYL);
	case GW_SEED_SAME:
		return c->seed;
	case GW_SEED_DERIVED:
	default:
		/* kept within int64's positive range: engines parse the seed as a signed int */
		return (int64_t)(mix64((uint64_t)c->seed ^ mix64(c->j.ngen)) >> 1);
	}
}

static json_object *ids_array(const uint32_t *t, size_t n);

/* A chat stream resumed: /v1/completions of the prompt's ids (the chat template applied) and
 * those generated so far, with the client's sampling fields, the remaining budget (null, the
 * engine's default, when the client asked none: vLLM's get_max_tokens gives what the context
 * leaves) and chat's logprobs as completions' top-k count. */
static json_object *chat_resume_body(const struct gw_call *c)
{
	static const char *const keep[] = {"model",
					   "temperature",
					   "top_p",
					   "top_k",
					   "min_p",
					   "stop",
					   "stop_token_ids",
					   "ignore_eos",
					   "skip_special_tokens",
					   "spaces_between_special_tokens",
					   "include_stop_str_in_output",
					   "presence_penalty",
					   "frequency_penalty",
					   "repetition_penalty",
					   "logit_bias",
					   "bad_words",
					   "allowed_token_ids",
					   "user",
					   "n",
					   "priority",
					   "stream",
					   "stream_options",
					   "seed",
					   NULL};
	json_object *o = json_object_new_object(), *v, *ids;

	if (!o)
		return NULL;
	for (size_t i = 0; keep[i]; i++)
		if (json_object_object_get_ex(c->body, keep[i], &v))
			json_object_object_add(o, keep[i], json_object_get(v));
	ids = json_object_new_array_ext((int)(c->j.nprompt + c->j.ngen));
	for (size_t i = 0; ids && i < c->j.nprompt; i++)
		json_object_array_add(ids, json_object_new_int64(c->j.prompt[i]));
	for (size_t i = 0; ids && i < c->j.ngen; i++)
		json_object_array_add(ids, json_object_new_int64(c->j.gen[i]));
	json_object_object_add(o, "prompt", ids);
	json_object_object_add(
		o, "max_tokens",
		c->max_unknown ? NULL : json_object_new_int64((int64_t)gw_call_remaining(c)));
	if ((v = get(c->body, "min_tokens")) && json_object_is_type(v, json_type_int))
		json_object_object_add(o, "min_tokens",
				       json_object_new_int64(MAX(
					       json_object_get_int64(v) - (int64_t)c->j.ngen, 0)));
	json_object_object_add(o, "return_token_ids", json_object_new_boolean(true));
	if (c->want_lp)
		json_object_object_add(o, "logprobs", json_object_new_int(c->top_logprobs));
	return o;
}

int gw_call_upstream_body(struct gw_call *c, enum gw_seed seed, char **ret, size_t *ret_len)
{
	json_object *o = NULL, *ids, *sp;
	const char *s;
	size_t len;
	int r = -ENOMEM;

	/* a text or chat prompt whose ids are unknown is sent again whole */
	if (c->learn_prompt && !c->prompt_known)
		c->j.ngen = 0;
	c->as_completion = c->api == GW_CHAT && c->prompt_known;
	if (c->as_completion) {
		o = chat_resume_body(c);
		if (!o)
			return -ENOMEM;
		if (c->seeded && c->j.ngen > 0)
			json_object_object_add(o, "seed",
					       json_object_new_int64(resumed_seed(c, seed)));
	} else if (json_object_deep_copy(c->body, &o, NULL) < 0) {
		return -ENOMEM;
	}
	if (c->as_completion) {
		/* built whole above */
	} else if (c->api == GW_GENERATE) {
		/* output_ids always come with /generate; their logprobs on request */
		json_object_object_add(o, "return_logprob", json_object_new_boolean(true));
	} else {
		json_object_object_add(o, "return_token_ids", json_object_new_boolean(true));
		if (!c->want_lp && c->api == GW_COMPLETIONS)
			json_object_object_add(o, "logprobs", json_object_new_int(0));
	}
	if (c->j.ngen > 0 && !c->as_completion) {
		ids = json_object_new_array_ext((int)(c->j.nprompt + c->j.ngen));
		if (!ids)
			goto out;
		for (size_t i = 0; i < c->j.nprompt; i++)
			json_object_array_add(ids, json_object_new_int64(c->j.prompt[i]));
		for (size_t i = 0; i < c->j.ngen; i++)
			json_object_array_add(ids, json_object_new_int64(c->j.gen[i]));
		json_object_object_add(o, c->api == GW_GENERATE ? "input_ids" : "prompt", ids);
		if (c->api == GW_GENERATE) {
			sp = get(o, "sampling_params");
			if (!sp) {
				sp = json_object_new_object();
				json_object_object_add(o, "sampling_params", sp);
			}
			json_object_object_add(
				sp, "max_new_tokens",
				json_object_new_int64((int64_t)gw_call_remaining(c)));
			if (c->seeded)
				json_object_object_add(
					sp, has(sp, "seed") ? "seed" : "sampling_seed",
					json_object_new_int64(resumed_seed(c, seed)));
		} else {
			json_object_object_add(
				o, "max_tokens",
				c->max_unknown
					? NULL
					: json_object_new_int64((int64_t)gw_call_remaining(c)));
			if (c->seeded)
				json_object_object_add(
					o, "seed", json_object_new_int64(resumed_seed(c, seed)));
		}
	}
	s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
	len = strlen(s);
	*ret = malloc(len + 1);
	if (!*ret)
		goto out;
	memcpy(*ret, s, len + 1);
	*ret_len = len;
	c->base_gen = (uint32_t)c->j.ngen;
	c->attempts++;
	r = 0;
out:
	json_object_put(o);
	return r;
}

static json_object *ids_array(const uint32_t *t, size_t n)
{
	json_object *a = json_object_new_array_ext((int)n);

	for (size_t i = 0; a && i < n; i++)
		json_object_array_add(a, json_object_new_int64(t[i]));
	return a;
}

static int journal_ids(struct gw_call *c, json_object *ids, json_object *lps, bool sglang)
{
	size_t n;
	int r;

	if (!ids || !json_object_is_type(ids, json_type_array))
		return -EBADMSG;
	n = json_object_array_length(ids);
	/* A non-stream attempt returns everything it generated; the journal holds only what
	 * earlier attempts added (nothing: a non-stream attempt is resubmitted whole). */
	for (size_t i = 0; i < n; i++) {
		json_object *t = json_object_array_get_idx(ids, i), *l = NULL;
		int64_t x = json_object_get_int64(t);
		float lp = NAN;

		if (!json_object_is_type(t, json_type_int) || x < 0 || x > UINT32_MAX)
			return -EBADMSG;
		if (lps && json_object_is_type(lps, json_type_array) &&
		    i < json_object_array_length(lps)) {
			l = json_object_array_get_idx(lps, i);
			/* SGLang: (logprob, token_id, text) triples; OpenAI: plain numbers */
			if (sglang && json_object_is_type(l, json_type_array))
				l = json_object_array_get_idx(l, 0);
			if (l && (json_object_is_type(l, json_type_double) ||
				  json_object_is_type(l, json_type_int)))
				lp = (float)json_object_get_double(l);
		}
		r = gw_journal_append(&c->j, (uint32_t)x, lp);
		if (r < 0)
			return r;
	}
	return 0;
}

static int rewrite_generate(struct gw_call *c, json_object *o)
{
	json_object *meta = get(o, "meta_info"), *fr;
	int r;

	r = journal_ids(c, get(o, "output_ids"), get(meta, "output_token_logprobs"), true);
	if (r < 0)
		return r;
	if (!meta || !json_object_is_type(meta, json_type_object))
		return 0;
	if (has(meta, "prompt_tokens"))
		json_object_object_add(meta, "prompt_tokens",
				       json_object_new_int64((int64_t)c->j.nprompt));
	if (has(meta, "completion_tokens"))
		json_object_object_add(meta, "completion_tokens",
				       json_object_new_int64((int64_t)c->j.ngen));
	fr = get(meta, "finish_reason");
	if (fr) {
		c->finished = true;
		if (has(fr, "length"))
			json_object_object_add(fr, "length",
					       json_object_new_int64((int64_t)c->j.ngen));
	}
	if (!c->want_lp) {
		json_object_object_del(meta, "output_token_logprobs");
		json_object_object_del(meta, "input_token_logprobs");
	}
	return 0;
}

/* One response: the first attempt's id and creation time throughout. */
static void keep_id(struct gw_call *c, json_object *o)
{
	json_object *v;

	if (!c->have_id) {
		if ((v = get(o, "id")) && json_object_is_type(v, json_type_string))
			snprintf(c->id, sizeof(c->id), "%s", json_object_get_string(v));
		if ((v = get(o, "created")))
			c->created = json_object_get_int64(v);
		c->have_id = true;
	} else {
		if (has(o, "id"))
			json_object_object_add(o, "id", json_object_new_string(c->id));
		if (has(o, "created"))
			json_object_object_add(o, "created", json_object_new_int64(c->created));
	}
}

/* usage (every non-stream body; a stream's last event with stream_options.include_usage, or
 * every event with continuous_usage_stats) describes the response as the client sees it: its
 * prompt and every token it got so far, not the resumed attempt's longer prompt and shorter
 * completion. */
static void rewrite_usage(struct gw_call *c, json_object *o)
{
	json_object *u = get(o, "usage");

	/* a prompt whose ids never came: the engine's counts are the client's (one attempt) */
	if (!u || !json_object_is_type(u, json_type_object) ||
	    (c->learn_prompt && !c->prompt_known))
		return;
	json_object_object_add(u, "prompt_tokens", json_object_new_int64((int64_t)c->j.nprompt));
	json_object_object_add(u, "completion_tokens", json_object_new_int64((int64_t)c->j.ngen));
	json_object_object_add(u, "total_tokens",
			       json_object_new_int64((int64_t)(c->j.nprompt + c->j.ngen)));
}

/* The prompt's ids, from the first response of a text or chat prompt. Ids the journal cannot
 * hold leave the request unresumable, served on. */
static void learn_prompt(struct gw_call *c, json_object *ids)
{
	size_t n;
	uint32_t *p;

	if (!c->learn_prompt || c->prompt_known || c->unresumable)
		return;
	if (!ids || !json_object_is_type(ids, json_type_array) ||
	    (n = json_object_array_length(ids)) == 0) {
		c->unresumable = true;
		return;
	}
	p = calloc(n, sizeof(*p));
	for (size_t i = 0; p && i < n; i++) {
		json_object *t = json_object_array_get_idx(ids, i);
		int64_t x = json_object_get_int64(t);

		if (!json_object_is_type(t, json_type_int) || x < 0 || x > UINT32_MAX) {
			free(p);
			p = NULL;
		} else {
			p[i] = (uint32_t)x;
		}
	}
	if (p && gw_journal_set_prompt(&c->j, p, n) == 0)
		c->prompt_known = true;
	else
		c->unresumable = true;
	free(p);
}

/* Journals a choice's token ids. A text or chat prompt's engine may not return them (an older
 * vLLM ignores return_token_ids): the request is then served on unresumable. */
static int journal_choice(struct gw_call *c, json_object *ids, json_object *lps)
{
	int r;

	if (c->learn_prompt && (!ids || !json_object_is_type(ids, json_type_array))) {
		c->unresumable = true;
		return 0;
	}
	r = journal_ids(c, ids, lps, false);
	if (r == -E2BIG && c->learn_prompt) {
		c->unresumable = true; /* past the journal bound: served on */
		return 0;
	}
	return r < 0 ? -EBADMSG : 0;
}

/* An OpenAI response's one choice in *ret; NULL for vLLM's usage event (choices [], usage:
 * tokens and finish came before it), which is rewritten here. */
static int one_choice(struct gw_call *c, json_object *o, json_object **ret)
{
	json_object *ch = get(o, "choices");

	*ret = NULL;
	if (!ch || !json_object_is_type(ch, json_type_array))
		return -EBADMSG;
	if (json_object_array_length(ch) == 0) {
		if (!c->stream || !json_object_is_type(get(o, "usage"), json_type_object))
			return -EBADMSG;
		keep_id(c, o);
		rewrite_usage(c, o);
		return 0;
	}
	if (json_object_array_length(ch) != 1)
		return -EBADMSG;
	*ret = json_object_array_get_idx(ch, 0);
	return json_object_is_type(*ret, json_type_object) ? 0 : -EBADMSG;
}

static int rewrite_completion(struct gw_call *c, json_object *o)
{
	json_object *ch, *lp;
	int r = one_choice(c, o, &ch);

	if (r < 0 || !ch)
		return r;
	learn_prompt(c, get(ch, "prompt_token_ids"));
	lp = get(ch, "logprobs");
	if (journal_choice(c, get(ch, "token_ids"), get(lp, "token_logprobs")) < 0)
		return -EBADMSG;
	if (has(ch, "finish_reason"))
		c->finished = true;
	keep_id(c, o);
	if (!c->want_ids) {
		json_object_object_del(ch, "token_ids");
		json_object_object_del(ch, "prompt_token_ids");
	} else if (has(ch, "prompt_token_ids")) {
		if (c->stream && c->prompt_ids_sent)
			json_object_object_del(ch, "prompt_token_ids");
		else if (!c->learn_prompt || c->prompt_known)
			json_object_object_add(ch, "prompt_token_ids",
					       ids_array(c->j.prompt, c->j.nprompt));
		c->prompt_ids_sent = true;
	}
	if (!c->want_lp && json_object_object_get_ex(ch, "logprobs", NULL))
		json_object_object_add(ch, "logprobs", NULL);
	rewrite_usage(c, o);
	return 0;
}

/* A member the engine sent, set to null: vLLM sends the fields it was not asked for as null. */
static void nulled(json_object *o, const char *key)
{
	if (json_object_object_get_ex(o, key, NULL))
		json_object_object_add(o, key, NULL);
}

/* A chat attempt's chunk (or body): the prompt's ids learned from the first, the tokens
 * journaled, the ids the client did not ask for null. */
static int rewrite_chat(struct gw_call *c, json_object *o)
{
	json_object *ch, *d;
	int r;

	learn_prompt(c, get(o, "prompt_token_ids"));
	if (!c->want_ids)
		nulled(o, "prompt_token_ids");
	r = one_choice(c, o, &ch);
	if (r < 0 || !ch)
		return r;
	d = get(ch, c->stream ? "delta" : "message");
	if (!d || !json_object_is_type(d, json_type_object))
		return -EBADMSG;
	/* the stream's first chunk (the role, no tokens) */
	if (!(c->stream && has(d, "role") && !has(ch, "token_ids")) &&
	    journal_choice(c, get(ch, "token_ids"), NULL) < 0)
		return -EBADMSG;
	if (!c->want_ids)
		nulled(ch, "token_ids");
	if (has(ch, "finish_reason"))
		c->finished = true;
	keep_id(c, o);
	rewrite_usage(c, o);
	return 0;
}

/* The UTF-8 bytes of s, as chat's logprobs spell them. */
static json_object *bytes_of(const char *s)
{
	json_object *a = json_object_new_array();

	for (; a && *s; s++)
		json_object_array_add(a, json_object_new_int((uint8_t)*s));
	return a;
}

static json_object *chat_logprob(const char *token, json_object *lp)
{
	json_object *e = json_object_new_object();

	json_object_object_add(e, "token", json_object_new_string(token));
	json_object_object_add(e, "logprob", json_object_get(lp));
	json_object_object_add(e, "bytes", bytes_of(token));
	return e;
}

/* Completions' logprobs ({tokens, token_logprobs, top_logprobs: [{token: logprob}]}) in chat's
 * shape ({"content": [{token, logprob, bytes, top_logprobs}]}), the first top_logprobs entries
 * of each step's alternatives kept. */
static json_object *chat_logprobs_of(const struct gw_call *c, json_object *lp)
{
	json_object *toks = get(lp, "tokens"), *vals = get(lp, "token_logprobs");
	json_object *tops = get(lp, "top_logprobs"), *out, *content;
	size_t n;

	if (!json_object_is_type(toks, json_type_array) ||
	    !json_object_is_type(vals, json_type_array))
		return NULL;
	n = MIN(json_object_array_length(toks), json_object_array_length(vals));
	out = json_object_new_object();
	content = json_object_new_array_ext((int)n);
	for (size_t i = 0; content && i < n; i++) {
		json_object *t = json_object_array_get_idx(toks, i), *e, *alts;
		json_object *top = json_object_is_type(tops, json_type_array)
					   ? json_object_array_get_idx(tops, i)
					   : NULL;
		int k = 0;

		e = chat_logprob(
			json_object_is_type(t, json_type_string) ? json_object_get_string(t) : "",
			json_object_array_get_idx(vals, i));
		alts = json_object_new_array();
		if (json_object_is_type(top, json_type_object)) {
			json_object_object_foreach(top, key, val)
			{
				if (k++ >= c->top_logprobs)
					break;
				json_object_array_add(alts, chat_logprob(key, val));
			}
		}
		json_object_object_add(e, "top_logprobs", alts);
		json_object_array_add(content, e);
	}
	json_object_object_add(out, "content", content);
	return out;
}

/* A resumed chat stream's /v1/completions event as the chat chunk vLLM would have sent: the
 * first attempt's id and created, delta {"content": text} (never the role again), chat's
 * logprobs, token_ids, finish_reason (with stop_reason), usage for the whole response. */
static int chat_from_completion(struct gw_call *c, json_object *o, json_object **ret)
{
	json_object *ch = get(o, "choices"), *out, *choices, *nc, *delta, *v;
	bool last;

	if (!ch || !json_object_is_type(ch, json_type_array) || json_object_array_length(ch) > 1)
		return -EBADMSG;
	out = json_object_new_object();
	choices = json_object_new_array();
	if (!out || !choices) {
		json_object_put(out);
		json_object_put(choices);
		return -ENOMEM;
	}
	json_object_object_add(out, "id", json_object_new_string(c->id));
	json_object_object_add(out, "object", json_object_new_string("chat.completion.chunk"));
	json_object_object_add(out, "created", json_object_new_int64(c->created));
	v = get(o, "model");
	json_object_object_add(out, "model", json_object_get(v));
	json_object_object_add(out, "choices", choices);
	*ret = out;
	if (json_object_array_length(ch) == 0) {
		/* the usage event */
		if (!json_object_is_type(get(o, "usage"), json_type_object))
			return -EBADMSG;
		json_object_object_add(out, "usage", json_object_get(get(o, "usage")));
		rewrite_usage(c, out);
		return 0;
	}
	ch = json_object_array_get_idx(ch, 0);
	if (!json_object_is_type(ch, json_type_object) ||
	    journal_choice(c, get(ch, "token_ids"), NULL) < 0)
		return -EBADMSG;
	nc = json_object_new_object();
	delta = json_object_new_object();
	json_object_array_add(choices, nc);
	json_object_object_add(nc, "index", json_object_new_int(0));
	v = get(ch, "text");
	json_object_object_add(delta, "content",
			       v && json_object_is_type(v, json_type_string)
				       ? json_object_get(v)
				       : json_object_new_string(""));
	json_object_object_add(nc, "delta", delta);
	json_object_object_add(nc, "logprobs",
			       c->want_lp ? chat_logprobs_of(c, get(ch, "logprobs")) : NULL);
	v = get(ch, "finish_reason");
	last = v != NULL;
	json_object_object_add(nc, "finish_reason", json_object_get(v));
	if (last) {
		c->finished = true;
		json_object_object_add(nc, "stop_reason", json_object_get(get(ch, "stop_reason")));
	}
	json_object_object_add(nc, "token_ids",
			       c->want_ids ? json_object_get(get(ch, "token_ids")) : NULL);
	if ((v = get(o, "usage"))) {
		json_object_object_add(out, "usage", json_object_get(v));
		rewrite_usage(c, out);
	}
	return 0;
}

int gw_call_on_response(struct gw_call *c, const char *data, size_t len, struct evbuffer *out)
{
	json_tokener *tok = json_tokener_new_ex(64);
	json_object *o;
	const char *s;
	int r;

	if (!tok)
		return -ENOMEM;
	o = json_tokener_parse_ex(tok, data, (int)len);
	json_tokener_free(tok);
	if (!o || !json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		return -EBADMSG;
	}
	if (c->as_completion) {
		json_object *chunk = NULL;

		r = chat_from_completion(c, o, &chunk);
		json_object_put(o);
		o = chunk;
	} else {
		r = c->api == GW_GENERATE ? rewrite_generate(c, o)
		    : c->api == GW_CHAT	  ? rewrite_chat(c, o)
					  : rewrite_completion(c, o);
	}
	if (r >= 0) {
		c->sent = true;
		s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
		if (c->stream)
			r = gw_sse_write(out, s, strlen(s));
		else
			r = evbuffer_add(out, s, strlen(s)) < 0 || evbuffer_add(out, "\n", 1) < 0
				    ? -ENOMEM
				    : 0;
	}
	json_object_put(o);
	return r;
}
