/* SPDX-License-Identifier: MIT */
/*
 * Every message type is a row in msg_types[]: its fields (key, kind, where the value lives in
 * struct proto_msg, allowed range) and where its fds go. One generic encoder and one generic
 * decoder walk those rows, so a new message type is a struct in proto.h plus a table here, and
 * encode and decode can never disagree about a field.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "mpbound.h"
#include "mpstr.h"
#include "fdpass.h"
#include "proto.h"
#include "util.h"

_Static_assert(sizeof(enum region_class) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(enum worker_role) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(enum ctl_cmd) == sizeof(int), "enums are stored as int");
_Static_assert(sizeof(enum event_kind) == sizeof(int), "enums are stored as int");
_Static_assert(PROTO_MAX_FDS <= FDPASS_MAX_FDS, "fdpass must carry every proto fd");

enum field_kind {
	FIELD_U32,	 /* uint32_t, in [min, max] */
	FIELD_U64,	 /* uint64_t, any value */
	FIELD_I32,	 /* int32_t, in [min, max] */
	FIELD_ENUM,	 /* an enum stored as int, in [min, max] */
	FIELD_STR,	 /* char[size], at most size - 1 bytes, no NUL inside */
	FIELD_UUID,	 /* uint8_t[PROTO_UUID_LEN], sent as bin of exactly that length */
	FIELD_UUID_LIST, /* uint8_t[size][PROTO_UUID_LEN] with a uint32_t count at count_offset */
	FIELD_BLOB,	 /* struct proto_blob: bin of min..size bytes */
	FIELD_STRV,	 /* struct proto_blob: array of min..max str, size bytes with NULs */
};

struct field {
	const char *key;
	enum field_kind kind;
	size_t offset; /* within struct proto_msg */
	size_t size;   /* FIELD_STR: buffer size; FIELD_UUID_LIST: capacity in entries */
	size_t count_offset;
	int64_t min, max;
	bool optional; /* may be absent on the wire (added to a type later) */
};

struct msg_type {
	const char *name;
	const struct field *fields;
	size_t n_fields;
	size_t nfds;
	size_t fd_offsets[PROTO_MAX_FDS]; /* int members that own the fds, in wire order */
};

#define MEMBER_SIZE(member) sizeof(((struct proto_msg *)0)->member)
#define AT(member)	    offsetof(struct proto_msg, member)

#define F_U32(k, member, lo, hi)                                                              \
	{                                                                                     \
		.key = (k), .kind = FIELD_U32, .offset = AT(member), .min = (lo), .max = (hi) \
	}
#define F_U64(k, member)                                            \
	{                                                           \
		.key = (k), .kind = FIELD_U64, .offset = AT(member) \
	}
#define F_I32(k, member, lo, hi)                                                              \
	{                                                                                     \
		.key = (k), .kind = FIELD_I32, .offset = AT(member), .min = (lo), .max = (hi) \
	}
#define F_ENUM(k, member, n)                                                                 \
	{                                                                                    \
		.key = (k), .kind = FIELD_ENUM, .offset = AT(member), .min = 0, .max = (n)-1 \
	}
#define F_STR(k, member)                                                                         \
	{                                                                                        \
		.key = (k), .kind = FIELD_STR, .offset = AT(member), .size = MEMBER_SIZE(member) \
	}
#define F_UUID(k, member)                                            \
	{                                                            \
		.key = (k), .kind = FIELD_UUID, .offset = AT(member) \
	}
#define F_UUID_LIST(k, member, count)                                                    \
	{                                                                                \
		.key = (k), .kind = FIELD_UUID_LIST, .offset = AT(member),               \
		.size = MEMBER_SIZE(member) / PROTO_UUID_LEN, .count_offset = AT(count), \
	}

#define F_BLOB(k, member, lo, cap)                                                               \
	{                                                                                        \
		.key = (k), .kind = FIELD_BLOB, .offset = AT(member), .size = (cap), .min = (lo) \
	}
#define F_STRV(k, member, lo, hi, cap)                                                            \
	{                                                                                         \
		.key = (k), .kind = FIELD_STRV, .offset = AT(member), .size = (cap), .min = (lo), \
		.max = (hi)                                                                       \
	}

/* Keys are short because every packet repeats them; proto.h lists them. */
static const struct field hello_fields[] = {
	F_U32("pid", hello.pid, 1, UINT32_MAX),
	F_STR("eng", hello.engine_id),
	F_ENUM("role", hello.role, _ROLE_MAX),
	F_I32("rank", hello.rank, -1, INT32_MAX),
	F_UUID_LIST("devs", hello.device_uuid, hello.n_devices),
};

static const struct field region_fields[] = {
	F_U64("id", region.id),
	F_UUID("dev", region.device_uuid),
	F_U64("va", region.va),
	F_U64("size", region.size),
	F_ENUM("cls", region.cls, _REGION_CLASS_MAX),
	F_U64("ord", region.order),
	F_U64("wver", region.weights_version),
};

static const struct field release_fields[] = {
	F_U64("id", release.id),
};

static const struct field error_fields[] = {
	F_I32("code", error.code, 1, INT32_MAX),
	F_U32("re", error.in_reply_to, 0, UINT32_MAX),
	F_STR("msg", error.message),
};

static const struct field fetch_fields[] = {
	F_U32("pid", fetch.pid, 0, UINT32_MAX),
	F_U64("id", fetch.id),
};

static const struct field region_fd_fields[] = {
	F_U32("pid", region_fd.pid, 0, UINT32_MAX),
	F_U64("id", region_fd.region.id),
	F_UUID("dev", region_fd.region.device_uuid),
	F_U64("va", region_fd.region.va),
	F_U64("size", region_fd.region.size),
	F_ENUM("cls", region_fd.region.cls, _REGION_CLASS_MAX),
	F_U64("ord", region_fd.region.order),
	F_U64("wver", region_fd.region.weights_version),
};

static const struct field ctl_fields[] = {
	F_ENUM("cmd", ctl.cmd, _CTL_CMD_MAX),
	F_U32("pid", ctl.pid, 0, UINT32_MAX),
	F_ENUM("act", ctl.act, _CTL_ACT_MAX),
	F_I32("dev", ctl.dev, -1, INT32_MAX),
	F_U64("arg", ctl.arg),
	{.key = "eng",
	 .kind = FIELD_STR,
	 .offset = AT(ctl.engine_id),
	 .size = MEMBER_SIZE(ctl.engine_id),
	 .optional = true},
};

static const struct field metric_fields[] = {
	F_STR("name", metric.name),
	F_STR("lbl", metric.labels),
	F_ENUM("kind", metric.kind, _METRIC_KIND_MAX),
	F_U64("val", metric.value),
	F_STR("help", metric.help),
	{.key = "scale",
	 .kind = FIELD_U32,
	 .offset = AT(metric.scale),
	 .min = 0,
	 .max = UINT32_MAX,
	 .optional = true},
};

static const struct field worker_info_fields[] = {
	F_U32("pid", worker_info.pid, 0, UINT32_MAX),
	F_U32("uid", worker_info.uid, 0, UINT32_MAX),
	F_STR("eng", worker_info.engine_id),
	F_ENUM("role", worker_info.role, _ROLE_MAX),
	F_I32("rank", worker_info.rank, -1, INT32_MAX),
	F_UUID_LIST("devs", worker_info.device_uuid, worker_info.n_devices),
	F_ENUM("state", worker_info.state, _WORKER_STATE_MAX),
	F_U32("nreg", worker_info.n_regions, 0, UINT32_MAX),
	F_U64("bytes", worker_info.bytes),
	F_U64("ms", worker_info.age_ms),
	{.key = "lay", .kind = FIELD_U64, .offset = AT(worker_info.layout_hash), .optional = true},
	{.key = "nlay",
	 .kind = FIELD_U32,
	 .offset = AT(worker_info.layout_n),
	 .max = UINT32_MAX,
	 .optional = true},
	{.key = "park",
	 .kind = FIELD_U32,
	 .offset = AT(worker_info.parked),
	 .max = 1,
	 .optional = true},
	{.key = "port",
	 .kind = FIELD_U32,
	 .offset = AT(worker_info.port),
	 .max = 65535,
	 .optional = true},
	{.key = "rdy",
	 .kind = FIELD_U32,
	 .offset = AT(worker_info.ready),
	 .max = 1,
	 .optional = true},
	{.key = "dmem", .kind = FIELD_U64, .offset = AT(worker_info.device_used), .optional = true},
	{.key = "rss", .kind = FIELD_U64, .offset = AT(worker_info.rss), .optional = true},
	{.key = "pss", .kind = FIELD_U64, .offset = AT(worker_info.pss), .optional = true},
	{.key = "pshm", .kind = FIELD_U64, .offset = AT(worker_info.pss_shmem), .optional = true},
	{.key = "cnv",
	 .kind = FIELD_U64,
	 .offset = AT(worker_info.canary_version),
	 .optional = true},
};

static const struct field region_info_fields[] = {
	F_U32("pid", region_info.pid, 0, UINT32_MAX),
	F_STR("eng", region_info.engine_id),
	F_U64("id", region_info.id),
	F_UUID("dev", region_info.device_uuid),
	F_U64("va", region_info.va),
	F_U64("size", region_info.size),
	F_ENUM("cls", region_info.cls, _REGION_CLASS_MAX),
	F_U64("ord", region_info.order),
	F_U64("wver", region_info.weights_version),
	F_ENUM("state", region_info.state, _REGION_STATE_MAX),
	F_U64("ms", region_info.age_ms),
	F_U64("sum", region_info.checksum),
	F_U64("sumv", region_info.checksum_version),
};

static const struct field config_entry_fields[] = {
	F_STR("key", config_entry.key),
	F_STR("val", config_entry.value),
};

static const struct field event_fields[] = {
	F_U64("ts", event.ts_us),
	F_ENUM("kind", event.kind, _EVENT_KIND_MAX),
	F_U32("pid", event.pid, 0, UINT32_MAX),
	F_U64("id", event.id),
	F_STR("msg", event.message),
};

static const struct field health_fields[] = {
	F_ENUM("check", health.check, _HEALTH_CHECK_MAX),
	F_ENUM("verdict", health.verdict, _VERDICT_MAX),
	F_I32("dev", health.dev, -1, INT32_MAX),
	F_U32("pid", health.pid, 0, UINT32_MAX),
	F_STR("msg", health.message),
};

static const struct field end_fields[] = {
	F_U32("re", end.in_reply_to, 0, UINT32_MAX),
	F_U32("n", end.count, 0, UINT32_MAX),
};

static const struct field shadow_region_fields[] = {
	F_U64("id", shadow_region.id),	   F_U64("va", shadow_region.va),
	F_U64("size", shadow_region.size), F_ENUM("cls", shadow_region.cls, _REGION_CLASS_MAX),
	F_U64("ord", shadow_region.order), F_UUID("dev", shadow_region.device_uuid),
};

static const struct field shadow_parked_fields[] = {
	F_U32("n", shadow_parked.n_entries, 0, UINT32_MAX),
	F_U64("hash", shadow_parked.hash),
};

static const struct field promote_map_fields[] = {
	F_U64("sid", promote_map.shadow_id),
	F_U32("pid", promote_map.primary_pid, 0, UINT32_MAX),
	F_U64("pidr", promote_map.primary_id),
	F_U64("size", promote_map.size),
	F_U64("wver", promote_map.weights_version),
};

static const struct field promote_commit_fields[] = {
	F_U32("n", promote_commit.n_regions, 0, UINT32_MAX),
	F_U64("hash", promote_commit.hash),
	F_U64("wver", promote_commit.weights_version),
};

static const struct field promote_done_fields[] = {
	F_I32("code", promote_done.code, 0, INT32_MAX),
	F_U32("n", promote_done.n_regions, 0, UINT32_MAX),
	F_U64("ns", promote_done.ns),
	F_STR("msg", promote_done.message),
};

static const struct field mem_info_fields[] = {
	F_U32("dev", mem_info.device, 0, PROTO_MAX_DEVICES - 1),
	F_UUID("uuid", mem_info.device_uuid),
	F_U32("seq", mem_info.seq, 0, PROTO_MAX_MEM_INFO - 1),
	F_U64("free", mem_info.free),
	F_U64("total", mem_info.total),
};

/* Agent environments (types 30-39). */
#define OPT_STR(k, member)                                                                        \
	{                                                                                         \
		.key = (k), .kind = FIELD_STR, .offset = AT(member), .size = MEMBER_SIZE(member), \
		.optional = true                                                                  \
	}
#define OPT_U64(k, member)                                                            \
	{                                                                             \
		.key = (k), .kind = FIELD_U64, .offset = AT(member), .optional = true \
	}
#define OPT_U32(k, member, hi)                                                              \
	{                                                                                   \
		.key = (k), .kind = FIELD_U32, .offset = AT(member), .min = 0, .max = (hi), \
		.optional = true                                                            \
	}

static const struct field env_request_fields[] = {
	F_ENUM("op", env_request.op, _ENV_OP_MAX),
	F_STR("env", env_request.env),
	OPT_STR("root", env_request.root),
	OPT_STR("cmd", env_request.cmd),
	OPT_STR("cg", env_request.cgroup),
	OPT_U32("pid", env_request.pid, UINT32_MAX),
	OPT_U64("turn", env_request.turn),
	OPT_U64("plen", env_request.prefix_tokens),
	OPT_U64("phash", env_request.prefix_hash),
	OPT_STR("ckpt", env_request.ckpt),
	OPT_STR("traj", env_request.trajectory),
	OPT_U32("fl", env_request.flags, UINT32_MAX),
	OPT_U64("pids", env_request.pids),
	OPT_U64("mem", env_request.memory),
	OPT_U64("cpu", env_request.cpu_millis),
	/* issue 19: a create's network */
	OPT_U32("net", env_request.net, _ENV_NET_MAX - 1),
	OPT_STR("dst", env_request.dst),
	OPT_U32("n", env_request.count, ENV_FORK_MAX),
	/* issue 19: a create's disk limit */
	OPT_U64("disk", env_request.disk),
	OPT_STR("img", env_request.image),
};

/* Container images (types 40-49). */
static const struct field image_request_fields[] = {
	F_ENUM("op", image_request.op, _IMAGE_OP_MAX),
	OPT_STR("ref", image_request.ref),
	OPT_STR("name", image_request.name),
};

static const struct field image_info_fields[] = {
	F_STR("id", image_info.id),
	F_STR("name", image_info.name),
	F_U32("n", image_info.n_layers, 0, UINT32_MAX),
	F_U64("unp", image_info.unpacked),
	F_U64("cached", image_info.cached),
	F_U64("ent", image_info.entries),
	F_U64("bytes", image_info.bytes),
	F_U64("us", image_info.us),
};

static const struct field env_info_fields[] = {
	F_STR("env", env_info.env),
	F_STR("ckpt", env_info.ckpt),
	F_STR("par", env_info.parent),
	F_STR("traj", env_info.trajectory),
	F_U64("turn", env_info.turn),
	F_U64("plen", env_info.prefix_tokens),
	F_U64("phash", env_info.prefix_hash),
	F_U32("pid", env_info.pid, 0, UINT32_MAX),
	F_U32("nproc", env_info.nproc, 0, UINT32_MAX),
	F_U64("fsb", env_info.fs_bytes),
	F_U64("fsn", env_info.fs_files),
	F_U64("criub", env_info.criu_bytes),
	F_U64("frz", env_info.freeze_us),
	F_U64("dump", env_info.dump_us),
	F_U64("fs", env_info.fs_us),
	F_U64("tot", env_info.total_us),
	F_STR("root", env_info.root),
	F_STR("cg", env_info.cgroup),
	F_U32("full", env_info.full_diff, 0, 1),
	OPT_U32("net", env_info.net, _ENV_NET_MAX - 1),
	OPT_U64("commit", env_info.commit_us),
	OPT_STR("path", env_info.path),
	OPT_STR("kind", env_info.kind),
	OPT_STR("mem", env_info.mem),
	OPT_U32("sdirty", env_info.soft_dirty, 1),
	OPT_STR("why", env_info.why),
	OPT_U64("pcr", env_info.precopy_rounds),
	OPT_U64("pcb", env_info.precopy_bytes),
	OPT_U64("pcfb", env_info.precopy_frozen_bytes),
};

static const struct field env_item_fields[] = {
	F_STR("kind", env_item.kind), F_U32("pid", env_item.pid, 0, UINT32_MAX),
	F_U64("ts", env_item.ts_ns),  F_STR("path", env_item.path),
	F_STR("p2", env_item.path2),  F_STR("txt", env_item.text),
};

static const struct field env_exec_fields[] = {
	F_STR("env", env_exec.env),
	F_STRV("argv", env_exec.argv, 1, 256, PROTO_EXEC_ARGV_MAX),
	F_STRV("envv", env_exec.envv, 0, 256, PROTO_EXEC_ENVV_MAX),
	F_STR("cwd", env_exec.cwd),
	F_STR("user", env_exec.user),
	F_U32("tmo", env_exec.timeout_ms, 0, UINT32_MAX),
	F_U32("max", env_exec.max_output, 0, UINT32_MAX),
	F_U32("fl", env_exec.flags, 0, UINT32_MAX),
};

static const struct field exec_out_fields[] = {
	F_U32("fd", exec_out.stream, 1, 2),
	F_BLOB("data", exec_out.data, 1, PROTO_EXEC_CHUNK_MAX),
};

static const struct field exec_done_fields[] = {
	F_I32("code", exec_done.exit_code, -1, 255),
	F_U32("sig", exec_done.signal, 0, 64),
	F_U32("tmo", exec_done.timed_out, 0, 1),
	F_U32("trunc", exec_done.truncated, 0, 3),
	F_U64("us", exec_done.wall_us),
	F_U64("nout", exec_done.out_bytes),
	F_U64("nerr", exec_done.err_bytes),
	F_U32("pid", exec_done.pid, 0, UINT32_MAX),
};

static const struct field file_read_fields[] = {
	F_STR("env", env_file.env),
	F_STR("path", env_file.path),
	F_U64("max", env_file.max),
};

static const struct field file_write_fields[] = {
	F_STR("env", env_file.env),
	F_STR("path", env_file.path),
	F_U32("mode", env_file.mode, 0, 07777),
	F_STR("user", env_file.user),
};

static const struct field file_data_fields[] = {
	F_STR("env", env_file.env),
	F_STR("path", env_file.path),
	F_U32("mode", env_file.mode, 0, 07777),
	F_U64("size", env_file.size),
	F_U32("uid", env_file.uid, 0, UINT32_MAX),
	F_U32("gid", env_file.gid, 0, UINT32_MAX),
};

static const struct field nccl_comm_fields[] = {
	F_U64("id", nccl_comm.id),
	F_U64("hash", nccl_comm.hash),
	F_I32("rank", nccl_comm.rank, 0, INT32_MAX),
	F_U32("n", nccl_comm.nranks, 1, UINT32_MAX),
	F_I32("cdev", nccl_comm.cuda_dev, -1, INT32_MAX),
	F_UUID("dev", nccl_comm.device_uuid),
	F_U64("par", nccl_comm.parent_id),
	F_ENUM("how", nccl_comm.origin, _NCCL_ORIGIN_MAX),
};

static const struct field nccl_comm_end_fields[] = {
	F_U64("id", nccl_comm_end.id),
	F_ENUM("how", nccl_comm_end.how, _NCCL_END_MAX),
};

static const struct field traj_step_fields[] = {
	F_ENUM("ev", traj_step.ev, _TRAJ_EVENT_MAX),
	F_STR("traj", traj_step.trajectory),
	F_STR("env", traj_step.env),
	OPT_U64("turn", traj_step.turn),
	OPT_U64("plen", traj_step.prompt_tokens),
	OPT_U64("gen", traj_step.generated_tokens),
	OPT_U64("mtps", traj_step.decode_mtps),
	OPT_U64("out", traj_step.output_tokens),
	OPT_U64("pfx", traj_step.prefix_tokens),
	OPT_U64("phash", traj_step.prefix_hash),
};

static const struct field traj_decision_fields[] = {
	F_ENUM("ev", traj_decision.ev, _TRAJ_EVENT_MAX),
	F_STR("traj", traj_decision.trajectory),
	F_STR("env", traj_decision.env),
	F_ENUM("act", traj_decision.act, _TRAJ_ACT_MAX),
	F_STR("why", traj_decision.why),
	F_U64("bub", traj_decision.bubble_us),
	F_U32("berr", traj_decision.bubble_err_pm, 0, UINT32_MAX),
	F_U64("cost", traj_decision.cost_us),
	F_U32("cerr", traj_decision.cost_err_pm, 0, UINT32_MAX),
	F_U64("held", traj_decision.held_us),
	OPT_STR("ckpt", traj_decision.ckpt),
	OPT_U64("ckus", traj_decision.ckpt_us),
	OPT_U32("abrt", traj_decision.aborted, 1),
};

static const struct field traj_list_fields[] = {
	F_STR("traj", traj_list.trajectory),
};

static const struct field traj_info_fields[] = {
	F_ENUM("kind", traj_info.kind, _TRAJ_INFO_KIND_MAX),
	F_STR("traj", traj_info.trajectory),
	F_STR("env", traj_info.env),
	F_U32("turns", traj_info.unprotected_turns, 0, UINT32_MAX),
	F_U64("unp", traj_info.unprotected_us),
	F_U64("bub", traj_info.bubble_us),
	F_U32("berr", traj_info.bubble_err_pm, 0, UINT32_MAX),
	F_U32("nlen", traj_info.n_lengths, 0, UINT32_MAX),
	F_U64("mtps", traj_info.decode_mtps),
	F_U32("gw", traj_info.pending, 0, 1),
	F_U64("plen", traj_info.prompt_tokens),
	F_U64("gen", traj_info.generated_tokens),
	F_U64("out", traj_info.last_output_tokens),
	F_U32("ndone", traj_info.ckpt_done, 0, UINT32_MAX),
	F_U32("nabrt", traj_info.ckpt_aborted, 0, UINT32_MAX),
	F_U64("cost", traj_info.cost_us),
	F_U64("fsbps", traj_info.fs_bps),
	F_U64("dmbps", traj_info.dump_bps),
	F_U32("cerr", traj_info.cost_err_pm, 0, UINT32_MAX),
	F_U32("ncost", traj_info.cost_n, 0, UINT32_MAX),
};

#define FIELDS(a) .fields = (a), .n_fields = ARRAY_SIZE(a)

static const struct msg_type msg_types[_PROTO_TYPE_MAX] = {
	[PROTO_HELLO] = {"hello", FIELDS(hello_fields)},
	[PROTO_REGION_ANNOUNCE] = {"region-announce", FIELDS(region_fields), .nfds = 1,
				   .fd_offsets = {AT(region.fd)}},
	[PROTO_REGION_RELEASE] = {"region-release", FIELDS(release_fields)},
	[PROTO_ERROR] = {"error", FIELDS(error_fields)},
	[PROTO_REGION_FETCH] = {"region-fetch", FIELDS(fetch_fields)},
	[PROTO_REGION_FD] = {"region-fd", FIELDS(region_fd_fields), .nfds = 1,
			     .fd_offsets = {AT(region_fd.region.fd)}},
	[PROTO_CTL] = {"ctl", FIELDS(ctl_fields)},
	[PROTO_METRIC] = {"metric", FIELDS(metric_fields)},
	[PROTO_WORKER_INFO] = {"worker-info", FIELDS(worker_info_fields)},
	[PROTO_REGION_INFO] = {"region-info", FIELDS(region_info_fields)},
	[PROTO_CONFIG_ENTRY] = {"config-entry", FIELDS(config_entry_fields)},
	[PROTO_EVENT] = {"event", FIELDS(event_fields)},
	[PROTO_HEALTH_INFO] = {"health-info", FIELDS(health_fields)},
	[PROTO_END] = {"end", FIELDS(end_fields)},
	[PROTO_SHADOW_REGION] = {"shadow-region", FIELDS(shadow_region_fields)},
	[PROTO_SHADOW_PARKED] = {"shadow-parked", FIELDS(shadow_parked_fields)},
	[PROTO_PROMOTE_MAP] = {"promote-map", FIELDS(promote_map_fields), .nfds = 1,
			       .fd_offsets = {AT(promote_map.fd)}},
	[PROTO_PROMOTE_COMMIT] = {"promote-commit", FIELDS(promote_commit_fields)},
	[PROTO_PROMOTE_DONE] = {"promote-done", FIELDS(promote_done_fields)},
	[PROTO_MEM_INFO] = {"mem-info", FIELDS(mem_info_fields)},
	[PROTO_ENV_REQUEST] = {"env-request", FIELDS(env_request_fields)},
	[PROTO_ENV_INFO] = {"env-info", FIELDS(env_info_fields)},
	[PROTO_ENV_ITEM] = {"env-item", FIELDS(env_item_fields)},
	[PROTO_IMAGE_REQUEST] = {"image-request", FIELDS(image_request_fields)},
	[PROTO_IMAGE_INFO] = {"image-info", FIELDS(image_info_fields)},
	[PROTO_NCCL_COMM] = {"nccl-comm", FIELDS(nccl_comm_fields), .nfds = 1,
			     .fd_offsets = {AT(nccl_comm.fd)}},
	[PROTO_NCCL_COMM_END] = {"nccl-comm-end", FIELDS(nccl_comm_end_fields)},
	[PROTO_TRAJ_STEP] = {"traj-step", FIELDS(traj_step_fields)},
	[PROTO_TRAJ_DECISION] = {"traj-decision", FIELDS(traj_decision_fields)},
	[PROTO_TRAJ_LIST] = {"traj-list", FIELDS(traj_list_fields)},
	[PROTO_TRAJ_INFO] = {"traj-info", FIELDS(traj_info_fields)},
	[PROTO_ENV_EXEC] = {"env-exec", FIELDS(env_exec_fields), .nfds = 1,
			    .fd_offsets = {AT(env_exec.fd)}},
	[PROTO_ENV_EXEC_OUT] = {"env-exec-out", FIELDS(exec_out_fields)},
	[PROTO_ENV_EXEC_DONE] = {"env-exec-done", FIELDS(exec_done_fields)},
	[PROTO_ENV_FILE_READ] = {"env-file-read", FIELDS(file_read_fields)},
	[PROTO_ENV_FILE_WRITE] = {"env-file-write", FIELDS(file_write_fields), .nfds = 1,
				  .fd_offsets = {AT(env_file.fd)}},
	[PROTO_ENV_FILE_DATA] = {"env-file-data", FIELDS(file_data_fields), .nfds = 1,
				 .fd_offsets = {AT(env_file.fd)}},
};

static const struct msg_type *msg_type_get(uint64_t type)
{
	if (type >= ARRAY_SIZE(msg_types) || !msg_types[type].name)
		return NULL;
	return &msg_types[type];
}

int proto_type_nfds(enum proto_type type)
{
	const struct msg_type *mt = msg_type_get((uint64_t)type);

	return mt ? (int)mt->nfds : -EINVAL;
}

const char *proto_type_to_string(enum proto_type type)
{
	const struct msg_type *mt = msg_type_get((uint64_t)type);

	return mt ? mt->name : NULL;
}

static const char *const region_class_names[_REGION_CLASS_MAX] = {
	[REGION_WEIGHTS] = "weights",
	[REGION_KV] = "kv",
	[REGION_NCCL] = "nccl",
	[REGION_OTHER] = "other",
};

static const char *const worker_role_names[_ROLE_MAX] = {
	[ROLE_PRIMARY] = "primary",
	[ROLE_SHADOW] = "shadow",
};

static const char *const ctl_cmd_names[_CTL_CMD_MAX] = {
	[CTL_STATUS] = "status", [CTL_WORKERS] = "workers", [CTL_REGIONS] = "regions",
	[CTL_CONFIG] = "config", [CTL_EVENTS] = "events",   [CTL_INJECT] = "inject",
	[CTL_HEALTH] = "health", [CTL_PROMOTE] = "promote",
};

static const char *const env_op_names[_ENV_OP_MAX] = {
	[ENV_OP_CREATE] = "create",   [ENV_OP_ADOPT] = "adopt", [ENV_OP_CHECKPOINT] = "checkpoint",
	[ENV_OP_RESTORE] = "restore", [ENV_OP_LIST] = "list",	[ENV_OP_DESTROY] = "destroy",
	[ENV_OP_WATCH] = "watch",     [ENV_OP_DIRTY] = "dirty", [ENV_OP_LOG] = "log",
	[ENV_OP_REBUILD] = "rebuild", [ENV_OP_FORK] = "fork",
};

static const char *const ctl_action_names[_CTL_ACT_MAX] = {
	[CTL_ACT_NONE] = "none",
	[CTL_ACT_KILL] = "kill",
	[CTL_ACT_HANG] = "hang",
	[CTL_ACT_RESUME] = "resume",
};

static const char *const metric_kind_names[_METRIC_KIND_MAX] = {
	[METRIC_COUNTER] = "counter",
	[METRIC_GAUGE] = "gauge",
	[METRIC_HISTOGRAM] = "histogram",
};

static const char *const worker_state_names[_WORKER_STATE_MAX] = {
	[WORKER_ALIVE] = "alive",
	[WORKER_DEAD] = "dead",
	[WORKER_UNCONFIRMED] = "unconfirmed",
};

static const char *const region_state_names[_REGION_STATE_MAX] = {
	[REGION_OWNED] = "owned",
	[REGION_RETAINED] = "retained",
	[REGION_PENDING] = "pending",
};

static const char *const event_kind_names[_EVENT_KIND_MAX] = {
	[EVENT_WORKER_HELLO] = "worker-hello",
	[EVENT_WORKER_EXIT] = "worker-exit",
	[EVENT_REGION_ANNOUNCE] = "region-announce",
	[EVENT_REGION_RELEASE] = "region-release",
	[EVENT_REGION_RETAINED] = "region-retained",
	[EVENT_REGION_EXPIRED] = "region-expired",
	[EVENT_REGION_FETCH] = "region-fetch",
	[EVENT_REFUSED] = "refused",
	[EVENT_HEALTH] = "health",
	[EVENT_INJECT] = "inject",
	[EVENT_RESTORED] = "restored",
	[EVENT_REGION_LOST] = "region-lost",
	[EVENT_SHADOW_PARKED] = "shadow-parked",
	[EVENT_RECOVERY] = "recovery",
	[EVENT_ENGINE] = "engine",
	[EVENT_NCCL] = "nccl",
	[EVENT_ENV] = "env",
};

static const char *const health_check_names[_HEALTH_CHECK_MAX] = {
	[HEALTH_OWNER] = "owner",
	[HEALTH_GPU] = "gpu",
	[HEALTH_CONTENT] = "content",
};

static const char *const health_verdict_names[_VERDICT_MAX] = {
	[VERDICT_OK] = "ok",
	[VERDICT_FAILED] = "failed",
	[VERDICT_UNKNOWN] = "unknown",
};

#define NAME_OF(names, v) ((unsigned)(v) < ARRAY_SIZE(names) ? (names)[v] : NULL)

const char *ctl_cmd_to_string(enum ctl_cmd cmd)
{
	return NAME_OF(ctl_cmd_names, cmd);
}

const char *ctl_action_to_string(enum ctl_action act)
{
	return NAME_OF(ctl_action_names, act);
}

static const char *const nccl_origin_names[_NCCL_ORIGIN_MAX] = {
	[NCCL_ORIGIN_INIT_RANK] = "init-rank", [NCCL_ORIGIN_INIT_RANK_CONFIG] = "init-rank-config",
	[NCCL_ORIGIN_INIT_ALL] = "init-all",   [NCCL_ORIGIN_SPLIT] = "split",
	[NCCL_ORIGIN_SHRINK] = "shrink",
};

static const char *const nccl_end_names[_NCCL_END_MAX] = {
	[NCCL_END_FINALIZE] = "finalize",
	[NCCL_END_DESTROY] = "destroy",
	[NCCL_END_ABORT] = "abort",
};

const char *nccl_origin_to_string(enum nccl_origin o)
{
	return NAME_OF(nccl_origin_names, o);
}

const char *nccl_end_to_string(enum nccl_end how)
{
	return NAME_OF(nccl_end_names, how);
}

static const char *const traj_event_names[_TRAJ_EVENT_MAX] = {
	[TRAJ_STEP_BEGIN] = "step-begin",
	[TRAJ_STEP_END] = "step-end",
};

static const char *const traj_action_names[_TRAJ_ACT_MAX] = {
	[TRAJ_ACT_NONE] = "none",
	[TRAJ_ACT_CHECKPOINT] = "checkpoint",
	[TRAJ_ACT_CHECKPOINT_SYNC] = "checkpoint-sync",
};

static const char *const traj_info_kind_names[_TRAJ_INFO_KIND_MAX] = {
	[TRAJ_INFO_TRAJECTORY] = "trajectory",
	[TRAJ_INFO_ENV] = "env",
};

const char *traj_info_kind_to_string(enum traj_info_kind k)
{
	return NAME_OF(traj_info_kind_names, k);
}

const char *traj_event_to_string(enum traj_event ev)
{
	return NAME_OF(traj_event_names, ev);
}

const char *traj_action_to_string(enum traj_action act)
{
	return NAME_OF(traj_action_names, act);
}

const char *metric_kind_to_string(enum metric_kind kind)
{
	return NAME_OF(metric_kind_names, kind);
}

const char *worker_state_to_string(enum worker_state state)
{
	return NAME_OF(worker_state_names, state);
}

const char *region_state_to_string(enum region_state state)
{
	return NAME_OF(region_state_names, state);
}

const char *event_kind_to_string(enum event_kind kind)
{
	return NAME_OF(event_kind_names, kind);
}

const char *health_check_to_string(enum health_check check)
{
	return NAME_OF(health_check_names, check);
}

const char *health_verdict_to_string(enum health_verdict verdict)
{
	return NAME_OF(health_verdict_names, verdict);
}

static int name_lookup(const char *const *names, size_t n, const char *s)
{
	if (!s)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (names[i] && strcmp(names[i], s) == 0)
			return (int)i;
	return -EINVAL;
}

const char *region_class_to_string(enum region_class cls)
{
	return (unsigned)cls < ARRAY_SIZE(region_class_names) ? region_class_names[cls] : NULL;
}

int region_class_from_string(const char *s, enum region_class *ret)
{
	int i = name_lookup(region_class_names, ARRAY_SIZE(region_class_names), s);

	if (i < 0)
		return i;
	*ret = (enum region_class)i;
	return 0;
}

const char *worker_role_to_string(enum worker_role role)
{
	return (unsigned)role < ARRAY_SIZE(worker_role_names) ? worker_role_names[role] : NULL;
}

int worker_role_from_string(const char *s, enum worker_role *ret)
{
	int i = name_lookup(worker_role_names, ARRAY_SIZE(worker_role_names), s);

	if (i < 0)
		return i;
	*ret = (enum worker_role)i;
	return 0;
}

int ctl_action_from_string(const char *s, enum ctl_action *ret)
{
	int i = name_lookup(ctl_action_names, ARRAY_SIZE(ctl_action_names), s);

	if (i < 0)
		return i;
	*ret = (enum ctl_action)i;
	return 0;
}

static const char *const image_op_names[_IMAGE_OP_MAX] = {
	[IMAGE_OP_LIST] = "list",
	[IMAGE_OP_IMPORT] = "import",
	[IMAGE_OP_RM] = "rm",
	[IMAGE_OP_GC] = "gc",
};

const char *image_op_to_string(enum image_op op)
{
	return NAME_OF(image_op_names, op);
}

int image_op_from_string(const char *s, enum image_op *ret)
{
	int i = name_lookup(image_op_names, ARRAY_SIZE(image_op_names), s);

	if (i < 0)
		return i;
	*ret = (enum image_op)i;
	return 0;
}

const char *env_op_to_string(enum env_op op)
{
	return NAME_OF(env_op_names, op);
}

int env_op_from_string(const char *s, enum env_op *ret)
{
	int i = name_lookup(env_op_names, ARRAY_SIZE(env_op_names), s);

	if (i < 0)
		return i;
	*ret = (enum env_op)i;
	return 0;
}

static const char *const env_net_names[] = {
	[ENV_NET_DEFAULT] = "default",
	[ENV_NET_NONE] = "none",
	[ENV_NET_SLIRP] = "slirp",
	[ENV_NET_HOST] = "host",
};

const char *env_net_to_string(enum env_net net)
{
	return NAME_OF(env_net_names, net);
}

int env_net_from_string(const char *s, enum env_net *ret)
{
	int i = name_lookup(env_net_names, ARRAY_SIZE(env_net_names), s);

	if (i < 0)
		return i;
	*ret = (enum env_net)i;
	return 0;
}

int traj_event_from_string(const char *s, enum traj_event *ret)
{
	int i = name_lookup(traj_event_names, ARRAY_SIZE(traj_event_names), s);

	if (i < 0)
		return i;
	*ret = (enum traj_event)i;
	return 0;
}

static void *field_at(const struct proto_msg *m, size_t offset)
{
	return (char *)(uintptr_t)m + offset;
}

/* ---- encoding ---------------------------------------------------------------------------- */

/* msgpack-c writes through a callback; this one fills the caller's buffer and never grows. */
struct fixed_buf {
	char *data;
	size_t cap, len;
};

static int fixed_buf_write(void *data, const char *buf, size_t len)
{
	struct fixed_buf *b = data;

	if (len > b->cap - b->len)
		return -1;
	if (len) /* msgpack writes an empty body with buf NULL */
		memcpy(b->data + b->len, buf, len);
	b->len += len;
	return 0;
}

/* count strings, each with its NUL, exactly len bytes, within the field's bounds. */
static bool strv_valid(const struct proto_blob *b, const struct field *f)
{
	const char *q = b->data;
	size_t off = 0;

	if (b->count < f->min || b->count > f->max || b->len > f->size || (b->len && !q))
		return false;
	for (uint32_t i = 0; i < b->count; i++) {
		const char *nul = off < b->len ? memchr(q + off, '\0', b->len - off) : NULL;

		if (!nul)
			return false;
		off = (size_t)(nul - q) + 1;
	}
	return off == b->len;
}

static int field_validate(const struct proto_msg *m, const struct field *f)
{
	const void *p = field_at(m, f->offset);

	switch (f->kind) {
	case FIELD_U32:
		return *(const uint32_t *)p >= f->min && *(const uint32_t *)p <= f->max ? 0
											: -EINVAL;
	case FIELD_I32:
		return *(const int32_t *)p >= f->min && *(const int32_t *)p <= f->max ? 0 : -EINVAL;
	case FIELD_ENUM:
		return *(const int *)p >= f->min && *(const int *)p <= f->max ? 0 : -EINVAL;
	case FIELD_STR:
		return strnlen(p, f->size) < f->size ? 0 : -EINVAL;
	case FIELD_UUID_LIST:
		return *(const uint32_t *)field_at(m, f->count_offset) <= f->size ? 0 : -EINVAL;
	case FIELD_BLOB: {
		const struct proto_blob *b = p;

		return b->len >= f->min && b->len <= f->size && (b->data || !b->len) ? 0 : -EINVAL;
	}
	case FIELD_STRV:
		return strv_valid(p, f) ? 0 : -EINVAL;
	case FIELD_U64:
	case FIELD_UUID:
		return 0;
	}
	return -EINVAL;
}

static int pack_key(msgpack_packer *pk, const char *key)
{
	size_t n = strlen(key);

	return msgpack_pack_str(pk, n) ?: msgpack_pack_str_body(pk, key, n);
}

static int pack_bin(msgpack_packer *pk, const void *p, size_t n)
{
	return msgpack_pack_bin(pk, n) ?: msgpack_pack_bin_body(pk, p, n);
}

static int field_pack(msgpack_packer *pk, const struct proto_msg *m, const struct field *f)
{
	const void *p = field_at(m, f->offset);
	uint32_t count;
	size_t n;
	int r;

	r = pack_key(pk, f->key);
	if (r != 0)
		return r;

	switch (f->kind) {
	case FIELD_U32:
		return msgpack_pack_uint32(pk, *(const uint32_t *)p);
	case FIELD_U64:
		return msgpack_pack_uint64(pk, *(const uint64_t *)p);
	case FIELD_I32:
		return msgpack_pack_int32(pk, *(const int32_t *)p);
	case FIELD_ENUM:
		return msgpack_pack_uint32(pk, (uint32_t) * (const int *)p);
	case FIELD_STR:
		n = strlen(p);
		return msgpack_pack_str(pk, n) ?: msgpack_pack_str_body(pk, p, n);
	case FIELD_UUID:
		return pack_bin(pk, p, PROTO_UUID_LEN);
	case FIELD_UUID_LIST:
		count = *(const uint32_t *)field_at(m, f->count_offset);
		r = msgpack_pack_array(pk, count);
		for (uint32_t i = 0; r == 0 && i < count; i++)
			r = pack_bin(pk, (const uint8_t *)p + (size_t)i * PROTO_UUID_LEN,
				     PROTO_UUID_LEN);
		return r;
	case FIELD_BLOB:
		return pack_bin(pk, ((const struct proto_blob *)p)->data,
				((const struct proto_blob *)p)->len);
	case FIELD_STRV: {
		const struct proto_blob *b = p;
		const char *q = b->data;

		r = msgpack_pack_array(pk, b->count);
		for (uint32_t i = 0; r == 0 && i < b->count; i++) {
			n = strlen(q);
			r = msgpack_pack_str(pk, n) ?: msgpack_pack_str_body(pk, q, n);
			q += n + 1;
		}
		return r;
	}
	}
	return -1;
}

int proto_encode(const struct proto_msg *m, void *buf, size_t cap, size_t *ret_len,
		 int ret_fds[PROTO_MAX_FDS], size_t *ret_nfds)
{
	struct fixed_buf out = {.data = buf, .cap = MIN(cap, (size_t)PROTO_MAX_MSG)};
	const struct msg_type *mt;
	msgpack_packer pk;
	int r;

	if (!m || !buf || !ret_len)
		return -EINVAL;
	mt = msg_type_get((uint64_t)m->type);
	if (!mt)
		return -EINVAL;
	for (size_t i = 0; i < mt->n_fields; i++) {
		r = field_validate(m, &mt->fields[i]);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; i < mt->nfds; i++)
		if (*(const int *)field_at(m, mt->fd_offsets[i]) < 0)
			return -EINVAL;
	if (mt->nfds > 0 && (!ret_fds || !ret_nfds))
		return -EINVAL;

	msgpack_packer_init(&pk, &out, fixed_buf_write);
	r = msgpack_pack_map(&pk, 2 + mt->n_fields) ?: pack_key(&pk, "v")
		?: msgpack_pack_uint32(&pk, PROTO_VERSION) ?: pack_key(&pk, "t")
		?: msgpack_pack_uint32(&pk, (uint32_t)m->type);
	for (size_t i = 0; r == 0 && i < mt->n_fields; i++)
		r = field_pack(&pk, m, &mt->fields[i]);
	if (r != 0)
		/* The only way packing fails is running out of room. */
		return cap > PROTO_MAX_MSG ? -EMSGSIZE : -ENOBUFS;

	for (size_t i = 0; i < mt->nfds; i++)
		ret_fds[i] = *(const int *)field_at(m, mt->fd_offsets[i]);
	if (ret_nfds)
		*ret_nfds = mt->nfds;
	*ret_len = out.len;
	return 0;
}

/* ---- decoding ---------------------------------------------------------------------------- */

/* msgpack-c allocates an array's or map's slots as soon as it reads the header, so the raw
 * bytes are walked first (common/mpbound.h): they must hold exactly one object whose headers
 * claim no more than the bytes could hold. */
static int msgpack_preflight(const uint8_t *p, size_t len)
{
	return mpbound_object_size(p, len, len) == (ssize_t)len ? 0 : -EBADMSG;
}

static bool key_is(const msgpack_object *k, const char *s)
{
	size_t n = strlen(s);

	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
	       memcmp(k->via.str.ptr, s, n) == 0;
}

/* The first value under key; decode_object() rejects maps where that is not the only one. */
static const msgpack_object *map_get(const msgpack_object_map *map, const char *key)
{
	for (uint32_t i = 0; i < map->size; i++)
		if (key_is(&map->ptr[i].key, key))
			return &map->ptr[i].val;
	return NULL;
}

static int get_uint(const msgpack_object *o, uint64_t max, uint64_t *ret)
{
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max)
		return -EBADMSG;
	*ret = o->via.u64;
	return 0;
}

static int get_int(const msgpack_object *o, int64_t min, int64_t max, int64_t *ret)
{
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		if (max < 0 || o->via.u64 > (uint64_t)max || (int64_t)o->via.u64 < min)
			return -EBADMSG;
		*ret = (int64_t)o->via.u64;
		return 0;
	}
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		if (o->via.i64 < min || o->via.i64 > max)
			return -EBADMSG;
		*ret = o->via.i64;
		return 0;
	}
	return -EBADMSG;
}

static int get_uuid(const msgpack_object *o, uint8_t *ret)
{
	if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != PROTO_UUID_LEN)
		return -EBADMSG;
	memcpy(ret, o->via.bin.ptr, PROTO_UUID_LEN);
	return 0;
}

static int blob_unpack(const msgpack_object *o, const struct field *f, struct proto_blob *b)
{
	if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size < f->min || o->via.bin.size > f->size)
		return -EBADMSG;
	b->data = malloc(o->via.bin.size ? o->via.bin.size : 1);
	if (!b->data)
		return -EBADMSG;
	if (o->via.bin.size) /* an empty bin may have no pointer */
		memcpy(b->data, o->via.bin.ptr, o->via.bin.size);
	b->len = o->via.bin.size;
	return 0;
}

/* Each string without a NUL inside (it would cut it), all of them within the field's bytes. */
static int strv_unpack(const msgpack_object *o, const struct field *f, struct proto_blob *b)
{
	size_t total = 0;
	char *q;

	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < f->min ||
	    o->via.array.size > f->max)
		return -EBADMSG;
	for (uint32_t i = 0; i < o->via.array.size; i++) {
		const msgpack_object *e = &o->via.array.ptr[i];

		if (e->type != MSGPACK_OBJECT_STR ||
		    memchr(e->via.str.ptr, '\0', e->via.str.size) ||
		    e->via.str.size >= f->size - total)
			return -EBADMSG;
		total += e->via.str.size + 1;
	}
	q = b->data = malloc(total ? total : 1);
	if (!q)
		return -EBADMSG;
	for (uint32_t i = 0; i < o->via.array.size; i++) {
		const msgpack_object *e = &o->via.array.ptr[i];

		memcpy(q, e->via.str.ptr, e->via.str.size);
		q[e->via.str.size] = '\0';
		q += e->via.str.size + 1;
	}
	b->len = (uint32_t)total;
	b->count = o->via.array.size;
	return 0;
}

static void blobs_free(const struct msg_type *mt, struct proto_msg *m)
{
	for (size_t i = 0; i < mt->n_fields; i++)
		if (mt->fields[i].kind == FIELD_BLOB || mt->fields[i].kind == FIELD_STRV) {
			struct proto_blob *b = field_at(m, mt->fields[i].offset);

			free(b->data);
			*b = (struct proto_blob){0};
		}
}

static int field_unpack(const msgpack_object *o, const struct field *f, struct proto_msg *m)
{
	void *p = field_at(m, f->offset);
	uint64_t u;
	int64_t i;
	int r;

	switch (f->kind) {
	case FIELD_U32:
		r = get_uint(o, (uint64_t)f->max, &u);
		if (r < 0 || (int64_t)u < f->min)
			return -EBADMSG;
		*(uint32_t *)p = (uint32_t)u;
		return 0;
	case FIELD_U64:
		r = get_uint(o, UINT64_MAX, &u);
		if (r < 0)
			return r;
		*(uint64_t *)p = u;
		return 0;
	case FIELD_I32:
		r = get_int(o, f->min, f->max, &i);
		if (r < 0)
			return r;
		*(int32_t *)p = (int32_t)i;
		return 0;
	case FIELD_ENUM:
		r = get_uint(o, (uint64_t)f->max, &u);
		if (r < 0)
			return r;
		*(int *)p = (int)u;
		return 0;
	case FIELD_STR:
		/* Too long is an error, never a silent cut; so is a NUL that would cut it. */
		if (!mpstr_ok(o, f->size - 1))
			return -EBADMSG;
		mpstr_copy(p, o);
		return 0;
	case FIELD_UUID:
		return get_uuid(o, p);
	case FIELD_UUID_LIST:
		if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > f->size)
			return -EBADMSG;
		for (uint32_t k = 0; k < o->via.array.size; k++) {
			r = get_uuid(&o->via.array.ptr[k],
				     (uint8_t *)p + (size_t)k * PROTO_UUID_LEN);
			if (r < 0)
				return r;
		}
		*(uint32_t *)field_at(m, f->count_offset) = o->via.array.size;
		return 0;
	case FIELD_BLOB:
		return blob_unpack(o, f, p);
	case FIELD_STRV:
		return strv_unpack(o, f, p);
	}
	return -EBADMSG;
}

static int decode_object(const msgpack_object *root, const int *fds, size_t nfds,
			 struct proto_msg *m)
{
	const msgpack_object_map *map;
	const msgpack_object *o;
	const struct msg_type *mt;
	uint64_t version, type;
	int r;

	if (root->type != MSGPACK_OBJECT_MAP)
		return -EBADMSG;
	map = &root->via.map;

	/* The version first: a peer speaking another version gets a precise answer. */
	o = map_get(map, "v");
	if (!o || get_uint(o, UINT64_MAX, &version) < 0)
		return -EBADMSG;
	if (version != PROTO_VERSION)
		return -EPROTONOSUPPORT;

	if (map->size > PROTO_MAX_KEYS)
		return -EBADMSG;
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object *k = &map->ptr[i].key;

		if (k->type != MSGPACK_OBJECT_STR)
			return -EBADMSG;
		for (uint32_t j = 0; j < i; j++) {
			const msgpack_object *prev = &map->ptr[j].key;

			if (mpstr_equal(prev, k))
				return -EBADMSG;
		}
	}

	o = map_get(map, "t");
	if (!o || get_uint(o, UINT64_MAX, &type) < 0)
		return -EBADMSG;
	mt = msg_type_get(type);
	if (!mt || nfds != mt->nfds)
		return -EBADMSG;
	for (size_t i = 0; i < nfds; i++)
		if (fds[i] < 0)
			return -EBADMSG;

	for (size_t i = 0; i < mt->n_fields; i++) {
		o = map_get(map, mt->fields[i].key);
		if (!o && mt->fields[i].optional)
			continue;
		/* A failure frees the blobs of the fields decoded so far. */
		r = o ? field_unpack(o, &mt->fields[i], m) : -EBADMSG;
		if (r < 0) {
			blobs_free(mt, m);
			return r;
		}
	}

	m->type = (enum proto_type)type;
	for (size_t i = 0; i < nfds; i++)
		*(int *)field_at(m, mt->fd_offsets[i]) = fds[i];
	return 0;
}

int proto_decode(const void *buf, size_t len, const int *fds, size_t nfds, struct proto_msg *ret)
{
	msgpack_unpacked u;
	size_t off = 0;
	int r;

	if (!ret)
		return -EINVAL;
	memset(ret, 0, sizeof(*ret));
	if (!buf || len == 0 || len > PROTO_MAX_MSG || (nfds > 0 && !fds) || nfds > PROTO_MAX_FDS)
		return -EBADMSG;

	r = msgpack_preflight(buf, len);
	if (r < 0)
		return r;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
		r = -EBADMSG;
	else
		r = decode_object(&u.data, fds, nfds, ret);
	msgpack_unpacked_destroy(&u);

	if (r < 0)
		/* Nothing half-filled escapes; type 0 also makes proto_msg_finish() a no-op. */
		memset(ret, 0, sizeof(*ret));
	return r;
}

static bool field_equal(const struct proto_msg *a, const struct proto_msg *b, const struct field *f)
{
	const void *p = field_at(a, f->offset), *q = field_at(b, f->offset);
	const struct proto_blob *x = p, *y = q;

	switch (f->kind) {
	case FIELD_U32:
		return *(const uint32_t *)p == *(const uint32_t *)q;
	case FIELD_U64:
		return *(const uint64_t *)p == *(const uint64_t *)q;
	case FIELD_I32:
		return *(const int32_t *)p == *(const int32_t *)q;
	case FIELD_ENUM:
		return *(const int *)p == *(const int *)q;
	case FIELD_STR:
		return strncmp(p, q, f->size) == 0;
	case FIELD_UUID:
		return memcmp(p, q, PROTO_UUID_LEN) == 0;
	case FIELD_UUID_LIST:
		return *(const uint32_t *)field_at(a, f->count_offset) ==
			       *(const uint32_t *)field_at(b, f->count_offset) &&
		       memcmp(p, q,
			      (size_t) * (const uint32_t *)field_at(a, f->count_offset) *
				      PROTO_UUID_LEN) == 0;
	case FIELD_BLOB:
	case FIELD_STRV:
		return x->len == y->len && x->count == y->count &&
		       (!x->len || memcmp(x->data, y->data, x->len) == 0);
	}
	return false;
}

bool proto_msg_equal(const struct proto_msg *a, const struct proto_msg *b, bool fds)
{
	const struct msg_type *mt;

	if (a->type != b->type)
		return false;
	mt = msg_type_get((uint64_t)a->type);
	if (!mt)
		return false;
	for (size_t i = 0; i < mt->n_fields; i++)
		if (!field_equal(a, b, &mt->fields[i]))
			return false;
	for (size_t i = 0; fds && i < mt->nfds; i++)
		if (*(const int *)field_at(a, mt->fd_offsets[i]) !=
		    *(const int *)field_at(b, mt->fd_offsets[i]))
			return false;
	return true;
}

void proto_msg_finish(struct proto_msg *m)
{
	const struct msg_type *mt;

	if (!m)
		return;
	mt = msg_type_get((uint64_t)m->type);
	if (!mt)
		return;
	for (size_t i = 0; i < mt->nfds; i++) {
		int *fd = field_at(m, mt->fd_offsets[i]);

		*fd = safe_close(*fd);
	}
	blobs_free(mt, m);
}

/* ---- transport --------------------------------------------------------------------------- */

int proto_send(int sock, const struct proto_msg *m, int flags)
{
	char buf[PROTO_MAX_MSG];
	int fds[PROTO_MAX_FDS];
	size_t len, nfds;
	ssize_t n;
	int r;

	r = proto_encode(m, buf, sizeof(buf), &len, fds, &nfds);
	if (r < 0)
		return r;
	n = fdpass_send(sock, buf, len, fds, nfds, flags);
	return n < 0 ? (int)n : 0;
}

int proto_recv(int sock, struct proto_msg *ret, int flags)
{
	char buf[PROTO_MAX_MSG];
	int fds[PROTO_MAX_FDS];
	size_t nfds = 0;
	ssize_t n;
	int r;

	if (!ret)
		return -EINVAL;
	memset(ret, 0, sizeof(*ret));

	n = fdpass_recv(sock, buf, sizeof(buf), fds, ARRAY_SIZE(fds), &nfds, flags);
	if (n < 0)
		return (int)n;
	if (n == 0)
		return -ECONNRESET;

	r = proto_decode(buf, (size_t)n, fds, nfds, ret);
	if (r < 0)
		for (size_t i = 0; i < nfds; i++)
			(void)safe_close(fds[i]);
	return r;
}

int proto_send_error(int sock, int code, enum proto_type in_reply_to, const char *fmt, ...)
{
	struct proto_msg m = {.type = PROTO_ERROR};
	va_list ap;

	if (code == 0 || code == INT32_MIN)
		return -EINVAL;
	m.error.code = code < 0 ? -code : code;
	m.error.in_reply_to = (uint32_t)in_reply_to;
	va_start(ap, fmt);
	(void)vsnprintf(m.error.message, sizeof(m.error.message), fmt, ap);
	va_end(ap);

	/* A reply must never stall the sender's event loop: one that does not fit now is dropped. */
	return proto_send(sock, &m, MSG_DONTWAIT);
}
