/* SPDX-License-Identifier: MIT */
/*
 * belayer-test-trainer: pushes new weights into a running engine the way RL frameworks do
 * (veRL, slime: SGLang's update_weights_from_distributed). It loads a safetensors file onto
 * its own device, creates an NCCL group with the engine's ranks (the trainer is rank 0, the
 * engine's TP ranks follow), then broadcasts every tensor into the engine's weights.
 *   belayer-test-trainer --port PORT --weights FILE [--tp N] [--device D]
 * Prints the engine's reply (with its new weights_version) on stdout.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine-client.h"
#include "engine-alloc.h"
#include "engine-gpu.h"
#include "engine-model.h"
#include "engine-safetensors.h"
#include "log.h"
#include "util.h"

#define TIMEOUT_MS 120000

static const char *meta_get(void *ud, const char *key)
{
	return st_meta(ud, key);
}

/* Sends method path body, runs fn (the trainer's side of the collective), reads the reply. */
static int call(uint16_t port, const char *path, const char *body, int (*fn)(void *), void *ud)
{
	struct http_response resp = {};
	int fd = client_connect(port), r;

	if (fd < 0)
		return log_error_errno(fd, "Failed to connect to the engine: %m");
	r = client_send(fd, "POST", path, body);
	if (r == 0 && fn)
		r = fn(ud);
	if (r == 0)
		r = client_recv(fd, TIMEOUT_MS, &resp);
	close(fd);
	if (r < 0)
		return log_error_errno(r, "%s failed: %m", path);
	printf("%s\n", resp.body);
	r = resp.status == 200 ? 0 : -EIO;
	http_response_free(&resp);
	return r;
}

struct group {
	ncclUniqueId id;
	int world;
	ncclComm_t comm;
	struct weight *w;
	size_t nw;
};

static int join(void *ud)
{
	struct group *g = ud;
	ncclResult_t nr = gpu.ncclCommInitRank(&g->comm, g->world, g->id, 0);

	if (nr != ncclSuccess)
		return log_error_errno(-EIO, "ncclCommInitRank: %s", gpu.ncclGetErrorString(nr));
	return 0;
}

static int broadcast_all(void *ud)
{
	struct group *g = ud;

	for (size_t i = 0; i < g->nw; i++) {
		ncclResult_t nr = gpu.ncclBroadcast((const void *)g->w[i].ptr, (void *)g->w[i].ptr,
						    g->w[i].bytes / sizeof(float), ncclFloat, 0,
						    g->comm, gpu_stream());

		if (nr != ncclSuccess)
			return log_error_errno(-EIO, "ncclBroadcast of %s: %s", g->w[i].d.name,
					       gpu.ncclGetErrorString(nr));
	}
	return gpu_sync();
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"port", required_argument, NULL, 'p'}, {"weights", required_argument, NULL, 'w'},
		{"tp", required_argument, NULL, 't'},	{"device", required_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},	{},
	};
	const char *path = NULL;
	int port = 0, tp = 1, dev = -1, opt, r;
	struct group g = {};
	struct model_config c;
	struct st_file f;
	json_object *req, *names, *dtypes, *shapes;
	char hex[2 * sizeof(g.id.internal) + 1];
	_cleanup_free_ char *buf = NULL;

	log_setup("belayer-test-trainer", LOG_LEVEL_INFO);
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) >= 0) {
		switch (opt) {
		case 'p':
			port = atoi(optarg);
			break;
		case 'w':
			path = optarg;
			break;
		case 't':
			tp = atoi(optarg);
			break;
		case 'd':
			dev = atoi(optarg);
			break;
		default:
			fprintf(opt == 'h' ? stdout : stderr,
				"usage: belayer-test-trainer --port PORT --weights FILE [--tp N] "
				"[--device D (default: N)]\n");
			return opt == 'h' ? 0 : 1;
		}
	}
	if (!path || port <= 0 || port > 65535 || tp < 1 || tp > 8)
		return log_error("--port and --weights are required"), 1;
	if (dev < 0)
		dev = tp; /* the engine's ranks use devices 0..tp-1 */

	if (gpu_cuda_init(dev) < 0 || gpu_nccl_load() < 0 || st_open(path, &f) < 0)
		return 1;
	r = model_config_from_metadata(meta_get, &f, &c);
	if (r == 0)
		r = model_create_unsharded(&c, &g.w, &g.nw);
	buf = malloc(1u << 20);
	if (r < 0 || !buf)
		return 1;
	/* the trainer's copy of the new policy, on its device */
	for (size_t i = 0; i < g.nw; i++) {
		const struct st_tensor *t = st_find(&f, g.w[i].d.name);

		if (!t || t->end - t->begin != g.w[i].bytes)
			return log_error("%s: tensor %s missing or mis-sized", path, g.w[i].d.name),
			       1;
		for (uint64_t done = 0; done < g.w[i].bytes;) {
			size_t n = (size_t)MIN((uint64_t)(1u << 20), g.w[i].bytes - done);

			if (pread(f.fd, buf, n, (off_t)(t->begin + done)) != (ssize_t)n ||
			    gpu.cuMemcpyHtoD(g.w[i].ptr + done, buf, n) != CUDA_SUCCESS)
				return log_error("Loading %s failed", g.w[i].d.name), 1;
			done += n;
		}
	}
	st_close(&f);

	if (gpu.ncclGetUniqueId(&g.id) != ncclSuccess)
		return 1;
	g.world = 1 + tp;
	for (size_t i = 0; i < sizeof(g.id.internal); i++)
		snprintf(hex + 2 * i, 3, "%02x", (unsigned char)g.id.internal[i]);
	req = json_object_new_object();
	json_object_object_add(req, "nccl_unique_id", json_object_new_string(hex));
	json_object_object_add(req, "world_size", json_object_new_int(g.world));
	json_object_object_add(req, "rank_offset", json_object_new_int(1));
	json_object_object_add(req, "group_name", json_object_new_string("weight_sync"));
	json_object_object_add(req, "backend", json_object_new_string("nccl"));
	r = call((uint16_t)port, "/init_weights_update_group",
		 json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN), join, &g);
	json_object_put(req);
	if (r < 0)
		return 1;

	req = json_object_new_object();
	names = json_object_new_array();
	dtypes = json_object_new_array();
	shapes = json_object_new_array();
	for (size_t i = 0; i < g.nw; i++) {
		json_object *s = json_object_new_array();

		json_object_array_add(names, json_object_new_string(g.w[i].d.name));
		json_object_array_add(dtypes, json_object_new_string("float32"));
		json_object_array_add(s, json_object_new_int64((int64_t)g.w[i].d.rows));
		json_object_array_add(s, json_object_new_int64((int64_t)g.w[i].d.cols));
		json_object_array_add(shapes, s);
	}
	json_object_object_add(req, "names", names);
	json_object_object_add(req, "dtypes", dtypes);
	json_object_object_add(req, "shapes", shapes);
	r = call((uint16_t)port, "/update_weights_from_distributed",
		 json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN), broadcast_all, &g);
	json_object_put(req);
	(void)gpu.ncclCommDestroy(g.comm);
	for (size_t i = 0; i < g.nw; i++)
		(void)dev_free(g.w[i].ptr);
	free(g.w);
	return r < 0 ? 1 : 0;
}
