/* SPDX-License-Identifier: MIT */
/* belayerctl health [--pid PID] [--dev N]: run the health checks now and print the verdicts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "belayerctl.h"

static int on_verdict(const struct proto_msg *m, void *userdata)
{
	const struct proto_health_info *h = &m->health;
	json_object *arr = userdata, *o;

	if (m->type != PROTO_HEALTH_INFO)
		return 0;
	o = json_object_new_object();
	json_object_object_add(o, "check",
			       json_object_new_string(health_check_to_string(h->check)));
	json_object_object_add(o, "verdict",
			       json_object_new_string(health_verdict_to_string(h->verdict)));
	json_object_object_add(o, "device", json_object_new_int(h->dev));
	json_object_object_add(o, "pid", json_u64(h->pid));
	json_object_object_add(o, "message", json_object_new_string(h->message));
	json_object_array_add(arr, o);
	return 0;
}

int cmd_health(const struct ctl_options *o, int argc, char **argv)
{
	unsigned long pid = 0;
	long dev = -1;
	json_object *arr;
	bool failed = false;
	int r;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--pid") == 0 && i + 1 < argc)
			pid = strtoul(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--dev") == 0 && i + 1 < argc)
			dev = strtol(argv[++i], NULL, 10);
		else {
			fprintf(stderr, "usage: belayerctl health [--pid PID] [--dev N]\n");
			return -EINVAL;
		}
	}
	arr = json_object_new_array();
	r = ctl_query(o, CTL_HEALTH, (uint32_t)pid, CTL_ACT_NONE, (int32_t)dev, 0, on_verdict, arr);
	if (r < 0) {
		json_object_put(arr);
		return r;
	}
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *h = json_object_array_get_idx(arr, i), *c, *v, *d, *m;

		json_object_object_get_ex(h, "check", &c);
		json_object_object_get_ex(h, "verdict", &v);
		json_object_object_get_ex(h, "device", &d);
		json_object_object_get_ex(h, "message", &m);
		failed |= strcmp(json_object_get_string(v), "failed") == 0;
		if (!o->json)
			printf("%-8s %-8s dev=%-3s %s\n", json_object_get_string(c),
			       json_object_get_string(v), json_object_get_string(d),
			       json_object_get_string(m));
	}
	if (o->json)
		json_print(arr, false);
	else
		json_object_put(arr);
	/* Scripts can branch on the exit status: 2 when a check failed. */
	return failed ? 2 : 0;
}
