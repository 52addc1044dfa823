/* SPDX-License-Identifier: MIT */
/*
 * The gateway's engine connections (issue 18, item 5): a bounded pool of HTTP/1.1 keep-alive
 * connections per engine, as Envoy's upstream pool does it. An attempt borrows one (an idle
 * one to the engine's current port, most recently used first, else a new one while the
 * engine has fewer than gateway_upstream_connections), sends its request on it, and gives it
 * back: kept idle when its response was read whole and the engine kept it open, closed
 * otherwise (a cancelled attempt's engine learns so from the close). With every connection
 * busy, attempts wait in FIFO order for one. The bound is above the engine's batch (vLLM's
 * max_num_seqs is 256): an engine with no request queued leaves the slot of each request
 * that ends idle until the next arrives, a step or more. Connections to another port (the
 * group was replaced) are closed, idle ones the engine closes are dropped as it closes them.
 *
 * Callbacks run from the loop, never inside a connection's own callbacks.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct event_base;
struct evhttp_connection;
struct gw_pool;
struct gw_stats;
struct gw_upconn;

/* One borrower waiting for a connection; embedded in it. */
struct gw_pool_wait {
	struct gw_pool_wait *prev, *next;
	uint32_t port;
	bool fresh;   /* a new connection, never an idle one (a retry after a failed one) */
	bool waiting; /* queued in the pool */
	void (*ready)(struct gw_pool_wait *w, struct gw_upconn *c);
};

/* NULL with errno set. stats: the engine's counters (upstream_connections). */
struct gw_pool *gw_pool_new(struct event_base *base, const char *name, uint32_t max,
			    struct gw_stats *stats);
/* Closes every connection; no waiter may be left. Accepts NULL. */
void gw_pool_free(struct gw_pool *p);

/* Lends a connection to w->port: 0 with *ret set, or -EAGAIN when every connection is busy
 * (w is queued; w->ready is called from the loop once one is free), or -ENOMEM. */
int gw_pool_get(struct gw_pool *p, struct gw_pool_wait *w, struct gw_upconn **ret);
/* Takes w out of the queue (a waiting borrower cancelled); nothing when it is not queued. */
void gw_pool_cancel(struct gw_pool *p, struct gw_pool_wait *w);
/* Ends the loan of c. complete: its response was read whole. NULL: the pool kept the
 * connection; else the connection to close, which the caller frees with
 * evhttp_connection_free() outside its callbacks (a request may still be pending on it). */
struct evhttp_connection *gw_pool_put(struct gw_pool *p, struct gw_upconn *c, bool complete);

struct evhttp_connection *gw_upconn_evcon(const struct gw_upconn *c);
/* The connection answered requests before this loan (an idle one reused). */
bool gw_upconn_reused(const struct gw_upconn *c);
/* evhttp closed the connection during this loan after it had connected (a refused or failed
 * connect leaves it false). */
bool gw_upconn_closed(const struct gw_upconn *c);
