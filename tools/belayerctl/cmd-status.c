/* SPDX-License-Identifier: MIT */
/* belayerctl status: the supervisor's metrics, with a summary of workers and retained memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "belayerctl.h"
#include "util.h"

struct status {
	json_object *metrics;
	json_object *recoveries; /* engine -> its last recovery */
	json_object *nccl;	 /* "communicators": the summary, "last_hang": the diagnosis */
	uint64_t workers_alive, workers_dead, regions_retained, bytes_retained, regions_owned,
		bytes_owned, connections, uptime;
};

/* "engine=NAME k=v k=v ..." (durations *_us grouped under "phases_us") or
 * "engine=NAME reason=TEXT" into st->recoveries[NAME]. */
static int on_recovery(struct status *st, const char *msg)
{
	char buf[PROTO_MAX_STR + 1], *save = NULL, *tok;
	json_object *r, *phases;
	const char *name;

	if (strncmp(msg, "engine=", 7) != 0)
		return 0;
	snprintf(buf, sizeof(buf), "%s", msg + 7);
	name = strtok_r(buf, " ", &save);
	if (!name)
		return 0;
	if (!json_object_object_get_ex(st->recoveries, name, &r)) {
		r = json_object_new_object();
		json_object_object_add(st->recoveries, name, r);
		json_object_object_add(r, "phases_us", json_object_new_object());
	}
	json_object_object_get_ex(r, "phases_us", &phases);
	if (strncmp(save ? save : "", "reason=", 7) == 0) {
		json_object_object_add(r, "reason", json_object_new_string(save + 7));
		return 0;
	}
	for (tok = strtok_r(NULL, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		char *eq = strchr(tok, '=');
		size_t n;

		if (!eq)
			continue;
		*eq++ = '\0';
		n = strlen(tok);
		if (n > 3 && strcmp(tok + n - 3, "_us") == 0 && strcmp(tok, "total_us") != 0) {
			tok[n - 3] = '\0';
			json_object_object_add(phases, tok, json_u64(strtoull(eq, NULL, 10)));
		} else if (strcmp(tok, "seq") == 0 || strcmp(tok, "total_us") == 0) {
			json_object_object_add(r, tok, json_u64(strtoull(eq, NULL, 10)));
		} else {
			json_object_object_add(r, tok, json_object_new_string(eq));
		}
	}
	return 0;
}

/* "nccl k=v ..." (the summary) or "nccl hang: k=v ..." (the last diagnosis) into st->nccl:
 * numbers as numbers, the rest as strings. */
static int on_nccl(struct status *st, const char *msg)
{
	char buf[PROTO_MAX_STR + 1], *save = NULL, *tok;
	bool hang = strncmp(msg, "nccl hang: ", 11) == 0;
	json_object *o = json_object_new_object();

	snprintf(buf, sizeof(buf), "%s", msg + (hang ? 11 : 5));
	for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		char *eq = strchr(tok, '='), *end;
		unsigned long long v;

		if (!eq)
			continue;
		*eq++ = '\0';
		v = strtoull(eq, &end, 10);
		if (*eq && !*end && strcmp(tok, "comm") != 0)
			json_object_object_add(o, tok, json_u64(v));
		else
			json_object_object_add(o, tok, json_object_new_string(eq));
	}
	json_object_object_add(st->nccl, hang ? "last_hang" : "summary", o);
	return 0;
}

static int on_metric(const struct proto_msg *m, void *userdata)
{
	struct status *st = userdata;
	const struct proto_metric *p = &m->metric;
	json_object *o, *labels;
	char buf[sizeof(p->labels)];
	char *save = NULL, *tok;

	if (m->type == PROTO_EVENT && m->event.kind == EVENT_RECOVERY)
		return on_recovery(st, m->event.message);
	if (m->type == PROTO_EVENT && m->event.kind == EVENT_NCCL)
		return on_nccl(st, m->event.message);
	if (m->type != PROTO_METRIC)
		return 0;
	if (!strcmp(p->name, "belayer_workers") && !strcmp(p->labels, "state=\"alive\""))
		st->workers_alive = p->value;
	else if (!strcmp(p->name, "belayer_workers") && !strcmp(p->labels, "state=\"dead\""))
		st->workers_dead = p->value;
	else if (!strcmp(p->name, "belayer_regions") && !strcmp(p->labels, "state=\"retained\""))
		st->regions_retained = p->value;
	else if (!strcmp(p->name, "belayer_region_bytes") &&
		 !strcmp(p->labels, "state=\"retained\""))
		st->bytes_retained = p->value;
	else if (!strcmp(p->name, "belayer_regions") && !strcmp(p->labels, "state=\"owned\""))
		st->regions_owned = p->value;
	else if (!strcmp(p->name, "belayer_region_bytes") && !strcmp(p->labels, "state=\"owned\""))
		st->bytes_owned = p->value;
	else if (!strcmp(p->name, "belayer_connections"))
		st->connections = p->value;
	else if (!strcmp(p->name, "belayer_uptime_seconds"))
		st->uptime = p->value;

	o = json_object_new_object();
	labels = json_object_new_object();
	/* Labels come as name="value",name="value" (values never hold quotes or commas). */
	snprintf(buf, sizeof(buf), "%s", p->labels);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '=');
		size_t n;

		if (!eq)
			continue;
		*eq++ = '\0';
		n = strlen(eq);
		if (n >= 2 && eq[0] == '"' && eq[n - 1] == '"') {
			eq[n - 1] = '\0';
			eq++;
		}
		json_object_object_add(labels, tok, json_object_new_string(eq));
	}
	json_object_object_add(o, "name", json_object_new_string(p->name));
	json_object_object_add(o, "labels", labels);
	json_object_object_add(o, "kind", json_object_new_string(metric_kind_to_string(p->kind)));
	/* a _seconds metric kept in microseconds: seconds, as Prometheus shows it */
	json_object_object_add(o, "value",
			       p->scale > 1 ? json_object_new_double((double)p->value / p->scale)
					    : json_u64(p->value));
	json_object_array_add(st->metrics, o);
	return 0;
}

int cmd_status(const struct ctl_options *o, int argc, char **argv)
{
	struct status st = {.metrics = json_object_new_array(),
			    .recoveries = json_object_new_object(),
			    .nccl = json_object_new_object()};
	char owned[32], retained[32];
	int r;

	if (argc > 1) {
		fprintf(stderr, "usage: belayerctl status\n");
		json_object_put(st.recoveries);
		json_object_put(st.metrics);
		json_object_put(st.nccl);
		return -EINVAL;
	}
	r = ctl_query(o, CTL_STATUS, 0, CTL_ACT_NONE, -1, 0, on_metric, &st);
	if (r < 0) {
		json_object_put(st.recoveries);
		json_object_put(st.metrics);
		json_object_put(st.nccl);
		return r;
	}
	if (o->json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "workers_alive", json_u64(st.workers_alive));
		json_object_object_add(j, "workers_dead", json_u64(st.workers_dead));
		json_object_object_add(j, "regions_owned", json_u64(st.regions_owned));
		json_object_object_add(j, "bytes_owned", json_u64(st.bytes_owned));
		json_object_object_add(j, "regions_retained", json_u64(st.regions_retained));
		json_object_object_add(j, "bytes_retained", json_u64(st.bytes_retained));
		json_object_object_add(j, "connections", json_u64(st.connections));
		json_object_object_add(j, "uptime_seconds", json_u64(st.uptime));
		json_object_object_add(j, "metrics", st.metrics);
		/* The last recovery per engine: outcome, trigger, reason, phase durations. */
		json_object_object_add(j, "recoveries", st.recoveries);
		/* NCCL communicators and the last hang diagnosis (which rank, collective, how long). */
		json_object_object_add(j, "nccl", st.nccl);
		json_print(j, false);
		return 0;
	}
	format_bytes(st.bytes_owned, owned, sizeof(owned));
	format_bytes(st.bytes_retained, retained, sizeof(retained));
	printf("Supervisor at %s, up %llu s\n", o->socket, (unsigned long long)st.uptime);
	printf("  workers:  %llu alive, %llu dead with retained memory\n",
	       (unsigned long long)st.workers_alive, (unsigned long long)st.workers_dead);
	printf("  regions:  %llu owned (%s), %llu retained (%s)\n",
	       (unsigned long long)st.regions_owned, owned, (unsigned long long)st.regions_retained,
	       retained);
	printf("  connections: %llu\n\nMetrics:\n", (unsigned long long)st.connections);
	for (size_t i = 0; i < json_object_array_length(st.metrics); i++) {
		json_object *m = json_object_array_get_idx(st.metrics, i), *v, *labels;
		char lbl[256] = "";
		size_t off = 0;

		json_object_object_get_ex(m, "labels", &labels);
		json_object_object_foreach(labels, k, lv)
		{
			off += (size_t)snprintf(lbl + off, sizeof(lbl) - MIN(off, sizeof(lbl)),
						"%s%s=%s", off ? "," : "", k,
						json_object_get_string(lv));
			if (off >= sizeof(lbl))
				break;
		}
		json_object_object_get_ex(m, "value", &v);
		json_object_object_get_ex(m, "name", &labels);
		printf("  %-36s %-36s %s\n", json_object_get_string(labels), lbl,
		       json_object_get_string(v));
	}
	json_object_object_foreach(st.recoveries, eng, rec)
	{
		json_object *v, *ph;

		printf("\nLast recovery of engine %s:", eng);
		json_object_object_foreach(rec, k, val)
		{
			if (strcmp(k, "phases_us") == 0 || strcmp(k, "reason") == 0)
				continue;
			printf(" %s=%s", k, json_object_get_string(val));
		}
		printf("\n");
		if (json_object_object_get_ex(rec, "reason", &v))
			printf("  reason: %s\n", json_object_get_string(v));
		json_object_object_get_ex(rec, "phases_us", &ph);
		json_object_object_foreach(ph, pk, pv)
		{
			printf("  %-8s %10.3f ms\n", pk, (double)json_object_get_uint64(pv) / 1000);
		}
	}
	{
		json_object *sum, *hang;

		if (json_object_object_get_ex(st.nccl, "summary", &sum)) {
			printf("\nNCCL:");
			json_object_object_foreach(sum, k, v)
				printf(" %s=%s", k, json_object_get_string(v));
			printf("\n");
		}
		if (json_object_object_get_ex(st.nccl, "last_hang", &hang)) {
			printf("  last hang:");
			json_object_object_foreach(hang, k, v)
				printf(" %s=%s", k, json_object_get_string(v));
			printf("\n");
		}
	}
	json_object_put(st.recoveries);
	json_object_put(st.metrics);
	json_object_put(st.nccl);
	return 0;
}
