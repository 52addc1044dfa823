/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-text.h"

int text_encode(const char *s, size_t n, uint32_t *out, size_t cap, size_t *len)
{
	if (n > cap - *len)
		return -E2BIG;
	for (size_t i = 0; i < n; i++)
		out[(*len)++] = (uint8_t)s[i];
	return 0;
}

static int put(uint32_t id, uint32_t *out, size_t cap, size_t *len)
{
	if (*len >= cap)
		return -E2BIG;
	out[(*len)++] = id;
	return 0;
}

size_t text_piece(uint32_t id, bool skip_special, char buf[static TEXT_PIECE_MAX])
{
	static const char *const special[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"};
	uint64_t x;
	size_t n;

	if (id == '\t' || id == '\n' || (id >= 0x20 && id < 0x7f)) {
		buf[0] = (char)id;
		buf[1] = 0;
		return 1;
	}
	if (id < 256) /* SentencePiece's spelling of a byte token */
		return (size_t)snprintf(buf, TEXT_PIECE_MAX, "<0x%02X>", id);
	if (id < TEXT_VOCAB_MIN) {
		buf[0] = 0;
		if (skip_special)
			return 0;
		return (size_t)snprintf(buf, TEXT_PIECE_MAX, "%s", special[id - 256]);
	}
	/* a merged token: a space and 2 to 4 lowercase letters, fixed per id */
	x = (uint64_t)(id - TEXT_VOCAB_MIN) * 0x9e3779b97f4a7c15ull;
	n = 2 + (size_t)((x >> 60) % 3);
	buf[0] = ' ';
	for (size_t i = 0; i < n; i++)
		buf[1 + i] = (char)('a' + (x >> (8 * i)) % 26);
	buf[1 + n] = 0;
	return 1 + n;
}

char *text_decode(const uint32_t *ids, size_t n, bool skip_special)
{
	char *s = malloc(n * (TEXT_PIECE_MAX - 1) + 1);
	size_t o = 0;

	if (!s)
		return NULL;
	for (size_t i = 0; i < n; i++)
		o += text_piece(ids[i], skip_special, s + o);
	s[o] = 0;
	return s;
}

static int bad(char *err, size_t cap, const char *msg, size_t i)
{
	snprintf(err, cap, "messages[%zu]: %s", i, msg);
	return -EINVAL;
}

/* A message's content: a string, null, or a list of text parts. */
static int content(json_object *c, size_t i, uint32_t *out, size_t cap, size_t *len, char *err,
		   size_t errcap)
{
	int r = 0;

	if (!c || json_object_is_type(c, json_type_null))
		return 0;
	if (json_object_is_type(c, json_type_string))
		return text_encode(json_object_get_string(c), (size_t)json_object_get_string_len(c),
				   out, cap, len);
	if (!json_object_is_type(c, json_type_array))
		return bad(err, errcap, "\"content\" must be a string or a list of parts", i);
	for (size_t k = 0; r == 0 && k < json_object_array_length(c); k++) {
		json_object *p = json_object_array_get_idx(c, k), *t, *x;

		if (!json_object_is_type(p, json_type_object) ||
		    !json_object_object_get_ex(p, "type", &t) ||
		    !json_object_is_type(t, json_type_string) ||
		    strcmp(json_object_get_string(t), "text") != 0 ||
		    !json_object_object_get_ex(p, "text", &x) ||
		    !json_object_is_type(x, json_type_string) || json_object_object_length(p) != 2)
			return bad(err, errcap,
				   "a content part must be {\"type\": \"text\", \"text\": string} "
				   "(this engine reads text only)",
				   i);
		r = text_encode(json_object_get_string(x), (size_t)json_object_get_string_len(x),
				out, cap, len);
	}
	return r;
}

int text_chat_prompt(json_object *messages, bool add_generation_prompt, uint32_t *out, size_t cap,
		     size_t *len, char *err, size_t errcap)
{
	static const char *const roles[] = {"system",	 "developer", "user",
					    "assistant", "tool",      NULL};
	size_t n;
	int r = 0;

	*len = 0;
	if (!messages || !json_object_is_type(messages, json_type_array)) {
		snprintf(err, errcap, "\"messages\" must be a list of messages");
		return -EINVAL;
	}
	n = json_object_array_length(messages);
	if (n == 0) {
		snprintf(err, errcap, "\"messages\" must not be empty");
		return -EINVAL;
	}
	for (size_t i = 0; r == 0 && i < n; i++) {
		json_object *m = json_object_array_get_idx(messages, i), *role = NULL, *c = NULL;
		const char *rs;
		bool known = false;

		if (!json_object_is_type(m, json_type_object))
			return bad(err, errcap, "a message must be an object", i);
		json_object_object_foreach(m, key, val)
		{
			(void)val;
			if (strcmp(key, "role") != 0 && strcmp(key, "content") != 0 &&
			    strcmp(key, "name") != 0) {
				snprintf(err, errcap, "messages[%zu]: unknown field \"%s\"", i,
					 key);
				return -EINVAL;
			}
		}
		if (!json_object_object_get_ex(m, "role", &role) ||
		    !json_object_is_type(role, json_type_string))
			return bad(err, errcap, "\"role\" must be a string", i);
		rs = json_object_get_string(role);
		for (size_t k = 0; roles[k]; k++)
			known = known || strcmp(rs, roles[k]) == 0;
		if (!known)
			return bad(err, errcap, "unknown \"role\"", i);
		if (json_object_object_get_ex(m, "name", &c) &&
		    !json_object_is_type(c, json_type_string))
			return bad(err, errcap, "\"name\" must be a string", i);
		c = NULL;
		(void)json_object_object_get_ex(m, "content", &c);
		r = put(TEXT_IM_START, out, cap, len);
		r = r ?: text_encode(rs, strlen(rs), out, cap, len);
		r = r ?: put('\n', out, cap, len);
		r = r ?: content(c, i, out, cap, len, err, errcap);
		r = r ?: put(TEXT_IM_END, out, cap, len);
		r = r ?: put('\n', out, cap, len);
	}
	if (r == 0 && add_generation_prompt) {
		r = put(TEXT_IM_START, out, cap, len);
		r = r ?: text_encode("assistant\n", 10, out, cap, len);
	}
	return r;
}
