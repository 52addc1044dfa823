/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-canary.h"
#include "supervisor-engines.h"
#include "supervisor-events.h"
#include "supervisor-metrics.h"
#include "supervisor-offload.h"
#include "supervisor-promote.h"

#define REPLY_MAX      (64u << 10)
#define RECORD_BACKOFF 1000 /* ms between failed recordings */

struct canary_job {
	struct sv_job job;
	struct sv_engine *e;
	uint64_t seq;  /* the recovery it checks; 0: a recording from the live primary */
	uint64_t wver; /* the weights version it is for */
	uint32_t port;
	uint64_t timeout_ms;
	char path[128];
	char body[1024];
	uint64_t start_ns, end_ns;
	int error; /* 0 or -errno */
	char answer[CANARY_ANSWER_MAX];
};

bool canary_enabled(const struct supervisor *s, const struct sv_engine *e)
{
	return s->config.recovery_canary && e->cfg->shadow[0];
}

uint64_t canary_primary_version(struct supervisor *s, const struct sv_engine *e, bool *ret_settled)
{
	uint64_t now = now_ms(), v = 0;

	*ret_settled = true;
	for (struct sv_worker *w = s->reg.workers; w; w = w->next) {
		if (w->state != WORKER_ALIVE || w->role != ROLE_PRIMARY ||
		    strcmp(worker_engine(w), e->cfg->name) != 0)
			continue;
		for (struct sv_region *rg = w->regions; rg; rg = rg->next) {
			if (rg->cls != REGION_WEIGHTS)
				continue;
			v = MAX(v, rg->weights_version);
			if (now - rg->since_ms < e->cfg->checksum_settle_ms)
				*ret_settled = false;
		}
	}
	return v;
}

/* ---- the request, off the loop ----------------------------------------------------------- */

int canary_body(const char *path, const uint32_t *ids, size_t n_ids, uint32_t tokens, char *buf,
		size_t cap)
{
	char list[768];
	size_t off = 0;

	list[0] = '\0';
	for (size_t i = 0; i < n_ids; i++) {
		int k = snprintf(list + off, sizeof(list) - off, "%s%" PRIu32, i ? "," : "",
				 ids[i]);

		if (k < 0 || (size_t)k >= sizeof(list) - off)
			return -E2BIG;
		off += (size_t)k;
	}
	/* Greedy: temperature 0 in both APIs, so the answer depends on the weights only. */
	if (strcmp(path, "/generate") == 0)
		off = (size_t)snprintf(
			buf, cap,
			"{\"input_ids\":[%s],\"sampling_params\":{\"max_new_tokens\":"
			"%" PRIu32 ",\"temperature\":0}}",
			list, tokens);
	else
		off = (size_t)snprintf(buf, cap,
				       "{\"prompt\":[%s],\"max_tokens\":%" PRIu32
				       ",\"temperature\":0,\"return_token_ids\":true}",
				       list, tokens);
	return off < cap ? 0 : -E2BIG;
}

/* The array after "key": at p, whitespace dropped, into ret; -EBADMSG unless one of digits. */
static int copy_array(const char *p, const char *end, char *ret, size_t cap)
{
	size_t n = 0;

	while (p < end && (*p == ' ' || *p == ':' || *p == '\t'))
		p++;
	if (p >= end || *p != '[')
		return -EBADMSG;
	for (; p < end; p++) {
		if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
			continue;
		if (!(*p >= '0' && *p <= '9') && *p != ',' && *p != '[' && *p != ']')
			return -EBADMSG;
		if (n + 1 >= cap)
			return -E2BIG;
		ret[n++] = *p;
		if (*p == ']') {
			ret[n] = '\0';
			return n > 2 ? 0 : -EBADMSG; /* "[]": no tokens at all */
		}
	}
	return -EBADMSG;
}

int canary_parse_reply(const char *reply, size_t len, char *ret_answer, size_t cap)
{
	static const char *const keys[] = {"\"output_ids\"", "\"token_ids\""};
	const char *end = reply + len, *body;

	if (len < 12 || strncmp(reply, "HTTP/1.", 7) != 0)
		return -EPROTO;
	if (strncmp(reply + 9, "200", 3) != 0)
		return -EPROTO;
	body = memmem(reply, len, "\r\n\r\n", 4);
	if (!body)
		return -EBADMSG;
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		const char *p = memmem(body, (size_t)(end - body), keys[i], strlen(keys[i]));

		if (p)
			return copy_array(p + strlen(keys[i]), end, ret_answer, cap);
	}
	return -EBADMSG;
}

/* Waits for events on fd until deadline (monotonic ms). 0, or -ETIMEDOUT. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
	for (;;) {
		struct pollfd pf = {.fd = fd, .events = events};
		uint64_t now = now_ms();
		int r;

		if (now >= deadline)
			return -ETIMEDOUT;
		r = poll(&pf, 1, (int)MIN(deadline - now, (uint64_t)INT32_MAX));
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return negative_errno();
	}
}

/* POST body to 127.0.0.1:port path, the whole reply into buf (HTTP/1.0: the engine closes). */
static int http_post(const struct canary_job *cj, char *buf, size_t cap, size_t *ret_len)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)cj->port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	uint64_t deadline = now_ms() + cj->timeout_ms;
	_cleanup_close_ int fd = -1;
	char head[256];
	size_t n = 0;
	int r, err = 0;
	socklen_t elen = sizeof(err);

	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return negative_errno();
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS)
		return negative_errno();
	r = wait_fd(fd, POLLOUT, deadline);
	if (r < 0)
		return r;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0 || err)
		return err ? -err : negative_errno();
	snprintf(head, sizeof(head),
		 "POST %s HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n"
		 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
		 cj->path, strlen(cj->body));
	/* Small enough for one send each into an empty socket buffer. */
	if (send(fd, head, strlen(head), MSG_NOSIGNAL) != (ssize_t)strlen(head) ||
	    send(fd, cj->body, strlen(cj->body), MSG_NOSIGNAL) != (ssize_t)strlen(cj->body))
		return -EIO;
	for (;;) {
		ssize_t k;

		r = wait_fd(fd, POLLIN, deadline);
		if (r < 0)
			return r;
		k = recv(fd, buf + n, cap - 1 - n, 0);
		if (k < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			return negative_errno();
		}
		if (k == 0)
			break;
		n += (size_t)k;
		if (n >= cap - 1)
			return -EMSGSIZE;
	}
	buf[n] = '\0';
	*ret_len = n;
	return n ? 0 : -ENODATA;
}

/* Offload thread. */
static void cjob_run(struct supervisor *s, struct sv_job *j)
{
	struct canary_job *cj = (struct canary_job *)j;
	char *reply = malloc(REPLY_MAX);
	size_t len = 0;

	cj->start_ns = now_ns();
	if (!reply)
		cj->error = -ENOMEM;
	else
		cj->error = http_post(cj, reply, REPLY_MAX, &len);
	if (cj->error == 0)
		cj->error = canary_parse_reply(reply, len, cj->answer, sizeof(cj->answer));
	cj->end_ns = now_ns();
	free(reply);
}

static const char *job_error(const struct canary_job *cj)
{
	switch (cj->error) {
	case -EPROTO:
		return "an HTTP status other than 200";
	case -EBADMSG:
		return "no output_ids / token_ids in the reply";
	case -ETIMEDOUT:
		return "no answer within canary_timeout";
	case -ENODATA:
		return "the connection closed without a reply";
	default:
		return strerror(-cj->error);
	}
}

/* Loop thread. */
static void cjob_done(struct supervisor *s, struct sv_job *j)
{
	struct canary_job *cj = (struct canary_job *)j;
	struct sv_engine *e = cj->e;
	struct eng_canary *c = &e->canary;
	char why[PROTO_MAX_STR + 1];
	bool settled;

	if (cj->seq == 0) {
		c->pending = false;
		if (cj->error < 0) {
			c->n_record_errors++;
			c->retry_ms = now_ms() + MAX(RECORD_BACKOFF, e->cfg->probe_interval_ms);
			if (!c->warned)
				log_warning("Engine %s: canary on port %u: %s; retrying.",
					    e->cfg->name, cj->port, job_error(cj));
			c->warned = true;
			return;
		}
		/* Only what the primary that still serves answered at the version that still
		 * holds: an update that landed meanwhile makes it a guess. */
		if (e->rec || !e->primary_ready || e->primary_port != cj->port ||
		    canary_primary_version(s, e, &settled) != cj->wver || !settled)
			return;
		c->warned = false;
		c->recorded = true;
		c->version = cj->wver;
		snprintf(c->answer, sizeof(c->answer), "%s", cj->answer);
		c->n_recorded++;
		supervisor_emit(s, EVENT_ENGINE, 0, cj->port,
				"engine \"%s\" canary recorded at weights version %" PRIu64 ": %s",
				e->cfg->name, cj->wver, cj->answer);
		return;
	}
	c->last_us = (cj->end_ns - cj->start_ns) / 1000;
	if (cj->error < 0) {
		c->n_error++;
		snprintf(why, sizeof(why), "canary: the promoted group on port %u: %s", cj->port,
			 job_error(cj));
		promote_canary_done(s, e, cj->seq, false, why);
		return;
	}
	if (!c->recorded || c->version != cj->wver || strcmp(c->answer, cj->answer) != 0) {
		c->n_mismatch++;
		snprintf(why, sizeof(why),
			 "canary: the promoted group answered %.64s at weights version %" PRIu64
			 ", the primary %.64s",
			 cj->answer, cj->wver, c->recorded ? c->answer : "nothing");
		promote_canary_done(s, e, cj->seq, false, why);
		return;
	}
	c->n_pass++;
	snprintf(why, sizeof(why),
		 "canary ok: %.64s at weights version %" PRIu64 " in %" PRIu64 " us", cj->answer,
		 cj->wver, c->last_us);
	promote_canary_done(s, e, cj->seq, true, why);
}

static void cjob_free(struct sv_job *j)
{
	free(j);
}

static int submit(struct supervisor *s, struct sv_engine *e, uint64_t seq, uint32_t port,
		  uint64_t wver)
{
	struct canary_job *cj = calloc(1, sizeof(*cj));
	int r;

	if (!cj)
		return -ENOMEM;
	cj->job = (struct sv_job){
		.lane = OFFLOAD_CANARY, .run = cjob_run, .done = cjob_done, .free = cjob_free};
	cj->e = e;
	cj->seq = seq;
	cj->wver = wver;
	cj->port = port;
	cj->timeout_ms = s->config.canary_timeout_ms;
	snprintf(cj->path, sizeof(cj->path), "%s", e->cfg->canary_path);
	r = canary_body(cj->path, e->cfg->canary_prompt.ids, e->cfg->canary_prompt.n,
			e->cfg->canary_tokens, cj->body, sizeof(cj->body));
	if (r < 0) {
		free(cj);
		return r;
	}
	offload_submit(s, &cj->job);
	return 0;
}

/* ---- recording and checking --------------------------------------------------------------- */

void canary_record(struct supervisor *s, struct sv_engine *e)
{
	struct eng_canary *c = &e->canary;
	uint64_t now = now_ms(), v;
	bool settled;

	/* Not before the engine serves (the initial load writes the weights without moving
	 * their version), nor while a recovery runs. */
	if (!canary_enabled(s, e) || e->rec || c->pending || !e->primary_ready ||
	    !e->primary_port || now < c->retry_ms || now - e->ready_ms < e->cfg->checksum_settle_ms)
		return;
	v = canary_primary_version(s, e, &settled);
	if (!settled || (c->recorded && c->version == v))
		return;
	/* Before: without offload threads the job is done inside submit(). */
	c->pending = true;
	if (submit(s, e, 0, e->primary_port, v) < 0)
		c->pending = false;
}

bool canary_armed(struct supervisor *s, const struct sv_engine *e)
{
	bool settled;

	if (!canary_enabled(s, e))
		return true;
	return e->canary.recorded && e->canary.version == canary_primary_version(s, e, &settled);
}

void canary_forget(struct sv_engine *e)
{
	e->canary.recorded = false;
	e->canary.answer[0] = '\0';
}

int canary_check(struct supervisor *s, struct sv_engine *e, uint64_t seq, uint32_t port,
		 uint64_t wver, char *why, size_t cap)
{
	int r;

	if (!e->canary.recorded || e->canary.version != wver) {
		snprintf(why, cap,
			 "canary: no answer recorded from the primary at weights version %" PRIu64
			 " (%s)",
			 wver,
			 e->canary.recorded ? "recorded at another version" : "none recorded yet");
		return -ENODATA;
	}
	r = submit(s, e, seq, port, wver);
	if (r < 0)
		snprintf(why, cap, "canary: %s", strerror(-r));
	return r;
}

void canary_collect_metrics(struct supervisor *s, struct metrics_collector *col)
{
	size_t n = s->engines ? s->engines->n : 0;

	for (size_t i = 0; i < n; i++) {
		const struct sv_engine *e = &s->engines->e[i];
		const struct {
			const char *outcome;
			uint64_t v;
		} o[] = {{"pass", e->canary.n_pass},
			 {"mismatch", e->canary.n_mismatch},
			 {"error", e->canary.n_error}};

		for (size_t k = 0; k < ARRAY_SIZE(o); k++)
			metrics_add(col, "belayer_canary_total", METRIC_COUNTER, o[k].v,
				    "Canaries of promoted groups before traffic, by outcome "
				    "(mismatch and error: a cold restart).",
				    "engine=\"%s\",outcome=\"%s\"", e->cfg->name, o[k].outcome);
	}
	for (size_t i = 0; i < n; i++)
		metrics_add(col, "belayer_canary_recordings_total", METRIC_COUNTER,
			    s->engines->e[i].canary.n_recorded,
			    "Canary answers recorded from the serving primary (one per weights "
			    "version).",
			    "engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		metrics_add(col, "belayer_canary_recording_errors_total", METRIC_COUNTER,
			    s->engines->e[i].canary.n_record_errors,
			    "Canary recordings from the serving primary that failed (an error, no "
			    "token ids, canary_timeout); retried.",
			    "engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		metrics_add(col, "belayer_canary_recorded", METRIC_GAUGE,
			    s->engines->e[i].canary.recorded && canary_armed(s, &s->engines->e[i]),
			    "1 when a canary answer is recorded at the primary's current weights "
			    "version.",
			    "engine=\"%s\"", s->engines->e[i].cfg->name);
}
