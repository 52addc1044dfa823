/* SPDX-License-Identifier: MIT */
/* belayerctl workers: every worker the supervisor knows, alive or dead with retained memory. */
#include <stdio.h>

#include "belayerctl.h"

static int on_worker(const struct proto_msg *m, void *userdata)
{
	const struct proto_worker_info *w = &m->worker_info;
	json_object *arr = userdata, *o, *devs;
	char uuid[37], layout[17];

	if (m->type != PROTO_WORKER_INFO)
		return 0;
	o = json_object_new_object();
	devs = json_object_new_array();
	for (uint32_t i = 0; i < w->n_devices; i++) {
		format_uuid(w->device_uuid[i], uuid);
		json_object_array_add(devs, json_object_new_string(uuid));
	}
	json_object_object_add(o, "pid", json_u64(w->pid));
	json_object_object_add(o, "uid", json_u64(w->uid));
	json_object_object_add(o, "engine", json_object_new_string(w->engine_id));
	json_object_object_add(o, "role", json_object_new_string(worker_role_to_string(w->role)));
	json_object_object_add(o, "rank", json_object_new_int(w->rank));
	json_object_object_add(o, "state",
			       json_object_new_string(worker_state_to_string(w->state)));
	json_object_object_add(o, "regions", json_u64(w->n_regions));
	json_object_object_add(o, "bytes", json_u64(w->bytes));
	json_object_object_add(o, "age_ms", json_u64(w->age_ms));
	json_object_object_add(o, "devices", devs);
	/* Shadow promotion: a shadow's parked layout, a primary's computed one; the port and
	 * readiness of configured engines' groups. */
	snprintf(layout, sizeof(layout), "%016llx", (unsigned long long)w->layout_hash);
	json_object_object_add(o, "layout", json_object_new_string(w->layout_n ? layout : ""));
	json_object_object_add(o, "layout_entries", json_u64(w->layout_n));
	json_object_object_add(o, "parked", json_object_new_boolean(w->parked));
	json_object_object_add(o, "port", json_u64(w->port));
	json_object_object_add(o, "ready", json_object_new_boolean(w->ready));
	/* What it holds, as last measured (null: not measured, e.g. not a configured engine's). */
	json_object_object_add(o, "device_bytes",
			       w->device_used ? json_u64(w->device_used - 1) : NULL);
	json_object_object_add(o, "rss_bytes", w->rss ? json_u64(w->rss) : NULL);
	json_object_object_add(o, "pss_bytes", w->rss ? json_u64(w->pss) : NULL);
	json_object_object_add(o, "pss_shmem_bytes", w->rss ? json_u64(w->pss_shmem) : NULL);
	json_object_object_add(o, "canary_version",
			       w->canary_version ? json_u64(w->canary_version - 1) : NULL);
	json_object_array_add(arr, o);
	return 0;
}

int cmd_workers(const struct ctl_options *o, int argc, char **argv)
{
	json_object *arr = json_object_new_array();
	int r;

	if (argc > 1) {
		fprintf(stderr, "usage: belayerctl workers\n");
		json_object_put(arr);
		return -EINVAL;
	}
	r = ctl_query(o, CTL_WORKERS, 0, CTL_ACT_NONE, -1, 0, on_worker, arr);
	if (r < 0) {
		json_object_put(arr);
		return r;
	}
	if (o->json) {
		json_print(arr, false);
		return 0;
	}
	printf("%-8s %-6s %-20s %-8s %-5s %-12s %-8s %-12s %-8s %-5s %-8s %-10s %-10s %-10s "
	       "%-6s %s\n",
	       "PID", "UID", "ENGINE", "ROLE", "RANK", "STATE", "REGIONS", "BYTES", "AGE", "PORT",
	       "SERVING", "DEVICE", "RSS", "PSS", "CANARY", "LAYOUT");
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *w = json_object_array_get_idx(arr, i), *v;
		char bytes[32], age[32];

#define GET(k) (json_object_object_get_ex(w, k, &v) ? v : NULL)
		format_bytes(json_object_get_uint64(GET("bytes")), bytes, sizeof(bytes));
		format_age(json_object_get_uint64(GET("age_ms")), age, sizeof(age));
		printf("%-8s ", json_object_get_string(GET("pid")));
		printf("%-6s ", json_object_get_string(GET("uid")));
		printf("%-20s ", json_object_get_string(GET("engine")));
		printf("%-8s ", json_object_get_string(GET("role")));
		printf("%-5s ", json_object_get_string(GET("rank")));
		printf("%-12s ", json_object_get_string(GET("state")));
		printf("%-8s %-12s %-8s ", json_object_get_string(GET("regions")), bytes, age);
		printf("%-5s ", json_object_get_uint64(GET("port"))
					? json_object_get_string(GET("port"))
					: "-");
		printf("%-8s ", json_object_get_boolean(GET("ready"))	 ? "ready"
				: json_object_get_boolean(GET("parked")) ? "parked"
									 : "-");
		for (size_t k = 0; k < 3; k++) {
			static const char *const keys[] = {"device_bytes", "rss_bytes",
							   "pss_bytes"};
			char b[32] = "-";

			if (GET(keys[k]))
				format_bytes(json_object_get_uint64(v), b, sizeof(b));
			printf("%-10s ", b);
		}
		if (GET("canary_version"))
			printf("v%-5s ", json_object_get_string(v));
		else
			printf("%-6s ", "-");
		printf("%s", json_object_get_string(GET("layout"))[0]
				     ? json_object_get_string(GET("layout"))
				     : "-");
		if (json_object_get_uint64(GET("layout_entries")))
			printf(" (%s regions)", json_object_get_string(GET("layout_entries")));
		printf("\n");
#undef GET
	}
	json_object_put(arr);
	return 0;
}
