/* SPDX-License-Identifier: MIT */
/*
 * HTTP semantics the gateway applies as a proxy (issue 18, item 7): which headers belong to one
 * connection and are not forwarded (RFC 9110 §7.6.1: the standard list and every header the
 * message's own Connection names), what it adds to a request it forwards (Via,
 * X-Forwarded-For), which engine statuses mean a broken engine rather than its verdict, and the
 * gateway's JSON error body.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct evkeyvalq;

/* The gateway's Via entry (RFC 9110 §7.6.3). */
#define GW_VIA "1.1 belayer"

/* Copies from's end-to-end headers to to: neither the hop-by-hop ones nor those named in
 * from's Connection header (evhttp sets the framing headers itself). */
void gw_http_copy_headers(struct evkeyvalq *to, const struct evkeyvalq *from);
/* Appends the gateway to Via in h (a message it forwards, either way). */
void gw_http_add_via(struct evkeyvalq *h);
/* Appends the gateway to Via and the client's address to X-Forwarded-For in h (a request on
 * its way upstream, its end-to-end headers already copied). */
void gw_http_add_forwarded(struct evkeyvalq *h, const char *client_addr);
/* TCP_NODELAY on a connection's socket (fd < 0: nothing): a proxy writes small messages in
 * pieces (evhttp: a head, then a body), and Nagle would hold each next piece until the peer's
 * delayed ACK (40 ms) on a kept-alive connection. */
void gw_nodelay(int fd);
/* A client's "close" among its Connection headers' tokens closes the connection after the
 * reply: evhttp itself reads only the first Connection header, whole ("X, close" or a second
 * header keep the connection). */
void gw_http_close_if_asked(struct evhttp_request *creq);
/* An engine status that says the engine is broken or going away (500, 502, 503, 504): the
 * request waits for a recovery. Any other status is the engine's verdict on the request (501
 * to a HEAD, 505 ...) and reaches the client as it is. */
bool gw_http_engine_failed(int code);
/* The error type of the gateway's JSON error body for a status (OpenAI's names). */
const char *gw_http_error_type(int code);
/* The reason phrase of a status the gateway answers with itself. */
const char *gw_http_reason(int code);
/* {"error": {"message": msg, "type": ..., "code": code}} and a newline, into buf. The length
 * written, or -ENOBUFS when it does not fit. */
int gw_http_error_json(char *buf, size_t cap, int code, const char *msg);
