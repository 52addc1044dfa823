/* SPDX-License-Identifier: MIT */
/*
 * A small blocking HTTP/1.1 client over plain sockets for the trainer and the tests: one
 * request per connection, bounded waits and sizes, chunked bodies (the engine's streams)
 * decoded, server-sent events split out.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define CLIENT_BODY_MAX (64u << 20)

struct http_response {
	int status;
	char *body; /* NUL-terminated, de-chunked */
	size_t len;
};

/* Connects to 127.0.0.1:port: the fd or -errno. */
int client_connect(uint16_t port);
/* Sends one request (body may be NULL) with Connection: close. 0 or -errno. */
int client_send(int fd, const char *method, const char *path, const char *body);
/* Reads the whole response within timeout_ms. 0 or -errno (-ETIMEDOUT, -EBADMSG). */
int client_recv(int fd, int timeout_ms, struct http_response *ret);
/* connect + send + recv + close. */
int client_request(uint16_t port, const char *method, const char *path, const char *body,
		   int timeout_ms, struct http_response *ret);
void http_response_free(struct http_response *r);

/* Calls fn on the payload of each "data: ..." event of an SSE body, in order; stops at the
 * first non-zero return. Returns the number of events or that return value. */
int sse_foreach(const char *body, int (*fn)(const char *data, void *ud), void *ud);
