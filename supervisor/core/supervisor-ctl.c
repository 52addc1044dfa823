/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "supervisor-client.h"
#include "supervisor-ctl.h"
#include "supervisor-events.h"
#include "supervisor-subsystem.h"

int ctl_send_end(struct supervisor *s, struct sv_client *c, uint32_t count)
{
	struct proto_msg m = {.type = PROTO_END};

	m.end.in_reply_to = PROTO_CTL;
	m.end.count = count;
	return client_send(s, c, &m);
}

/* The metrics (the core's, then each subsystem's), then the subsystems' status events. */
static int ctl_status(struct supervisor *s, struct sv_client *c)
{
	struct proto_msg m;
	uint32_t n = 0;

	for (size_t i = 0; metrics_get(s, i, &m); i++, n++)
		if (client_send(s, c, &m) < 0)
			return -ECONNRESET;
	SUBSYSTEMS_FOREACH (s, it)
		if ((*it)->status && (*it)->status(s, c, &n) < 0)
			return -ECONNRESET;
	return ctl_send_end(s, c, n);
}

static int ctl_config(struct supervisor *s, struct sv_client *c)
{
	struct proto_msg m = {.type = PROTO_CONFIG_ENTRY};
	const char *section, *key;
	char value[PROTO_MAX_STR + 1];
	uint32_t n = 0;

	for (size_t i = 0; config_entry(&s->config, i, &section, &key, value, sizeof(value), NULL);
	     i++, n++) {
		snprintf(m.config_entry.key, sizeof(m.config_entry.key), "%s.%s", section, key);
		memcpy(m.config_entry.value, value, sizeof(value));
		if (client_send(s, c, &m) < 0)
			return -ECONNRESET;
	}
	return ctl_send_end(s, c, n);
}

/* The subsystem that serves this command; NULL: none does. */
static const struct sv_ctl_handler *ctl_find(struct supervisor *s, enum ctl_cmd cmd)
{
	SUBSYSTEMS_FOREACH (s, it)
		for (const struct sv_ctl_handler *h = (*it)->ctl; h && h->handle; h++)
			if (h->cmd == cmd)
				return h;
	return NULL;
}

int ctl_dispatch(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl)
{
	const struct sv_ctl_handler *h;

	switch (ctl->cmd) {
	case CTL_STATUS:
		return ctl_status(s, c);
	case CTL_CONFIG:
		return ctl_config(s, c);
	case CTL_EVENTS:
		c->subscribed = true;
		return ctl_send_end(
			s, c,
			(uint32_t)events_replay(s, c, (size_t)MIN(ctl->arg, (uint64_t)SIZE_MAX)));
	default:
		h = ctl_find(s, ctl->cmd);
		if (h)
			return h->handle(s, c, ctl);
		break;
	}
	return client_refuse(s, c, REJECT_BAD_MESSAGE, EINVAL, PROTO_CTL, "unknown command");
}
