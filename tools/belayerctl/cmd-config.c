/* SPDX-License-Identifier: MIT */
/* belayerctl config: the supervisor's effective configuration (file + overrides + defaults). */
#include <stdio.h>
#include <string.h>

#include "belayerctl.h"

static int on_entry(const struct proto_msg *m, void *userdata)
{
	json_object *j = userdata;

	if (m->type == PROTO_CONFIG_ENTRY)
		json_object_object_add(j, m->config_entry.key,
				       json_object_new_string(m->config_entry.value));
	return 0;
}

int cmd_config(const struct ctl_options *o, int argc, char **argv)
{
	json_object *j = json_object_new_object();
	const char *section = NULL;
	int r;

	if (argc > 1) {
		fprintf(stderr, "usage: belayerctl config\n");
		json_object_put(j);
		return -EINVAL;
	}
	r = ctl_query(o, CTL_CONFIG, 0, CTL_ACT_NONE, -1, 0, on_entry, j);
	if (r < 0) {
		json_object_put(j);
		return r;
	}
	if (o->json) {
		json_print(j, false);
		return 0;
	}
	/* As INI, so it can be pasted into belayer.conf. */
	json_object_object_foreach(j, key, val)
	{
		const char *dot = strrchr(key, '.'); /* engine.NAME.key: the section has a dot */

		if (!dot)
			continue;
		if (!section || strncmp(section, key, (size_t)(dot - key) + 1) != 0) {
			printf("%s[%.*s]\n", section ? "\n" : "", (int)(dot - key), key);
			section = key;
		}
		printf("%s = %s\n", dot + 1, json_object_get_string(val));
	}
	json_object_put(j);
	return 0;
}
