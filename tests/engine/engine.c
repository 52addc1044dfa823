/* SPDX-License-Identifier: MIT */
/*
 * belayer-test-engine: an inference server standing in for vLLM/SGLang on the emulated GPU
 * (and on a real one). See README.md. Rank 0 starts the other tensor-parallel ranks as
 * processes of this same program (--rank, --nccl-id), serves HTTP and drives the steps.
 */
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "engine-alloc.h"
#include "engine-gpu.h"
#include "engine-safetensors.h"
#include "log.h"
#include "util.h"

extern char **environ;

enum {
	ARG_TP = 0x100,
	ARG_LOAD_FORMAT,
	ARG_GPU_UTIL,
	ARG_KV_BYTES,
	ARG_MAX_SEQS,
	ARG_BLOCK_SIZE,
	ARG_MAX_TOKENS,
	ARG_DEBUG,
	ARG_DEBUG_DROP,
	ARG_DEBUG_CUT,
	ARG_DEBUG_NO_IDS,
	ARG_DEBUG_DROP_REUSED,
	ARG_DEBUG_LISTEN_DELAY,
	ARG_RANK,
	ARG_NCCL_ID,
	ARG_SEED,
	ARG_NAME,
	ARG_HOST,
	ARG_PORT,
	ARG_MODEL,
	ARG_NO_RANK_ENV,
	ARG_ONE_VISIBLE,
	ARG_CUSTOM_ALL_REDUCE,
	ARG_CUDA_GRAPH,
	ARG_NCCL_NONBLOCKING,
	ARG_INDEX_TABLES,
	ARG_INDEX_FIRST,
	ARG_TAGS,
	ARG_SLEEP_MODE,
};

static const struct option options[] = {
	{"model", required_argument, NULL, ARG_MODEL},
	{"served-model-name", required_argument, NULL, ARG_NAME},
	{"host", required_argument, NULL, ARG_HOST},
	{"port", required_argument, NULL, ARG_PORT},
	{"tp", required_argument, NULL, ARG_TP},
	{"tensor-parallel-size", required_argument, NULL, ARG_TP},
	{"load-format", required_argument, NULL, ARG_LOAD_FORMAT},
	{"seed", required_argument, NULL, ARG_SEED},
	{"gpu-memory-utilization", required_argument, NULL, ARG_GPU_UTIL},
	{"kv-cache-bytes", required_argument, NULL, ARG_KV_BYTES},
	{"max-num-seqs", required_argument, NULL, ARG_MAX_SEQS},
	{"block-size", required_argument, NULL, ARG_BLOCK_SIZE},
	{"max-num-batched-tokens", required_argument, NULL, ARG_MAX_TOKENS},
	{"enable-debug-endpoints", no_argument, NULL, ARG_DEBUG},
	{"debug-drop-requests", required_argument, NULL, ARG_DEBUG_DROP},
	{"debug-cut-replies", required_argument, NULL, ARG_DEBUG_CUT},
	{"debug-no-token-ids", no_argument, NULL, ARG_DEBUG_NO_IDS},
	{"debug-drop-reused", required_argument, NULL, ARG_DEBUG_DROP_REUSED},
	{"debug-listen-delay", required_argument, NULL, ARG_DEBUG_LISTEN_DELAY},
	{"rank", required_argument, NULL, ARG_RANK},
	{"nccl-id", required_argument, NULL, ARG_NCCL_ID},
	{"no-rank-env", no_argument, NULL, ARG_NO_RANK_ENV},
	{"one-visible-device", no_argument, NULL, ARG_ONE_VISIBLE},
	{"custom-all-reduce", no_argument, NULL, ARG_CUSTOM_ALL_REDUCE},
	{"cuda-graph", no_argument, NULL, ARG_CUDA_GRAPH},
	{"nccl-nonblocking", no_argument, NULL, ARG_NCCL_NONBLOCKING},
	{"index-tables", no_argument, NULL, ARG_INDEX_TABLES},
	{"index-tables-first", no_argument, NULL, ARG_INDEX_FIRST},
	{"belayer-tags", no_argument, NULL, ARG_TAGS},
	{"enable-sleep-mode", no_argument, NULL, ARG_SLEEP_MODE},
	{"help", no_argument, NULL, 'h'},
	{},
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: belayer-test-engine --model FILE.safetensors [options]\n"
		"  --host ADDR                   listen address (127.0.0.1)\n"
		"  --port N                      HTTP port (8000; 0: any, printed when ready)\n"
		"  --tp N, --tensor-parallel-size N   ranks, one process and device each (1)\n"
		"  --load-format auto|dummy      dummy: weights initialised on the device (auto)\n"
		"  --seed N                      seed of the dummy weights (0)\n"
		"  --gpu-memory-utilization F    fraction of device memory to use (0.9)\n"
		"  --kv-cache-bytes N[KMG]       KV cache size per rank, instead of the fraction\n"
		"  --max-num-seqs N              concurrent sequences (256)\n"
		"  --block-size N                tokens per KV block (16)\n"
		"  --max-num-batched-tokens N    tokens per step (max(2048, context))\n"
		"  --served-model-name NAME      model name in the OpenAI API (file name)\n"
		"  --enable-debug-endpoints      /debug/kv, /debug/pause|resume|step (tests)\n"
		"  --debug-drop-requests N       cut the connections of the first N token "
		"requests\n"
		"                                before any reply, /health answering (tests)\n"
		"  --debug-cut-replies N         cut the first N non-stream token replies "
		"mid-body (tests)\n"
		"  --debug-no-token-ids          ignore return_token_ids, as a vLLM older than "
		"it (tests)\n"
		"  --debug-drop-reused N         cut the connections of the first N token "
		"requests\n"
		"                                that arrive on a connection used before, as "
		"an\n"
		"                                engine closing it idle would (tests)\n"
		"  --debug-listen-delay MS       listen MS after the model is loaded: connections "
		"are\n"
		"                                refused meanwhile (tests)\n"
		"  --one-visible-device          each rank sees only its device (the rank-th of\n"
		"                                CUDA_VISIBLE_DEVICES), as its device 0 (Ray)\n"
		"  --no-rank-env                 ranks learn their rank from arguments only, "
		"without\n"
		"                                RANK/LOCAL_RANK, as vLLM's and SGLang's "
		"workers\n"
		"  --custom-all-reduce           TP ranks share cudaMalloc buffers over legacy IPC "
		"before\n"
		"                                the KV probe, as vLLM's custom all-reduce\n"
		"  --cuda-graph                  decode steps captured as CUDA graphs and "
		"replayed\n"
		"  --nccl-nonblocking            the TP communicator is nonblocking "
		"(config.blocking = 0),\n"
		"                                as PyTorch's with "
		"TORCH_NCCL_USE_COMM_NONBLOCKING=1\n"
		"  --index-tables                block table and slot mapping as large "
		"allocations\n"
		"                                after the KV cache, as vLLM's and SGLang's\n"
		"  --index-tables-first          the same, allocated before the weights, as "
		"vLLM's\n"
		"                                CpuGpuBuffers at runner init\n"
		"  --belayer-tags                weights and KV tagged with belayer_set_tag, as "
		"with\n"
		"                                python/belayer_tag.py installed\n"
		"  --enable-sleep-mode           weights and KV cache as vLLM's CuMemAllocator "
		"makes\n"
		"                                them (cuMemCreate); POST /sleep, /wake_up\n");
}

static int parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	switch (*end) {
	case 'K':
	case 'k':
		shift = 10, end++;
		break;
	case 'M':
	case 'm':
		shift = 20, end++;
		break;
	case 'G':
	case 'g':
		shift = 30, end++;
		break;
	default:
		break;
	}
	if (*end == 'i' && shift)
		end++;
	if ((*end == 'B' || *end == 'b') && shift)
		end++;
	if (*end || v > (UINT64_MAX >> shift))
		return -EINVAL;
	*ret = v << shift;
	return 0;
}

static int parse_u32_arg(const char *s, uint32_t lo, uint32_t hi, uint32_t *ret)
{
	uint64_t v;

	if (parse_size(s, &v) < 0 || v < lo || v > hi)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

static int parse_args(int argc, char **argv, struct engine_options *o)
{
	const char *id_hex = NULL;
	uint64_t v;
	int c;

	*o = (struct engine_options){.host = "127.0.0.1",
				     .port = 8000,
				     .tp = 1,
				     .gpu_util = 0.9,
				     .max_num_seqs = 256,
				     .block_size = 16};
	while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
		int r = 0;

		switch (c) {
		case ARG_MODEL:
			o->model = optarg;
			break;
		case ARG_NAME:
			o->served_name = optarg;
			break;
		case ARG_HOST:
			o->host = optarg;
			break;
		case ARG_PORT:
			r = parse_size(optarg, &v);
			if (r == 0 && v > 65535)
				r = -EINVAL;
			o->port = (uint16_t)v;
			break;
		case ARG_TP:
			r = parse_u32_arg(optarg, 1, 8, &o->tp);
			break;
		case ARG_LOAD_FORMAT:
			if (strcmp(optarg, "dummy") == 0)
				o->dummy = true;
			else if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "safetensors") != 0)
				r = -EINVAL;
			break;
		case ARG_SEED:
			r = parse_size(optarg, &o->dummy_seed);
			break;
		case ARG_GPU_UTIL:
			o->gpu_util = strtod(optarg, NULL);
			if (!(o->gpu_util > 0.0 && o->gpu_util <= 1.0))
				r = -EINVAL;
			break;
		case ARG_KV_BYTES:
			r = parse_size(optarg, &o->kv_bytes);
			break;
		case ARG_MAX_SEQS:
			r = parse_u32_arg(optarg, 1, 4096, &o->max_num_seqs);
			break;
		case ARG_BLOCK_SIZE:
			r = parse_u32_arg(optarg, 1, 1024, &o->block_size);
			break;
		case ARG_MAX_TOKENS:
			r = parse_u32_arg(optarg, 1, 1u << 20, &o->max_batched_tokens);
			break;
		case ARG_DEBUG:
			o->debug_endpoints = true;
			break;
		case ARG_DEBUG_DROP:
			r = parse_u32_arg(optarg, 0, 1000000, &o->debug_drop);
			break;
		case ARG_DEBUG_CUT:
			r = parse_u32_arg(optarg, 0, 1000000, &o->debug_cut);
			break;
		case ARG_DEBUG_NO_IDS:
			o->debug_no_ids = true;
			break;
		case ARG_DEBUG_DROP_REUSED:
			r = parse_u32_arg(optarg, 0, 1000000, &o->debug_drop_reused);
			break;
		case ARG_DEBUG_LISTEN_DELAY:
			r = parse_u32_arg(optarg, 0, 600000, &o->debug_listen_delay_ms);
			break;
		case ARG_RANK:
			r = parse_u32_arg(optarg, 1, 7, &o->rank);
			break;
		case ARG_ONE_VISIBLE:
			o->one_visible_device = true;
			break;
		case ARG_NO_RANK_ENV:
			o->no_rank_env = true;
			break;
		case ARG_CUSTOM_ALL_REDUCE:
			o->custom_all_reduce = true;
			break;
		case ARG_NCCL_NONBLOCKING:
			o->nccl_nonblocking = true;
			break;
		case ARG_CUDA_GRAPH:
			o->cuda_graph = true;
			break;
		case ARG_INDEX_TABLES:
			o->index_tables = true;
			break;
		case ARG_INDEX_FIRST:
			o->index_tables = o->index_first = true;
			break;
		case ARG_TAGS:
			o->tags = true;
			break;
		case ARG_SLEEP_MODE:
			o->sleep_mode = true;
			break;
		case ARG_NCCL_ID:
			id_hex = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(EXIT_SUCCESS);
		default:
			usage(stderr);
			return -EINVAL;
		}
		if (r < 0)
			return log_error_errno(r, "Invalid value \"%s\" for an option", optarg);
	}
	if (optind < argc || !o->model) {
		usage(stderr);
		return -EINVAL;
	}
	if (o->rank >= o->tp)
		return log_error_errno(-EINVAL, "--rank must be below --tp");
	if (o->rank > 0) {
		if (!id_hex || strlen(id_hex) != 2 * sizeof(o->tp_id.internal))
			return log_error_errno(-EINVAL, "--rank needs --nccl-id");
		for (size_t i = 0; i < sizeof(o->tp_id.internal); i++) {
			unsigned b;

			if (sscanf(id_hex + 2 * i, "%2x", &b) != 1)
				return -EINVAL;
			o->tp_id.internal[i] = (char)b;
		}
	}
	if (!o->served_name) {
		const char *slash = strrchr(o->model, '/');

		o->served_name = slash ? slash + 1 : o->model;
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *meta_get(void *ud, const char *key)
{
	return st_meta(ud, key);
}

/* The model's config from the file's header (the only read in --load-format dummy). */
static int read_config(const char *path, struct model_config *ret)
{
	struct st_file f;
	int r = st_open(path, &f);

	if (r < 0)
		return r;
	r = model_config_from_metadata(meta_get, &f, ret);
	st_close(&f);
	return r;
}

static void free_env(char **env)
{
	for (size_t i = 0; env && env[i]; i++)
		free(env[i]);
	free(env);
}

/* Our environment with RANK and LOCAL_RANK set to rank (the shim falls back on them;
 * BELAYER_RANK, when set, still wins there), or without either (no_rank_env: the rank is an
 * argument only, as vLLM's and SGLang's executors give it). */
static int spawn_env(uint32_t rank, bool no_rank_env, char ***ret)
{
	size_t n = 0, k = 0;
	char **env;

	while (environ[n])
		n++;
	env = calloc(n + 3, sizeof(char *));
	if (!env)
		return ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "RANK=", 5) != 0 &&
		    strncmp(environ[i], "LOCAL_RANK=", 11) != 0)
			env[k++] = strdup(environ[i]);
	if (!no_rank_env && (asprintf(&env[k++], "RANK=%u", rank) < 0 ||
			     asprintf(&env[k++], "LOCAL_RANK=%u", rank) < 0)) {
		env[k - 1] = NULL;
		free_env(env);
		return ENOMEM;
	}
	for (size_t i = 0; i < k; i++)
		if (!env[i]) {
			free_env(env);
			return ENOMEM;
		}
	*ret = env;
	return 0;
}

/* --one-visible-device, after the other ranks were started (they narrow their own): this rank
 * sees only the rank-th device of the CUDA_VISIBLE_DEVICES it was started with (all devices
 * when unset: device `rank`), which is then its device 0. Ray starts each worker so, with one
 * GPU id in its CUDA_VISIBLE_DEVICES. */
static int visible_own_device(uint32_t rank)
{
	const char *all = getenv("CUDA_VISIBLE_DEVICES");
	char one[128];

	if (!all) {
		snprintf(one, sizeof(one), "%u", rank);
	} else {
		for (uint32_t i = 0; i < rank && all; i++)
			if ((all = strchr(all, ',')))
				all++;
		if (!all || !*all || strcspn(all, ",") >= sizeof(one))
			return log_error_errno(-ENODEV, "CUDA_VISIBLE_DEVICES lists no device %u",
					       rank);
		snprintf(one, sizeof(one), "%.*s", (int)strcspn(all, ","), all);
	}
	return setenv("CUDA_VISIBLE_DEVICES", one, 1) < 0 ? -errno : 0;
}

/* Rank 0 starts ranks 1..tp-1 as copies of itself, as vLLM's multiprocess executor does. */
static int spawn_ranks(int argc, char **argv, const ncclUniqueId *id, pid_t *pids, uint32_t tp,
		       bool no_rank_env)
{
	char hex[2 * sizeof(id->internal) + 1];

	for (size_t i = 0; i < sizeof(id->internal); i++)
		snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id->internal[i]);
	for (uint32_t rank = 1; rank < tp; rank++) {
		char rank_s[16];
		char **args = calloc((size_t)argc + 5, sizeof(char *)), **env = NULL;
		int r, n = 0;

		if (!args)
			return -ENOMEM;
		snprintf(rank_s, sizeof(rank_s), "%u", rank);
		args[n++] = argv[0];
		for (int i = 1; i < argc; i++)
			args[n++] = argv[i];
		args[n++] = (char *)"--rank";
		args[n++] = rank_s;
		args[n++] = (char *)"--nccl-id";
		args[n++] = hex;
		r = spawn_env(rank, no_rank_env, &env);
		if (r == 0)
			r = posix_spawn(&pids[rank], "/proc/self/exe", NULL, NULL, args, env);
		free(args);
		free_env(env);
		if (r != 0)
			return log_error_errno(-r, "Failed to start rank %u: %m", rank);
	}
	return 0;
}

static void on_step(evutil_socket_t fd, short what, void *arg)
{
	struct engine *e = arg;
	int r;

	(void)fd;
	(void)what;
	r = sched_step(e);
	if (r < 0) {
		/* a failed collective or kernel: the GPU state is unknown, stop like vLLM does */
		log_error_errno(r, "Step failed, shutting down: %m");
		event_base_loopbreak(e->base);
		return;
	}
	sched_kick(e);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct engine *e = arg;

	(void)what;
	log_info("Signal %d, shutting down", (int)sig);
	event_base_loopbreak(e->base);
}

/* Number of KV blocks: --kv-cache-bytes, else what --gpu-memory-utilization leaves after
 * weights and activations (the cuMemGetInfo probe), agreed on by all ranks (the minimum). */
static int size_kv(struct engine *e, uint32_t *ret)
{
	struct model *m = &e->m;
	uint64_t bb = model_block_bytes(m, e->o.block_size), budget, blocks;
	size_t free_b = 0, total_b = 0;
	CUdeviceptr tmp = 0;
	CUresult cr;
	int r;

	/* The ranks agree on the minimum (vLLM: over an RPC, SGLang: a CPU all-reduce) through a
	 * block of the weights' pool, carved from the rest of its small segment and given back:
	 * no driver allocation is made and freed between the weights and the KV cache. */
	if (e->o.tp > 1) {
		r = dev_alloc(DEV_POOL_WEIGHTS, &tmp, sizeof(blocks));
		if (r < 0)
			return log_error_errno(r, "KV sizing buffer: %m");
	}
	cr = gpu.cuMemGetInfo(&free_b, &total_b);
	if (cr != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(cr), "cuMemGetInfo failed: %s", gpu_strerror(cr));
	if (e->o.kv_bytes) {
		budget = e->o.kv_bytes;
	} else {
		double allowed = e->o.gpu_util * (double)total_b, used = (double)(total_b - free_b);

		budget = allowed > used ? (uint64_t)(allowed - used) : 0;
	}
	blocks = budget / bb;
	/* slots (block * block_size + offset) are 32-bit in the step's inputs */
	if (blocks > UINT32_MAX / e->o.block_size)
		blocks = UINT32_MAX / e->o.block_size;
	if (e->o.tp > 1) {
		ncclResult_t nr;

		cr = gpu.cuMemcpyHtoD(tmp, &blocks, sizeof(blocks));
		nr = cr == CUDA_SUCCESS ? gpu.ncclAllReduce((void *)tmp, (void *)tmp, 1, ncclUint64,
							    ncclMin, m->comm, gpu_stream())
					: ncclInternalError;
		nr = gpu_nccl_wait(m->comm, nr);
		r = nr == ncclSuccess && gpu_sync() == 0 &&
				    gpu.cuMemcpyDtoH(&blocks, tmp, sizeof(blocks)) == CUDA_SUCCESS
			    ? 0
			    : -EIO;
		(void)dev_free(tmp);
		if (r < 0)
			return log_error_errno(r, "Agreeing on the KV size failed");
	}
	if (blocks < (m->c.max_pos + e->o.block_size - 1) / e->o.block_size)
		return log_error_errno(-ENOMEM,
				       "KV cache of %" PRIu64 " bytes holds %" PRIu64
				       " blocks, less than one sequence of %u tokens",
				       budget, blocks, m->c.max_pos);
	*ret = (uint32_t)blocks;
	return 0;
}

/* A one-token step through every kernel and collective, before serving. */
static int warm_up(struct engine *e)
{
	struct ctl c = {.op = CTL_STEP, .ntok = 1, .nrows = 1, .nsample = e->o.rank == 0};
	struct step_layout sl;
	uint32_t *s;

	if (e->o.rank != 0)
		return 0; /* followers run it from ctl_follow */
	step_layout(&e->m, 1, 1, 1, &sl);
	s = e->step_host;
	memset(s, 0, sl.total);
	s[sl.sample / 4] = 0;
	return ctl_run(e, &c);
}

/*
 * --belayer-tags: what python/belayer_tag.py does to vLLM and SGLang, done by the engine
 * itself: positive classification before anything is allocated (belayer_tags_only), then
 * tag "weights" around building and loading the model and "kv" around the KV cache, the tag
 * cleared after each (shim/belayer.h). Resolved by name: without the shim, nothing happens.
 */
static void belayer_tag(const struct engine *e, const char *tag)
{
	void (*tags_only)(void), (*clear_tag)(void);
	int (*set_tag)(const char *);

	if (!e->o.tags)
		return;
	if (!tag) {
		clear_tag = (__typeof__(clear_tag))dlsym(RTLD_DEFAULT, "belayer_clear_tag");
		if (clear_tag)
			clear_tag();
	} else if (strcmp(tag, "tags-only") == 0) {
		tags_only = (__typeof__(tags_only))dlsym(RTLD_DEFAULT, "belayer_tags_only");
		if (tags_only)
			tags_only();
	} else {
		set_tag = (__typeof__(set_tag))dlsym(RTLD_DEFAULT, "belayer_set_tag");
		if (set_tag)
			(void)set_tag(tag);
	}
}

int main(int argc, char **argv)
{
	struct engine e = {};
	struct model_config mc;
	pid_t pids[8] = {};
	double t0 = now_s(), t[7];
	ncclResult_t nr;
	uint32_t blocks = 0;
	int r;

	log_setup("belayer-test-engine", LOG_LEVEL_INFO);
	/* As the Python engines (the interpreter ignores SIGPIPE): a write to a connection its
	 * client closed is an error of that connection, not the process's death. */
	(void)signal(SIGPIPE, SIG_IGN);
	r = parse_args(argc, argv, &e.o);
	if (r < 0)
		return EXIT_FAILURE;
	if (e.o.rank > 0)
		(void)prctl(PR_SET_PDEATHSIG, SIGTERM); /* rank 0 owns the group */
	r = read_config(e.o.model, &mc);
	if (r < 0)
		return EXIT_FAILURE;
	if (!e.o.max_batched_tokens)
		e.o.max_batched_tokens = MAX(2048u, mc.max_pos);
	if (e.o.max_batched_tokens < mc.max_pos) {
		log_error("--max-num-batched-tokens must hold a whole context (%u)", mc.max_pos);
		return EXIT_FAILURE;
	}

	/* NCCL's id first, so the other ranks start while this one initialises CUDA */
	/* loaded at any TP degree: weight updates from a trainer use NCCL too */
	r = gpu_nccl_load();
	if (r < 0)
		return EXIT_FAILURE;
	if (e.o.tp > 1) {
		if (e.o.rank == 0) {
			nr = gpu.ncclGetUniqueId(&e.o.tp_id);
			if (nr != ncclSuccess) {
				log_error("ncclGetUniqueId failed: %s", gpu.ncclGetErrorString(nr));
				return EXIT_FAILURE;
			}
			r = spawn_ranks(argc, argv, &e.o.tp_id, pids, e.o.tp, e.o.no_rank_env);
			if (r < 0)
				goto fail;
		}
	}
	t[0] = now_s();
	r = e.o.one_visible_device ? visible_own_device(e.o.rank) : 0;
	r = r ?: gpu_cuda_init(e.o.one_visible_device ? 0 : (int)e.o.rank);
	r = r ?: gpu_kernels_load();
	if (r < 0)
		goto fail;
	t[1] = now_s();
	if (e.o.tp > 1) {
		ncclConfig_t config = NCCL_CONFIG_INITIALIZER;

		/* Blocking by default, made the way vLLM's pynccl makes it. */
		config.blocking = 0;
		nr = e.o.nccl_nonblocking
			     ? gpu.ncclCommInitRankConfig(&e.m.comm, (int)e.o.tp, e.o.tp_id,
							  (int)e.o.rank, &config)
			     : gpu.ncclCommInitRank(&e.m.comm, (int)e.o.tp, e.o.tp_id,
						    (int)e.o.rank);
		nr = gpu_nccl_wait(e.m.comm, nr);
		if (nr != ncclSuccess) {
			r = log_error_errno(-EIO, "Creating the TP communicator failed: %s",
					    gpu.ncclGetErrorString(nr));
			goto fail;
		}
	}
	t[2] = now_s();
	belayer_tag(&e, "tags-only");
	/* vLLM's runner allocates its input batch's block tables at init, before the model */
	e.m.c = mc;
	r = e.o.index_first ? model_alloc_index(&e.m, e.o.max_batched_tokens, e.o.max_num_seqs,
						e.o.block_size)
			    : 0;
	/* CuMemAllocator allocates only inside its pool: the weights and KV, not the tables */
	if (e.o.sleep_mode)
		dev_alloc_use_cumem((int)e.o.rank);
	belayer_tag(&e, "weights");
	r = r ?: model_create(&e.m, &mc, e.o.tp, e.o.rank);
	if (r == 0)
		r = e.o.dummy ? model_load_dummy(&e.m, e.o.dummy_seed)
			      : model_load_file(&e.m, e.o.model);
	belayer_tag(&e, NULL);
	if (r < 0)
		goto fail;
	e.m.cuda_graph = e.o.cuda_graph;
	e.model_path = strdup(e.o.model);
	t[3] = now_s();
	/* vLLM's finalize_p2p(): before determine_available_memory(). */
	r = car_init(&e);
	if (r < 0)
		goto fail;
	/* The KV cache first, then the buffers of the serving steps: in vLLM the forward pass's
	 * tensors come from the caching allocator after the KV cache is allocated. */
	r = size_kv(&e, &blocks);
	belayer_tag(&e, "kv");
	r = r ?: model_alloc_kv(&e.m, e.o.block_size, blocks);
	belayer_tag(&e, NULL);
	if (e.o.index_tables && !e.o.index_first)
		r = r
			    ?: model_alloc_index(&e.m, e.o.max_batched_tokens, e.o.max_num_seqs,
						 e.o.block_size);
	r = r
		    ?: model_alloc_activations(&e.m, e.o.max_batched_tokens, e.o.max_num_seqs,
					       e.o.block_size);
	r = r ?: ctl_init(&e);
	if (r < 0)
		goto fail;
	t[4] = now_s();
	if (e.o.rank == 0)
		r = sched_init(&e);
	r = r ?: warm_up(&e);
	if (r < 0)
		goto fail;
	t[5] = now_s();

	if (e.o.rank > 0) {
		r = ctl_follow(&e);
		if (e.update_comm)
			(void)gpu.ncclCommDestroy(e.update_comm);
		(void)gpu.ncclCommDestroy(e.m.comm);
		free(e.m.w);
		free(e.model_path);
		return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
	}

	e.base = event_base_new();
	if (!e.base) {
		r = -ENOMEM;
		goto fail;
	}
	e.step_ev = evtimer_new(e.base, on_step, &e);
	if (e.o.debug_listen_delay_ms)
		(void)poll(NULL, 0, (int)e.o.debug_listen_delay_ms);
	r = e.step_ev ? http_start(&e) : -ENOMEM;
	if (r < 0)
		goto fail;
	{
		struct event *sigint = evsignal_new(e.base, SIGINT, on_signal, &e);
		struct event *sigterm = evsignal_new(e.base, SIGTERM, on_signal, &e);

		if (!sigint || !sigterm || event_add(sigint, NULL) < 0 ||
		    event_add(sigterm, NULL) < 0) {
			r = -ENOMEM;
			goto fail;
		}
		t[6] = now_s();
		/* one JSON line on stdout when ready: the phases of the cold start */
		printf("{\"event\":\"ready\",\"port\":%u,\"tp\":%u,\"load_format\":\"%s\","
		       "\"weights_bytes\":%" PRIu64 ",\"kv_cache_bytes\":%" PRIu64
		       ",\"num_blocks\":%u,\"block_size\":%u,\"phases\":{\"cuda_init_s\":%.3f,"
		       "\"nccl_init_s\":%.3f,\"weights_load_s\":%.3f,\"kv_alloc_s\":%.3f,"
		       "\"warmup_s\":%.3f,\"serve_s\":%.3f},\"total_s\":%.3f}\n",
		       e.o.port, e.o.tp, e.o.dummy ? "dummy" : "auto", model_bytes(&mc),
		       e.m.kv_bytes, e.m.num_blocks, e.m.block_size, t[1] - t[0], t[2] - t[1],
		       t[3] - t[2], t[4] - t[3], t[5] - t[4], t[6] - t[5], t[6] - t0);
		fflush(stdout);
		r = event_base_dispatch(e.base);
		event_free(sigint);
		event_free(sigterm);
	}
	{
		struct ctl c = {.op = CTL_EXIT};

		if (e.o.tp > 1)
			(void)ctl_run(&e, &c);
	}
	r = 0;
fail:
	for (uint32_t i = 1; i < e.o.tp; i++)
		if (pids[i] > 0) {
			if (r < 0)
				(void)kill(pids[i], SIGTERM);
			(void)waitpid(pids[i], NULL, 0);
		}
	/* in-flight requests are aborted (their replies ended) before the server goes */
	sched_finish(&e);
	if (e.update_comm)
		(void)gpu.ncclCommDestroy(e.update_comm);
	if (e.m.comm)
		(void)gpu.ncclCommDestroy(e.m.comm);
	if (e.http)
		evhttp_free(e.http);
	if (e.step_ev)
		event_free(e.step_ev);
	if (e.base)
		event_base_free(e.base);
	free(e.m.w);
	free(e.model_path);
	return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
