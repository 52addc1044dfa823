/* SPDX-License-Identifier: MIT */
/*
 * The HTTP API on rank 0 (libevent's evhttp, JSON with json-c), token in / token out:
 *   POST /generate                 SGLang: input_ids, sampling_params, stream, return_logprob
 *   POST /v1/completions           OpenAI/vLLM: prompt as token ids, max_tokens, stream, ...
 *   GET  /health, GET /v1/models
 * and the server with its routes; weights and debug endpoints are in engine-http-admin.c.
 * Requests are validated strictly (unknown fields, wrong types, over-long prompts: 400) and
 * a rejected request never disturbs the others. Streams are server-sent events.
 */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "engine.h"
#include "engine-http.h"
#include "engine-kernels.h"
#include "engine-text.h"
#include "log.h"
#include "util.h"

#define BODY_MAX	      (8u << 20)
#define ENGINE_LISTEN_BACKLOG 2048 /* uvicorn's default */

enum api {
	API_GENERATE,
	API_COMPLETIONS,
	API_CHAT, /* OpenAI/vLLM /v1/chat/completions */
};

/* One HTTP request being served by a struct request. */
enum {
	USAGE_LAST = 1 << 0,
	USAGE_CONTINUOUS = 1 << 1,
};

struct job {
	struct engine *e;
	struct evhttp_request *hreq;
	bool closed; /* the client went away: evhttp detached hreq, ending it frees it */
	enum api api;
	bool stream, logprobs, return_token_ids;
	/* stream_options, as vLLM: include_usage adds a last event {"choices": [], "usage"}
	 * before [DONE]; continuous_usage_stats adds usage (so far) to every event too */
	bool usage, continuous_usage;
	bool skip_special; /* vLLM's skip_special_tokens (true): special ids decode to "" */
	time_t created;
	struct event *eof; /* non-stream: the client closing (evhttp reads nothing meanwhile) */
};

void send_json(struct evhttp_request *hreq, int code, json_object *o)
{
	struct evbuffer *b = evbuffer_new();
	const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);

	evhttp_add_header(evhttp_request_get_output_headers(hreq), "Content-Type",
			  "application/json");
	if (b) {
		evbuffer_add(b, s, strlen(s));
		evbuffer_add(b, "\n", 1);
	}
	evhttp_send_reply(hreq, code, code == 200 ? "OK" : "Error", b);
	if (b)
		evbuffer_free(b);
	json_object_put(o);
}

void send_error(struct evhttp_request *hreq, int code, const char *fmt, ...)
{
	json_object *o = json_object_new_object(), *err = json_object_new_object();
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* vLLM's shape: {"error": {"message", "type", "code"}}; SGLang clients read "message" */
	json_object_object_add(err, "message", json_object_new_string(msg));
	json_object_object_add(
		err, "type",
		json_object_new_string(code == 404 ? "NotFoundError" : "BadRequestError"));
	json_object_object_add(err, "code", json_object_new_int(code));
	json_object_object_add(o, "error", err);
	send_json(hreq, code, o);
}

/* The request body parsed as a JSON object, or NULL after replying 400. */
json_object *body_json(struct evhttp_request *hreq)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(hreq);
	size_t len = evbuffer_get_length(in);
	json_tokener *tok;
	json_object *o;
	char *p;

	if (evhttp_request_get_command(hreq) != EVHTTP_REQ_POST) {
		send_error(hreq, 405, "Method not allowed: use POST");
		return NULL;
	}
	if (len > BODY_MAX) {
		send_error(hreq, 400, "Request body larger than %u bytes", BODY_MAX);
		return NULL;
	}
	p = (char *)evbuffer_pullup(in, (ssize_t)len);
	tok = json_tokener_new();
	if (!tok) {
		send_error(hreq, 500, "Out of memory");
		return NULL;
	}
	o = len ? json_tokener_parse_ex(tok, p, (int)len) : NULL;
	if (o && json_tokener_get_parse_end(tok) < len) {
		/* trailing garbage after the object */
		size_t end = json_tokener_get_parse_end(tok);

		while (end < len &&
		       (p[end] == ' ' || p[end] == '\n' || p[end] == '\r' || p[end] == '\t'))
			end++;
		if (end < len) {
			json_object_put(o);
			o = NULL;
		}
	}
	json_tokener_free(tok);
	if (!o) {
		send_error(hreq, 400, "Malformed JSON in the request body");
		return NULL;
	}
	if (!json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		send_error(hreq, 400, "The request body must be a JSON object");
		return NULL;
	}
	return o;
}

/* Rejects fields outside allowed (a NULL-terminated list): true when all are known. */
bool known_fields(struct evhttp_request *hreq, json_object *o, const char *what,
		  const char *const *allowed)
{
	json_object_object_foreach(o, key, val)
	{
		bool ok = false;

		(void)val;
		for (size_t i = 0; allowed[i]; i++)
			ok = ok || strcmp(key, allowed[i]) == 0;
		if (!ok) {
			send_error(hreq, 400, "Unknown field \"%s\" in %s", key, what);
			return false;
		}
	}
	return true;
}

/* Field helpers: absent -> default kept; wrong type or range -> 400 and false. */
bool get_int(struct evhttp_request *hreq, json_object *o, const char *key, int64_t lo, int64_t hi,
	     int64_t *v)
{
	json_object *f;

	if (!json_object_object_get_ex(o, key, &f) || json_object_is_type(f, json_type_null))
		return true;
	if (!json_object_is_type(f, json_type_int)) {
		send_error(hreq, 400, "\"%s\" must be an integer", key);
		return false;
	}
	errno = 0;
	*v = json_object_get_int64(f);
	if (errno || *v < lo || *v > hi) {
		send_error(hreq, 400, "\"%s\" must be in [%" PRId64 ", %" PRId64 "]", key, lo, hi);
		return false;
	}
	return true;
}

bool get_num(struct evhttp_request *hreq, json_object *o, const char *key, double lo, double hi,
	     double *v)
{
	json_object *f;

	if (!json_object_object_get_ex(o, key, &f) || json_object_is_type(f, json_type_null))
		return true;
	if (!json_object_is_type(f, json_type_int) && !json_object_is_type(f, json_type_double)) {
		send_error(hreq, 400, "\"%s\" must be a number", key);
		return false;
	}
	*v = json_object_get_double(f);
	if (!(*v >= lo && *v <= hi)) {
		send_error(hreq, 400, "\"%s\" must be in [%g, %g]", key, lo, hi);
		return false;
	}
	return true;
}

bool get_bool(struct evhttp_request *hreq, json_object *o, const char *key, bool *v)
{
	json_object *f;

	if (!json_object_object_get_ex(o, key, &f) || json_object_is_type(f, json_type_null))
		return true;
	if (!json_object_is_type(f, json_type_boolean)) {
		send_error(hreq, 400, "\"%s\" must be true or false", key);
		return false;
	}
	*v = json_object_get_boolean(f);
	return true;
}

const char *get_str(struct evhttp_request *hreq, json_object *o, const char *key, bool required)
{
	json_object *f;

	if (!json_object_object_get_ex(o, key, &f) || json_object_is_type(f, json_type_null)) {
		if (required)
			send_error(hreq, 400, "Missing field \"%s\"", key);
		return required ? NULL : "";
	}
	if (!json_object_is_type(f, json_type_string)) {
		send_error(hreq, 400, "\"%s\" must be a string", key);
		return NULL;
	}
	return json_object_get_string(f);
}

/* A validated prompt of n ids (within the vocabulary) and its budget as a request. */
static struct request *new_request(struct engine *e, struct evhttp_request *hreq,
				   const uint32_t *tok, size_t n, int64_t max_new,
				   double temperature, int64_t seed, bool seeded)
{
	const struct model_config *c = &e->m.c;
	struct request *req;

	if (n + (uint64_t)max_new > c->max_pos) {
		send_error(hreq, 400,
			   "This model's maximum context length is %u tokens. However, you "
			   "requested %zu tokens (%zu in the prompt, %" PRId64 " to generate).",
			   c->max_pos, n + (size_t)max_new, n, max_new);
		return NULL;
	}
	if ((n + (uint64_t)max_new + e->m.block_size - 1) / e->m.block_size > e->m.num_blocks) {
		send_error(hreq, 400, "Request needs more KV cache than the engine has");
		return NULL;
	}
	req = calloc(1, sizeof(*req));
	if (req) {
		req->tok = calloc(n + (size_t)max_new, sizeof(uint32_t));
		req->logprob = calloc((size_t)max_new, sizeof(float));
	}
	if (!req || !req->tok || !req->logprob) {
		request_free(req);
		send_error(hreq, 500, "Out of memory");
		return NULL;
	}
	memcpy(req->tok, tok, n * sizeof(*tok));
	req->nprompt = req->ntok = (uint32_t)n;
	req->max_new = (uint32_t)max_new;
	req->temperature = (float)temperature;
	req->rng = seeded ? (uint64_t)seed : mix64((uint64_t)time(NULL) ^ (e->next_id << 20));
	return req;
}

/* A prompt of token ids (a non-empty list within the vocabulary) into tok (max_pos ids at
 * most): its length, or 0 after a 400. */
static size_t prompt_ids(struct engine *e, struct evhttp_request *hreq, json_object *ids,
			 const char *key, uint32_t *tok)
{
	const struct model_config *c = &e->m.c;
	size_t n;

	if (!ids) {
		send_error(hreq, 400, "Missing field \"%s\" (a list of token ids)", key);
		return 0;
	}
	if (!json_object_is_type(ids, json_type_array)) {
		send_error(hreq, 400, "\"%s\" must be a list of token ids", key);
		return 0;
	}
	n = json_object_array_length(ids);
	if (n == 0) {
		send_error(hreq, 400, "\"%s\" must not be empty", key);
		return 0;
	}
	if (n > c->max_pos) {
		send_error(hreq, 400,
			   "This model's maximum context length is %u tokens. However, your "
			   "prompt has %zu tokens.",
			   c->max_pos, n);
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		json_object *t = json_object_array_get_idx(ids, i);
		int64_t v = json_object_get_int64(t);

		if (!json_object_is_type(t, json_type_int) || v < 0 || v >= c->vocab) {
			send_error(hreq, 400, "\"%s\"[%zu] is not a token id in [0, %u)", key, i,
				   c->vocab);
			return 0;
		}
		tok[i] = (uint32_t)v;
	}
	return n;
}

/* The ids of a token-id prompt, or of a text prompt through the tokenizer: 0 after a 400. */
static size_t prompt_any(struct engine *e, struct evhttp_request *hreq, json_object *p,
			 const char *key, uint32_t *tok)
{
	size_t n = 0;

	if (!p || !json_object_is_type(p, json_type_string))
		return prompt_ids(e, hreq, p, key, tok);
	if (e->m.c.vocab < TEXT_VOCAB_MIN) {
		send_error(hreq, 400,
			   "This model has no tokenizer (vocab_size < %u): send token ids",
			   TEXT_VOCAB_MIN);
		return 0;
	}
	if (text_encode(json_object_get_string(p), (size_t)json_object_get_string_len(p), tok,
			e->m.c.max_pos, &n) < 0) {
		send_error(hreq, 400,
			   "This model's maximum context length is %u tokens. However, "
			   "your prompt is longer.",
			   e->m.c.max_pos);
		return 0;
	}
	if (n == 0)
		send_error(hreq, 400, "\"%s\" must not be empty", key);
	return n;
}

/* ---- responses ---- */

json_object *ids_array(const uint32_t *tok, uint32_t n)
{
	json_object *a = json_object_new_array();

	for (uint32_t i = 0; i < n; i++)
		json_object_array_add(a, json_object_new_int64(tok[i]));
	return a;
}

static json_object *generate_body(struct request *req, uint32_t from, uint32_t to, bool final,
				  const struct job *j)
{
	json_object *o = json_object_new_object(), *meta = json_object_new_object();
	uint32_t gen = req->ntok - req->nprompt;

	json_object_object_add(o, "text", json_object_new_string(""));
	json_object_object_add(o, "output_ids",
			       ids_array(req->tok + req->nprompt + from, to - from));
	json_object_object_add(meta, "id", json_object_new_string_len("", 0));
	json_object_object_add(meta, "prompt_tokens", json_object_new_int64(req->nprompt));
	json_object_object_add(meta, "completion_tokens", json_object_new_int64(gen));
	if (final) {
		json_object *fr = json_object_new_object();

		json_object_object_add(fr, "type", json_object_new_string("length"));
		json_object_object_add(fr, "length", json_object_new_int64(gen));
		json_object_object_add(meta, "finish_reason", fr);
	} else {
		json_object_object_add(meta, "finish_reason", NULL);
	}
	if (j->logprobs) {
		json_object *lps = json_object_new_array();

		/* SGLang's (logprob, token_id, text) triples */
		for (uint32_t i = from; i < to; i++) {
			json_object *t = json_object_new_array();

			json_object_array_add(t, json_object_new_double(req->logprob[i]));
			json_object_array_add(t, json_object_new_int64(req->tok[req->nprompt + i]));
			json_object_array_add(t, NULL);
			json_object_array_add(lps, t);
		}
		json_object_object_add(meta, "output_token_logprobs", lps);
	}
	json_object_object_add(meta, "weights_version",
			       json_object_new_int64((int64_t)req->weights_version));
	json_object_object_add(o, "meta_info", meta);
	return o;
}

static json_object *usage_info(uint32_t prompt, uint32_t completion)
{
	json_object *u = json_object_new_object();

	json_object_object_add(u, "prompt_tokens", json_object_new_int64(prompt));
	json_object_object_add(u, "completion_tokens", json_object_new_int64(completion));
	json_object_object_add(u, "total_tokens", json_object_new_int64(prompt + completion));
	return u;
}

/* What every completion object of a request starts with: id, object, created, model. */
static json_object *completion_head(struct engine *e, struct request *req, const struct job *j)
{
	json_object *o = json_object_new_object();
	bool chat = j->api == API_CHAT;
	char id[32];

	snprintf(id, sizeof(id), "%s-%" PRIu64, chat ? "chatcmpl" : "cmpl", req->id);
	json_object_object_add(o, "id", json_object_new_string(id));
	json_object_object_add(o, "object",
			       json_object_new_string(!chat	  ? "text_completion"
						      : j->stream ? "chat.completion.chunk"
								  : "chat.completion"));
	json_object_object_add(o, "created", json_object_new_int64(j->created));
	json_object_object_add(o, "model", json_object_new_string(e->o.served_name));
	return o;
}

/* The text of generated tokens [from, to). */
static json_object *gen_text(struct request *req, uint32_t from, uint32_t to, const struct job *j)
{
	char *t = text_decode(req->tok + req->nprompt + from, to - from, j->skip_special);
	json_object *s = json_object_new_string(t ? t : "");

	free(t);
	return s;
}

static json_object *completion_body(struct engine *e, struct request *req, uint32_t from,
				    uint32_t to, bool final, const struct job *j)
{
	json_object *o = completion_head(e, req, j), *ch = json_object_new_object();
	json_object *choices = json_object_new_array();

	json_object_object_add(ch, "index", json_object_new_int(0));
	json_object_object_add(ch, "text", gen_text(req, from, to, j));
	/* vLLM's return_token_ids: the generated ids, and the prompt's in the first event */
	if (j->return_token_ids) {
		json_object_object_add(ch, "token_ids",
				       ids_array(req->tok + req->nprompt + from, to - from));
		if (from == 0 || !j->stream)
			json_object_object_add(ch, "prompt_token_ids",
					       ids_array(req->tok, req->nprompt));
	}
	if (j->logprobs) {
		json_object *lp = json_object_new_object(), *toks = json_object_new_array();
		json_object *vals = json_object_new_array();

		for (uint32_t i = from; i < to; i++) {
			char t[TEXT_PIECE_MAX];

			(void)text_piece(req->tok[req->nprompt + i], false, t);
			json_object_array_add(toks, json_object_new_string(t));
			json_object_array_add(vals, json_object_new_double(req->logprob[i]));
		}
		json_object_object_add(lp, "tokens", toks);
		json_object_object_add(lp, "token_logprobs", vals);
		json_object_object_add(lp, "top_logprobs", NULL);
		json_object_object_add(lp, "text_offset", json_object_new_array());
		json_object_object_add(ch, "logprobs", lp);
	} else {
		json_object_object_add(ch, "logprobs", NULL);
	}
	json_object_object_add(ch, "finish_reason",
			       final ? json_object_new_string("length") : NULL);
	json_object_array_add(choices, ch);
	json_object_object_add(o, "choices", choices);
	if ((final && !j->stream) || (j->stream && j->continuous_usage))
		json_object_object_add(o, "usage", usage_info(req->nprompt, to));
	return o;
}

/* Chat's logprobs (vLLM's _create_chat_logprobs): {"content": [{token, logprob, bytes,
 * top_logprobs}]}, top_logprobs empty (only top_logprobs 0 is served). */
static json_object *chat_logprobs(struct request *req, uint32_t from, uint32_t to)
{
	json_object *lp = json_object_new_object(), *content = json_object_new_array();

	for (uint32_t i = from; i < to; i++) {
		json_object *c = json_object_new_object(), *bytes = json_object_new_array();
		char t[TEXT_PIECE_MAX];
		size_t n = text_piece(req->tok[req->nprompt + i], false, t);

		for (size_t k = 0; k < n; k++)
			json_object_array_add(bytes, json_object_new_int((uint8_t)t[k]));
		json_object_object_add(c, "token", json_object_new_string(t));
		json_object_object_add(c, "logprob", json_object_new_double(req->logprob[i]));
		json_object_object_add(c, "bytes", bytes);
		json_object_object_add(c, "top_logprobs", json_object_new_array());
		json_object_array_add(content, c);
	}
	json_object_object_add(lp, "content", content);
	return lp;
}

/* vLLM's chat stream: a first chunk with delta {"role": "assistant", "content": ""} (and
 * prompt_token_ids), then per step a chunk with delta {"content"} and the step's token_ids;
 * the last one with finish_reason and stop_reason. Fields vLLM sets explicitly are present as
 * null (its model_dump_json(exclude_unset=True)). */
static json_object *chat_chunk(struct engine *e, struct request *req, uint32_t from, uint32_t to,
			       bool final, bool role, const struct job *j)
{
	json_object *o = completion_head(e, req, j), *ch = json_object_new_object();
	json_object *choices = json_object_new_array(), *delta = json_object_new_object();

	json_object_object_add(ch, "index", json_object_new_int(0));
	if (role) {
		json_object_object_add(delta, "role", json_object_new_string("assistant"));
		json_object_object_add(delta, "content", json_object_new_string(""));
	} else {
		json_object_object_add(delta, "content", gen_text(req, from, to, j));
	}
	json_object_object_add(ch, "delta", delta);
	json_object_object_add(ch, "logprobs",
			       j->logprobs && !role ? chat_logprobs(req, from, to) : NULL);
	json_object_object_add(ch, "finish_reason",
			       final ? json_object_new_string("length") : NULL);
	if (final)
		json_object_object_add(ch, "stop_reason", NULL);
	if (!role)
		json_object_object_add(
			ch, "token_ids",
			j->return_token_ids ? ids_array(req->tok + req->nprompt + from, to - from)
					    : NULL);
	json_object_array_add(choices, ch);
	json_object_object_add(o, "choices", choices);
	if (j->continuous_usage)
		json_object_object_add(o, "usage", usage_info(req->nprompt, role ? 0 : to));
	if (role)
		json_object_object_add(o, "prompt_token_ids",
				       j->return_token_ids ? ids_array(req->tok, req->nprompt)
							   : NULL);
	return o;
}

/* vLLM's ChatCompletionResponse. */
static json_object *chat_body(struct engine *e, struct request *req, const struct job *j)
{
	json_object *o = completion_head(e, req, j), *ch = json_object_new_object();
	json_object *choices = json_object_new_array(), *msg = json_object_new_object();
	uint32_t gen = req->ntok - req->nprompt;

	json_object_object_add(msg, "role", json_object_new_string("assistant"));
	json_object_object_add(msg, "content", gen_text(req, 0, gen, j));
	json_object_object_add(msg, "refusal", NULL);
	json_object_object_add(ch, "index", json_object_new_int(0));
	json_object_object_add(ch, "message", msg);
	json_object_object_add(ch, "logprobs", j->logprobs ? chat_logprobs(req, 0, gen) : NULL);
	json_object_object_add(ch, "finish_reason", json_object_new_string("length"));
	json_object_object_add(ch, "stop_reason", NULL);
	json_object_object_add(ch, "token_ids",
			       j->return_token_ids ? ids_array(req->tok + req->nprompt, gen)
						   : NULL);
	json_object_array_add(choices, ch);
	json_object_object_add(o, "choices", choices);
	json_object_object_add(o, "system_fingerprint", NULL);
	json_object_object_add(o, "usage", usage_info(req->nprompt, gen));
	json_object_object_add(o, "prompt_logprobs", NULL);
	json_object_object_add(o, "prompt_token_ids",
			       j->return_token_ids ? ids_array(req->tok, req->nprompt) : NULL);
	return o;
}

/* vLLM's last event with stream_options.include_usage: no choices, the whole request's usage. */
static json_object *usage_body(struct engine *e, struct request *req, const struct job *j)
{
	json_object *o = completion_head(e, req, j);

	json_object_object_add(o, "choices", json_object_new_array());
	json_object_object_add(o, "usage", usage_info(req->nprompt, req->ntok - req->nprompt));
	return o;
}

static void sse_send(struct evhttp_request *hreq, json_object *o)
{
	struct evbuffer *b = evbuffer_new();

	if (!b) {
		json_object_put(o);
		return;
	}
	if (o)
		evbuffer_add_printf(b, "data: %s\n\n",
				    json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	else
		evbuffer_add_printf(b, "data: [DONE]\n\n");
	evhttp_send_reply_chunk(hreq, b);
	evbuffer_free(b);
	json_object_put(o);
}

static void on_close(struct evhttp_connection *con, void *arg)
{
	struct request *req = arg;
	struct job *j = req->user;

	(void)con;
	/* libevent keeps a request whose reply is unfinished (evcon NULL) for its owner to end */
	j->closed = true;
	req->cancelled = true;
}

/* A non-stream client closed its end while its request runs: cancelled at the next step, as
 * vLLM's with_cancellation and SGLang's disconnect checks do. */
static void on_eof(evutil_socket_t fd, short what, void *arg)
{
	struct request *req = arg;
	struct job *j = req->user;

	(void)fd;
	(void)what;
	(void)event_del(j->eof);
	if (!j->closed)
		evhttp_connection_set_closecb(evhttp_request_get_connection(j->hreq), NULL, NULL);
	j->closed = true;
	req->cancelled = true;
}

static void job_detach(struct request *req)
{
	struct job *j = req->user;

	if (j && j->eof)
		event_free(j->eof);
	free(j);
	req->user = NULL;
}

/* An unfinished request goes away: end its reply (which frees a detached one). */
static void release_job(struct request *req)
{
	struct job *j = req->user;

	if (!j->closed)
		evhttp_connection_set_closecb(evhttp_request_get_connection(j->hreq), NULL, NULL);
	if (j->stream)
		evhttp_send_reply_end(j->hreq);
	else
		send_error(j->hreq, 503, "The request was aborted");
	job_detach(req);
}

/* --debug-cut-replies: a non-stream reply cut mid-body, as by an engine that dies while
 * writing it: the head (the whole body's Content-Length) and half the body go out, then the
 * connection is shut down; the reply after it only hands the request back to libevent. */
static void send_cut(struct evhttp_request *hreq, json_object *o)
{
	const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
	struct bufferevent *bev =
		evhttp_connection_get_bufferevent(evhttp_request_get_connection(hreq));
	int fd = bev ? bufferevent_getfd(bev) : -1;
	size_t n = strlen(s);
	char head[160];

	snprintf(head, sizeof(head),
		 "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
		 n + 1);
	if (fd >= 0) {
		(void)send(fd, head, strlen(head), MSG_NOSIGNAL);
		(void)send(fd, s, n / 2, MSG_NOSIGNAL);
		(void)shutdown(fd, SHUT_RDWR);
	}
	evhttp_send_reply(hreq, 503, "Cut", NULL);
	json_object_put(o);
}

/* After a step: stream the new tokens, or answer once finished. */
static void emit(struct request *req)
{
	struct job *j = req->user;
	uint32_t gen = req->ntok - req->nprompt;
	json_object *o;

	if (!j)
		return;
	if (j->closed) {
		req->cancelled = true;
		return;
	}
	if (req->finished)
		/* the reply below hands the request back to evhttp: no close callback after it */
		evhttp_connection_set_closecb(evhttp_request_get_connection(j->hreq), NULL, NULL);
	if (j->stream) {
		if (j->api == API_CHAT && req->emitted == 0)
			sse_send(j->hreq, chat_chunk(j->e, req, 0, 0, false, true, j));
		o = j->api == API_GENERATE ? generate_body(req, req->emitted, gen, req->finished, j)
		    : j->api == API_CHAT
			    ? chat_chunk(j->e, req, req->emitted, gen, req->finished, false, j)
			    : completion_body(j->e, req, req->emitted, gen, req->finished, j);
		sse_send(j->hreq, o);
		if (req->finished && j->usage)
			sse_send(j->hreq, usage_body(j->e, req, j));
		if (req->finished) {
			sse_send(j->hreq, NULL);
			evhttp_send_reply_end(j->hreq);
		}
	} else if (req->finished) {
		o = j->api == API_GENERATE ? generate_body(req, 0, gen, true, j)
		    : j->api == API_CHAT   ? chat_body(j->e, req, j)
					   : completion_body(j->e, req, 0, gen, true, j);
		if (j->e->o.debug_cut) {
			j->e->o.debug_cut--;
			send_cut(j->hreq, o);
		} else {
			send_json(j->hreq, 200, o);
		}
	}
	if (req->finished)
		job_detach(req);
}

static void start(struct engine *e, struct evhttp_request *hreq, struct request *req, enum api api,
		  bool stream, bool logprobs, bool return_token_ids, unsigned usage,
		  bool skip_special)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j) {
		request_free(req);
		send_error(hreq, 500, "Out of memory");
		return;
	}
	*j = (struct job){.e = e,
			  .hreq = hreq,
			  .api = api,
			  .stream = stream,
			  .logprobs = logprobs,
			  .return_token_ids = return_token_ids,
			  .usage = usage & USAGE_LAST,
			  .continuous_usage = usage & USAGE_CONTINUOUS,
			  .skip_special = skip_special,
			  .created = time(NULL)};
	req->user = j;
	req->emit = emit;
	req->release_user = release_job;
	evhttp_connection_set_closecb(evhttp_request_get_connection(hreq), on_close, req);
	if (!stream) {
		struct bufferevent *bev =
			evhttp_connection_get_bufferevent(evhttp_request_get_connection(hreq));
		int fd = bev ? bufferevent_getfd(bev) : -1;

		j->eof = fd >= 0 ? event_new(e->base, fd, EV_CLOSED | EV_PERSIST, on_eof, req)
				 : NULL;
		if (j->eof)
			(void)event_add(j->eof, NULL);
	}
	if (stream) {
		struct evkeyvalq *h = evhttp_request_get_output_headers(hreq);

		evhttp_add_header(h, "Content-Type", "text/event-stream");
		evhttp_add_header(h, "Cache-Control", "no-cache");
		evhttp_send_reply_start(hreq, 200, "OK");
	}
	sched_submit(e, req);
}

/* --debug-drop-requests: the connection of one of the first N token requests ends before any
 * reply while /health answers, as an engine's request path can fail while its port and probe
 * are up; the gateway's retry against a live engine is tested with it. The reply goes nowhere
 * (the socket is shut down already): it only hands the request back to libevent. */
static bool debug_drop(struct engine *e, struct evhttp_request *hreq)
{
	struct evhttp_connection *conn = evhttp_request_get_connection(hreq);
	struct bufferevent *bev;
	bool reused = false;
	char *host;
	uint16_t port;

	/* --debug-drop-reused: a connection that carried a token request before (its peer port
	 * seen: ports of live connections are distinct) is cut as an engine's keep-alive timeout
	 * does, its request unread: the gateway's race between reusing an idle connection and
	 * the engine closing it */
	evhttp_connection_get_peer(conn, &host, &port);
	for (uint32_t i = 0; i < e->n_token_peers && !reused; i++)
		reused = e->token_peers[i] == port;
	if (!reused && e->n_token_peers < ARRAY_SIZE(e->token_peers))
		e->token_peers[e->n_token_peers++] = port;
	if (reused && e->o.debug_drop_reused) {
		e->o.debug_drop_reused--;
	} else {
		if (e->o.debug_drop == 0)
			return false;
		e->o.debug_drop--;
	}
	bev = evhttp_connection_get_bufferevent(evhttp_request_get_connection(hreq));
	if (bev)
		(void)shutdown(bufferevent_getfd(bev), SHUT_RDWR);
	evhttp_send_reply(hreq, 503, "Dropped", NULL);
	return true;
}

static void on_generate(struct evhttp_request *hreq, void *arg)
{
	static const char *const top[] = {
		"input_ids", "sampling_params", "stream", "return_logprob", "rid", NULL};
	static const char *const sp_keys[] = {"max_new_tokens", "temperature", "seed", NULL};
	struct engine *e = arg;
	json_object *o, *sp = NULL, *ids = NULL;
	int64_t max_new = 128, seed = 0;
	double temperature = 1.0;
	bool stream = false, logprob = false, seeded = false;
	struct request *req;
	uint32_t *tok;
	size_t n;

	if (debug_drop(e, hreq))
		return;
	o = body_json(hreq);
	if (!o)
		return;
	tok = calloc(e->m.c.max_pos, sizeof(*tok));
	if (!tok) {
		send_error(hreq, 500, "Out of memory");
		json_object_put(o);
		return;
	}
	if (!known_fields(hreq, o, "the request", top))
		goto out;
	if (json_object_object_get_ex(o, "sampling_params", &sp) &&
	    !json_object_is_type(sp, json_type_null)) {
		if (!json_object_is_type(sp, json_type_object)) {
			send_error(hreq, 400, "\"sampling_params\" must be an object");
			goto out;
		}
		if (!known_fields(hreq, sp, "sampling_params", sp_keys) ||
		    !get_int(hreq, sp, "max_new_tokens", 1, e->m.c.max_pos, &max_new) ||
		    !get_num(hreq, sp, "temperature", 0.0, 100.0, &temperature) ||
		    !get_int(hreq, sp, "seed", INT64_MIN, INT64_MAX, &seed))
			goto out;
		seeded = json_object_object_get_ex(sp, "seed", NULL);
	}
	if (!get_bool(hreq, o, "stream", &stream) ||
	    !get_bool(hreq, o, "return_logprob", &logprob) || !get_str(hreq, o, "rid", false))
		goto out;
	(void)json_object_object_get_ex(o, "input_ids", &ids);
	n = prompt_ids(e, hreq, ids, "input_ids", tok);
	req = n ? new_request(e, hreq, tok, n, max_new, temperature, seed, seeded) : NULL;
	if (req)
		start(e, hreq, req, API_GENERATE, stream, logprob, false, 0, true);
out:
	free(tok);
	json_object_put(o);
}

/* stream_options as vLLM takes it: an object, only with stream true. */
static bool stream_options(struct evhttp_request *hreq, json_object *o, bool stream, unsigned *ret)
{
	static const char *const keys[] = {"include_usage", "continuous_usage_stats", NULL};
	json_object *so;
	bool last = false, cont = false;

	*ret = 0;
	if (!json_object_object_get_ex(o, "stream_options", &so) ||
	    json_object_is_type(so, json_type_null))
		return true;
	if (!stream) {
		send_error(hreq, 400, "Stream options can only be defined when `stream=True`.");
		return false;
	}
	if (!json_object_is_type(so, json_type_object)) {
		send_error(hreq, 400, "\"stream_options\" must be an object");
		return false;
	}
	if (!known_fields(hreq, so, "stream_options", keys) ||
	    !get_bool(hreq, so, "include_usage", &last) ||
	    !get_bool(hreq, so, "continuous_usage_stats", &cont))
		return false;
	/* vLLM: continuous usage only with include_usage */
	*ret = (last ? USAGE_LAST : 0) | (last && cont ? USAGE_CONTINUOUS : 0);
	return true;
}

/* max_tokens as vLLM reads it (get_max_tokens): absent, its default; null, what the context
 * leaves after the prompt. 0 after a 400. */
static int64_t max_tokens_of(struct engine *e, struct evhttp_request *hreq, json_object *o,
			     const char *key, int64_t dflt, size_t nprompt)
{
	int64_t v = dflt;
	json_object *f;

	if (json_object_object_get_ex(o, key, &f) && json_object_is_type(f, json_type_null))
		v = 0;
	if (!get_int(hreq, o, key, 1, e->m.c.max_pos, &v))
		return 0;
	if (v == 0 && nprompt >= e->m.c.max_pos) {
		send_error(hreq, 400,
			   "This model's maximum context length is %u tokens. However, your "
			   "prompt has %zu tokens.",
			   e->m.c.max_pos, nprompt);
		return 0;
	}
	return v ? v : (int64_t)(e->m.c.max_pos - nprompt);
}

/* The fields /v1/completions and /v1/chat/completions share. */
struct oai_params {
	int64_t seed, n;
	double temperature, top_p;
	bool stream, tids, skip_special, seeded;
	unsigned usage;
};

static bool oai_params(struct engine *e, struct evhttp_request *hreq, json_object *o,
		       struct oai_params *p)
{
	const char *model;

	*p = (struct oai_params){.n = 1, .temperature = 1.0, .top_p = 1.0, .skip_special = true};
	model = get_str(hreq, o, "model", false);
	if (!model)
		return false;
	if (*model && strcmp(model, e->o.served_name) != 0) {
		send_error(hreq, 404, "The model `%s` does not exist.", model);
		return false;
	}
	if (!get_num(hreq, o, "temperature", 0.0, 100.0, &p->temperature) ||
	    !get_int(hreq, o, "seed", INT64_MIN, INT64_MAX, &p->seed) ||
	    !get_int(hreq, o, "n", 1, 1, &p->n) ||
	    !get_num(hreq, o, "top_p", 1.0, 1.0, &p->top_p) ||
	    !get_bool(hreq, o, "stream", &p->stream) ||
	    !get_bool(hreq, o, "return_token_ids", &p->tids) ||
	    !get_bool(hreq, o, "skip_special_tokens", &p->skip_special) ||
	    !get_str(hreq, o, "user", false) || !stream_options(hreq, o, p->stream, &p->usage))
		return false;
	/* --debug-no-token-ids: a vLLM older than return_token_ids ignores it, as any field it
	 * does not know */
	if (e->o.debug_no_ids)
		p->tids = false;
	/* json_object_object_get: NULL for an absent or null member */
	p->seeded = json_object_object_get(o, "seed") != NULL;
	return true;
}

/* An OpenAI request's body, its known fields and shared parameters checked; NULL after an
 * error reply. */
static json_object *oai_body(struct engine *e, struct evhttp_request *hreq, const char *const *top,
			     struct oai_params *p)
{
	json_object *o;

	if (debug_drop(e, hreq))
		return NULL;
	o = body_json(hreq);
	if (o && (!known_fields(hreq, o, "the request", top) || !oai_params(e, hreq, o, p))) {
		json_object_put(o);
		return NULL;
	}
	return o;
}

/* A handler's prompt buffer (max_pos ids), NULL after a 500. */
static uint32_t *prompt_buf(struct engine *e, struct evhttp_request *hreq)
{
	uint32_t *tok = calloc(e->m.c.max_pos, sizeof(*tok));

	if (!tok)
		send_error(hreq, 500, "Out of memory");
	return tok;
}

static void on_completions(struct evhttp_request *hreq, void *arg)
{
	static const char *const top[] = {"model",	"prompt",
					  "max_tokens", "temperature",
					  "seed",	"stream",
					  "logprobs",	"return_token_ids",
					  "n",		"top_p",
					  "user",	"stream_options",
					  "echo",	"skip_special_tokens",
					  NULL};
	struct engine *e = arg;
	json_object *o, *ids = NULL;
	int64_t max_tokens, logprobs = -1;
	bool echo = false;
	struct oai_params p;
	struct request *req;
	uint32_t *tok = NULL;
	size_t n;

	o = oai_body(e, hreq, top, &p);
	if (!o)
		return;
	if (!get_int(hreq, o, "logprobs", 0, 20, &logprobs) || !get_bool(hreq, o, "echo", &echo))
		goto out;
	if (echo) {
		send_error(hreq, 400, "\"echo\" is not supported by this engine");
		goto out;
	}
	tok = prompt_buf(e, hreq);
	if (!tok)
		goto out;
	(void)json_object_object_get_ex(o, "prompt", &ids);
	n = prompt_any(e, hreq, ids, "prompt", tok);
	if (!n)
		goto out;
	max_tokens = max_tokens_of(e, hreq, o, "max_tokens", 16, n);
	if (!max_tokens)
		goto out;
	req = new_request(e, hreq, tok, n, max_tokens, p.temperature, p.seed, p.seeded);
	if (req)
		start(e, hreq, req, API_COMPLETIONS, p.stream, logprobs >= 0, p.tids, p.usage,
		      p.skip_special);
out:
	free(tok);
	json_object_put(o);
}

/* vLLM's /v1/chat/completions: messages through the chat template (engine-text.h), the
 * sampling fields of /v1/completions, max_completion_tokens over the deprecated max_tokens
 * (neither: what the context leaves), logprobs true with top_logprobs 0. */
static void on_chat(struct evhttp_request *hreq, void *arg)
{
	static const char *const top[] = {"messages",
					  "model",
					  "max_tokens",
					  "max_completion_tokens",
					  "temperature",
					  "seed",
					  "stream",
					  "stream_options",
					  "logprobs",
					  "top_logprobs",
					  "return_token_ids",
					  "n",
					  "top_p",
					  "user",
					  "skip_special_tokens",
					  "add_generation_prompt",
					  NULL};
	struct engine *e = arg;
	json_object *o, *msgs = NULL, *mct;
	int64_t max_tokens, top_logprobs = 0;
	bool logprobs = false, gen_prompt = true;
	struct oai_params p;
	struct request *req;
	uint32_t *tok = NULL;
	char err[256];
	size_t n = 0;
	int r;

	o = oai_body(e, hreq, top, &p);
	if (!o)
		return;
	if (!get_bool(hreq, o, "logprobs", &logprobs) ||
	    !get_int(hreq, o, "top_logprobs", 0, 20, &top_logprobs) ||
	    !get_bool(hreq, o, "add_generation_prompt", &gen_prompt))
		goto out;
	if (top_logprobs > 0) {
		send_error(hreq, 400, "\"top_logprobs\" > 0 is not supported by this engine");
		goto out;
	}
	if (e->m.c.vocab < TEXT_VOCAB_MIN) {
		send_error(hreq, 400, "This model has no tokenizer (vocab_size < %u)",
			   TEXT_VOCAB_MIN);
		goto out;
	}
	tok = prompt_buf(e, hreq);
	if (!tok)
		goto out;
	if (!json_object_object_get_ex(o, "messages", &msgs)) {
		send_error(hreq, 400, "Missing field \"messages\"");
		goto out;
	}
	r = text_chat_prompt(msgs, gen_prompt, tok, e->m.c.max_pos, &n, err, sizeof(err));
	if (r == -E2BIG) {
		send_error(hreq, 400,
			   "This model's maximum context length is %u tokens. However, your "
			   "messages are longer.",
			   e->m.c.max_pos);
		goto out;
	}
	if (r < 0) {
		send_error(hreq, 400, "%s", err);
		goto out;
	}
	/* vLLM: max_completion_tokens or max_tokens */
	mct = json_object_object_get(o, "max_completion_tokens");
	max_tokens = max_tokens_of(e, hreq, o,
				   mct && !json_object_is_type(mct, json_type_null)
					   ? "max_completion_tokens"
					   : "max_tokens",
				   0, n);
	if (!max_tokens)
		goto out;
	req = new_request(e, hreq, tok, n, max_tokens, p.temperature, p.seed, p.seeded);
	if (req)
		start(e, hreq, req, API_CHAT, p.stream, logprobs, p.tids, p.usage, p.skip_special);
out:
	free(tok);
	json_object_put(o);
}

static void on_health(struct evhttp_request *hreq, void *arg)
{
	(void)arg;
	evhttp_send_reply(hreq, 200, "OK", NULL);
}

/* vLLM's ModelCard. */
static json_object *model_card(struct engine *e)
{
	json_object *m = json_object_new_object();

	json_object_object_add(m, "id", json_object_new_string(e->o.served_name));
	json_object_object_add(m, "object", json_object_new_string("model"));
	json_object_object_add(m, "created", json_object_new_int64(e->started));
	json_object_object_add(m, "owned_by", json_object_new_string("belayer"));
	json_object_object_add(m, "root", json_object_new_string(e->o.served_name));
	json_object_object_add(m, "parent", NULL);
	json_object_object_add(m, "max_model_len", json_object_new_int64(e->m.c.max_pos));
	return m;
}

static void on_models(struct evhttp_request *hreq, void *arg)
{
	struct engine *e = arg;
	json_object *o = json_object_new_object(), *data = json_object_new_array();

	json_object_array_add(data, model_card(e));
	json_object_object_add(o, "object", json_object_new_string("list"));
	json_object_object_add(o, "data", data);
	send_json(hreq, 200, o);
}

/* GET /v1/models/{id} (the OpenAI SDK's models.retrieve): the card, or 404 for another id. */
static void on_model(struct evhttp_request *hreq, struct engine *e, const char *path)
{
	char *id = evhttp_uridecode(path + strlen("/v1/models/"), 0, NULL);

	if (evhttp_request_get_command(hreq) != EVHTTP_REQ_GET)
		send_error(hreq, 405, "Method not allowed: use GET");
	else if (!id)
		send_error(hreq, 500, "Out of memory");
	else if (strcmp(id, e->o.served_name) != 0)
		send_error(hreq, 404, "The model `%.200s` does not exist.", id);
	else
		send_json(hreq, 200, model_card(e));
	free(id);
}

static void on_other(struct evhttp_request *hreq, void *arg)
{
	const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(hreq);
	const char *path = u ? evhttp_uri_get_path(u) : NULL;

	if (path && strncmp(path, "/v1/models/", strlen("/v1/models/")) == 0) {
		on_model(hreq, arg, path);
		return;
	}
	send_error(hreq, 404, "Not found: %s", evhttp_request_get_uri(hreq));
}

int http_start(struct engine *e)
{
	static const struct {
		const char *path;
		void (*cb)(struct evhttp_request *, void *);
		bool debug;
	} routes[] = {
		{"/generate", on_generate, false},
		{"/v1/completions", on_completions, false},
		{"/v1/chat/completions", on_chat, false},
		{"/health", on_health, false},
		{"/v1/models", on_models, false},
		{"/get_model_info", http_on_model_info, false},
		{"/update_weights_from_disk", http_on_update_disk, false},
		{"/init_weights_update_group", http_on_init_group, false},
		{"/update_weights_from_distributed", http_on_update_dist, false},
		{"/sleep", http_on_sleep, false},
		{"/wake_up", http_on_wake_up, false},
		{"/is_sleeping", http_on_is_sleeping, false},
		{"/debug/kv", http_on_debug_kv, true},
		{"/debug/pause", http_on_debug, true},
		{"/debug/resume", http_on_debug, true},
		{"/debug/step", http_on_debug, true},
		{"/debug/headers", http_on_debug_headers, true},
	};
	struct evhttp_bound_socket *s;

	e->started = time(NULL);
	e->http = evhttp_new(e->base);
	if (!e->http)
		return -ENOMEM;
	evhttp_set_max_body_size(e->http, BODY_MAX + 1);
	evhttp_set_allowed_methods(e->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
	for (size_t i = 0; i < ARRAY_SIZE(routes); i++)
		if (!routes[i].debug || e->o.debug_endpoints)
			evhttp_set_cb(e->http, routes[i].path, routes[i].cb, e);
	evhttp_set_gencb(e->http, on_other, e);
	s = evhttp_bind_socket_with_handle(e->http, e->o.host, e->o.port);
	if (!s)
		return log_error_errno(-EADDRINUSE, "Failed to listen on %s:%u", e->o.host,
				       e->o.port);
	/* uvicorn's backlog (vLLM's and SGLang's server), not evhttp's 128 */
	if (listen(evhttp_bound_socket_get_fd(s), ENGINE_LISTEN_BACKLOG) < 0)
		log_warning_errno(-errno, "Failed to set the listen backlog: %m, ignoring.");
	/* TCP_NODELAY, as asyncio sets it on every TCP transport (uvicorn: vLLM's and SGLang's
	 * server); Linux's accepted sockets inherit it from the listener. evhttp writes a reply's
	 * head and body apart, and on a kept-alive connection the body would wait for the
	 * client's delayed ACK. */
	if (setsockopt(evhttp_bound_socket_get_fd(s), IPPROTO_TCP, TCP_NODELAY, &(int){1},
		       sizeof(int)) < 0)
		log_warning_errno(-errno, "Failed to set TCP_NODELAY: %m, ignoring.");
	if (e->o.port == 0) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);

		if (getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&ss, &len) == 0)
			e->o.port = ntohs(ss.ss_family == AF_INET6
						  ? ((struct sockaddr_in6 *)&ss)->sin6_port
						  : ((struct sockaddr_in *)&ss)->sin_port);
	}
	return 0;
}
