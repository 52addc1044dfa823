/* SPDX-License-Identifier: MIT */
/*
 * The gateway's listener and proxy: client requests in (evhttp server), attempts upstream
 * (each on a keep-alive connection lent by the engine's pool; cancelling one closes its
 * connection), the wait for a recovery, and the client's reply (a stream spliced across
 * attempts, or one body).
 *
 * Lifetimes. A client request (struct gw_req) lives until its reply is ended or its client
 * went away and the reply was ended for evhttp to free. An attempt (struct gw_attempt) is
 * owned by its request until it ends; libevent may still be inside the attempt's callbacks
 * then, so attempts are detached and freed from a zero-timeout event, never in a callback.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "log.h"
#include "supervisor-config.h"
#include "supervisor-gateway-http.h"
#include "supervisor-gateway-limits.h"
#include "supervisor-gateway-pool.h"
#include "supervisor-gateway-resume.h"
#include "supervisor-gateway-sse.h"
#include "supervisor-gateway-stats.h"
#include "supervisor-gateway.h"
#include "supervisor.h"
#include "sv-policy.h"
#include "sv-recovery.h"
#include "util.h"

#define GW_TICK_MS	 5
#define GW_EVENT_MAX	 (4u << 20)  /* one SSE event from the engine */
#define GW_RESPONSE_MAX	 (64u << 20) /* one non-stream response from the engine */
#define GW_UPSTREAM_HOST "127.0.0.1"
/* A failed attempt while the engine serves and no recovery starts is retried this many
 * times, GW_RETRY_MS after the failure, doubling, before gateway_detect_grace ends it. */
#define GW_RETRIES  3
#define GW_RETRY_MS 100
/* An attempt whose request cannot have reached the engine (its connection refused, or a
 * reused idle one the engine had closed) is made again at once on a new connection, this
 * many times in a row at most, before it counts as the engine's failure. */
#define GW_RESEND 2

enum req_state {
	REQ_WAITING,	/* for the engine to serve (it is recovering) */
	REQ_UPSTREAM,	/* an attempt is in flight */
	REQ_RECOVERING, /* the attempt failed: waiting for the engine's recovery */
};

struct gw_engine;
struct gw_req;

struct gw_attempt {
	struct gw_req *r; /* NULL: detached (cancelled or ended) */
	struct gw_engine *ge;
	struct evhttp_connection *conn; /* while lent, or to free with the attempt */
	struct gw_upconn *uc;		/* the pool's connection lent to it */
	struct gw_pool_wait wait;	/* for a connection */
	struct evhttp_request *ureq;	/* NULL once libevent freed it */
	int code;			/* upstream status, 0 before the headers */
	int uerr;			/* evhttp's error, -1: none */
	bool failed;
	bool complete;	       /* the response was read whole */
	struct evbuffer *sse;  /* stream bytes not yet split into events */
	struct evbuffer *body; /* a non-stream (or error) response */
};

struct gw_req {
	struct gw_req *prev, *next;
	struct gw_engine *ge;
	struct evhttp_request *creq;
	struct evhttp_connection *cconn;
	enum evhttp_cmd_type method;
	char *uri;
	/* what goes upstream: the client's end-to-end headers (passthrough) or the body's type
	 * (journaled), and Via, X-Forwarded-For */
	struct evkeyvalq *cheaders;
	struct evbuffer *cbody; /* the client's body (passthrough resends it) */
	bool managed;		/* token-in/token-out: journaled, resumable */
	struct gw_call call;
	enum req_state state;
	struct gw_attempt *a;
	struct gw_eof_watch *eof; /* the client closing while its request is served */
	bool reply_started, client_gone, paused;
	bool sse; /* a passthrough reply that is an event stream (the engine's Content-Type) */
	uint32_t attempt_port;
	uint64_t attempt_nrec; /* the engine's recoveries started when the attempt began */
	uint64_t target_nrec;  /* the recovery that replaces the failed attempt's worker */
	uint64_t deadline_ms, grace_ms;
	uint64_t retry_ms; /* when a retry against the serving engine may start */
	unsigned retries;  /* made since the last recovery the request followed */
	unsigned resends;  /* GW_RESEND's, in a row */
	bool refused;	   /* the last attempt's connection was refused: the engine never saw it */
	char why[160];
	struct gateway_traj_ticket traj; /* X-Belayer-Trajectory's entry; seq 0: untagged */
	enum gw_path path;		 /* for the metrics */
	uint16_t status;     /* the reply's status, or the failure's when a begun reply failed */
	uint32_t n_attempts; /* started */
	uint64_t start_us;
};

struct gw_engine {
	struct supervisor *s;
	struct sv_engine *e;
	const struct sv_engine_config *cfg;
	struct evhttp *http;
	struct gw_conns *conns; /* its client connections' bounds */
	enum gw_seed seed;
	struct gw_req *reqs;
	uint32_t n_reqs, n_waiting;
	struct gw_pool *pool;
	struct gw_stats stats;
};

struct gateway {
	struct supervisor *s;
	struct event_base *base;
	struct event *tick;
	size_t n;
	struct gw_engine ge[CONFIG_ENGINES_MAX];
};

static struct gateway *gw;

static void req_advance(struct gw_req *r);

static uint64_t mono_us(void)
{
	struct timespec ts;

	(void)clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* ---- attempts ---------------------------------------------------------------------------- */

static void attempt_free_cb(evutil_socket_t fd, short what, void *arg)
{
	struct gw_attempt *a = arg;

	(void)fd;
	(void)what;
	/* Frees a request still pending on it without calling its callbacks: the upstream
	 * engine sees the connection close, which cancels its request. */
	if (a->conn)
		evhttp_connection_free(a->conn);
	if (a->sse)
		evbuffer_free(a->sse);
	if (a->body)
		evbuffer_free(a->body);
	free(a);
}

/* Detaches a from its request; it is freed from the loop. Its connection goes back to the
 * pool when its response was read whole, else is closed. */
static void attempt_drop(struct gw_req *r)
{
	struct gw_attempt *a = r->a;

	if (!a)
		return;
	r->a = NULL;
	a->r = NULL;
	gw_pool_cancel(a->ge->pool, &a->wait);
	if (a->uc) {
		a->conn = gw_pool_put(a->ge->pool, a->uc, a->complete);
		a->uc = NULL;
	}
	if (event_base_once(gw->base, -1, EV_TIMEOUT, attempt_free_cb, a, &(struct timeval){0}) < 0)
		/* cannot happen short of ENOMEM; leaking beats a use after free */
		log_warning("gateway: failed to schedule an upstream connection's release, "
			    "ignoring.");
}

/* ---- replies to the client --------------------------------------------------------------- */

static void req_free(struct gw_req *r)
{
	struct gw_engine *ge = r->ge;

	attempt_drop(r);
	gw_stats_reply(&ge->stats, r->path, r->status, mono_us() - r->start_us);
	gw_eof_watch_free(r->eof);
	if (r->traj.seq)
		gateway_trajs_end(gw->s->gw_trajs, &r->traj, r->managed && r->call.finished,
				  r->call.j.ngen, mono_us());
	if (r->state == REQ_WAITING)
		ge->n_waiting--;
	if (r->prev)
		r->prev->next = r->next;
	else
		ge->reqs = r->next;
	if (r->next)
		r->next->prev = r->prev;
	ge->n_reqs--;
	if (r->managed)
		gw_call_finish(&r->call);
	else
		json_object_put(r->call.body);
	if (r->cbody)
		evbuffer_free(r->cbody);
	if (r->cheaders) {
		evhttp_clear_headers(r->cheaders);
		free(r->cheaders);
	}
	free(r->uri);
	free(r);
}

/* Hands the client request back to evhttp: no close callback for it after this. */
static void client_release(struct gw_req *r)
{
	if (!r->client_gone && r->cconn)
		evhttp_connection_set_closecb(r->cconn, NULL, NULL);
}

static void send_json_error(struct evhttp_request *creq, int code, const char *type,
			    const char *msg)
{
	struct evbuffer *b = evbuffer_new();
	json_object *o = json_object_new_object(), *e = json_object_new_object();

	json_object_object_add(e, "message", json_object_new_string(msg));
	json_object_object_add(e, "type", json_object_new_string(type));
	json_object_object_add(e, "code", json_object_new_int(code));
	json_object_object_add(o, "error", e);
	evhttp_add_header(evhttp_request_get_output_headers(creq), "Content-Type",
			  "application/json");
	if (b)
		evbuffer_add_printf(b, "%s\n",
				    json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	evhttp_send_reply(creq, code, gw_http_reason(code), b);
	if (b)
		evbuffer_free(b);
	json_object_put(o);
}

static const char *error_type(int code)
{
	return gw_http_error_type(code);
}

/* Ends r with an error: a status when nothing was sent yet, an SSE error event otherwise. */
static void req_fail(struct gw_req *r, int code, const char *msg)
{
	log_info("gateway %s: %s %s: %d %s", r->ge->cfg->name,
		 r->method == EVHTTP_REQ_POST ? "POST" : "request", r->uri, code, msg);
	attempt_drop(r);
	client_release(r);
	r->status = (uint16_t)code;
	if (!r->reply_started) {
		send_json_error(r->creq, code, error_type(code), msg);
	} else if (!r->managed && !r->sse) {
		/* A passthrough body cut short (the engine died mid-reply): the connection is
		 * closed without the chunked reply's end, so the client sees it truncated, never
		 * as a whole 200. evhttp frees the request with its connection. */
		if (r->cconn)
			evhttp_connection_free(r->cconn);
	} else {
		struct evbuffer *b = evbuffer_new();

		/* A passthrough stream gets the error event too, after a blank line that ends
		 * whatever event was cut, and no [DONE]: a truncated stream never looks whole. */
		if (b && !r->managed)
			(void)evbuffer_add(b, "\n\n", 2);
		if (b && !r->client_gone) {
			json_object *o = json_object_new_object(), *e = json_object_new_object();
			const char *s;

			json_object_object_add(e, "message", json_object_new_string(msg));
			json_object_object_add(e, "type", json_object_new_string(error_type(code)));
			json_object_object_add(e, "code", json_object_new_int(code));
			json_object_object_add(o, "error", e);
			s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
			(void)gw_sse_write(b, s, strlen(s));
			if (r->managed)
				(void)gw_sse_write(b, "[DONE]", 6);
			json_object_put(o);
			evhttp_send_reply_chunk(r->creq, b);
		}
		if (b)
			evbuffer_free(b);
		evhttp_send_reply_end(r->creq);
	}
	req_free(r);
}

/* The client went away: the attempt is cancelled (its connection closed), the reply ended so
 * that evhttp frees the detached request. */
static void on_client_close(struct evhttp_connection *conn, void *arg)
{
	struct gw_req *r = arg;

	(void)conn;
	r->client_gone = true;
	r->status = 499;
	r->ge->stats.client_disconnects++;
	log_debug("gateway %s: client of %s went away, cancelling.", r->ge->cfg->name, r->uri);
	attempt_drop(r);
	if (r->reply_started)
		evhttp_send_reply_end(r->creq);
	else
		evhttp_send_error(r->creq, 499, NULL);
	req_free(r);
}

/* The client closed its end while its request is upstream or waits for a recovery (evhttp
 * reads nothing from it then, and a non-stream reply writes nothing until its end): cancelled
 * as on_client_close, the connection freed with the request. */
static void on_client_eof(void *arg)
{
	struct gw_req *r = arg;
	struct evhttp_connection *cconn = r->cconn;

	log_debug("gateway %s: client of %s closed its connection, cancelling.", r->ge->cfg->name,
		  r->uri);
	r->ge->stats.client_disconnects++;
	evhttp_connection_set_closecb(cconn, NULL, NULL);
	r->client_gone = true;
	r->status = 499;
	req_free(r);
	evhttp_connection_free(cconn);
}

static void on_client_drained(struct evhttp_connection *conn, void *arg)
{
	struct gw_req *r = arg;

	(void)conn;
	if (r->paused && r->a && r->a->conn) {
		r->paused = false;
		(void)bufferevent_enable(evhttp_connection_get_bufferevent(r->a->conn), EV_READ);
	}
}

/* Sends b to the client; above the client buffer limit, stops reading the upstream until the
 * client's output drains (the engine's socket then fills and backpressures it). */
static void client_send(struct gw_req *r, struct evbuffer *b)
{
	struct bufferevent *cbev;

	if (!evbuffer_get_length(b))
		return;
	evhttp_send_reply_chunk_with_cb(r->creq, b, on_client_drained, r);
	cbev = r->cconn ? evhttp_connection_get_bufferevent(r->cconn) : NULL;
	if (cbev && r->a && r->a->conn &&
	    evbuffer_get_length(bufferevent_get_output(cbev)) > r->ge->cfg->gateway_client_buffer) {
		r->paused = true;
		(void)bufferevent_disable(evhttp_connection_get_bufferevent(r->a->conn), EV_READ);
	}
}

static void copy_headers(struct evkeyvalq *to, const struct evkeyvalq *from)
{
	gw_http_copy_headers(to, from);
}

/* The managed stream's reply starts at the first attempt's 200. */
static void reply_start(struct gw_req *r)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(r->creq);

	if (r->managed) {
		evhttp_add_header(h, "Content-Type", "text/event-stream");
		evhttp_add_header(h, "Cache-Control", "no-cache");
	} else if (r->a && r->a->ureq) {
		const struct evkeyvalq *uh = evhttp_request_get_input_headers(r->a->ureq);
		const char *ct = evhttp_find_header(uh, "Content-Type");

		copy_headers(h, uh);
		r->sse = ct && strncasecmp(ct, "text/event-stream", 17) == 0;
	}
	gw_http_add_via(h);
	r->status = (uint16_t)(r->a ? r->a->code : 200);
	evhttp_send_reply_start(r->creq, r->status, "OK");
	r->reply_started = true;
}

/* ---- failure and recovery ---------------------------------------------------------------- */

static bool engine_serving(const struct gw_engine *ge)
{
	struct engine_upstream u;

	engine_upstream(ge->e, &u);
	return !u.recovering && u.ready && u.port;
}

/* The attempt in flight failed (connection lost, stream cut, 5xx): wait for the engine's
 * recovery and resume, unless the request cannot be resumed. */
static void attempt_failed(struct gw_req *r, const char *why)
{
	struct gw_engine *ge = r->ge;
	uint64_t now = now_ms();

	attempt_drop(r);
	snprintf(r->why, sizeof(r->why), "%s", why);
	/* A passthrough request whose reply began cannot be continued. */
	if (!r->managed && r->reply_started) {
		req_fail(r, 502, why);
		return;
	}
	if (r->managed && !gw_call_resumable(&r->call)) {
		req_fail(r, 502, "the engine failed and the request cannot be resumed");
		return;
	}
	if (r->managed && r->call.j.max && r->call.j.nprompt + r->call.j.ngen >= r->call.j.max) {
		req_fail(r, 502, "the engine failed and the request is too long to resume");
		return;
	}
	/* a refused connection is retried every GW_RETRY_MS: not a line each time */
	log_full_errno(r->refused ? LOG_LEVEL_DEBUG : LOG_LEVEL_INFO, 0,
		       "gateway %s: %s: %s; %s after the engine's recovery.", ge->cfg->name, r->uri,
		       why, r->managed && r->call.j.ngen ? "resuming" : "resubmitting");
	r->state = REQ_RECOVERING;
	/* The recovery that replaces the worker the attempt talked to: the first one started after
	 * the attempt began (attempts begin only while no recovery runs). It may be running now,
	 * or be over already when the failure is seen late (then the attempt restarts at once),
	 * or be yet to start. */
	r->target_nrec = r->attempt_nrec + 1;
	r->retry_ms = now + ((uint64_t)GW_RETRY_MS << MIN(r->retries, GW_RETRIES));
	r->grace_ms = now + ge->cfg->gateway_detect_grace_ms;
	r->deadline_ms = now + ge->cfg->gateway_recovery_timeout_ms;
}

/* ---- upstream callbacks ------------------------------------------------------------------ */

static int on_up_header(struct evhttp_request *ureq, void *arg)
{
	struct gw_attempt *a = arg;
	struct gw_req *r = a->r;

	a->code = evhttp_request_get_response_code(ureq);
	if (!r)
		return -1; /* detached: stop reading */
	/* A 200 stream starts (or, resumed, continues) the client's stream; anything else is
	 * collected whole and judged at the end. */
	if (a->code == 200 && !r->reply_started && (r->managed ? r->call.stream : true))
		reply_start(r);
	return 0;
}

/* Splits the buffered stream into events and forwards their client versions. */
static int stream_events(struct gw_req *r, struct gw_attempt *a)
{
	struct evbuffer *out = evbuffer_new();
	int r2 = 0;

	if (!out)
		return -ENOMEM;
	for (;;) {
		char *data;
		size_t n;

		r2 = gw_sse_next(a->sse, GW_EVENT_MAX, &data, &n);
		if (r2 <= 0)
			break;
		/* [DONE] is the gateway's to send, once, after the last attempt. */
		if (strcmp(data, "[DONE]") != 0 && n > 0)
			r2 = gw_call_on_response(&r->call, data, n, out);
		free(data);
		if (r2 < 0)
			break;
	}
	client_send(r, out);
	evbuffer_free(out);
	return r2;
}

static void on_up_chunk(struct evhttp_request *ureq, void *arg)
{
	struct gw_attempt *a = arg;
	struct gw_req *r = a->r;
	struct evbuffer *in = evhttp_request_get_input_buffer(ureq);
	int k;

	if (!r || a->failed) {
		evbuffer_drain(in, evbuffer_get_length(in));
		return;
	}
	if (a->code == 200 && r->reply_started && !r->managed) {
		client_send(r, in);
		return;
	}
	if (a->code == 200 && r->managed && r->call.stream) {
		evbuffer_add_buffer(a->sse, in);
		k = stream_events(r, a);
		if (r->traj.seq)
			gateway_trajs_progress(gw->s->gw_trajs, &r->traj, r->call.j.ngen,
					       mono_us());
		if (k == -E2BIG) {
			/* Served on, no longer resumable. */
			r->call.j.max = 0;
		} else if (k < 0) {
			a->failed = true;
			req_fail(r, 502,
				 k == -EMSGSIZE ? "the engine sent an oversize event"
						: "the engine sent a malformed event");
		}
		return;
	}
	if (evbuffer_get_length(a->body) + evbuffer_get_length(in) > GW_RESPONSE_MAX) {
		a->failed = true;
		req_fail(r, 502, "the engine's response is too large");
		return;
	}
	evbuffer_add_buffer(a->body, in);
}

static void upstream_error_reply(struct gw_req *r, struct gw_attempt *a)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(r->creq);
	const char *ct = a->ureq ? evhttp_find_header(evhttp_request_get_input_headers(a->ureq),
						      "Content-Type")
				 : NULL;

	evhttp_add_header(h, "Content-Type", ct ? ct : "application/json");
	gw_http_add_via(h);
	client_release(r);
	r->status = (uint16_t)a->code;
	/* a HEAD's answer has no body, whatever its status */
	evhttp_send_reply(r->creq, a->code, "Error", r->method == EVHTTP_REQ_HEAD ? NULL : a->body);
	attempt_drop(r);
	req_free(r);
}

static void on_up_error(enum evhttp_request_error err, void *arg)
{
	struct gw_attempt *a = arg;

	a->uerr = (int)err;
}

static int attempt_open(struct gw_req *r, bool resend);

/* An attempt that failed before any response head: was its request surely not taken up by the
 * engine? Its connection never connected (refused: evhttp closes a connected one before it
 * calls back), or it was an idle one reused and the engine had closed it (the keep-alive
 * race: the engine drops idle connections, a request written meanwhile is never read; a
 * worker that died with it is a recovery's, and the resubmission follows it anyway). A
 * timeout is no such failure. Then the attempt is made again at once on a new connection,
 * not counted as the engine's failure. */
static bool attempt_resend(struct gw_req *r, struct gw_attempt *a)
{
	struct gw_engine *ge = r->ge;
	struct engine_upstream u;
	bool reused = a->uc && gw_upconn_reused(a->uc);

	if (!a->uc || a->code != 0 || a->uerr == EVREQ_HTTP_TIMEOUT || r->resends >= GW_RESEND ||
	    (gw_upconn_closed(a->uc) && !reused))
		return false;
	engine_upstream(ge->e, &u);
	if (u.recovering || !u.ready || u.port != r->attempt_port)
		return false;
	r->resends++;
	ge->stats.upstream_retries++;
	log_debug("gateway %s: %s: the engine %s; sending it again on a new connection.",
		  ge->cfg->name, r->uri,
		  reused ? "had closed the idle connection" : "refused the connection");
	attempt_drop(r);
	if (attempt_open(r, true) < 0)
		req_fail(r, 503, "out of memory");
	return true;
}

static void on_up_done(struct evhttp_request *ureq, void *arg)
{
	struct gw_attempt *a = arg;
	struct gw_req *r = a->r;
	char why[128];

	if (!ureq)
		a->ureq = NULL; /* libevent freed it: the connection failed */
	a->complete = ureq && a->code != 0;
	if (!r || a->failed)
		return;
	if (!ureq || a->code == 0) {
		if (attempt_resend(r, a))
			return;
		r->refused = a->uc && !gw_upconn_closed(a->uc) && a->uerr != EVREQ_HTTP_TIMEOUT;
		attempt_failed(r, r->refused ? "the engine refused the connection"
					     : "the engine connection failed");
		return;
	}
	r->resends = 0;
	if (gw_http_engine_failed(a->code)) {
		snprintf(why, sizeof(why), "the engine answered %d", a->code);
		attempt_failed(r, why);
		return;
	}
	if (a->code != 200) {
		/* the engine's verdict on the request (400 ...): the client's, unchanged */
		if (!r->reply_started) {
			upstream_error_reply(r, a);
		} else {
			snprintf(why, sizeof(why), "the engine refused the resumed request (%d)",
				 a->code);
			req_fail(r, 502, why);
		}
		return;
	}
	if (!r->managed) {
		if (!r->reply_started) /* cannot happen: the header callback started it */
			reply_start(r);
		client_release(r);
		evhttp_send_reply_end(r->creq);
		req_free(r);
		return;
	}
	if (r->call.stream) {
		/* a last event without its blank line */
		if (evbuffer_get_length(a->sse))
			(void)evbuffer_add(a->sse, "\n\n", 2);
		if (stream_events(r, a) < 0) {
			req_fail(r, 502, "the engine sent a malformed event");
			return;
		}
		if (!r->call.finished) {
			attempt_failed(r, "the engine's stream ended early");
			return;
		}
		struct evbuffer *b = evbuffer_new();

		if (b) {
			(void)gw_sse_write(b, "[DONE]", 6);
			evhttp_send_reply_chunk(r->creq, b);
			evbuffer_free(b);
		}
		client_release(r);
		evhttp_send_reply_end(r->creq);
		req_free(r);
		return;
	}
	/* non-stream: one body, rewritten */
	{
		struct evbuffer *out = evbuffer_new();
		size_t n = evbuffer_get_length(a->body);
		const char *data = (const char *)evbuffer_pullup(a->body, (ssize_t)n);
		int k = out && data ? gw_call_on_response(&r->call, data, n, out) : -ENOMEM;

		if (k < 0) {
			if (out)
				evbuffer_free(out);
			req_fail(r, 502,
				 "the engine's response is not one the gateway understands");
			return;
		}
		evhttp_add_header(evhttp_request_get_output_headers(r->creq), "Content-Type",
				  "application/json");
		client_release(r);
		r->status = 200;
		evhttp_send_reply(r->creq, 200, "OK", out);
		evbuffer_free(out);
		req_free(r);
	}
}

/* ---- attempts out ------------------------------------------------------------------------ */

/* Sends a's request on the connection lent to it. */
static void attempt_send(struct gw_attempt *a, struct gw_upconn *c)
{
	struct gw_req *r = a->r;

	a->uc = c;
	a->conn = gw_upconn_evcon(c);
	a->ge->stats.upstream_requests++;
	if (evhttp_make_request(a->conn, a->ureq, r->method,
				r->managed ? gw_call_upstream_uri(&r->call, r->uri) : r->uri) < 0) {
		/* evhttp freed the request */
		a->ureq = NULL;
		attempt_failed(r, "the engine could not be reached");
		return;
	}
	/* A new connection's socket exists now (its connect has begun; nothing is written
	 * before it completes): no Nagle delay, set once. evhttp writes a request's head and
	 * body apart, and on a kept-alive connection the body then waited for the engine's
	 * delayed ACK, 40 ms a request. */
	if (!gw_upconn_reused(c))
		gw_nodelay(bufferevent_getfd(evhttp_connection_get_bufferevent(a->conn)));
}

static void on_conn_ready(struct gw_pool_wait *w, struct gw_upconn *c)
{
	attempt_send((struct gw_attempt *)((char *)w - offsetof(struct gw_attempt, wait)), c);
}

/* A new attempt of r; resend: the same one again (attempt_resend), not a new try. */
static int attempt_open(struct gw_req *r, bool resend)
{
	struct gw_engine *ge = r->ge;
	struct gw_attempt *a = calloc(1, sizeof(*a));
	struct gw_upconn *c;
	struct engine_upstream u;
	struct evkeyvalq *h;
	char host[64];
	char *body = NULL;
	size_t len = 0;
	int k;

	if (!a)
		return -ENOMEM;
	a->r = r;
	a->ge = ge;
	a->uerr = -1;
	r->a = a;
	/* a resend of a request the engine never took up is the same attempt, not a new try */
	if (!resend && r->n_attempts++) {
		if (r->managed && r->call.j.ngen)
			ge->stats.resumed++;
		else
			ge->stats.resubmitted++;
	}
	a->sse = evbuffer_new();
	a->body = evbuffer_new();
	engine_upstream(ge->e, &u);
	r->attempt_port = u.port;
	r->attempt_nrec = u.n_recoveries;
	a->ureq = evhttp_request_new(on_up_done, a);
	if (!a->sse || !a->body || !a->ureq)
		goto nomem;
	evhttp_request_set_header_cb(a->ureq, on_up_header);
	evhttp_request_set_chunked_cb(a->ureq, on_up_chunk);
	evhttp_request_set_error_cb(a->ureq, on_up_error);
	h = evhttp_request_get_output_headers(a->ureq);
	if (r->cheaders)
		copy_headers(h, r->cheaders);
	snprintf(host, sizeof(host), "%s:%u", GW_UPSTREAM_HOST, r->attempt_port);
	evhttp_add_header(h, "Host", host);
	if (r->managed) {
		k = gw_call_upstream_body(&r->call, ge->seed, &body, &len);
		if (k < 0)
			goto nomem;
		if (!r->cheaders)
			evhttp_add_header(h, "Content-Type", "application/json");
		k = evbuffer_add(evhttp_request_get_output_buffer(a->ureq), body, len);
		free(body);
		if (k < 0)
			goto nomem;
	} else if (r->cbody && evbuffer_get_length(r->cbody)) {
		struct evbuffer_ptr p;

		/* a copy: a resubmission sends it again */
		evbuffer_ptr_set(r->cbody, &p, 0, EVBUFFER_PTR_SET);
		if (evbuffer_add_buffer_reference(evhttp_request_get_output_buffer(a->ureq),
						  r->cbody) < 0)
			goto nomem;
	}
	r->state = REQ_UPSTREAM;
	r->refused = false;
	if (!resend) {
		r->resends = 0;
		gateway_trajs_attempt(gw->s->gw_trajs, &r->traj);
	}
	a->wait = (struct gw_pool_wait){
		.port = r->attempt_port, .fresh = resend, .ready = on_conn_ready};
	k = gw_pool_get(ge->pool, &a->wait, &c);
	if (k == -EAGAIN)
		return 0; /* on_conn_ready() sends it */
	if (k < 0)
		goto nomem;
	attempt_send(a, c);
	return 0;
nomem:
	if (a->ureq) {
		evhttp_request_free(a->ureq);
		a->ureq = NULL;
	}
	attempt_drop(r);
	return -ENOMEM;
}

static int attempt_start(struct gw_req *r)
{
	return attempt_open(r, false);
}

static void req_advance(struct gw_req *r)
{
	struct gw_engine *ge = r->ge;
	struct engine_upstream e;
	uint64_t now = now_ms();
	char msg[512];

	engine_upstream(ge->e, &e);

	switch (r->state) {
	case REQ_WAITING:
		if (engine_serving(ge)) {
			ge->n_waiting--;
			r->state = REQ_UPSTREAM;
			if (attempt_start(r) < 0)
				req_fail(r, 503, "out of memory");
		} else if (now >= r->deadline_ms) {
			req_fail(r, 503, "the engine is recovering and did not serve in time");
		}
		break;
	case REQ_RECOVERING:
		if (engine_serving(ge) &&
		    (e.n_recoveries >= r->target_nrec || e.port != r->attempt_port)) {
			r->retries = 0;
			if (attempt_start(r) < 0)
				req_fail(r, 503, "out of memory");
		} else if (engine_serving(ge) && (r->retries < GW_RETRIES || r->refused) &&
			   now >= r->retry_ms) {
			/* No recovery began and the engine serves (its probe answers): the failure
			 * was this connection's. No recovery may ever come (a cold-restarted
			 * engine that cut its first connections left them waiting for one, then
			 * 502), so the attempt is made again, a bounded number of times. A refused
			 * connection never reached the engine: retried until it is taken, the
			 * engine fails, or gateway_recovery_timeout, not counted. */
			if (r->refused) {
				ge->stats.upstream_retries++;
				log_debug("gateway %s: %s: %s while the engine serves; retrying.",
					  ge->cfg->name, r->uri, r->why);
			} else {
				log_info("gateway %s: %s: %s while the engine serves; retry %u of "
					 "%u.",
					 ge->cfg->name, r->uri, r->why, ++r->retries, GW_RETRIES);
			}
			if (attempt_start(r) < 0)
				req_fail(r, 503, "out of memory");
		} else if (!e.recovering && now >= r->grace_ms && e.n_recoveries < r->target_nrec &&
			   (r->retries >= GW_RETRIES || !engine_serving(ge))) {
			/* No recovery began: the engine is not dead, the request failed. */
			snprintf(msg, sizeof(msg), "engine \"%s\" failed the request: %s",
				 ge->cfg->name, r->why);
			req_fail(r, 502, msg);
		} else if (now >= r->deadline_ms) {
			snprintf(
				msg, sizeof(msg),
				"engine \"%s\" failed the request (%s) and did not recover in time",
				ge->cfg->name, r->why);
			req_fail(r, 504, msg);
		}
		break;
	case REQ_UPSTREAM:
		break;
	}
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	for (size_t i = 0; i < gw->n; i++) {
		for (struct gw_req *r = gw->ge[i].reqs, *next; r; r = next) {
			next = r->next;
			req_advance(r);
		}
		if (gw->ge[i].conns)
			gw_conns_tick(gw->ge[i].conns);
	}
}

/* ---- client requests in ------------------------------------------------------------------ */

/* X-Belayer-Trajectory (issue 11): a token-in/token-out request becomes its trajectory's
 * pending one. -EINVAL: the header is not a trajectory id (the request is refused: a tag that
 * cannot be matched to the framework's step events would be silently useless). */
static int req_tag(struct gw_req *r)
{
	const char *v =
		evhttp_find_header(evhttp_request_get_input_headers(r->creq), GATEWAY_TRAJ_HEADER);

	if (!v)
		return 0;
	if (gateway_traj_id_check(v) < 0)
		return -EINVAL;
	/* proxied unchanged: no token counts to keep */
	if (!r->managed || !gw->s->gw_trajs)
		return 0;
	return gateway_trajs_begin(gw->s->gw_trajs, v, r->call.j.nprompt, mono_us(), &r->traj);
}

static void on_request(struct evhttp_request *creq, void *arg)
{
	struct gw_engine *ge = arg;
	const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(creq);
	const char *path = u ? evhttp_uri_get_path(u) : NULL;
	enum evhttp_cmd_type m = evhttp_request_get_command(creq);
	struct evbuffer *in = evhttp_request_get_input_buffer(creq);
	struct gw_req *r;
	char err[160];
	int k = -ENOTSUP;

	(void)gw_conns_request(ge->conns, creq);
	gw_http_close_if_asked(creq);
	if (ge->n_reqs >= ge->cfg->gateway_max_requests) {
		ge->stats.rejected[GW_REJECT_REQUESTS]++;
		gw_stats_reply(&ge->stats, gw_path_of(path), 503, 0);
		send_json_error(creq, 503, error_type(503), "too many requests in the gateway");
		return;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		gw_stats_reply(&ge->stats, gw_path_of(path), 503, 0);
		send_json_error(creq, 503, error_type(503), "out of memory");
		return;
	}
	r->ge = ge;
	r->path = gw_path_of(path);
	r->start_us = mono_us();
	r->creq = creq;
	r->cconn = evhttp_request_get_connection(creq);
	r->method = m;
	r->uri = strdup(evhttp_request_get_uri(creq));
	if (m == EVHTTP_REQ_POST && path &&
	    (strcmp(path, "/generate") == 0 || strcmp(path, "/v1/completions") == 0 ||
	     strcmp(path, "/v1/chat/completions") == 0)) {
		size_t n = evbuffer_get_length(in);
		const char *body = (const char *)evbuffer_pullup(in, (ssize_t)n);

		k = gw_call_parse(&r->call,
				  strcmp(path, "/generate") == 0	 ? GW_GENERATE
				  : strcmp(path, "/v1/completions") == 0 ? GW_COMPLETIONS
									 : GW_CHAT,
				  body ? body : "", n, ge->cfg->gateway_journal_tokens, err,
				  sizeof(err));
	}
	/* linked first: req_fail() and req_free() unlink */
	r->next = ge->reqs;
	if (ge->reqs)
		ge->reqs->prev = r;
	ge->reqs = r;
	ge->n_reqs++;
	r->state = REQ_UPSTREAM;
	if (!r->uri) {
		req_fail(r, 503, "out of memory");
		return;
	}
	if (k == -EBADMSG) {
		req_fail(r, 400, err);
		return;
	}
	if (k == -E2BIG) {
		req_fail(r, 413, "the prompt exceeds the gateway's journal bound");
		return;
	}
	if (k == -ENOMEM) {
		req_fail(r, 503, "out of memory");
		return;
	}
	r->managed = k == 0;
	if (req_tag(r) < 0) {
		req_fail(r, 400, GATEWAY_TRAJ_HEADER " must be 1 to 255 visible ASCII characters");
		return;
	}
	/* What goes upstream, kept for a resubmission: a passthrough request's end-to-end headers
	 * and body as the client sent them, a journaled one's body type; Via, X-Forwarded-For. */
	r->cheaders = calloc(1, sizeof(*r->cheaders));
	r->cbody = r->managed ? NULL : evbuffer_new();
	if (!r->cheaders || (!r->managed && !r->cbody)) {
		req_fail(r, 503, "out of memory");
		return;
	}
	r->cheaders->tqh_first = NULL;
	r->cheaders->tqh_last = &r->cheaders->tqh_first;
	if (r->managed)
		evhttp_add_header(r->cheaders, "Content-Type", "application/json");
	else
		copy_headers(r->cheaders, evhttp_request_get_input_headers(creq));
	{
		char *peer = NULL;
		ev_uint16_t pport;

		evhttp_connection_get_peer(r->cconn, &peer, &pport);
		gw_http_add_forwarded(r->cheaders, peer);
	}
	if (!r->managed)
		evbuffer_add_buffer(r->cbody, in);
	evhttp_connection_set_closecb(r->cconn, on_client_close, r);
	r->eof = gw_eof_watch_new(gw->base, r->cconn, on_client_eof, r);
	if (!r->eof)
		log_warning("gateway %s: %s: cannot watch its client's end (%m): a client gone is "
			    "noticed only when its reply is written, ignoring.",
			    ge->cfg->name, r->uri);
	if (engine_serving(ge)) {
		if (attempt_start(r) < 0)
			req_fail(r, 503, "out of memory");
		return;
	}
	if (ge->n_waiting >= ge->cfg->gateway_max_waiting) {
		req_fail(r, 503, "the engine is recovering and too many requests wait for it");
		return;
	}
	ge->n_waiting++;
	r->state = REQ_WAITING;
	r->deadline_ms = now_ms() + ge->cfg->gateway_recovery_timeout_ms;
}

/* ---- start / stop ------------------------------------------------------------------------ */

static int parse_seed(const char *s, enum gw_seed *ret)
{
	if (strcmp(s, "derived") == 0)
		*ret = GW_SEED_DERIVED;
	else if (strcmp(s, "advance") == 0)
		*ret = GW_SEED_ADVANCE;
	else if (strcmp(s, "same") == 0)
		*ret = GW_SEED_SAME;
	else
		return -EINVAL;
	return 0;
}

static int listen_one(struct gw_engine *ge)
{
	struct evhttp_bound_socket *bound;
	char addr[64], *colon;
	unsigned long port;
	char *end;

	snprintf(addr, sizeof(addr), "%s", ge->cfg->gateway_listen);
	colon = strrchr(addr, ':');
	if (!colon)
		return log_error_errno(-EINVAL,
				       "engine %s: gateway_listen \"%s\" is not ADDRESS:PORT",
				       ge->cfg->name, ge->cfg->gateway_listen);
	*colon = 0;
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || *end || port > 65535 || colon == addr)
		return log_error_errno(-EINVAL,
				       "engine %s: gateway_listen \"%s\" is not ADDRESS:PORT",
				       ge->cfg->name, ge->cfg->gateway_listen);
	if (parse_seed(ge->cfg->gateway_seed, &ge->seed) < 0)
		return log_error_errno(
			-EINVAL, "engine %s: gateway_seed \"%s\" is not derived, advance or same",
			ge->cfg->name, ge->cfg->gateway_seed);
	ge->http = evhttp_new(gw->base);
	if (!ge->http)
		return log_error_errno(-ENOMEM, "Failed to create the gateway of engine %s.",
				       ge->cfg->name);
	ge->conns = gw_conns_new(gw->base, ge->http,
				 &(struct gw_limits){
					 .max_header = ge->cfg->gateway_max_header,
					 .max_body = ge->cfg->gateway_max_body,
					 .header_timeout_ms = ge->cfg->gateway_header_timeout_ms,
					 .body_timeout_ms = ge->cfg->gateway_body_timeout_ms,
					 .max_connections = ge->cfg->gateway_max_connections,
				 },
				 &ge->stats, ge->cfg->name);
	if (!ge->conns)
		return log_error_errno(-ENOMEM, "Failed to create the gateway of engine %s.",
				       ge->cfg->name);
	evhttp_set_allowed_methods(ge->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
						     EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
						     EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
	evhttp_set_gencb(ge->http, on_request, ge);
	ge->pool = gw_pool_new(gw->base, ge->cfg->name, ge->cfg->gateway_upstream_connections,
			       &ge->stats);
	if (!ge->pool)
		return log_error_errno(-ENOMEM, "Failed to create the gateway of engine %s.",
				       ge->cfg->name);
	bound = evhttp_bind_socket_with_handle(ge->http, addr, (uint16_t)port);
	if (!bound)
		return log_error_errno(-EADDRNOTAVAIL,
				       "Failed to listen on %s for the gateway of engine %s: %m",
				       ge->cfg->gateway_listen, ge->cfg->name);
	/* evhttp listens with a backlog of 128: a burst of a thousand clients' connects would
	 * overflow it (SYNs dropped, retried after 1 s). listen() again sets the backlog. */
	if (listen(evhttp_bound_socket_get_fd(bound), SOMAXCONN) < 0)
		log_warning_errno(-errno,
				  "engine %s: failed to raise the gateway's listen backlog: %m, "
				  "ignoring.",
				  ge->cfg->name);
	/* clients' connections inherit it from the listener (Linux) */
	gw_nodelay(evhttp_bound_socket_get_fd(bound));
	log_info("Gateway of engine %s listening on %s.", ge->cfg->name, ge->cfg->gateway_listen);
	return 0;
}

int gateway_start(struct supervisor *s, struct event_base *base)
{
	int r;

	if (!recovery_engines_n(s))
		return 0;
	gw = calloc(1, sizeof(*gw));
	if (!gw)
		return -ENOMEM;
	gw->s = s;
	gw->base = base;
	for (size_t i = 0; i < recovery_engines_n(s); i++) {
		struct sv_engine *e = recovery_engine(s, i);
		const struct sv_engine_config *cfg = engine_config(e);

		if (!cfg->gateway_listen[0])
			continue;
		gw->ge[gw->n] = (struct gw_engine){.s = s, .e = e, .cfg = cfg};
		r = listen_one(&gw->ge[gw->n]);
		gw->n++;
		if (r < 0)
			goto fail;
	}
	if (!gw->n) {
		free(gw);
		gw = NULL;
		return 0;
	}
	s->gw_trajs = gateway_trajs_new(GATEWAY_TRAJ_MAX);
	if (!s->gw_trajs) {
		r = -ENOMEM;
		goto fail;
	}
	gw->tick = event_new(base, -1, EV_PERSIST, on_tick, NULL);
	if (!gw->tick || event_add(gw->tick, &(struct timeval){.tv_usec = GW_TICK_MS * 1000}) < 0) {
		r = -ENOMEM;
		goto fail;
	}
	return 0;
fail:
	gateway_stop(s);
	return r;
}

void gateway_stop(struct supervisor *s)
{
	if (!gw)
		return;
	for (size_t i = 0; i < gw->n; i++) {
		struct gw_engine *ge = &gw->ge[i];

		while (ge->reqs)
			req_fail(ge->reqs, 503, "the supervisor is stopping");
		if (ge->http)
			evhttp_free(ge->http);
		/* after evhttp's: the connections it freed still hold their sockets */
		gw_conns_free(ge->conns);
		gw_pool_free(ge->pool);
	}
	if (gw->tick)
		event_free(gw->tick);
	gateway_trajs_free(s->gw_trajs);
	s->gw_trajs = NULL;
	/* detached attempts still scheduled are freed when the loop runs them, or not at all:
	 * the process is exiting */
	free(gw);
	gw = NULL;
}

const struct gw_stats *gateway_stats(size_t i, const char **ret_name, uint32_t *ret_in_flight,
				     uint32_t *ret_waiting)
{
	if (!gw || i >= gw->n)
		return NULL;
	*ret_name = gw->ge[i].cfg->name;
	*ret_in_flight = gw->ge[i].n_reqs;
	*ret_waiting = gw->ge[i].n_waiting;
	return &gw->ge[i].stats;
}
