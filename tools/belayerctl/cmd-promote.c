/* SPDX-License-Identifier: MIT */
/*
 * belayerctl promote ENGINE: manual failover. The supervisor kills the engine's primary group
 * and recovers it as after a crash (promotion of the shadow group, or a cold restart when a
 * check fails). With --wait, follows the event stream until that recovery's summary and prints
 * it (exit status 0 when promoted, 3 after a cold restart, 1 when it failed).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "belayerctl.h"
#include "util.h"

static int wait_summary(const struct ctl_options *o, int sock, const char *engine)
{
	char prefix[PROTO_MAX_STR + 16];

	snprintf(prefix, sizeof(prefix), "engine=%s seq=", engine);
	for (;;) {
		struct proto_msg m;
		int r = ctl_recv(sock, o, &m);

		if (r < 0)
			return r;
		if (m.type != PROTO_EVENT || m.event.kind != EVENT_RECOVERY)
			continue;
		if (strstr(m.event.message, "cold restart:") || strstr(m.event.message, "failed:"))
			fprintf(stderr, "%s\n", m.event.message);
		if (strncmp(m.event.message, prefix, strlen(prefix)) != 0)
			continue;
		if (o->json) {
			json_object *j = json_object_new_object();

			json_object_object_add(j, "summary",
					       json_object_new_string(m.event.message));
			json_print(j, true);
		} else {
			printf("%s\n", m.event.message);
		}
		if (strstr(m.event.message, "outcome=promoted"))
			return 0;
		return strstr(m.event.message, "outcome=cold_restart") ? 3 : 1;
	}
}

int cmd_promote(const struct ctl_options *o, int argc, char **argv)
{
	static const struct option options[] = {
		{"wait", no_argument, NULL, 'w'},
		{},
	};
	struct proto_msg m = {.type = PROTO_CTL};
	struct ctl_options wo = *o;
	_cleanup_close_ int sock = -1, events = -1;
	bool wait = false;
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "w", options, NULL)) >= 0) {
		if (c != 'w') {
			fprintf(stderr, "usage: belayerctl promote [--wait] ENGINE\n");
			return -EINVAL;
		}
		wait = true;
	}
	if (optind != argc - 1 || strlen(argv[optind]) > PROTO_MAX_STR) {
		fprintf(stderr, "usage: belayerctl promote [--wait] ENGINE\n");
		return -EINVAL;
	}
	if (wait) {
		/* Subscribed before the request: the summary cannot slip past. */
		events = ctl_connect(o);
		if (events < 0)
			return events;
		r = ctl_request(events, CTL_EVENTS, 0, CTL_ACT_NONE, -1, 0);
		if (r < 0)
			return r;
		do
			r = ctl_recv(events, o, &m);
		while (r == 0 && m.type != PROTO_END);
		if (r < 0)
			return r;
	}
	sock = ctl_connect(o);
	if (sock < 0)
		return sock;
	m = (struct proto_msg){.type = PROTO_CTL};
	m.ctl.cmd = CTL_PROMOTE;
	m.ctl.dev = -1;
	snprintf(m.ctl.engine_id, sizeof(m.ctl.engine_id), "%s", argv[optind]);
	r = proto_send(sock, &m, 0);
	if (r < 0)
		return r;
	r = ctl_recv(sock, o, &m);
	if (r < 0)
		return r;
	if (!wait) {
		if (!o->json)
			printf("Recovery of engine %s started (belayerctl events follows it).\n",
			       argv[optind]);
		return 0;
	}
	/* A recovery includes a cold start when promotion is refused: minutes, not seconds. */
	wo.timeout_ms = -1;
	return wait_summary(&wo, events, argv[optind]);
}
