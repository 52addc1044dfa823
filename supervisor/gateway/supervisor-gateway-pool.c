/* SPDX-License-Identifier: MIT */
/*
 * The gateway's engine connections: see supervisor-gateway-pool.h.
 *
 * A connection is lent (an attempt's), idle (on the idle stack, evhttp watching it for the
 * engine's close), or dead (closed by the engine while idle, freed from the loop: evhttp
 * still runs inside it when it says so). n counts the lent and idle ones against max.
 */
#include <errno.h>
#include <stdlib.h>

#include <event2/event.h>
#include <event2/http.h>

#include "log.h"
#include "supervisor-gateway-pool.h"
#include "supervisor-gateway-stats.h"

#define POOL_HOST "127.0.0.1"
/* A connection silent this long is dropped: a hung engine is the liveness probe's to find;
 * this only bounds a connection nothing else would end (idle ones included). */
#define POOL_TIMEOUT_S 600

struct gw_upconn {
	struct gw_upconn *prev, *next; /* idle stack or dead list */
	struct gw_pool *pool;
	struct evhttp_connection *evcon;
	uint32_t port;
	uint64_t served; /* loans that ended with a whole response */
	bool lent, reused, closed;
};

struct gw_pool {
	struct event_base *base;
	const char *name;
	struct gw_stats *stats;
	uint32_t max, n;
	uint32_t port; /* the port last asked for: the engine's current one */
	struct gw_upconn *idle, *dead;
	struct gw_pool_wait *wait_head, *wait_tail;
	struct event *kick; /* frees the dead, serves the waiters */
};

static void list_push(struct gw_upconn **head, struct gw_upconn *c)
{
	c->prev = NULL;
	c->next = *head;
	if (*head)
		(*head)->prev = c;
	*head = c;
}

static void list_unlink(struct gw_upconn **head, struct gw_upconn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		*head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
}

static void upconn_free(struct gw_upconn *c)
{
	/* no close callback into c while it goes */
	evhttp_connection_set_closecb(c->evcon, NULL, NULL);
	evhttp_connection_free(c->evcon);
	free(c);
}

static void pool_kick(struct gw_pool *p)
{
	event_active(p->kick, EV_TIMEOUT, 0);
}

/* evhttp closed a connection that had connected: a lent one's attempt sees its failure (or
 * its Connection: close) and gives it back; an idle one the engine closed goes. */
static void on_close(struct evhttp_connection *evcon, void *arg)
{
	struct gw_upconn *c = arg;
	struct gw_pool *p = c->pool;

	(void)evcon;
	c->closed = true;
	if (c->lent)
		return;
	log_debug("gateway %s: the engine closed an idle connection (port %u).", p->name, c->port);
	list_unlink(&p->idle, c);
	p->n--;
	list_push(&p->dead, c);
	pool_kick(p);
}

static struct gw_upconn *upconn_open(struct gw_pool *p, uint32_t port)
{
	struct gw_upconn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	/* evhttp's sockets are SOCK_CLOEXEC (evutil_socket_ with EVUTIL_SOCK_CLOEXEC) */
	c->evcon = evhttp_connection_base_new(p->base, NULL, POOL_HOST, (uint16_t)port);
	if (!c->evcon) {
		free(c);
		errno = ENOMEM;
		return NULL;
	}
	evhttp_connection_set_timeout(c->evcon, POOL_TIMEOUT_S);
	evhttp_connection_set_closecb(c->evcon, on_close, c);
	c->pool = p;
	c->port = port;
	p->n++;
	p->stats->upstream_connections++;
	return c;
}

static void lend(struct gw_upconn *c)
{
	c->lent = true;
	c->reused = c->served > 0;
	c->closed = false;
}

/* Closes the idle connections to any port but the current one (a replaced group's). */
static void drop_stale(struct gw_pool *p)
{
	for (struct gw_upconn *c = p->idle, *next; c; c = next) {
		next = c->next;
		if (c->port == p->port)
			continue;
		list_unlink(&p->idle, c);
		p->n--;
		upconn_free(c);
	}
}

/* A connection for w now, or NULL (none free, or out of memory: errno). */
static struct gw_upconn *take(struct gw_pool *p, const struct gw_pool_wait *w)
{
	struct gw_upconn *c;

	if (w->port != p->port) {
		p->port = w->port;
		drop_stale(p);
	}
	if (!w->fresh && p->idle) {
		c = p->idle; /* the most recently used: the least likely to be closed */
		list_unlink(&p->idle, c);
		lend(c);
		return c;
	}
	if (p->n >= p->max && p->idle) {
		/* a fresh one wanted with every slot taken: the least recently used idle goes */
		for (c = p->idle; c->next; c = c->next)
			;
		list_unlink(&p->idle, c);
		p->n--;
		upconn_free(c);
	}
	if (p->n >= p->max) {
		errno = EAGAIN;
		return NULL;
	}
	c = upconn_open(p, w->port);
	if (c)
		lend(c);
	return c;
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct gw_pool *p = arg;

	(void)fd;
	(void)what;
	while (p->dead) {
		struct gw_upconn *c = p->dead;

		list_unlink(&p->dead, c);
		upconn_free(c);
	}
	while (p->wait_head) {
		struct gw_pool_wait *w = p->wait_head;
		struct gw_upconn *c = take(p, w);

		if (!c) {
			if (errno != EAGAIN)
				/* the next put or close tries again */
				log_warning("gateway %s: failed to open an engine connection: %m, "
					    "ignoring.",
					    p->name);
			return;
		}
		gw_pool_cancel(p, w);
		w->ready(w, c);
	}
}

struct gw_pool *gw_pool_new(struct event_base *base, const char *name, uint32_t max,
			    struct gw_stats *stats)
{
	struct gw_pool *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	*p = (struct gw_pool){.base = base, .name = name, .stats = stats, .max = max ?: 1};
	p->kick = event_new(base, -1, 0, on_kick, p);
	if (!p->kick) {
		free(p);
		errno = ENOMEM;
		return NULL;
	}
	return p;
}

void gw_pool_free(struct gw_pool *p)
{
	if (!p)
		return;
	on_kick(-1, 0, p); /* the dead */
	while (p->idle) {
		struct gw_upconn *c = p->idle;

		list_unlink(&p->idle, c);
		upconn_free(c);
	}
	event_free(p->kick);
	free(p);
}

int gw_pool_get(struct gw_pool *p, struct gw_pool_wait *w, struct gw_upconn **ret)
{
	struct gw_upconn *c = p->wait_head ? NULL : take(p, w);

	if (c) {
		*ret = c;
		return 0;
	}
	if (p->wait_head == NULL && errno != EAGAIN)
		return -ENOMEM;
	/* FIFO: behind the ones already waiting, even when a slot is free this instant */
	w->prev = p->wait_tail;
	w->next = NULL;
	if (p->wait_tail)
		p->wait_tail->next = w;
	else
		p->wait_head = w;
	p->wait_tail = w;
	w->waiting = true;
	return -EAGAIN;
}

void gw_pool_cancel(struct gw_pool *p, struct gw_pool_wait *w)
{
	if (!w->waiting)
		return;
	if (w->prev)
		w->prev->next = w->next;
	else
		p->wait_head = w->next;
	if (w->next)
		w->next->prev = w->prev;
	else
		p->wait_tail = w->prev;
	w->prev = w->next = NULL;
	w->waiting = false;
}

struct evhttp_connection *gw_pool_put(struct gw_pool *p, struct gw_upconn *c, bool complete)
{
	struct evhttp_connection *evcon = c->evcon;

	c->lent = false;
	if (p->wait_head)
		pool_kick(p);
	if (complete && !c->closed && c->port == p->port) {
		c->served++;
		list_push(&p->idle, c);
		return NULL;
	}
	/* cut short (a half-read response may follow), closed, or to a replaced group */
	p->n--;
	evhttp_connection_set_closecb(evcon, NULL, NULL);
	free(c);
	return evcon;
}

struct evhttp_connection *gw_upconn_evcon(const struct gw_upconn *c)
{
	return c->evcon;
}

bool gw_upconn_reused(const struct gw_upconn *c)
{
	return c->reused;
}

bool gw_upconn_closed(const struct gw_upconn *c)
{
	return c->closed;
}
