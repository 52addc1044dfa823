/* SPDX-License-Identifier: MIT */
/* belayerctl events [--replay N] [--no-follow]: the supervisor's event stream. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "belayerctl.h"
#include "util.h"

static void print_event(const struct ctl_options *o, const struct proto_event *e)
{
	char when[64];
	time_t t = (time_t)(e->ts_us / 1000000);
	struct tm tm;

	if (o->json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "ts_us", json_u64(e->ts_us));
		json_object_object_add(j, "kind",
				       json_object_new_string(event_kind_to_string(e->kind)));
		json_object_object_add(j, "pid", json_u64(e->pid));
		json_object_object_add(j, "id", json_u64(e->id));
		json_object_object_add(j, "message", json_object_new_string(e->message));
		json_print(j, true); /* JSON Lines: one event per line */
		return;
	}
	gmtime_r(&t, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	printf("%s.%06" PRIu64 "Z %-16s pid=%-7u id=%-4" PRIu64 " %s\n", when, e->ts_us % 1000000,
	       event_kind_to_string(e->kind), e->pid, e->id, e->message);
	fflush(stdout);
}

int cmd_events(const struct ctl_options *o, int argc, char **argv)
{
	struct ctl_options follow = *o;
	_cleanup_close_ int sock = -1;
	unsigned long replay = 0;
	bool keep = true;
	int r;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--no-follow") == 0)
			keep = false;
		else if (strcmp(argv[i], "--replay") == 0 && i + 1 < argc)
			replay = strtoul(argv[++i], NULL, 10);
		else {
			fprintf(stderr, "usage: belayerctl events [--replay N] [--no-follow]\n");
			return -EINVAL;
		}
	}
	sock = ctl_connect(o);
	if (sock < 0)
		return sock;
	r = ctl_request(sock, CTL_EVENTS, 0, CTL_ACT_NONE, -1, replay);
	if (r < 0)
		return r;
	/* Replayed history, then END, then (following) live events until the supervisor goes. */
	for (bool ended = false;;) {
		struct proto_msg m;

		follow.timeout_ms = ended ? -1 : o->timeout_ms;
		r = ctl_recv(sock, &follow, &m);
		if (r < 0)
			return ended && r == -ECONNRESET ? 0 : r;
		if (m.type == PROTO_END) {
			ended = true;
			if (!keep)
				return 0;
		} else if (m.type == PROTO_EVENT) {
			print_event(o, &m.event);
		}
		proto_msg_finish(&m);
	}
}
