/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fdpass.h"
#include "log.h"
#include "supervisor-client.h"
#include "supervisor-events.h"
#include "util.h"

static bool peer_allowed(const struct supervisor *s, const struct ucred *cred)
{
	const struct sv_config *c = &s->config;

	if (c->allowed_uids.n == 0 && c->allowed_gids.n == 0)
		return true; /* the socket's owner, group and mode decide */
	return cred->uid == 0 || cred->uid == s->uid ||
	       id_list_contains(&c->allowed_uids, cred->uid) ||
	       id_list_contains(&c->allowed_gids, cred->gid);
}

struct sv_client *client_new(struct supervisor *s, int fd)
{
	struct sv_client *c;
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		log_debug_errno(negative_errno(), "SO_PEERCRED failed: %m");
		(void)safe_close(fd);
		return NULL;
	}
	if (s->n_clients >= s->config.max_connections) {
		s->metrics.rejected[REJECT_MAX_CONNECTIONS]++;
		(void)proto_send_error(fd, EUSERS, 0, "too many connections (max_connections=%u)",
				       s->config.max_connections);
		(void)safe_close(fd);
		return NULL;
	}
	if (!peer_allowed(s, &cred)) {
		s->metrics.rejected[REJECT_PEER_NOT_ALLOWED]++;
		supervisor_emit(s, EVENT_REFUSED, (uint32_t)cred.pid, 0,
				"connection of uid %u gid %u not allowed", cred.uid, cred.gid);
		(void)proto_send_error(fd, EACCES, 0, "uid %u is not allowed", cred.uid);
		(void)safe_close(fd);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		(void)safe_close(fd);
		return NULL;
	}
	c->fd = fd;
	c->cred = cred;
	c->serial = ++s->next_serial;
	c->outq_tail = &c->outq;
	c->next = s->clients;
	if (s->clients)
		s->clients->prev = c;
	s->clients = c;
	s->n_clients++;
	s->metrics.connections_total++;
	return c;
}

void client_free(struct supervisor *s, struct sv_client *c)
{
	if (!c)
		return;
	if (c->worker && c->worker->client == c)
		c->worker->client = NULL;
	while (c->outq) {
		struct sv_packet *p = c->outq;

		c->outq = p->next;
		(void)safe_close(p->fd);
		free(p);
	}
	if (c->prev)
		c->prev->next = c->next;
	else
		s->clients = c->next;
	if (c->next)
		c->next->prev = c->prev;
	s->n_clients--;
	(void)safe_close(c->fd);
	free(c);
}

struct sv_client *client_by_serial(struct supervisor *s, uint64_t serial)
{
	for (struct sv_client *c = s->clients; c; c = c->next)
		if (c->serial == serial)
			return c;
	return NULL;
}

int client_flush(struct supervisor *s, struct sv_client *c)
{
	while (c->outq) {
		struct sv_packet *p = c->outq;
		ssize_t n = fdpass_send(c->fd, p->data, p->len, &p->fd, p->fd >= 0 ? 1 : 0,
					MSG_DONTWAIT);

		if (n == -EAGAIN)
			return 0;
		if (n < 0)
			return (int)n;
		c->outq = p->next;
		if (!c->outq)
			c->outq_tail = &c->outq;
		c->outq_bytes -= p->len;
		(void)safe_close(p->fd);
		free(p);
	}
	return 0;
}

/* droppable: a message that cannot go out right now is dropped instead of queued. Error
 * replies are: shims never read them, and must not be disconnected as slow readers for it. */
static int send_msg(struct supervisor *s, struct sv_client *c, const struct proto_msg *m,
		    bool droppable)
{
	uint8_t buf[PROTO_MAX_MSG];
	int fds[PROTO_MAX_FDS];
	struct sv_packet *p;
	size_t len, nfds = 0;
	ssize_t n;
	int r;

	if (c->closing)
		return -ECONNRESET;
	r = proto_encode(m, buf, sizeof(buf), &len, fds, &nfds);
	if (r < 0)
		return r;
	if (!c->outq) {
		n = fdpass_send(c->fd, buf, len, fds, nfds, MSG_DONTWAIT);
		if (n >= 0)
			return 0;
		if (n != -EAGAIN) {
			c->closing = true;
			return (int)n;
		}
	}
	if (droppable)
		return -EAGAIN;
	if (c->outq_bytes + len > s->config.max_queued_bytes) {
		s->metrics.rejected[REJECT_SLOW_READER]++;
		log_debug("Client pid %d reads too slowly, disconnecting.", c->cred.pid);
		c->closing = true;
		return -ENOBUFS;
	}
	p = malloc(sizeof(*p) + len);
	if (!p)
		return -ENOMEM;
	p->next = NULL;
	p->len = len;
	p->fd = -1;
	if (nfds > 0) {
		p->fd = fcntl(fds[0], F_DUPFD_CLOEXEC, 3);
		if (p->fd < 0) {
			r = negative_errno();
			free(p);
			return r;
		}
	}
	memcpy(p->data, buf, len);
	*c->outq_tail = p;
	c->outq_tail = &p->next;
	c->outq_bytes += len;
	if (s->hooks && s->hooks->want_write)
		s->hooks->want_write(s, c);
	return 0;
}

int client_send(struct supervisor *s, struct sv_client *c, const struct proto_msg *m)
{
	return send_msg(s, c, m, false);
}

static int vsend_error(struct supervisor *s, struct sv_client *c, int code,
		       enum proto_type in_reply_to, const char *fmt, va_list ap) _printf_(5, 0);

static int vsend_error(struct supervisor *s, struct sv_client *c, int code,
		       enum proto_type in_reply_to, const char *fmt, va_list ap)
{
	struct proto_msg m = {.type = PROTO_ERROR};

	m.error.code = code < 0 ? -code : code;
	m.error.in_reply_to = (uint32_t)in_reply_to;
	(void)vsnprintf(m.error.message, sizeof(m.error.message), fmt, ap);
	return send_msg(s, c, &m, true);
}

int client_send_error(struct supervisor *s, struct sv_client *c, int code,
		      enum proto_type in_reply_to, const char *fmt, ...)
{
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = vsend_error(s, c, code, in_reply_to, fmt, ap);
	va_end(ap);
	return r;
}

int client_refuse(struct supervisor *s, struct sv_client *c, enum reject_reason why, int code,
		  enum proto_type in_reply_to, const char *fmt, ...)
{
	va_list ap;

	s->metrics.rejected[why]++;
	va_start(ap, fmt);
	(void)vsend_error(s, c, code, in_reply_to, fmt, ap);
	va_end(ap);
	if (++c->errors >= s->config.max_client_errors && !c->closing) {
		s->metrics.rejected[REJECT_TOO_MANY_ERRORS]++;
		log_debug("Client pid %d made %u errors, disconnecting.", c->cred.pid, c->errors);
		c->closing = true;
	}
	return code < 0 ? code : -code;
}
