/* SPDX-License-Identifier: MIT */
/*
 * The gateway's reading of requests and engine responses (supervisor-gateway-resume.h) on
 * arbitrary bytes: a client's body for one of the APIs, then the engine's response events, a
 * failed attempt's next body after each when asked. Nothing crashes or leaks, whatever the
 * client or the engine sends (both reach it from the network).
 *
 * Input: byte 0 (bits 0-1: the API, /generate, /v1/completions or /v1/chat/completions; bit 2:
 * a failure after every event), then NUL-separated parts: the client's body, then each event.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "supervisor-gateway-resume.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The next NUL-separated part of [*p, end). */
static bool part(const char **p, const char *end, const char **ret, size_t *ret_len)
{
	const char *nul;

	if (*p > end)
		return false;
	nul = memchr(*p, 0, (size_t)(end - *p));
	*ret = *p;
	*ret_len = (size_t)((nul ? nul : end) - *p);
	*p = (nul ? nul : end) + 1;
	return true;
}

static void next_attempt(struct gw_call *c)
{
	char *body;
	size_t len;

	if (!gw_call_resumable(c))
		return;
	if (gw_call_upstream_body(c, GW_SEED_DERIVED, &body, &len) < 0)
		return;
	if (!gw_call_upstream_uri(c, "/x") || strlen(body) != len)
		abort();
	free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const enum gw_api apis[] = {GW_GENERATE, GW_COMPLETIONS, GW_CHAT, GW_CHAT};
	const char *p = (const char *)data + 1, *end = (const char *)data + size, *s;
	struct evbuffer *out;
	struct gw_call c;
	char err[160];
	size_t n;

	if (size < 1 || !part(&p, end, &s, &n))
		return 0;
	if (gw_call_parse(&c, apis[data[0] & 3], s, n, 4096, err, sizeof(err)) < 0) {
		gw_call_finish(&c);
		return 0;
	}
	out = evbuffer_new();
	if (!out)
		abort();
	next_attempt(&c);
	while (part(&p, end, &s, &n)) {
		if (gw_call_on_response(&c, s, n, out) < 0)
			break;
		if (data[0] & 4)
			next_attempt(&c);
	}
	evbuffer_free(out);
	gw_call_finish(&c);
	return 0;
}
