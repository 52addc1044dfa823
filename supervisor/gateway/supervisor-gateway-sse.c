/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "supervisor-gateway-sse.h"

int gw_sse_next(struct evbuffer *in, size_t max, char **ret, size_t *ret_len)
{
	struct evbuffer_ptr end;
	size_t n, sep = 2;
	char *raw, *out, *o;

	/* "\r\n\r\n" is as valid as "\n\n" between events. */
	end = evbuffer_search(in, "\n\n", 2, NULL);
	if (end.pos < 0) {
		end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
		sep = 4;
	}
	if (end.pos < 0)
		return evbuffer_get_length(in) > max ? -EMSGSIZE : 0;
	n = (size_t)end.pos;
	if (n > max)
		return -EMSGSIZE;
	raw = malloc(n + 1);
	out = malloc(n + 1);
	if (!raw || !out) {
		free(raw);
		free(out);
		return -ENOMEM;
	}
	evbuffer_remove(in, raw, n);
	evbuffer_drain(in, sep);
	raw[n] = 0;
	/* Joins the event's data lines (with "\n", as the SSE spec says); other fields
	 * (event:, id:, comments) carry nothing the gateway uses. */
	o = out;
	for (char *line = raw, *next; line; line = next) {
		size_t len;

		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		len = strlen(line);
		if (len && line[len - 1] == '\r')
			line[--len] = 0;
		if (strncmp(line, "data:", 5) != 0)
			continue;
		line += 5;
		if (*line == ' ')
			line++;
		if (o != out)
			*o++ = '\n';
		len = strlen(line);
		memcpy(o, line, len);
		o += len;
	}
	*o = 0;
	free(raw);
	*ret = out;
	*ret_len = (size_t)(o - out);
	return 1;
}

int gw_sse_write(struct evbuffer *out, const char *data, size_t len)
{
	if (evbuffer_add(out, "data: ", 6) < 0 || evbuffer_add(out, data, len) < 0 ||
	    evbuffer_add(out, "\n\n", 2) < 0)
		return -ENOMEM;
	return 0;
}
