/* SPDX-License-Identifier: MIT */
/*
 * Server-sent events as the engines stream them (vLLM, SGLang): events separated by a blank
 * line, each with one "data: " line. Reading is incremental over whatever the upstream
 * connection delivered so far and bounded per event; writing produces the same framing.
 */
#pragma once

#include <stddef.h>

struct evbuffer;

/* Takes the next complete event off in. Returns 1 with its data (malloc'ed, NUL-terminated,
 * "data: " and the line ends stripped; "" for an event without data) in *ret, 0 when no
 * complete event is buffered yet, -EMSGSIZE when more than max bytes are buffered without an
 * event's end, -ENOMEM. */
int gw_sse_next(struct evbuffer *in, size_t max, char **ret, size_t *ret_len);
/* Appends "data: DATA\n\n". */
int gw_sse_write(struct evbuffer *out, const char *data, size_t len);
