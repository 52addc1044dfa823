/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "fdpass.h"
#include "log.h"
#include "supervisor-client.h"
#include "supervisor-ctl.h"
#include "supervisor-handler.h"
#include "supervisor-subsystem.h"

/* The subsystem that serves this message type; NULL: none does. */
static const struct sv_message_handler *handler_find(struct supervisor *s, enum proto_type type)
{
	SUBSYSTEMS_FOREACH (s, it)
		for (const struct sv_message_handler *h = (*it)->messages; h && h->handle; h++)
			if (h->type == type)
				return h;
	return NULL;
}

int handler_dispatch(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	const struct sv_message_handler *h;

	switch (m->type) {
	case PROTO_CTL:
		return ctl_dispatch(s, c, &m->ctl);
	case PROTO_ERROR:
		/* A peer's complaint about something we sent: nothing to answer. */
		log_debug("Peer pid %d reports error %d: %s", c->cred.pid, m->error.code,
			  m->error.message);
		return 0;
	default:
		h = handler_find(s, m->type);
		if (h)
			return h->handle(s, c, m);
		/* Replies only the supervisor sends. */
		return client_refuse(s, c, REJECT_BAD_MESSAGE, EOPNOTSUPP, m->type,
				     "%s is not a request", proto_type_to_string(m->type));
	}
}

int handler_read(struct supervisor *s, struct sv_client *c)
{
	uint8_t buf[PROTO_MAX_MSG + 1];
	int fds[FDPASS_MAX_FDS];
	struct proto_msg m;
	size_t nfds = 0;
	ssize_t n;
	int r;

	n = fdpass_recv(c->fd, buf, sizeof(buf), fds, ARRAY_SIZE(fds), &nfds, MSG_DONTWAIT);
	if (n == 0)
		return -ECONNRESET;
	if (n == -EMSGSIZE) /* fdpass closed what came with it */
		return client_refuse(s, c, REJECT_MESSAGE_SIZE, EMSGSIZE, 0,
				     "packet larger than %u bytes", s->config.max_message_size),
		       0;
	if (n == -EBADMSG)
		return client_refuse(s, c, REJECT_BAD_MESSAGE, EBADMSG, 0,
				     "more fds than any message carries"),
		       0;
	if (n < 0)
		return (int)n;
	if ((size_t)n > s->config.max_message_size) {
		for (size_t i = 0; i < nfds; i++)
			(void)safe_close(fds[i]);
		(void)client_refuse(s, c, REJECT_MESSAGE_SIZE, EMSGSIZE, 0,
				    "packet of %zd bytes, max_message_size=%u", n,
				    s->config.max_message_size);
		return 0;
	}
	r = proto_decode(buf, (size_t)n, fds, nfds, &m);
	if (r < 0) {
		for (size_t i = 0; i < nfds; i++)
			(void)safe_close(fds[i]);
		(void)client_refuse(s, c, REJECT_BAD_MESSAGE, -r, 0, "malformed message: %s",
				    strerror(-r));
		return 0;
	}
	(void)handler_dispatch(s, c, &m);
	proto_msg_finish(&m);
	return 0;
}
