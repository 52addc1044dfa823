/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "supervisor-client.h"
#include "supervisor-events.h"

int events_init(struct supervisor *s, size_t history)
{
	s->history.cap = history;
	s->history.head = s->history.count = 0;
	if (history == 0)
		return 0;
	s->history.events = calloc(history, sizeof(*s->history.events));
	return s->history.events ? 0 : -ENOMEM;
}

void events_finish(struct supervisor *s)
{
	free(s->history.events);
	s->history.events = NULL;
}

void supervisor_emit(struct supervisor *s, enum event_kind kind, uint32_t pid, uint64_t id,
		     const char *fmt, ...)
{
	struct proto_msg m = {.type = PROTO_EVENT};
	struct sv_event_ring *h = &s->history;
	va_list ap;

	m.event.ts_us = now_realtime_us();
	m.event.kind = kind;
	m.event.pid = pid;
	m.event.id = id;
	va_start(ap, fmt);
	(void)vsnprintf(m.event.message, sizeof(m.event.message), fmt, ap);
	va_end(ap);
	s->metrics.events_total++;

	/* Announcements are many and routine; the rest is what an operator wants to see. */
	log_full_errno(kind == EVENT_REGION_ANNOUNCE || kind == EVENT_REGION_RELEASE
			       ? LOG_LEVEL_DEBUG
			       : LOG_LEVEL_INFO,
		       0, "%s pid=%u: %s", event_kind_to_string(kind), pid, m.event.message);

	if (h->cap > 0) {
		h->events[(h->head + h->count) % h->cap] = m.event;
		if (h->count < h->cap)
			h->count++;
		else
			h->head = (h->head + 1) % h->cap;
	}
	for (struct sv_client *c = s->clients; c; c = c->next)
		if (c->subscribed)
			(void)client_send(s, c, &m);
}

size_t events_replay(struct supervisor *s, struct sv_client *c, size_t n)
{
	struct sv_event_ring *h = &s->history;
	size_t first, sent = 0;

	n = MIN(n, h->count);
	first = h->count - n;
	for (size_t i = first; i < h->count; i++) {
		struct proto_msg m = {.type = PROTO_EVENT};

		m.event = h->events[(h->head + i) % h->cap];
		if (client_send(s, c, &m) < 0)
			break;
		sent++;
	}
	return sent;
}
