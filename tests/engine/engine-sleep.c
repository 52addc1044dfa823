/* SPDX-License-Identifier: MIT */
/*
 * vLLM's sleep-mode endpoints (vllm/entrypoints/openai/api_server.py, served with
 * --enable-sleep-mode in development mode), on every rank through the control plane:
 *   POST /sleep?level=1|2    LLM.sleep(level): level 1 offloads the weights to host memory and
 *                            discards the KV cache, level 2 discards both (engine-alloc.h)
 *   POST /wake_up[?tags=weights&tags=kv_cache]   LLM.wake_up(tags): all pools without tags
 *   GET  /is_sleeping        {"is_sleeping": bool}
 * Sleeping with requests in flight is refused (an RL loop sleeps the engine between rollouts);
 * requests that arrive while it sleeps wait until the KV cache is awake again.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "engine.h"
#include "engine-alloc.h"
#include "engine-http.h"

#define POOL_BIT(p) (1u << (p))

static void reply(struct evhttp_request *hreq, int r, const char *what)
{
	if (r < 0) {
		send_error(hreq, r == -EINVAL ? 400 : 500, "%s failed: %s", what, strerror(-r));
		return;
	}
	send_json(hreq, 200, json_object_new_object());
}

void http_on_sleep(struct evhttp_request *hreq, void *arg)
{
	struct engine *e = arg;
	const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(hreq));
	struct ctl c = {.op = CTL_SLEEP, .count = 1};
	struct evkeyvalq params;
	const char *v;

	if (evhttp_request_get_command(hreq) != EVHTTP_REQ_POST) {
		send_error(hreq, 405, "Method not allowed: use POST");
		return;
	}
	if (!e->o.sleep_mode) {
		send_error(hreq, 400, "Sleep mode is not enabled (--enable-sleep-mode)");
		return;
	}
	if (q && evhttp_parse_query_str(q, &params) == 0) {
		v = evhttp_find_header(&params, "level");
		if (v && strcmp(v, "1") != 0 && strcmp(v, "2") != 0)
			c.count = 0;
		else if (v)
			c.count = (uint32_t)(v[0] - '0');
		evhttp_clear_headers(&params);
	}
	if (c.count == 0) {
		send_error(hreq, 400, "\"level\" must be 1 or 2");
		return;
	}
	if (sched_busy(e)) {
		send_error(hreq, 400, "Cannot sleep with requests in flight");
		return;
	}
	if (dev_asleep(~0u)) {
		send_error(hreq, 400, "Already sleeping");
		return;
	}
	reply(hreq, ctl_run(e, &c), "Sleep");
}

void http_on_wake_up(struct evhttp_request *hreq, void *arg)
{
	struct engine *e = arg;
	const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(hreq));
	struct ctl c = {.op = CTL_WAKE, .count = 0};
	struct evkeyvalq params;
	int r;

	if (evhttp_request_get_command(hreq) != EVHTTP_REQ_POST) {
		send_error(hreq, 405, "Method not allowed: use POST");
		return;
	}
	if (q && evhttp_parse_query_str(q, &params) == 0) {
		for (struct evkeyval *kv = params.tqh_first; kv; kv = kv->next.tqe_next) {
			if (strcmp(kv->key, "tags") != 0)
				continue;
			if (strcmp(kv->value, "weights") == 0)
				c.count |= POOL_BIT(DEV_POOL_WEIGHTS);
			else if (strcmp(kv->value, "kv_cache") == 0)
				c.count |= POOL_BIT(DEV_POOL_KV);
			else
				c.count |= 1u << 31; /* unknown */
		}
		evhttp_clear_headers(&params);
	}
	if (c.count & (1u << 31)) {
		send_error(hreq, 400, "\"tags\" are weights and kv_cache");
		return;
	}
	if (c.count == 0)
		c.count = POOL_BIT(DEV_POOL_WEIGHTS) | POOL_BIT(DEV_POOL_KV);
	r = ctl_run(e, &c);
	if (r == 0 && !dev_asleep(~0u))
		sched_kick(e); /* what waited for the KV cache */
	reply(hreq, r, "Wake-up");
}

void http_on_is_sleeping(struct evhttp_request *hreq, void *arg)
{
	json_object *o = json_object_new_object();

	(void)arg;
	json_object_object_add(o, "is_sleeping", json_object_new_boolean(dev_asleep(~0u)));
	send_json(hreq, 200, o);
}
