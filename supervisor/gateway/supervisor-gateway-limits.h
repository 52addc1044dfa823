/* SPDX-License-Identifier: MIT */
/*
 * The gateway's client connections (issue 18, items 3, 6 and 7): bounds on what a client may
 * hold before its request reaches the gateway, enforced on the bytes as they arrive, ahead of
 * evhttp (libevent 2.1.12 answers its own limits with an HTML page, 413 for headers and for bad
 * chunk framing alike, and never times a request out as a whole: its timeouts restart with
 * every byte), and the watch that notices a client gone while its request is upstream.
 *
 * Each connection's bufferevent is made here (evhttp_set_bevcb) and kept referenced, so the
 * gateway sees its input before evhttp parses it and takes the connection over to answer and
 * close it (a lingering close: the rest of the client's request is read and dropped, so the
 * answer is not lost to a reset; not over gateway_max_connections, where a flood would hold a
 * socket each). The bounds, per connection:
 *   - gateway_max_connections: a connection over it is answered 503 and closed;
 *   - gateway_max_header: the request line and headers (431);
 *   - gateway_header_timeout: the whole request head, from the connection's accept (or a kept
 *     alive connection's first byte) (408; a new connection that sent nothing is closed);
 *   - gateway_body_timeout: the whole body, from the head's end (408);
 *   - gateway_max_body: a Content-Length or chunked body over it (413); malformed framing
 *     (chunk sizes, Content-Length, Transfer-Encoding other than chunked, both) 400 or 501.
 * None applies once the request is the gateway's: a request held upstream for minutes, or a
 * long stream, is never cut by them. A kept-alive connection idle GW_KEEPALIVE_MS after its
 * reply is closed silently. A pipelined request (its bytes read with its predecessor's) has
 * evhttp's own bounds alone: twice gateway_max_header, gateway_max_body, no timeout.
 */
#pragma once

#include <stdint.h>

#define GW_KEEPALIVE_MS 60000 /* a kept-alive client connection idle this long is closed */
#define GW_LINGER_MS	2000  /* a refused connection's rest is read and dropped this long */

struct event_base;
struct evhttp;
struct evhttp_connection;
struct evhttp_request;
struct gw_stats;

struct gw_limits {
	uint64_t max_header; /* bytes of the request line and headers */
	uint64_t max_body;
	uint64_t header_timeout_ms;
	uint64_t body_timeout_ms;
	uint32_t max_connections;
};

struct gw_conns;

/* Takes over the making of http's connections. NULL with errno set. name: the engine's, for
 * logs; stats: where refusals and connections are counted. */
struct gw_conns *gw_conns_new(struct event_base *base, struct evhttp *http,
			      const struct gw_limits *lim, struct gw_stats *stats,
			      const char *name);
/* After evhttp_free() of its evhttp: closes what the connections still hold. NULL is fine. */
void gw_conns_free(struct gw_conns *c);
/* Times out heads and bodies, closes the connections evhttp and the gateway are done with. */
void gw_conns_tick(struct gw_conns *c);
/* creq was read whole and is the gateway's now: no bound applies until its reply is sent.
 * 0; -ENOENT: a connection not made here (it is unbounded). */
int gw_conns_request(struct gw_conns *c, struct evhttp_request *creq);

/* Calls cb(arg) once when the client of cconn closes its end (EV_CLOSED where the loop's
 * backend has it, else a read event and a peek), for as long as the watch lives: evhttp reads
 * nothing from a client while its request is being served and would not notice. NULL with
 * errno set. */
struct gw_eof_watch *gw_eof_watch_new(struct event_base *base, struct evhttp_connection *cconn,
				      void (*cb)(void *arg), void *arg);
void gw_eof_watch_free(struct gw_eof_watch *w);
