/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#include "proto-samples.h"
#include "util.h"

static void fill_uuid(uint8_t *u, uint8_t seed)
{
	for (size_t i = 0; i < PROTO_UUID_LEN; i++)
		u[i] = (uint8_t)(seed * 31 + i * 7);
}

static void sample_hello(struct proto_msg *m)
{
	m->type = PROTO_HELLO;
	m->hello.pid = 4242;
	(void)snprintf(m->hello.engine_id, sizeof(m->hello.engine_id), "vllm-engine-0");
	m->hello.role = ROLE_PRIMARY;
	m->hello.rank = 3;
	m->hello.n_devices = 2;
	fill_uuid(m->hello.device_uuid[0], 1);
	fill_uuid(m->hello.device_uuid[1], 2);
}

/* Every bound at its limit: the longest string, the most devices, the extreme integers. */
static void sample_hello_max(struct proto_msg *m)
{
	m->type = PROTO_HELLO;
	m->hello.pid = UINT32_MAX;
	memset(m->hello.engine_id, 'e', PROTO_MAX_STR);
	m->hello.role = ROLE_SHADOW;
	m->hello.rank = INT32_MAX;
	m->hello.n_devices = PROTO_MAX_DEVICES;
	for (size_t i = 0; i < PROTO_MAX_DEVICES; i++)
		fill_uuid(m->hello.device_uuid[i], (uint8_t)(i + 10));
}

static void sample_hello_min(struct proto_msg *m)
{
	m->type = PROTO_HELLO;
	m->hello.pid = 1;
	m->hello.role = ROLE_PRIMARY;
	m->hello.rank = -1;
	m->hello.n_devices = 0;
}

static void sample_region(struct proto_msg *m, int fd)
{
	m->type = PROTO_REGION_ANNOUNCE;
	m->region.id = 17;
	fill_uuid(m->region.device_uuid, 1);
	m->region.va = 0x7f0000200000;
	m->region.size = 2u << 20;
	m->region.cls = REGION_KV;
	m->region.order = 5;
	m->region.weights_version = 2;
	m->region.fd = fd;
}

static void sample_region_max(struct proto_msg *m, int fd)
{
	m->type = PROTO_REGION_ANNOUNCE;
	m->region.id = UINT64_MAX;
	fill_uuid(m->region.device_uuid, 9);
	m->region.va = UINT64_MAX;
	m->region.size = UINT64_MAX;
	m->region.cls = REGION_OTHER;
	m->region.order = UINT64_MAX;
	m->region.weights_version = UINT64_MAX;
	m->region.fd = fd;
}

static void sample_release(struct proto_msg *m)
{
	m->type = PROTO_REGION_RELEASE;
	m->release.id = 17;
}

static void sample_error(struct proto_msg *m)
{
	m->type = PROTO_ERROR;
	m->error.code = EPERM;
	m->error.in_reply_to = PROTO_REGION_ANNOUNCE;
	(void)snprintf(m->error.message, sizeof(m->error.message), "region 17: not yours");
}

static void sample_error_max(struct proto_msg *m)
{
	m->type = PROTO_ERROR;
	m->error.code = INT32_MAX;
	m->error.in_reply_to = UINT32_MAX;
	memset(m->error.message, 'm', PROTO_MAX_STR);
}

static void sample_fetch(struct proto_msg *m)
{
	m->type = PROTO_REGION_FETCH;
	m->fetch.pid = 4242;
	m->fetch.id = 17;
}

static void sample_region_fd(struct proto_msg *m, int fd)
{
	m->type = PROTO_REGION_FD;
	m->region_fd.pid = 4242;
	m->region_fd.region.id = 17;
	fill_uuid(m->region_fd.region.device_uuid, 1);
	m->region_fd.region.va = 0x7f0000200000;
	m->region_fd.region.size = 8u << 20;
	m->region_fd.region.cls = REGION_WEIGHTS;
	m->region_fd.region.order = 1;
	m->region_fd.region.weights_version = 3;
	m->region_fd.region.fd = fd;
}

static void sample_ctl(struct proto_msg *m)
{
	m->type = PROTO_CTL;
	m->ctl.cmd = CTL_INJECT;
	m->ctl.pid = 4242;
	m->ctl.act = CTL_ACT_HANG;
	m->ctl.dev = -1;
	m->ctl.arg = 0;
}

static void sample_ctl_promote(struct proto_msg *m)
{
	m->type = PROTO_CTL;
	m->ctl.cmd = CTL_PROMOTE;
	m->ctl.dev = -1;
	snprintf(m->ctl.engine_id, sizeof(m->ctl.engine_id), "llm");
}

static void sample_metric(struct proto_msg *m)
{
	m->type = PROTO_METRIC;
	(void)snprintf(m->metric.name, sizeof(m->metric.name), "belayer_health_verdicts_total");
	(void)snprintf(m->metric.labels, sizeof(m->metric.labels), "check=\"gpu\",verdict=\"ok\"");
	m->metric.kind = METRIC_COUNTER;
	m->metric.value = 12;
	(void)snprintf(m->metric.help, sizeof(m->metric.help), "Health-check verdicts.");
}

static void sample_worker_info(struct proto_msg *m)
{
	m->type = PROTO_WORKER_INFO;
	m->worker_info.pid = 4242;
	m->worker_info.uid = 1000;
	(void)snprintf(m->worker_info.engine_id, sizeof(m->worker_info.engine_id), "vllm-0");
	m->worker_info.role = ROLE_SHADOW;
	m->worker_info.rank = 1;
	m->worker_info.n_devices = 1;
	fill_uuid(m->worker_info.device_uuid[0], 3);
	m->worker_info.state = WORKER_DEAD;
	m->worker_info.n_regions = 6;
	m->worker_info.bytes = 66u << 20;
	m->worker_info.age_ms = 1500;
	m->worker_info.device_used = (10u << 20) + 1;
	m->worker_info.rss = 26u << 20;
	m->worker_info.pss = 11u << 20;
	m->worker_info.pss_shmem = 10u << 20;
	m->worker_info.canary_version = 3;
}

static void sample_region_info(struct proto_msg *m)
{
	m->type = PROTO_REGION_INFO;
	m->region_info.pid = 4242;
	(void)snprintf(m->region_info.engine_id, sizeof(m->region_info.engine_id), "vllm-0");
	m->region_info.id = 2;
	fill_uuid(m->region_info.device_uuid, 3);
	m->region_info.va = 0x7f0000a00000;
	m->region_info.size = 16u << 20;
	m->region_info.cls = REGION_KV;
	m->region_info.order = 3;
	m->region_info.weights_version = 1;
	m->region_info.state = REGION_RETAINED;
	m->region_info.age_ms = 250;
	m->region_info.checksum = 0x1234567890abcdefull;
	m->region_info.checksum_version = 2;
}

static void sample_config_entry(struct proto_msg *m)
{
	m->type = PROTO_CONFIG_ENTRY;
	(void)snprintf(m->config_entry.key, sizeof(m->config_entry.key), "supervisor.socket");
	(void)snprintf(m->config_entry.value, sizeof(m->config_entry.value),
		       "/run/belayer/supervisor.sock");
}

static void sample_event(struct proto_msg *m)
{
	m->type = PROTO_EVENT;
	m->event.ts_us = 1764500000000000ull;
	m->event.kind = EVENT_WORKER_EXIT;
	m->event.pid = 4242;
	m->event.id = 0;
	(void)snprintf(m->event.message, sizeof(m->event.message), "killed by signal 9");
}

static void sample_health(struct proto_msg *m)
{
	m->type = PROTO_HEALTH_INFO;
	m->health.check = HEALTH_GPU;
	m->health.verdict = VERDICT_FAILED;
	m->health.dev = 0;
	m->health.pid = 0;
	(void)snprintf(m->health.message, sizeof(m->health.message), "fatal XID 79");
}

static void sample_end(struct proto_msg *m)
{
	m->type = PROTO_END;
	m->end.in_reply_to = PROTO_CTL;
	m->end.count = 6;
}

static void sample_shadow_region(struct proto_msg *m)
{
	m->type = PROTO_SHADOW_REGION;
	m->shadow_region.id = 3;
	m->shadow_region.va = 0x7f0040000000;
	m->shadow_region.size = 1u << 30;
	m->shadow_region.cls = REGION_WEIGHTS;
	m->shadow_region.order = 2;
	fill_uuid(m->shadow_region.device_uuid, 4);
}

static void sample_shadow_parked(struct proto_msg *m)
{
	m->type = PROTO_SHADOW_PARKED;
	m->shadow_parked.n_entries = 2;
	m->shadow_parked.hash = 0x8b2a6f1e0d4c3b79ull;
}

static void sample_promote_map(struct proto_msg *m, int fd)
{
	m->type = PROTO_PROMOTE_MAP;
	m->promote_map.shadow_id = 3;
	m->promote_map.primary_pid = 4242;
	m->promote_map.primary_id = 7;
	m->promote_map.size = 1u << 30;
	m->promote_map.weights_version = 5;
	m->promote_map.fd = fd;
}

static void sample_promote_commit(struct proto_msg *m)
{
	m->type = PROTO_PROMOTE_COMMIT;
	m->promote_commit.n_regions = 2;
	m->promote_commit.hash = 0x8b2a6f1e0d4c3b79ull;
	m->promote_commit.weights_version = 5;
}

static void sample_promote_done(struct proto_msg *m)
{
	m->type = PROTO_PROMOTE_DONE;
	m->promote_done.code = 0;
	m->promote_done.n_regions = 2;
	m->promote_done.ns = 180000;
	(void)snprintf(m->promote_done.message, sizeof(m->promote_done.message),
		       "2 regions mapped");
}

static void sample_promote_done_failed(struct proto_msg *m)
{
	m->type = PROTO_PROMOTE_DONE;
	m->promote_done.code = EXDEV;
	m->promote_done.n_regions = 0;
	m->promote_done.ns = UINT64_MAX;
	memset(m->promote_done.message, 'p', PROTO_MAX_STR);
}

static void sample_mem_info(struct proto_msg *m)
{
	m->type = PROTO_MEM_INFO;
	m->mem_info.device = 1;
	m->mem_info.seq = 2;
	memset(m->mem_info.device_uuid, 0xcd, PROTO_UUID_LEN);
	m->mem_info.free = 70ull << 30;
	m->mem_info.total = 80ull << 30;
}

static void sample_env_checkpoint(struct proto_msg *m)
{
	m->type = PROTO_ENV_REQUEST;
	m->env_request.op = ENV_OP_CHECKPOINT;
	(void)snprintf(m->env_request.env, sizeof(m->env_request.env), "env-7");
	(void)snprintf(m->env_request.trajectory, sizeof(m->env_request.trajectory), "traj-42");
	m->env_request.turn = 12;
	m->env_request.prefix_tokens = 8192;
	m->env_request.prefix_hash = 0x1234abcd5678ef90ull;
}

static void sample_env_create(struct proto_msg *m)
{
	m->type = PROTO_ENV_REQUEST;
	m->env_request.op = ENV_OP_CREATE;
	(void)snprintf(m->env_request.env, sizeof(m->env_request.env), "env-7");
	(void)snprintf(m->env_request.root, sizeof(m->env_request.root), "/srv/bases/py311");
	(void)snprintf(m->env_request.cmd, sizeof(m->env_request.cmd), "exec sleep infinity");
	m->env_request.pids = 256;
	m->env_request.memory = ENV_LIMIT_NONE;
	m->env_request.cpu_millis = 1500;
	m->env_request.disk = 8u << 20;
	m->env_request.net = ENV_NET_SLIRP;
}

static void sample_image_import(struct proto_msg *m)
{
	m->type = PROTO_IMAGE_REQUEST;
	m->image_request.op = IMAGE_OP_IMPORT;
	(void)snprintf(m->image_request.ref, sizeof(m->image_request.ref),
		       "docker-archive:/srv/images/py311.tar:localhost/py:3.11");
	(void)snprintf(m->image_request.name, sizeof(m->image_request.name), "py");
}

static void sample_image_info(struct proto_msg *m)
{
	m->type = PROTO_IMAGE_INFO;
	(void)snprintf(m->image_info.id, sizeof(m->image_info.id),
		       "sha256:a10a8f7cd0f69fd862add0720439221fee12d2ea9ca7fe158fd8fe0701d4aa40");
	(void)snprintf(m->image_info.name, sizeof(m->image_info.name), "localhost/py:3.11");
	m->image_info.n_layers = 12;
	m->image_info.unpacked = 11;
	m->image_info.cached = 1;
	m->image_info.entries = 48213;
	m->image_info.bytes = 3ull << 30;
	m->image_info.us = 41000000;
}

static void sample_env_info(struct proto_msg *m)
{
	m->type = PROTO_ENV_INFO;
	(void)snprintf(m->env_info.env, sizeof(m->env_info.env), "env-7");
	(void)snprintf(m->env_info.ckpt, sizeof(m->env_info.ckpt), "c00000012");
	(void)snprintf(m->env_info.parent, sizeof(m->env_info.parent), "c00000011");
	(void)snprintf(m->env_info.trajectory, sizeof(m->env_info.trajectory), "traj-42");
	m->env_info.turn = 12;
	m->env_info.prefix_tokens = 8192;
	m->env_info.prefix_hash = UINT64_MAX;
	m->env_info.pid = 4321;
	m->env_info.nproc = 5;
	m->env_info.fs_bytes = 20480;
	m->env_info.criu_bytes = 322560;
	m->env_info.freeze_us = 77000;
	m->env_info.full_diff = 1;
	m->env_info.net = ENV_NET_NONE;
	m->env_info.commit_us = 4100;
	(void)snprintf(m->env_info.path, sizeof(m->env_info.path), "dirty-set");
	(void)snprintf(m->env_info.kind, sizeof(m->env_info.kind), "fs-only");
	(void)snprintf(m->env_info.mem, sizeof(m->env_info.mem), "full");
	m->env_info.soft_dirty = 1;
	(void)snprintf(m->env_info.why, sizeof(m->env_info.why), "ring buffer overflow");
	m->env_info.precopy_rounds = 2;
	m->env_info.precopy_bytes = 1600000;
	m->env_info.precopy_frozen_bytes = 4096;
}

static void sample_env_item(struct proto_msg *m)
{
	m->type = PROTO_ENV_ITEM;
	(void)snprintf(m->env_item.kind, sizeof(m->env_item.kind), "exec");
	m->env_item.pid = 77;
	m->env_item.ts_ns = 123456789;
	(void)snprintf(m->env_item.path, sizeof(m->env_item.path), "/usr/bin/make");
	(void)snprintf(m->env_item.text, sizeof(m->env_item.text), "make -j2");
}

static void sample_env_exec(struct proto_msg *m, int fd)
{
	static char argv[] = "sh\0-c\0echo hi; exit 3";
	static char envv[] = "FOO=bar\0PATH=/bin";

	m->type = PROTO_ENV_EXEC;
	(void)snprintf(m->env_exec.env, sizeof(m->env_exec.env), "e1");
	m->env_exec.argv = (struct proto_blob){argv, sizeof(argv), 3};
	m->env_exec.envv = (struct proto_blob){envv, sizeof(envv), 2};
	(void)snprintf(m->env_exec.cwd, sizeof(m->env_exec.cwd), "/work");
	(void)snprintf(m->env_exec.user, sizeof(m->env_exec.user), "1000:1000");
	m->env_exec.timeout_ms = 30000;
	m->env_exec.max_output = 65536;
	m->env_exec.flags = EXEC_FLAG_STREAM;
	m->env_exec.fd = fd;
}

static void sample_env_exec_out(struct proto_msg *m)
{
	static char data[] = "hello\n\0binary\xff";

	m->type = PROTO_ENV_EXEC_OUT;
	m->exec_out.stream = 2;
	m->exec_out.data = (struct proto_blob){data, sizeof(data) - 1, 0};
}

static void sample_env_exec_done(struct proto_msg *m)
{
	m->type = PROTO_ENV_EXEC_DONE;
	m->exec_done.exit_code = -1;
	m->exec_done.signal = 9;
	m->exec_done.timed_out = 1;
	m->exec_done.truncated = 3;
	m->exec_done.wall_us = 1000123;
	m->exec_done.out_bytes = 3000000;
	m->exec_done.err_bytes = 12;
	m->exec_done.pid = 25;
}

static void sample_env_file_read(struct proto_msg *m)
{
	m->type = PROTO_ENV_FILE_READ;
	(void)snprintf(m->env_file.env, sizeof(m->env_file.env), "e1");
	(void)snprintf(m->env_file.path, sizeof(m->env_file.path), "/work/../etc/passwd");
	m->env_file.max = 1 << 20;
}

static void sample_env_file_write(struct proto_msg *m, int fd)
{
	m->type = PROTO_ENV_FILE_WRITE;
	(void)snprintf(m->env_file.env, sizeof(m->env_file.env), "e1");
	(void)snprintf(m->env_file.path, sizeof(m->env_file.path), "/work/out.txt");
	m->env_file.mode = 0640;
	(void)snprintf(m->env_file.user, sizeof(m->env_file.user), "nobody");
	m->env_file.fd = fd;
}

static void sample_env_file_data(struct proto_msg *m, int fd)
{
	m->type = PROTO_ENV_FILE_DATA;
	(void)snprintf(m->env_file.env, sizeof(m->env_file.env), "e1");
	(void)snprintf(m->env_file.path, sizeof(m->env_file.path), "/work/out.txt");
	m->env_file.mode = 0640;
	m->env_file.size = 4096;
	m->env_file.uid = 65534;
	m->env_file.gid = 65534;
	m->env_file.fd = fd;
}

static void sample_nccl_comm(struct proto_msg *m, int fd)
{
	m->type = PROTO_NCCL_COMM;
	m->nccl_comm.id = 1;
	m->nccl_comm.hash = 0x5bd1e9955bd1e995ull;
	m->nccl_comm.rank = 1;
	m->nccl_comm.nranks = 4;
	m->nccl_comm.cuda_dev = 1;
	fill_uuid(m->nccl_comm.device_uuid, 5);
	m->nccl_comm.origin = NCCL_ORIGIN_INIT_RANK;
	m->nccl_comm.fd = fd;
}

static void sample_nccl_comm_split(struct proto_msg *m, int fd)
{
	m->type = PROTO_NCCL_COMM;
	m->nccl_comm.id = UINT64_MAX;
	m->nccl_comm.hash = UINT64_MAX;
	m->nccl_comm.rank = INT32_MAX;
	m->nccl_comm.nranks = UINT32_MAX;
	m->nccl_comm.cuda_dev = -1;
	m->nccl_comm.parent_id = 1;
	m->nccl_comm.origin = NCCL_ORIGIN_SHRINK;
	m->nccl_comm.fd = fd;
}

static void sample_nccl_comm_end(struct proto_msg *m)
{
	m->type = PROTO_NCCL_COMM_END;
	m->nccl_comm_end.id = 2;
	m->nccl_comm_end.how = NCCL_END_ABORT;
}

static void sample_traj_step_end(struct proto_msg *m)
{
	m->type = PROTO_TRAJ_STEP;
	m->traj_step.ev = TRAJ_STEP_END;
	strcpy(m->traj_step.trajectory, "rollout-7/traj-3");
	strcpy(m->traj_step.env, "swe-3");
	m->traj_step.turn = 4;
	m->traj_step.prompt_tokens = 5120;
	m->traj_step.generated_tokens = 12;
	m->traj_step.decode_mtps = 41500;
}

static void sample_traj_step_begin(struct proto_msg *m)
{
	m->type = PROTO_TRAJ_STEP;
	m->traj_step.ev = TRAJ_STEP_BEGIN;
	strcpy(m->traj_step.trajectory, "t");
	strcpy(m->traj_step.env, "e");
	m->traj_step.output_tokens = UINT64_MAX;
}

static void sample_traj_decision(struct proto_msg *m)
{
	m->type = PROTO_TRAJ_DECISION;
	m->traj_decision.ev = TRAJ_STEP_END;
	strcpy(m->traj_decision.trajectory, "rollout-7/traj-3");
	strcpy(m->traj_decision.env, "swe-3");
	m->traj_decision.act = TRAJ_ACT_CHECKPOINT;
	strcpy(m->traj_decision.why, "fits");
	m->traj_decision.bubble_us = 2400000;
	m->traj_decision.bubble_err_pm = 120;
	m->traj_decision.cost_us = 180000;
	m->traj_decision.cost_err_pm = UINT32_MAX;
	m->traj_decision.held_us = 0;
}

/* A step-begin answer: the bubble's checkpoint, aborted at the delay bound after a hold. */
static void sample_traj_decision_begin(struct proto_msg *m)
{
	m->type = PROTO_TRAJ_DECISION;
	m->traj_decision.ev = TRAJ_STEP_BEGIN;
	strcpy(m->traj_decision.trajectory, "rollout-7/traj-3");
	strcpy(m->traj_decision.env, "swe-3");
	strcpy(m->traj_decision.why, "step-begin");
	m->traj_decision.held_us = 51234;
	strcpy(m->traj_decision.ckpt, "c00000042");
	m->traj_decision.ckpt_us = UINT64_MAX;
	m->traj_decision.aborted = 1;
}

static void sample_traj_list(struct proto_msg *m)
{
	m->type = PROTO_TRAJ_LIST;
	strcpy(m->traj_list.trajectory, "rollout-7/traj-3");
}

static void sample_traj_info(struct proto_msg *m)
{
	m->type = PROTO_TRAJ_INFO;
	m->traj_info.kind = TRAJ_INFO_TRAJECTORY;
	strcpy(m->traj_info.trajectory, "rollout-7/traj-3");
	strcpy(m->traj_info.env, "swe-3");
	m->traj_info.unprotected_turns = 2;
	m->traj_info.unprotected_us = 4100000;
	m->traj_info.bubble_us = 2400000;
	m->traj_info.bubble_err_pm = 120;
	m->traj_info.n_lengths = 64;
	m->traj_info.decode_mtps = 41500;
	m->traj_info.pending = 1;
	m->traj_info.prompt_tokens = 5120;
	m->traj_info.generated_tokens = 12;
	m->traj_info.last_output_tokens = UINT64_MAX;
	m->traj_info.ckpt_done = 3;
	m->traj_info.ckpt_aborted = UINT32_MAX;
}

static void sample_traj_info_env(struct proto_msg *m)
{
	m->type = PROTO_TRAJ_INFO;
	m->traj_info.kind = TRAJ_INFO_ENV;
	strcpy(m->traj_info.env, "swe-3");
	m->traj_info.cost_us = 20000;
	m->traj_info.fs_bps = 500000000;
	m->traj_info.dump_bps = UINT64_MAX;
	m->traj_info.cost_err_pm = 1000;
	m->traj_info.cost_n = 7;
}

static const struct {
	const char *name;
	void (*fill)(struct proto_msg *m);
	void (*fill_fd)(struct proto_msg *m, int fd);
} samples[] = {
	{"hello", sample_hello, NULL},
	{"hello-max", sample_hello_max, NULL},
	{"hello-min", sample_hello_min, NULL},
	{"region-announce", NULL, sample_region},
	{"region-announce-max", NULL, sample_region_max},
	{"region-release", sample_release, NULL},
	{"error", sample_error, NULL},
	{"error-max", sample_error_max, NULL},
	{"region-fetch", sample_fetch, NULL},
	{"region-fd", NULL, sample_region_fd},
	{"ctl", sample_ctl, NULL},
	{"ctl-promote", sample_ctl_promote, NULL},
	{"metric", sample_metric, NULL},
	{"worker-info", sample_worker_info, NULL},
	{"region-info", sample_region_info, NULL},
	{"config-entry", sample_config_entry, NULL},
	{"event", sample_event, NULL},
	{"health-info", sample_health, NULL},
	{"end", sample_end, NULL},
	{"shadow-region", sample_shadow_region, NULL},
	{"shadow-parked", sample_shadow_parked, NULL},
	{"promote-map", NULL, sample_promote_map},
	{"promote-commit", sample_promote_commit, NULL},
	{"promote-done", sample_promote_done, NULL},
	{"promote-done-failed", sample_promote_done_failed, NULL},
	{"nccl-comm", NULL, sample_nccl_comm},
	{"nccl-comm-split", NULL, sample_nccl_comm_split},
	{"nccl-comm-end", sample_nccl_comm_end, NULL},
	{"env-checkpoint", sample_env_checkpoint, NULL},
	{"env-create", sample_env_create, NULL},
	{"image-import", sample_image_import, NULL},
	{"image-info", sample_image_info, NULL},
	{"env-info", sample_env_info, NULL},
	{"env-item", sample_env_item, NULL},
	{"traj-step-end", sample_traj_step_end, NULL},
	{"traj-step-begin", sample_traj_step_begin, NULL},
	{"traj-decision", sample_traj_decision, NULL},
	{"traj-decision-begin", sample_traj_decision_begin, NULL},
	{"traj-list", sample_traj_list, NULL},
	{"traj-info", sample_traj_info, NULL},
	{"traj-info-env", sample_traj_info_env, NULL},
	{"env-exec", NULL, sample_env_exec},
	{"env-exec-out", sample_env_exec_out, NULL},
	{"env-exec-done", sample_env_exec_done, NULL},
	{"env-file-read", sample_env_file_read, NULL},
	{"env-file-write", NULL, sample_env_file_write},
	{"env-file-data", NULL, sample_env_file_data},
	{"mem-info", sample_mem_info, NULL},
};

bool proto_msg_same(const struct proto_msg *a, const struct proto_msg *b)
{
	return proto_msg_equal(a, b, true);
}

size_t proto_sample_count(void)
{
	return ARRAY_SIZE(samples);
}

const char *proto_sample(size_t i, int fd, struct proto_msg *ret)
{
	if (i >= ARRAY_SIZE(samples))
		return NULL;
	/* Zeroed first, so two samples compare equal with memcmp. */
	memset(ret, 0, sizeof(*ret));
	if (samples[i].fill)
		samples[i].fill(ret);
	else
		samples[i].fill_fd(ret, fd);
	return samples[i].name;
}

struct out_buf {
	char *data;
	size_t cap, len;
};

static int out_write(void *data, const char *buf, size_t len)
{
	struct out_buf *b = data;

	if (len > b->cap - b->len)
		return -1;
	if (len == 0)
		return 0; /* an empty body comes with buf NULL: memcpy's arguments must not be */
	memcpy(b->data + b->len, buf, len);
	b->len += len;
	return 0;
}

static bool key_is(const msgpack_object *k, const char *s)
{
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(s) &&
	       memcmp(k->via.str.ptr, s, k->via.str.size) == 0;
}

static int pack_key(msgpack_packer *pk, const char *key)
{
	return msgpack_pack_str(pk, strlen(key)) ?: msgpack_pack_str_body(pk, key, strlen(key));
}

ssize_t proto_mutate(const void *in, size_t len, const char *key, enum proto_mutation op,
		     const msgpack_object *val, void *out, size_t cap)
{
	struct out_buf ob = {.data = out, .cap = cap};
	const msgpack_object_map *map;
	msgpack_unpacked u;
	msgpack_packer pk;
	size_t off = 0, n;
	bool found = false;
	ssize_t r = 0;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, in, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP) {
		r = -EBADMSG;
		goto out;
	}
	map = &u.data.via.map;
	for (uint32_t i = 0; i < map->size; i++)
		found = found || key_is(&map->ptr[i].key, key);
	if (!found && op != MUT_ADD) {
		r = -ENOENT;
		goto out;
	}

	n = map->size + (op == MUT_REMOVE ? -1 : op == MUT_REPLACE ? 0 : 1);
	msgpack_packer_init(&pk, &ob, out_write);
	if (msgpack_pack_map(&pk, n) != 0)
		r = -ENOBUFS;
	for (uint32_t i = 0; r == 0 && i < map->size; i++) {
		const msgpack_object_kv *kv = &map->ptr[i];
		bool hit = key_is(&kv->key, key);

		if (hit && op == MUT_REMOVE)
			continue;
		if (msgpack_pack_object(&pk, kv->key) != 0 ||
		    msgpack_pack_object(&pk, hit && op == MUT_REPLACE ? *val : kv->val) != 0)
			r = -ENOBUFS;
		if (r == 0 && hit && op == MUT_DUPLICATE &&
		    (msgpack_pack_object(&pk, kv->key) != 0 ||
		     msgpack_pack_object(&pk, kv->val) != 0))
			r = -ENOBUFS;
	}
	if (r == 0 && op == MUT_ADD &&
	    (pack_key(&pk, key) != 0 || msgpack_pack_object(&pk, *val) != 0))
		r = -ENOBUFS;
	if (r == 0)
		r = (ssize_t)ob.len;
out:
	msgpack_unpacked_destroy(&u);
	return r;
}

int proto_keys(const void *in, size_t len, char keys[][16], size_t max)
{
	msgpack_unpacked u;
	size_t off = 0;
	int r = 0;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, in, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP) {
		r = -EBADMSG;
		goto out;
	}
	for (uint32_t i = 0; i < u.data.via.map.size; i++) {
		const msgpack_object *k = &u.data.via.map.ptr[i].key;

		if (i >= max) {
			r = -ENOBUFS;
			goto out;
		}
		if (k->type != MSGPACK_OBJECT_STR || k->via.str.size >= 16) {
			r = -EBADMSG;
			goto out;
		}
		memcpy(keys[i], k->via.str.ptr, k->via.str.size);
		keys[i][k->via.str.size] = '\0';
		r++;
	}
out:
	msgpack_unpacked_destroy(&u);
	return r;
}
