/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>

#include "log.h"
#include "supervisor-gateway-frame.h"
#include "supervisor-gateway-http.h"
#include "supervisor-gateway-limits.h"
#include "supervisor-gateway-stats.h"
#include "supervisor.h"
#include "util.h"

enum phase {
	PH_HEAD,    /* reading the request line and headers (or idle before them) */
	PH_BODY,    /* reading the body */
	PH_REQUEST, /* the request is the gateway's, until its reply is sent */
	PH_LINGER,  /* refused: the gateway's answer is out, the rest is read and dropped */
};

struct conn {
	struct conn *prev, *next;
	struct gw_conns *c;
	struct bufferevent *bev; /* a reference of ours: evhttp's free leaves the socket open */
	struct evbuffer_cb_entry *input;
	enum phase phase;
	bool over;	/* accepted over gateway_max_connections */
	bool got_bytes; /* bytes of the request head arrived in this phase */
	bool kept;	/* a kept-alive connection (its head's clock starts at its first byte) */
	uint64_t deadline_ms;
	struct gw_frame frame; /* the request being read */
};

struct gw_conns {
	struct event_base *base;
	struct evhttp *http;
	struct gw_limits lim;
	struct gw_stats *stats;
	char name[64];
	struct conn *conns;
	uint32_t n;
};

static void conn_release(struct conn *k)
{
	struct gw_conns *c = k->c;

	if (k->prev)
		k->prev->next = k->next;
	else
		c->conns = k->next;
	if (k->next)
		k->next->prev = k->prev;
	c->n--;
	if (k->input)
		(void)evbuffer_remove_cb_entry(bufferevent_get_input(k->bev), k->input);
	if (k->phase == PH_LINGER)
		bufferevent_setcb(k->bev, NULL, NULL, NULL, NULL);
	gw_frame_finish(&k->frame);
	/* the last reference closes the socket (BEV_OPT_CLOSE_ON_FREE) */
	(void)bufferevent_decref(k->bev);
	free(k);
}

/* now + ms, or never for 0 */
static uint64_t deadline(uint64_t now, uint64_t ms)
{
	return ms ? now + ms : UINT64_MAX;
}

/* A new request head begins (a new connection, or a reply sent on a kept-alive one). */
static void head_begin(struct conn *k, uint64_t now, bool kept)
{
	k->phase = PH_HEAD;
	k->kept = kept;
	k->got_bytes = false;
	k->deadline_ms = kept ? now + GW_KEEPALIVE_MS : deadline(now, k->c->lim.header_timeout_ms);
	gw_frame_reset(&k->frame);
}

/* ---- refusing: the gateway's answer, evhttp's connection freed, a lingering close ---------- */

static void linger_read(struct bufferevent *bev, void *arg)
{
	struct evbuffer *in = bufferevent_get_input(bev);

	(void)arg;
	(void)evbuffer_drain(in, evbuffer_get_length(in));
}

static void linger_event(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	(void)what;
	/* EOF or an error: the client is done too */
	conn_release(arg);
}

/* evhttp's connection while it has one on the bufferevent: its event callback, set from the
 * accept to bufferevent_free() (the read callback is cleared while a reply is written). */
static struct evhttp_connection *conn_evcon(struct conn *k)
{
	bufferevent_event_cb ecb;
	void *arg = NULL;

	if (k->phase == PH_LINGER)
		return NULL;
	bufferevent_getcb(k->bev, NULL, NULL, &ecb, &arg);
	return ecb ? arg : NULL;
}

static void conn_refuse(struct conn *k, const struct gw_frame_refusal *f)
{
	struct gw_conns *c = k->c;
	struct evhttp_connection *evcon = conn_evcon(k);
	evutil_socket_t fd = bufferevent_getfd(k->bev);
	char body[512], msg[1024];
	int n, m;

	if (f->code)
		log_info("gateway %s: client connection (fd %d): %d %s", c->name, (int)fd, f->code,
			 f->msg);
	else
		log_debug("gateway %s: client connection (fd %d): %s, closing.", c->name, (int)fd,
			  f->msg);
	if (f->why < _GW_REJECT_MAX)
		c->stats->rejected[f->why]++;
	n = f->code ? gw_http_error_json(body, sizeof(body), f->code, f->msg) : -1;
	if (n > 0) {
		m = snprintf(msg, sizeof(msg),
			     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
			     "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
			     f->code, gw_http_reason(f->code), n, body);
		/* A few hundred bytes into an empty socket buffer (evhttp writes nothing while it
		 * reads a request): written at once or lost with a client that stopped reading. */
		if (m > 0 && (size_t)m < sizeof(msg) && fd >= 0 &&
		    send(fd, msg, (size_t)m, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
			log_debug("gateway %s: the client's %d answer was not written: %m", c->name,
				  f->code);
	}
	if (k->input) {
		(void)evbuffer_remove_cb_entry(bufferevent_get_input(k->bev), k->input);
		k->input = NULL;
	}
	/* evhttp lets go of the bufferevent (its callbacks cleared) and shuts the socket's
	 * writing down: our answer, then the FIN. Our reference keeps the socket. */
	if (evcon)
		evhttp_connection_free(evcon);
	k->phase = PH_LINGER;
	k->deadline_ms = now_ms() + GW_LINGER_MS;
	/* what the client sent meanwhile goes with the next read (linger_read) */
	bufferevent_setcb(k->bev, linger_read, NULL, linger_event, k);
	(void)bufferevent_disable(k->bev, EV_WRITE);
	/* No lingering without an answer, nor over gateway_max_connections: a flood of
	 * connections must not hold a socket each for GW_LINGER_MS past the cap. */
	if (!f->code || f->why == GW_REJECT_CONNECTIONS || bufferevent_enable(k->bev, EV_READ) < 0)
		k->deadline_ms = 0; /* released by the next tick */
}

/* ---- the request as it arrives ---------------------------------------------------------- */

/* Bytes of the request's head or body, through the framing scanner (supervisor-gateway-frame.c);
 * the connection's clock follows its phase. */
static bool conn_feed(struct conn *k, const char *p, size_t n, struct gw_frame_refusal *f)
{
	const struct gw_limits *lim = &k->c->lim;
	size_t used;
	bool refused;

	if (k->phase == PH_HEAD && n) {
		/* a kept-alive connection's head is timed from its first byte */
		if (!k->got_bytes && k->kept)
			k->deadline_ms = deadline(now_ms(), lim->header_timeout_ms);
		k->got_bytes = true;
	}
	refused = gw_frame_feed(&k->frame, p, n, &used, f);
	if (k->phase == PH_HEAD && k->frame.state != GW_FRAME_HEAD) {
		/* the head is complete: the body's clock starts (and runs on past the body's end,
		 * until evhttp hands the request over: gw_conns_request) */
		k->phase = PH_BODY;
		k->deadline_ms = deadline(now_ms(), lim->body_timeout_ms);
	}
	return refused;
}

/* Every byte the client sends, as it lands in the input buffer and before evhttp reads it. */
static void on_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
	struct conn *k = arg;
	size_t len = evbuffer_get_length(in), n = MIN(info->n_added, len);
	struct evbuffer_ptr pos;
	struct evbuffer_iovec v[16];
	struct gw_frame_refusal f;
	bool refused = false;
	int nv;

	if (!n || k->phase == PH_LINGER || k->phase == PH_REQUEST)
		return;
	if (k->over) {
		conn_refuse(k, &(struct gw_frame_refusal){503, GW_REJECT_CONNECTIONS,
							  "too many client connections"});
		return;
	}
	if (evbuffer_ptr_set(in, &pos, len - n, EVBUFFER_PTR_SET) < 0)
		return;
	while (n && !refused) {
		nv = evbuffer_peek(in, (ev_ssize_t)n, &pos, v, ARRAY_SIZE(v));
		if (nv <= 0)
			break;
		for (int i = 0; i < MIN(nv, (int)ARRAY_SIZE(v)) && n && !refused; i++) {
			size_t m = MIN(v[i].iov_len, n);

			refused = conn_feed(k, v[i].iov_base, m, &f);
			n -= m;
			(void)evbuffer_ptr_set(in, &pos, m, EVBUFFER_PTR_ADD);
		}
	}
	if (refused)
		conn_refuse(k, &f);
}

/* evhttp's accept: the connection's bufferevent, one reference of it ours. */
static struct bufferevent *on_accept(struct event_base *base, void *arg)
{
	struct gw_conns *c = arg;
	struct conn *k = calloc(1, sizeof(*k));

	if (!k)
		return NULL; /* evhttp makes its own: an unbounded connection */
	k->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!k->bev) {
		free(k);
		return NULL;
	}
	k->input = evbuffer_add_cb(bufferevent_get_input(k->bev), on_input, k);
	bufferevent_incref(k->bev);
	k->c = c;
	gw_frame_init(&k->frame, c->lim.max_header, c->lim.max_body);
	head_begin(k, now_ms(), false);
	k->over = c->n >= c->lim.max_connections;
	k->next = c->conns;
	if (c->conns)
		c->conns->prev = k;
	c->conns = k;
	c->n++;
	c->stats->client_connections++;
	return k->bev;
}

static void on_reply_sent(struct evhttp_request *creq, void *arg)
{
	struct conn *k = arg;

	(void)creq;
	/* Bytes already buffered are a pipelined request's, read with its predecessor and
	 * unseen here: evhttp's own bounds alone apply to it. */
	if (k->phase == PH_REQUEST && !evbuffer_get_length(bufferevent_get_input(k->bev)))
		head_begin(k, now_ms(), true);
}

struct gw_conns *gw_conns_new(struct event_base *base, struct evhttp *http,
			      const struct gw_limits *lim, struct gw_stats *stats, const char *name)
{
	struct gw_conns *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->base = base;
	c->http = http;
	c->lim = *lim;
	c->stats = stats;
	snprintf(c->name, sizeof(c->name), "%s", name);
	evhttp_set_bevcb(http, on_accept, c);
	/* evhttp's own bounds stay as a backstop (a pipelined request's head is read by
	 * evhttp alone), looser than the gateway's so that the gateway's answer comes first */
	evhttp_set_max_headers_size(http,
				    (ev_ssize_t)MIN(lim->max_header * 2, (uint64_t)INT32_MAX));
	evhttp_set_max_body_size(http, (ev_ssize_t)lim->max_body);
	return c;
}

void gw_conns_free(struct gw_conns *c)
{
	if (!c)
		return;
	while (c->conns)
		conn_release(c->conns);
	free(c);
}

void gw_conns_tick(struct gw_conns *c)
{
	uint64_t now = now_ms();

	for (struct conn *k = c->conns, *next; k; k = next) {
		next = k->next;
		if (k->phase == PH_LINGER) {
			if (now >= k->deadline_ms)
				conn_release(k);
			continue;
		}
		if (!conn_evcon(k)) {
			/* evhttp is done with it: the socket closes with our reference */
			conn_release(k);
			continue;
		}
		if (k->over) {
			conn_refuse(k, &(struct gw_frame_refusal){503, GW_REJECT_CONNECTIONS,
								  "too many client connections"});
			continue;
		}
		if (k->phase == PH_REQUEST || now < k->deadline_ms)
			continue;
		/* evhttp may still be writing an answer of its own: it closes the connection */
		if (evbuffer_get_length(bufferevent_get_output(k->bev)))
			continue;
		if (k->phase == PH_BODY)
			conn_refuse(k, &(struct gw_frame_refusal){
					       408, GW_REJECT_BODY_TIMEOUT,
					       "the request body did not arrive within "
					       "the gateway's gateway_body_timeout"});
		else if (k->got_bytes)
			conn_refuse(k, &(struct gw_frame_refusal){
					       408, GW_REJECT_HEADER_TIMEOUT,
					       "the request headers did not arrive within "
					       "the gateway's gateway_header_timeout"});
		else if (!k->kept)
			/* nothing sent at all: no request to answer */
			conn_refuse(k, &(struct gw_frame_refusal){
					       0, GW_REJECT_HEADER_TIMEOUT,
					       "no request within gateway_header_timeout"});
		else
			/* a kept-alive connection idle since its last reply: closed, not refused */
			conn_refuse(k, &(struct gw_frame_refusal){0, _GW_REJECT_MAX,
								  "kept alive and idle"});
	}
}

int gw_conns_request(struct gw_conns *c, struct evhttp_request *creq)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(creq);
	struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;

	for (struct conn *k = c->conns; k && bev; k = k->next)
		if (k->bev == bev) {
			k->phase = PH_REQUEST;
			k->deadline_ms = 0;
			evhttp_request_set_on_complete_cb(creq, on_reply_sent, k);
			return 0;
		}
	return -ENOENT;
}

/* ---- a client gone while its request is served ------------------------------------------ */

struct gw_eof_watch {
	struct event *ev;
	void (*cb)(void *arg);
	void *arg;
};

static void on_eof(evutil_socket_t fd, short what, void *arg)
{
	struct gw_eof_watch *w = arg;

	if (!(what & EV_CLOSED)) {
		char b;
		ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

		if (k < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (k > 0) {
			/* a pipelined request: the client is there, and this backend cannot tell
			 * its end from its bytes any more */
			(void)event_del(w->ev);
			return;
		}
	}
	(void)event_del(w->ev);
	w->cb(w->arg);
}

struct gw_eof_watch *gw_eof_watch_new(struct event_base *base, struct evhttp_connection *cconn,
				      void (*cb)(void *arg), void *arg)
{
	struct bufferevent *bev = cconn ? evhttp_connection_get_bufferevent(cconn) : NULL;
	evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
	short what = event_base_get_features(base) & EV_FEATURE_EARLY_CLOSE ? EV_CLOSED : EV_READ;
	struct gw_eof_watch *w;

	if (fd < 0) {
		errno = EBADF;
		return NULL;
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->cb = cb;
	w->arg = arg;
	w->ev = event_new(base, fd, what | EV_PERSIST, on_eof, w);
	if (!w->ev || event_add(w->ev, NULL) < 0) {
		gw_eof_watch_free(w);
		errno = ENOMEM;
		return NULL;
	}
	return w;
}

void gw_eof_watch_free(struct gw_eof_watch *w)
{
	if (!w)
		return;
	if (w->ev)
		event_free(w->ev);
	free(w);
}
