/* SPDX-License-Identifier: MIT */
/*
 * Weight and debug endpoints (SGLang's names where they exist):
 *   GET  /get_model_info
 *   POST /update_weights_from_disk         H2D from a safetensors file into the weights
 *   POST /init_weights_update_group        join a trainer's NCCL group
 *   POST /update_weights_from_distributed  receive the trainer's broadcast of each tensor
 *   GET  /debug/kv[?block=N], POST /debug/pause|resume|step   (tests only)
 * Each runs on every rank through the control plane (engine-ctl.c), between two steps.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "engine.h"
#include "engine-gpu.h"
#include "engine-http.h"
#include "engine-safetensors.h"
#include "log.h"
#include "util.h"

void http_on_model_info(struct evhttp_request *hreq, void *arg)
{
	struct engine *e = arg;
	json_object *o = json_object_new_object();

	json_object_object_add(o, "model_path",
			       json_object_new_string(e->model_path ? e->model_path : ""));
	json_object_object_add(o, "served_model_name", json_object_new_string(e->o.served_name));
	json_object_object_add(o, "weights_version",
			       json_object_new_int64((int64_t)e->m.weights_version));
	json_object_object_add(o, "tp_size", json_object_new_int64(e->o.tp));
	json_object_object_add(o, "vocab_size", json_object_new_int64(e->m.c.vocab));
	json_object_object_add(o, "max_model_len", json_object_new_int64(e->m.c.max_pos));
	send_json(hreq, 200, o);
}

static void reply_update(struct engine *e, struct evhttp_request *hreq, int r, const char *ok)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "success", json_object_new_boolean(r == 0));
	json_object_object_add(o, "message", json_object_new_string(r == 0 ? ok : strerror(-r)));
	json_object_object_add(o, "weights_version",
			       json_object_new_int64((int64_t)e->m.weights_version));
	send_json(hreq, r == 0 ? 200 : 400, o);
}

static const char *st_meta_get(void *ud, const char *key)
{
	return st_meta(ud, key);
}

void http_on_update_disk(struct evhttp_request *hreq, void *arg)
{
	static const char *const top[] = {"model_path", "load_format", NULL};
	struct engine *e = arg;
	json_object *o = body_json(hreq);
	struct ctl c = {.op = CTL_LOAD_FILE};
	struct model_config mc;
	struct st_file f;
	const char *path, *fmt;
	int r;

	if (!o)
		return;
	if (!known_fields(hreq, o, "the request", top) ||
	    !(path = get_str(hreq, o, "model_path", true)) ||
	    !(fmt = get_str(hreq, o, "load_format", false)))
		goto out;
	if (*fmt && strcmp(fmt, "auto") != 0 && strcmp(fmt, "safetensors") != 0) {
		send_error(hreq, 400, "Unsupported load_format \"%s\"", fmt);
		goto out;
	}
	if (strlen(path) >= sizeof(c.path)) {
		send_error(hreq, 400, "\"model_path\" too long");
		goto out;
	}
	/* validated here first so that no rank fails half way */
	r = st_open(path, &f);
	if (r == 0) {
		r = model_config_from_metadata(st_meta_get, &f, &mc);
		if (r == 0 && memcmp(&mc, &e->m.c, sizeof(mc)) != 0)
			r = -EINVAL;
		st_close(&f);
	}
	if (r < 0) {
		send_error(hreq, 400, "Cannot update weights from \"%s\": %s", path,
			   r == -EINVAL ? "model config differs" : strerror(-r));
		goto out;
	}
	snprintf(c.path, sizeof(c.path), "%s", path);
	r = ctl_run(e, &c);
	if (r == 0) {
		free(e->model_path);
		e->model_path = strdup(path);
	}
	reply_update(e, hreq, r, "Succeeded to update model weights.");
out:
	json_object_put(o);
}

static int unhex(const char *s, uint8_t *out, size_t n)
{
	if (strlen(s) != 2 * n)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		unsigned v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -EINVAL;
		out[i] = (uint8_t)v;
	}
	return 0;
}

void http_on_init_group(struct evhttp_request *hreq, void *arg)
{
	static const char *const top[] = {"nccl_unique_id", "world_size", "rank_offset",
					  "group_name",	    "backend",	  NULL};
	struct engine *e = arg;
	json_object *o = body_json(hreq);
	struct ctl c = {.op = CTL_GROUP_INIT};
	int64_t world = 0, offset = 1;
	const char *id, *backend;
	int r;

	if (!o)
		return;
	if (!known_fields(hreq, o, "the request", top) ||
	    !(id = get_str(hreq, o, "nccl_unique_id", true)) ||
	    !get_int(hreq, o, "world_size", 2, 64, &world) ||
	    !get_int(hreq, o, "rank_offset", 1, 63, &offset) ||
	    !get_str(hreq, o, "group_name", false) ||
	    !(backend = get_str(hreq, o, "backend", false)))
		goto out;
	if (*backend && strcmp(backend, "nccl") != 0) {
		send_error(hreq, 400, "Only the \"nccl\" backend is supported");
		goto out;
	}
	if (offset + e->o.tp > world || unhex(id, c.nccl_id, sizeof(c.nccl_id)) < 0) {
		send_error(hreq, 400,
			   "Bad group: world_size %" PRId64 ", rank_offset %" PRId64
			   ", nccl_unique_id must be %zu hex bytes",
			   world, offset, sizeof(c.nccl_id));
		goto out;
	}
	c.world = (uint32_t)world;
	c.rank_offset = (uint32_t)offset;
	/* blocks until the trainer joins, like SGLang's init_weights_update_group */
	r = ctl_run(e, &c);
	reply_update(e, hreq, r, "Succeeded to initialize the weight update group.");
out:
	json_object_put(o);
}

void http_on_update_dist(struct evhttp_request *hreq, void *arg)
{
	static const char *const top[] = {"names", "dtypes", "shapes", "flush_cache", NULL};
	struct engine *e = arg;
	json_object *o = body_json(hreq), *names, *dtypes, *shapes;
	struct ctl c = {.op = CTL_UPDATE_DIST};
	bool flush = false;
	size_t n;
	int r;

	if (!o)
		return;
	if (!known_fields(hreq, o, "the request", top) || !get_bool(hreq, o, "flush_cache", &flush))
		goto out;
	if (!json_object_object_get_ex(o, "names", &names) ||
	    !json_object_object_get_ex(o, "dtypes", &dtypes) ||
	    !json_object_object_get_ex(o, "shapes", &shapes) ||
	    !json_object_is_type(names, json_type_array) ||
	    !json_object_is_type(dtypes, json_type_array) ||
	    !json_object_is_type(shapes, json_type_array) ||
	    json_object_array_length(dtypes) != json_object_array_length(names) ||
	    json_object_array_length(shapes) != json_object_array_length(names)) {
		send_error(hreq, 400,
			   "\"names\", \"dtypes\" and \"shapes\" must be lists of one length");
		goto out;
	}
	n = json_object_array_length(names);
	if (n == 0 || n > CTL_MAX_TENSORS) {
		send_error(hreq, 400, "Between 1 and %d tensors per update", CTL_MAX_TENSORS);
		goto out;
	}
	if (!e->update_comm) {
		send_error(hreq, 400, "No weight update group: call /init_weights_update_group");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		json_object *nm = json_object_array_get_idx(names, i);
		json_object *dt = json_object_array_get_idx(dtypes, i);
		json_object *sh = json_object_array_get_idx(shapes, i);
		int idx = json_object_is_type(nm, json_type_string)
				  ? model_find(&e->m, json_object_get_string(nm))
				  : -ENOENT;
		const struct weight *w = idx >= 0 ? &e->m.w[idx] : NULL;

		if (!w) {
			send_error(hreq, 400, "names[%zu]: no such tensor", i);
			goto out;
		}
		if (!json_object_is_type(dt, json_type_string) ||
		    (strcmp(json_object_get_string(dt), "float32") != 0 &&
		     strcmp(json_object_get_string(dt), "torch.float32") != 0)) {
			send_error(hreq, 400, "dtypes[%zu]: only float32 tensors", i);
			goto out;
		}
		if (!json_object_is_type(sh, json_type_array) ||
		    json_object_array_length(sh) != 2 ||
		    json_object_get_int64(json_object_array_get_idx(sh, 0)) != (int64_t)w->d.rows ||
		    json_object_get_int64(json_object_array_get_idx(sh, 1)) != (int64_t)w->d.cols) {
			send_error(hreq, 400, "shapes[%zu]: %s is [%" PRIu64 ", %" PRIu64 "]", i,
				   w->d.name, w->d.rows, w->d.cols);
			goto out;
		}
		c.idx[i] = (uint16_t)idx;
	}
	c.count = (uint32_t)n;
	r = ctl_run(e, &c);
	reply_update(e, hreq, r, "Succeeded to update parameter online.");
out:
	json_object_put(o);
}

/* ---- test-only endpoints (--enable-debug-endpoints) ---- */

void http_on_debug_kv(struct evhttp_request *hreq, void *arg)
{
	struct engine *e = arg;
	json_object *o = json_object_new_object(), *seqs = json_object_new_array();
	uint64_t id = 0, off = 0;
	char addr[32];

	snprintf(addr, sizeof(addr), "0x%" PRIx64, (uint64_t)e->m.kv);
	json_object_object_add(o, "kv_arena", json_object_new_string(addr));
	json_object_object_add(o, "kv_bytes", json_object_new_int64((int64_t)e->m.kv_bytes));
	json_object_object_add(o, "block_bytes", json_object_new_int64((int64_t)e->m.block_bytes));
	json_object_object_add(o, "block_size", json_object_new_int64(e->m.block_size));
	json_object_object_add(o, "num_blocks", json_object_new_int64(e->m.num_blocks));
	json_object_object_add(o, "num_layers", json_object_new_int64(e->m.c.layers));
	json_object_object_add(o, "width", json_object_new_int64(e->m.width_local));
	/* connections token requests came on: a proxy that keeps them alive uses few */
	json_object_object_add(o, "token_connections", json_object_new_int64(e->n_token_peers));
	/* the emulator's allocation id, for "emu-ctl flip ID OFFSET" */
	if (gpu.emu_alloc_id && gpu.emu_alloc_id(e->m.kv, &id, &off) == 0) {
		json_object_object_add(o, "emu_alloc_id", json_object_new_int64((int64_t)id));
		json_object_object_add(o, "emu_alloc_offset", json_object_new_int64((int64_t)off));
	}
	/* ?block=N: an FNV-1a hash of block N's bytes (D2H), to see a corruption land */
	{
		const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(hreq));
		struct evkeyvalq params;
		const char *b;

		if (q && evhttp_parse_query_str(q, &params) == 0) {
			b = evhttp_find_header(&params, "block");
			if (b && strtoul(b, NULL, 10) < e->m.num_blocks) {
				uint64_t blk = strtoul(b, NULL, 10), h = 0xcbf29ce484222325ull;
				uint8_t *buf = malloc(e->m.block_bytes);
				char hex[24];

				if (buf && gpu.cuMemcpyDtoH(buf, e->m.kv + blk * e->m.block_bytes,
							    e->m.block_bytes) == CUDA_SUCCESS) {
					for (uint64_t i = 0; i < e->m.block_bytes; i++)
						h = (h ^ buf[i]) * 0x100000001b3ull;
					snprintf(hex, sizeof(hex), "%016" PRIx64, h);
					json_object_object_add(o, "block_hash",
							       json_object_new_string(hex));
				}
				free(buf);
			}
			evhttp_clear_headers(&params);
		}
	}
	for (uint32_t i = 0; i < e->o.max_num_seqs; i++) {
		struct request *req = e->running[i];
		json_object *s;

		if (!req)
			continue;
		s = json_object_new_object();
		json_object_object_add(s, "id", json_object_new_int64((int64_t)req->id));
		json_object_object_add(s, "tokens", json_object_new_int64(req->ntok));
		json_object_object_add(s, "computed", json_object_new_int64(req->computed));
		json_object_object_add(s, "blocks", ids_array(req->blocks, req->nblocks));
		json_object_array_add(seqs, s);
	}
	{
		int64_t nwaiting = 0;

		for (struct request *w = e->waiting; w; w = w->next)
			nwaiting++;
		json_object_object_add(o, "waiting", json_object_new_int64(nwaiting));
	}
	json_object_object_add(o, "seqs", seqs);
	json_object_object_add(o, "steps", json_object_new_int64((int64_t)e->steps));
	send_json(hreq, 200, o);
}

void http_on_debug(struct evhttp_request *hreq, void *arg)
{
	struct engine *e = arg;
	const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(hreq));
	json_object *o;
	int r = 0;

	if (evhttp_request_get_command(hreq) != EVHTTP_REQ_POST) {
		send_error(hreq, 405, "Method not allowed: use POST");
		return;
	}
	if (strcmp(path, "/debug/pause") == 0) {
		e->paused = true;
	} else if (strcmp(path, "/debug/resume") == 0) {
		e->paused = false;
		sched_kick(e);
	} else if (strcmp(path, "/debug/step") == 0) {
		r = sched_step(e);
	}
	o = json_object_new_object();
	json_object_object_add(o, "success", json_object_new_boolean(r == 0));
	json_object_object_add(o, "steps", json_object_new_int64((int64_t)e->steps));
	send_json(hreq, r == 0 ? 200 : 500, o);
}

/* GET /debug/headers: the request's headers as the engine received them, {"Name": "value"}
 * (repeated names joined with ", "), for tests of what a proxy in front forwards. */
void http_on_debug_headers(struct evhttp_request *hreq, void *arg)
{
	const struct evkeyvalq *h = evhttp_request_get_input_headers(hreq);
	json_object *o = json_object_new_object(), *v;

	(void)arg;
	for (const struct evkeyval *kv = h->tqh_first; kv; kv = kv->next.tqe_next) {
		if (json_object_object_get_ex(o, kv->key, &v)) {
			char *both;

			if (asprintf(&both, "%s, %s", json_object_get_string(v), kv->value) < 0)
				continue;
			json_object_object_add(o, kv->key, json_object_new_string(both));
			free(both);
		} else {
			json_object_object_add(o, kv->key, json_object_new_string(kv->value));
		}
	}
	send_json(hreq, 200, o);
}
