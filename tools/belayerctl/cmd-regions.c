/* SPDX-License-Identifier: MIT */
/* belayerctl regions [--pid PID]: the regions the supervisor holds (issue #4 item 5). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "belayerctl.h"

static int on_region(const struct proto_msg *m, void *userdata)
{
	const struct proto_region_info *r = &m->region_info;
	json_object *arr = userdata, *o;
	char uuid[37], va[32];

	if (m->type != PROTO_REGION_INFO)
		return 0;
	o = json_object_new_object();
	format_uuid(r->device_uuid, uuid);
	snprintf(va, sizeof(va), "0x%" PRIx64, r->va);
	json_object_object_add(o, "pid", json_u64(r->pid));
	json_object_object_add(o, "engine", json_object_new_string(r->engine_id));
	json_object_object_add(o, "id", json_u64(r->id));
	json_object_object_add(o, "class", json_object_new_string(region_class_to_string(r->cls)));
	json_object_object_add(o, "size", json_u64(r->size));
	json_object_object_add(o, "va", json_object_new_string(va));
	json_object_object_add(o, "device", json_object_new_string(uuid));
	json_object_object_add(o, "order", json_u64(r->order));
	json_object_object_add(o, "weights_version", json_u64(r->weights_version));
	json_object_object_add(o, "state",
			       json_object_new_string(region_state_to_string(r->state)));
	json_object_object_add(o, "age_ms", json_u64(r->age_ms));
	if (r->checksum_version) {
		json_object_object_add(o, "checksum", json_u64(r->checksum));
		json_object_object_add(o, "checksum_weights_version",
				       json_u64(r->checksum_version - 1));
	}
	json_object_array_add(arr, o);
	return 0;
}

int cmd_regions(const struct ctl_options *o, int argc, char **argv)
{
	json_object *arr;
	unsigned long pid = 0;
	int r;

	if (argc == 3 && strcmp(argv[1], "--pid") == 0) {
		char *end;

		pid = strtoul(argv[2], &end, 10);
		if (*end || pid == 0 || pid > UINT32_MAX) {
			fprintf(stderr, "belayerctl regions: bad pid %s\n", argv[2]);
			return -EINVAL;
		}
	} else if (argc != 1) {
		fprintf(stderr, "usage: belayerctl regions [--pid PID]\n");
		return -EINVAL;
	}
	arr = json_object_new_array();
	r = ctl_query(o, CTL_REGIONS, (uint32_t)pid, CTL_ACT_NONE, -1, 0, on_region, arr);
	if (r < 0) {
		json_object_put(arr);
		return r;
	}
	if (o->json) {
		json_print(arr, false);
		return 0;
	}
	printf("%-8s %-16s %-6s %-8s %-11s %-16s %-5s %-9s %s\n", "PID", "ENGINE", "ID", "CLASS",
	       "SIZE", "VA", "WVER", "STATE", "AGE");
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *g = json_object_array_get_idx(arr, i), *v;
		char size[32], age[32];

#define GET(k) (json_object_object_get_ex(g, k, &v) ? v : NULL)
		format_bytes(json_object_get_uint64(GET("size")), size, sizeof(size));
		format_age(json_object_get_uint64(GET("age_ms")), age, sizeof(age));
		printf("%-8s ", json_object_get_string(GET("pid")));
		printf("%-16s ", json_object_get_string(GET("engine")));
		printf("%-6s ", json_object_get_string(GET("id")));
		printf("%-8s %-11s ", json_object_get_string(GET("class")), size);
		printf("%-16s ", json_object_get_string(GET("va")));
		printf("%-5s ", json_object_get_string(GET("weights_version")));
		printf("%-9s %s\n", json_object_get_string(GET("state")), age);
#undef GET
	}
	json_object_put(arr);
	return 0;
}
