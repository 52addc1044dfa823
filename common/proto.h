/* SPDX-License-Identifier: MIT */
/*
 * The wire protocol between the shim, the supervisor and belayerctl (DESIGN §4).
 *
 * Every message is one SOCK_SEQPACKET packet holding one msgpack map:
 *   "v": protocol version (uint), "t": message type (uint), then the type's fields.
 * Fds travel beside the packet with SCM_RIGHTS; each type says how many it carries.
 *
 * Fields per type (key: msgpack type, range -> struct member):
 *   PROTO_HELLO (1), no fd:
 *     "pid": uint 1..UINT32_MAX -> pid      "eng": str -> engine_id
 *     "role": uint enum worker_role -> role  "rank": int -1..INT32_MAX -> rank
 *     "devs": array (<= PROTO_MAX_DEVICES) of bin[16] -> device_uuid[], n_devices
 *   PROTO_REGION_ANNOUNCE (2), 1 fd -> fd:
 *     "id": uint64 -> id    "dev": bin[16] -> device_uuid   "va": uint64 -> va
 *     "size": uint64 -> size  "cls": uint enum region_class -> cls
 *     "ord": uint64 -> order  "wver": uint64 -> weights_version
 *   PROTO_REGION_RELEASE (3), no fd:
 *     "id": uint64 -> id
 *   PROTO_ERROR (4), no fd:
 *     "code": int 1..INT32_MAX -> code  "re": uint32 -> in_reply_to  "msg": str -> message
 *   PROTO_REGION_FETCH (5), no fd:
 *     "pid": uint32 -> pid (the region's owner)  "id": uint64 -> id
 *   PROTO_REGION_FD (6), 1 fd -> region.fd:
 *     "pid": uint32 -> pid, then the fields of PROTO_REGION_ANNOUNCE -> region
 *   PROTO_CTL (7), no fd:
 *     "cmd": uint enum ctl_cmd -> cmd  "pid": uint32 -> pid (0: none)
 *     "act": uint enum ctl_action -> act  "dev": int -1..INT32_MAX -> dev
 *     "arg": uint64 -> arg  "eng": str -> engine_id (optional; CTL_PROMOTE's engine)
 *   PROTO_METRIC (8), no fd:
 *     "name": str -> name  "lbl": str -> labels  "kind": uint enum metric_kind -> kind
 *     "val": uint64 -> value  "help": str -> help
 *   PROTO_WORKER_INFO (9), no fd:
 *     "pid": uint32  "uid": uint32  "eng": str  "role": enum worker_role  "rank": int
 *     "devs": array of bin[16]  "state": uint enum worker_state  "nreg": uint32 -> n_regions
 *     "bytes": uint64  "ms": uint64 -> age_ms (since hello, or since death when dead)
 *     optional: "lay": uint64 -> layout_hash  "nlay": uint32 -> layout_n
 *     "park": uint32 0..1 -> parked  "port": uint32 0..65535  "rdy": uint32 0..1 -> ready
 *   PROTO_REGION_INFO (10), no fd:
 *     "pid": uint32  "eng": str  "id" "dev" "va" "size" "cls" "ord" "wver" as in ANNOUNCE
 *     "state": uint enum region_state  "ms": uint64 -> age_ms  "sum": uint64 -> checksum
 *     "sumv": uint64 -> checksum_version (the weights version + 1 it was taken at; 0: none)
 *   PROTO_CONFIG_ENTRY (11), no fd:
 *     "key": str -> key  "val": str -> value
 *   PROTO_EVENT (12), no fd:
 *     "ts": uint64 -> ts_us (CLOCK_REALTIME)  "kind": uint enum event_kind -> kind
 *     "pid": uint32  "id": uint64  "msg": str -> message
 *   PROTO_HEALTH_INFO (13), no fd:
 *     "check": uint enum health_check  "verdict": uint enum health_verdict
 *     "dev": int -1..INT32_MAX -> dev  "pid": uint32  "msg": str -> message
 *   PROTO_END (14), no fd:
 *     "re": uint32 -> in_reply_to (the request's type)  "n": uint32 -> count (items sent)
 * Shadow promotion (types 20-29; DESIGN §1.2):
 *   PROTO_SHADOW_REGION (20), shadow -> supervisor, no fd: one scratch-backed weights/kv region
 *     "id": uint64  "va": uint64  "size": uint64  "cls": uint enum region_class
 *     "ord": uint64 -> order  "dev": bin[16] -> device_uuid
 *     Sent as the region appears (and again, all of them, after a reconnect); a region that
 *     goes later is withdrawn with a PROTO_REGION_RELEASE of its id (ids are shared with
 *     the process's announced regions). The shadow's nccl/other regions are announced as usual.
 *   PROTO_SHADOW_PARKED (21), shadow -> supervisor, no fd: initialization looks done
 *     "n": uint32 -> n_entries (layout entries)  "hash": uint64 -> hash (common/layout.h)
 *   PROTO_PROMOTE_MAP (22), supervisor -> shadow, 1 fd -> fd (the primary region's memory):
 *     "sid": uint64 -> shadow_id  "pid": uint32 -> primary_pid  "pidr": uint64 -> primary_id
 *     "size": uint64  "wver": uint64 -> weights_version
 *     May come early (before any failure); a later MAP for the same "sid" replaces it. A MAP
 *     that cannot be used (not a shadow, unknown region, size differs, import failed) is
 *     answered with PROTO_ERROR (in_reply_to 22); a later COMMIT then fails for that region.
 *   PROTO_PROMOTE_COMMIT (23), supervisor -> shadow, no fd:
 *     "n": uint32 -> n_regions (regions that must be mapped)  "hash": uint64 (expected layout)
 *     "wver": uint64 -> weights_version (now held by the memory)
 *   PROTO_PROMOTE_DONE (24), shadow -> supervisor, no fd:
 *     "code": int 0..INT32_MAX (0: ok, else errno)  "n": uint32 -> n_regions (mapped)
 *     "ns": uint64 (remap time)  "msg": str -> message
 *   PROTO_MEM_INFO (25), shim -> supervisor, no fd: the answer the engine got from one
 *     cuMemGetInfo (review finding 6: a shadow is given its primary's answers, in order)
 *     "dev": uint32 0..PROTO_MAX_DEVICES-1 -> device (the CUDA ordinal of the call's context)
 *     "uuid": bin[16] -> device_uuid (cuDeviceGetUuid of that device: what the answers are
 *       keyed by, with the worker's rank, since CUDA_VISIBLE_DEVICES renumbers ordinals per
 *       process; zero when the driver does not say)
 *     "seq": uint32 0..PROTO_MAX_MEM_INFO-1 (the call's number on that device, from 0)
 *     "free", "total": uint64 (bytes)
 *     Sent as the engine calls (and again, all of them, after a reconnect); only the first
 *     PROTO_MAX_MEM_INFO calls of a device are recorded.
 *   After a PROMOTE_DONE with code 0 the shim is a primary: on the same connection it sends
 *   a fresh PROTO_HELLO with role primary, then one PROTO_REGION_ANNOUNCE (with fd) per
 *   promoted region (cls, ord, va as in its SHADOW_REGION, "wver" from the COMMIT), and from
 *   then on behaves as any primary. A failed COMMIT leaves it a parked shadow on scratch.
 * Agent environments (types 30-39; DESIGN §2, issue 10), no fds:
 *   PROTO_ENV_REQUEST (30), peer -> supervisor: "op": uint enum env_op, "env": str (an id:
 *     [A-Za-z0-9_.-], 1..63 bytes, not starting with '.'; "" for list/watch), optional:
 *     "root": str (create: the base dir; adopt: the root; watch: the cgroup path), "cmd": str,
 *     "cg": str (adopt: the cgroup), "pid": uint32 (adopt: the init), "turn", "plen", "phash":
 *     uint64 (checkpoint: the trajectory's turn, token-prefix length and hash), "ckpt": str
 *     (restore: the checkpoint, "" the latest), "traj": str, "fl": uint32 (ENV_FLAG_*),
 *     "pids", "mem", "cpu": uint64 (create: the limits, tasks, bytes, thousandths of a
 *     CPU; 0 or absent: the configured default; ENV_LIMIT_NONE: no limit), "net": uint
 *     enum env_net (create: its network; 0 or absent: [env] net), "dst": str (fork: the new
 *     environment's id; with "n" > 1 the forks are DST-1 .. DST-N), "n": uint32 1..64 (fork:
 *     how many; 0 or absent: 1), "disk": uint64 (create: bytes of the writable layer; 0 or
 *     absent: [env] disk_max; ENV_LIMIT_NONE: no limit). A fork is answered with one
 *     PROTO_ENV_INFO per fork.
 *     "img": str (create: a container image instead of root: a stored image's name or id,
 *     or oci:DIR[:TAG] / docker-archive:FILE[:REF], imported when not stored).
 *     Replies: PROTO_ENV_INFO or PROTO_ENV_ITEM messages closed by PROTO_END, or PROTO_ERROR.
 *   PROTO_ENV_INFO (31), supervisor -> peer: an environment (list, create, adopt) or a
 *     checkpoint's manifest (checkpoint, restore, list of checkpoints): "env", "ckpt",
 *     "par" (parent), "traj": str; "turn", "plen", "phash": uint64; "pid", "nproc": uint32;
 *     "fsb", "fsn", "criub", "frz", "dump", "fs", "tot": uint64 (bytes, files, µs);
 *     "root", "cg": str; "full": uint32 0..1; optional "net": uint enum env_net (an
 *     environment's network; 0 for a checkpoint's manifest); optional "commit": uint64
 *     (µs, a checkpoint's commit phase), "path": str (its FS delta's: "walk", "dirty-set"),
 *     "kind": str (a checkpoint's: "full", "fs-only", "skipped"), "mem": str (an
 *     environment's memory checkpoint mode: "full", "pre-dump"), "sdirty": uint32 0..1.
 *     "why": str (why it walked: the manifest's reason); "pcr", "pcb", "pcfb": uint64 (a
 *     pre-copied checkpoint's rounds before the freeze, bytes they copied, bytes copied again
 *     frozen; 0: not pre-copied).
 *   PROTO_ENV_ITEM (32), supervisor -> peer: one dirty path or side-effect log record:
 *     "kind": str, "pid": uint32, "ts": uint64 (ns), "path", "p2", "txt": str.
 *   PROTO_ENV_EXEC (33), peer -> supervisor, 1 fd (stdin: a regular file, read from offset
 *     0, at most 16 MiB; an empty one for none): "env": str, "argv": array of 1..256 str
 *     (PROTO_EXEC_ARGV_MAX bytes with a NUL each), "envv": array of 0..256 "K=V" str (likewise),
 *     "cwd": str (< PROTO_PATH_MAX), "user": str (< 64), "tmo": uint32 (ms), "max": uint32
 *     (bytes kept per stream), "fl": uint32 (EXEC_FLAG_*). Replies: EXEC_OUT chunks (as they
 *     come with EXEC_FLAG_STREAM, else after the command ended), then EXEC_DONE; or ERROR.
 *   PROTO_ENV_EXEC_OUT (34), supervisor -> peer: "fd": uint32 1..2, "data": bin (1 ..
 *     PROTO_EXEC_CHUNK_MAX bytes).
 *   PROTO_ENV_EXEC_DONE (35): "code": int -1..255, "sig": uint32 0..64, "tmo": uint32 0..1,
 *     "trunc": uint32 0..3, "us", "nout", "nerr": uint64, "pid": uint32.
 *   PROTO_ENV_FILE_READ (36), peer -> supervisor, no fd: "env", "path": str, "max": uint64.
 *     Replies FILE_DATA or ERROR.
 *   PROTO_ENV_FILE_WRITE (37), peer -> supervisor, 1 fd (the content: a regular file, from
 *     offset 0): "env", "path": str, "mode": uint32 0..07777, "user": str. Replies END
 *     (in_reply_to 37, "n": the bytes written) or ERROR.
 *   PROTO_ENV_FILE_DATA (38), supervisor -> peer, 1 fd (a sealed memfd): "env", "path": str,
 *     "mode": uint32, "size": uint64, "uid", "gid": uint32.
 * Container images (types 40-49; issue 20), no fds:
 *   PROTO_IMAGE_REQUEST (40), belayerctl -> supervisor: "op": uint enum image_op, optional
 *     "ref": str (import: the reference; rm: a name or id), "name": str (import: the name).
 *     Replies: PROTO_IMAGE_INFO messages closed by PROTO_END (gc: END, count = the layers
 *     removed), or PROTO_ERROR.
 *   PROTO_IMAGE_INFO (41), supervisor -> belayerctl: "id", "name": str, "n": uint32
 *     (layers), "unp", "cached", "ent", "bytes", "us": uint64 (an import's figures).
 * NCCL communicators (types 50-59; DESIGN §1.4, issue 12):
 *   PROTO_NCCL_COMM (50), shim -> supervisor, 1 fd -> fd (a memfd holding the communicator's
 *     progress counters, struct nccl_counters of common/nccl-counters.h, read-only to the
 *     supervisor): "id": uint64 (the communicator's id within the process, 1..)
 *     "hash": uint64 (hash of its unique id; a split/shrink: derived from the parent's)
 *     "rank": int 0..INT32_MAX  "n": uint32 1..UINT32_MAX -> nranks
 *     "cdev": int -1..INT32_MAX -> cuda_dev  "dev": bin[16] -> device_uuid
 *     "par": uint64 -> parent_id (0: none)  "how": uint enum nccl_origin -> origin
 *     Sent as the communicator is created (and again after a reconnect); an announce of an id
 *     the supervisor holds replaces it.
 *   PROTO_NCCL_COMM_END (51), shim -> supervisor, no fd: "id": uint64, "how": uint enum
 *     nccl_end -> how (finalize keeps the record; destroy and abort end it).
 * Trajectory events (types 60-69; DESIGN §2, issue 11), no fds:
 *   PROTO_TRAJ_STEP (60), RL framework -> supervisor: a trajectory's environment step began
 *     (the action arrived) or ended (the observation went back; an inference bubble starts):
 *     "ev": uint enum traj_event  "traj": str (1..255 bytes)  "env": str (an environment id)
 *     optional: "turn": uint64  "plen": uint64 (the pending request's prompt tokens)
 *     "gen": uint64 (tokens generated so far)  "mtps": uint64 (decode rate, tokens/s x 1000)
 *     "out": uint64 (step-begin: output tokens of the generation that produced the action)
 *     "pfx", "phash": uint64 (step-end: the trajectory's context so far, its length in tokens
 *     and hash as the Python SDK's PrefixTracker computes them; a checkpoint the policy takes
 *     in the bubble records them, so that a restore to it says how to truncate the context)
 *     Answered with PROTO_TRAJ_DECISION, or PROTO_ERROR.
 *   PROTO_TRAJ_DECISION (61), supervisor -> framework: what the checkpoint policy did:
 *     "ev": uint enum traj_event (the event answered)  "traj", "env": str
 *     "act": uint enum traj_action  "why": str (the policy's reason)
 *     "bub": uint64 (predicted bubble, µs; 0: unknown)  "berr": uint32 (its error, per mille)
 *     "cost": uint64 (predicted checkpoint cost, µs)  "cerr": uint32 (per mille)
 *     "held": uint64 (step-begin: µs the reply waited for a running checkpoint)
 *     optional, meaningful on step-begin answers (0 / "" otherwise): "ckpt": str (the id of
 *     the policy's checkpoint of the bubble that just ended, when it completed by the reply;
 *     "" none)  "ckus": uint64 (µs that checkpoint ran, to its thaw or its end, completed or
 *     aborted; 0: none ran)  "abrt": uint32 0..1 -> aborted (1: aborted at the delay bound)
 *   PROTO_TRAJ_LIST (62), belayerctl -> supervisor: what the policy knows of trajectories:
 *     "traj": str (only that trajectory and its environment; "" every one). Answered with
 *     PROTO_TRAJ_INFO items closed by PROTO_END (in_reply_to 62), open to every peer.
 *   PROTO_TRAJ_INFO (63), supervisor -> belayerctl: one trajectory or one environment:
 *     "kind": uint enum traj_info_kind  "traj": str ("" for an environment)  "env": str
 *     trajectories: "turns": uint32 -> unprotected_turns  "unp": uint64 -> unprotected_us
 *     (since the last checkpoint, or since tracking began)  "bub": uint64 -> bubble_us (the
 *     prediction made at the last step end; 0: none)  "berr": uint32 -> bubble_err_pm
 *     "nlen": uint32 -> n_lengths (output lengths the predictor remembers)
 *     "mtps": uint64 -> decode_mtps (the gateway's for the trajectory's requests, else the
 *     rate learnt from its bubbles; tokens/s x 1000)  "gw": uint32 0..1 -> pending (the
 *     gateway has a request of it in flight)  "plen", "gen": uint64 (that request's prompt
 *     and generated tokens)  "out": uint64 -> last_output_tokens (its last completed one's)
 *     "ndone", "nabrt": uint32 -> ckpt_done, ckpt_aborted (the policy's checkpoints)
 *     environments: "cost": uint64 -> cost_us (the predicted fixed cost of a checkpoint)
 *     "fsbps", "dmbps": uint64 -> fs_bps, dump_bps (learnt copy rates, bytes/s)
 *     "cerr": uint32 -> cost_err_pm  "ncost": uint32 -> cost_n (checkpoints observed)
 *     Fields of the other kind are 0.
 * Strings are msgpack str of at most PROTO_MAX_STR bytes without NUL (METRIC "name" and "lbl":
 * 95, CONFIG_ENTRY "key": 63); the encoder writes the
 * keys in the order above, integers in their shortest form.
 *
 * Decoders are bounded: at most PROTO_MAX_MSG bytes, at most PROTO_MAX_KEYS keys, strings at
 * most PROTO_MAX_STR bytes, arrays at most PROTO_MAX_DEVICES entries, every field type- and
 * range-checked, every required field present, no key twice, nothing after the map, the fd
 * count exact. Anything else is -EBADMSG (-EPROTONOSUPPORT for a version we do not speak);
 * the decoder never crashes and never leaks. Fields marked optional may be absent (zero then);
 * the encoder always writes them. Unknown keys (of any value type) are ignored so
 * a newer peer of the same version can add optional fields.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROTO_VERSION	  1
#define PROTO_MAX_MSG	  65536
#define PROTO_MAX_STR	  255
#define PROTO_MAX_DEVICES 16
#define PROTO_MAX_FDS	  1
#define PROTO_UUID_LEN	  16
#define PROTO_MAX_KEYS	  32

/* cuMemGetInfo answers recorded per device (PROTO_MEM_INFO) */
#define PROTO_MAX_MEM_INFO 64

enum proto_type {
	PROTO_HELLO = 1,	   /* shim -> supervisor: who is speaking */
	PROTO_REGION_ANNOUNCE = 2, /* shim -> supervisor: one tracked region, with its fd */
	PROTO_REGION_RELEASE = 3,  /* shim -> supervisor: the region was freed */
	PROTO_ERROR = 4,	   /* either way: a request was refused, and why */
	PROTO_REGION_FETCH = 5,	   /* peer -> supervisor: send me a retained region's fd */
	PROTO_REGION_FD = 6,	   /* supervisor -> peer: a region's record, with its fd */
	PROTO_CTL = 7,		   /* belayerctl -> supervisor: a control request */
	PROTO_METRIC = 8,	   /* supervisor -> belayerctl: one counter or gauge */
	PROTO_WORKER_INFO = 9,	   /* supervisor -> belayerctl: one worker */
	PROTO_REGION_INFO = 10,	   /* supervisor -> belayerctl: one region */
	PROTO_CONFIG_ENTRY = 11,   /* supervisor -> belayerctl: one effective setting */
	PROTO_EVENT = 12,	   /* supervisor -> belayerctl: one event of the stream */
	PROTO_HEALTH_INFO = 13,	   /* supervisor -> belayerctl: one health-check verdict */
	PROTO_END = 14,		   /* supervisor -> peer: a multi-message reply is complete */
	/* 15-19 unassigned: the decoder refuses them. */
	PROTO_SHADOW_REGION = 20,  /* shadow -> supervisor: a scratch-backed region */
	PROTO_SHADOW_PARKED = 21,  /* shadow -> supervisor: parked, with its layout hash */
	PROTO_PROMOTE_MAP = 22,	   /* supervisor -> shadow: a primary region's fd for a region */
	PROTO_PROMOTE_COMMIT = 23, /* supervisor -> shadow: remap everything now */
	PROTO_PROMOTE_DONE = 24,   /* shadow -> supervisor: the commit's outcome */
	PROTO_MEM_INFO = 25,	   /* shim -> supervisor: a cuMemGetInfo answer its engine got */
	/* 25-29: shadow promotion's; 30-39: agent environments. */
	PROTO_ENV_REQUEST = 30, /* peer -> supervisor: an environment operation */
	PROTO_ENV_INFO = 31,	/* supervisor -> peer: an environment or a checkpoint */
	PROTO_ENV_ITEM = 32,	/* supervisor -> peer: a dirty path or side-effect record */

	PROTO_ENV_EXEC = 33,	   /* peer -> supervisor: run a command in an environment */
	PROTO_ENV_EXEC_OUT = 34,   /* supervisor -> peer: a chunk of its stdout or stderr */
	PROTO_ENV_EXEC_DONE = 35,  /* supervisor -> peer: how it ended */
	PROTO_ENV_FILE_READ = 36,  /* peer -> supervisor: read a file of an environment */
	PROTO_ENV_FILE_WRITE = 37, /* peer -> supervisor: write one (its content in the fd) */
	PROTO_ENV_FILE_DATA = 38,  /* supervisor -> peer: a file read (its content in the fd) */
	/* 40-49: container images (issue 20). */
	PROTO_IMAGE_REQUEST = 40, /* belayerctl -> supervisor: list, import, rm, gc images */
	PROTO_IMAGE_INFO = 41,	  /* supervisor -> belayerctl: one stored image */
	/* 50-59: NCCL communicators. */
	PROTO_NCCL_COMM = 50,	  /* shim -> supervisor: a communicator, with its counters' memfd */
	PROTO_NCCL_COMM_END = 51, /* shim -> supervisor: a communicator finalized or ended */
	/* 60-69: trajectory events (the adaptive checkpoint policy). */
	PROTO_TRAJ_STEP = 60,	  /* framework -> supervisor: an environment step began or ended */
	PROTO_TRAJ_DECISION = 61, /* supervisor -> framework: the checkpoint policy's answer */
	PROTO_TRAJ_LIST = 62,	  /* belayerctl -> supervisor: list trajectories, environments */
	PROTO_TRAJ_INFO = 63,	  /* supervisor -> belayerctl: one of them */
	_PROTO_TYPE_MAX,
};

/* What a PROTO_CTL asks for. Replies: a run of *_INFO/METRIC/CONFIG_ENTRY messages closed by
 * PROTO_END, or PROTO_ERROR. CTL_EVENTS replies with PROTO_END once subscribed, then streams
 * PROTO_EVENT until the peer disconnects. */
enum ctl_cmd {
	CTL_STATUS = 0,	 /* metrics */
	CTL_WORKERS = 1, /* workers */
	CTL_REGIONS = 2, /* regions (pid: only that owner's; 0: all) */
	CTL_CONFIG = 3,	 /* effective configuration */
	CTL_EVENTS = 4,	 /* subscribe to the event stream (arg: replay that many recent events) */
	CTL_INJECT = 5,	 /* act on worker pid */
	CTL_HEALTH = 6,	 /* run health checks: GPU (dev, -1: all), owner + content (pid) */
	CTL_PROMOTE = 7, /* fail engine "eng" over to its shadow group now (manual promotion) */
	_CTL_CMD_MAX,
};

/* What a PROTO_ENV_REQUEST asks for. */
enum env_op {
	ENV_OP_CREATE = 0,     /* env, root (base), cmd: start an environment */
	ENV_OP_ADOPT = 1,      /* env, root, cg, pid: register another runtime's environment */
	ENV_OP_CHECKPOINT = 2, /* env, turn, plen, phash, traj: full checkpoint */
	ENV_OP_RESTORE = 3,    /* env, ckpt: full restore; replies the checkpoint's manifest */
	ENV_OP_LIST = 4,       /* env "": every environment; else its checkpoints */
	ENV_OP_DESTROY = 5,    /* env: kill, unmount, forget (checkpoints stay on disk) */
	ENV_OP_WATCH = 6,      /* root: a cgroup path to trace (env: its name, "" for one) */
	ENV_OP_DIRTY = 7,      /* env: the paths changed since its last checkpoint */
	ENV_OP_LOG = 8,	       /* env: its side-effect log (fl ENV_FLAG_FOLLOW: then stream) */
	ENV_OP_REBUILD = 9,    /* env: rebuild from the base, run cmd again (replay baseline) */
	ENV_OP_FORK = 10,      /* env, ckpt, dst, n: n new environments from a checkpoint */
	_ENV_OP_MAX,
};

/* What a PROTO_IMAGE_REQUEST asks for. */
enum image_op {
	IMAGE_OP_LIST = 0,   /* every stored image */
	IMAGE_OP_IMPORT = 1, /* ref (oci:DIR[:TAG], docker-archive:FILE[:REF]), name (optional) */
	IMAGE_OP_RM = 2,     /* ref: a name or id; refused (EBUSY) while an environment uses it */
	IMAGE_OP_GC = 3,     /* remove layers no image lists; replies END with their count */
	_IMAGE_OP_MAX,
};

#define ENV_FLAG_FOLLOW 1u
/* checkpoint: a new checkpoint even when nothing changed (issue 23 item 3: otherwise an
 * environment with no dirty path and no process activity is not checkpointed, and the reply
 * is its head's manifest with kind "skipped") */
#define ENV_FLAG_NEW_CKPT 2u
/* A create's "pids"/"mem"/"cpu"/"disk" that asks for no limit (0 asks for the configured one). */
#define ENV_LIMIT_NONE UINT64_MAX

/* The most forks one request makes. */
#define ENV_FORK_MAX 64

/* A create's "net": an environment's network (issue 19). 0 asks for [env] net. */
enum env_net {
	ENV_NET_DEFAULT = 0,
	ENV_NET_NONE = 1,  /* its own network namespace, loopback only */
	ENV_NET_SLIRP = 2, /* its own, with user-mode egress through slirp4netns */
	ENV_NET_HOST = 3,  /* the host's (only with [env] allow_host_net) */
	_ENV_NET_MAX,
};

/* Bounds of exec and file requests (README "env exec", "env read", "env write"). */
#define PROTO_EXEC_ARGV_MAX  8192  /* "argv": its strings and their NULs */
#define PROTO_EXEC_ENVV_MAX  8192  /* "envv": likewise */
#define PROTO_EXEC_CHUNK_MAX 16384 /* "data" of an EXEC_OUT */
#define PROTO_PATH_MAX	     1024  /* "path" of file requests, "cwd" of exec */
#define EXEC_FLAG_STREAM     1u	   /* send EXEC_OUT chunks as the output comes */

/* How a PROTO_NCCL_COMM communicator was made. */
enum nccl_origin {
	NCCL_ORIGIN_INIT_RANK = 0,
	NCCL_ORIGIN_INIT_RANK_CONFIG = 1,
	NCCL_ORIGIN_INIT_ALL = 2,
	NCCL_ORIGIN_SPLIT = 3,
	NCCL_ORIGIN_SHRINK = 4,
	_NCCL_ORIGIN_MAX,
};

/* How a PROTO_NCCL_COMM_END communicator ended. */
enum nccl_end {
	NCCL_END_FINALIZE = 0,
	NCCL_END_DESTROY = 1,
	NCCL_END_ABORT = 2,
	_NCCL_END_MAX,
};

/* Which edge of an environment step a PROTO_TRAJ_STEP reports. */
enum traj_event {
	TRAJ_STEP_BEGIN = 0, /* the action arrived: the bubble is over */
	TRAJ_STEP_END = 1,   /* the observation went back: a bubble starts */
	_TRAJ_EVENT_MAX,
};

/* What the checkpoint policy did at a PROTO_TRAJ_STEP. */
enum traj_action {
	TRAJ_ACT_NONE = 0,	      /* no checkpoint */
	TRAJ_ACT_CHECKPOINT = 1,      /* a checkpoint in the bubble */
	TRAJ_ACT_CHECKPOINT_SYNC = 2, /* a checkpoint the next action waits for */
	_TRAJ_ACT_MAX,
};

/* What a PROTO_TRAJ_INFO describes. */
enum traj_info_kind {
	TRAJ_INFO_TRAJECTORY = 0,
	TRAJ_INFO_ENV = 1,
	_TRAJ_INFO_KIND_MAX,
};

enum ctl_action {
	CTL_ACT_NONE = 0,
	CTL_ACT_KILL = 1,   /* SIGKILL */
	CTL_ACT_HANG = 2,   /* SIGSTOP */
	CTL_ACT_RESUME = 3, /* SIGCONT */
	_CTL_ACT_MAX,
};

enum metric_kind {
	METRIC_COUNTER = 0,
	METRIC_GAUGE = 1,
	/* one series of a histogram: NAME_bucket (an "le" label, cumulative), NAME_sum, NAME_count */
	METRIC_HISTOGRAM = 2,
	_METRIC_KIND_MAX,
};

enum worker_state {
	WORKER_ALIVE = 0,
	WORKER_DEAD = 1,
	WORKER_UNCONFIRMED = 2, /* known from the journal, alive, not yet said hello again */
	_WORKER_STATE_MAX,
};

enum region_state {
	REGION_OWNED = 0,    /* owner alive; the supervisor holds a copy of the fd */
	REGION_RETAINED = 1, /* owner dead; the supervisor's fd keeps the memory */
	REGION_PENDING = 2,  /* known from the journal, no fd yet: waits for the re-announce */
	_REGION_STATE_MAX,
};

enum event_kind {
	EVENT_WORKER_HELLO = 0,
	EVENT_WORKER_EXIT = 1,
	EVENT_REGION_ANNOUNCE = 2,
	EVENT_REGION_RELEASE = 3,
	EVENT_REGION_RETAINED = 4,
	EVENT_REGION_EXPIRED = 5,
	EVENT_REGION_FETCH = 6,
	EVENT_REFUSED = 7,
	EVENT_HEALTH = 8,
	EVENT_INJECT = 9,
	EVENT_RESTORED = 10,
	EVENT_REGION_LOST = 11,
	EVENT_SHADOW_PARKED = 12, /* id: the layout hash */
	EVENT_RECOVERY = 13,	  /* a recovery's steps, outcome and phase durations */
	EVENT_ENGINE = 14,	  /* a configured engine's process group started, ready or exited */
	EVENT_NCCL = 15, /* a communicator hang (diagnosis) or a rank lost mid-collective */
	EVENT_ENV = 16,	 /* an environment's checkpoint or restore failed, and why */
	_EVENT_KIND_MAX,
};

enum health_check {
	HEALTH_OWNER = 0,
	HEALTH_GPU = 1,
	HEALTH_CONTENT = 2,
	_HEALTH_CHECK_MAX,
};

enum health_verdict {
	VERDICT_OK = 0,
	VERDICT_FAILED = 1,
	VERDICT_UNKNOWN = 2,
	_VERDICT_MAX,
};

enum region_class {
	REGION_WEIGHTS = 0,
	REGION_KV = 1,
	REGION_NCCL = 2,
	REGION_OTHER = 3,
	_REGION_CLASS_MAX,
};

enum worker_role {
	ROLE_PRIMARY = 0,
	ROLE_SHADOW = 1,
	_ROLE_MAX,
};

struct proto_hello {
	uint32_t pid;
	char engine_id[PROTO_MAX_STR + 1];
	enum worker_role role;
	int32_t rank; /* -1 while unknown */
	uint32_t n_devices;
	uint8_t device_uuid[PROTO_MAX_DEVICES][PROTO_UUID_LEN];
};

struct proto_region {
	uint64_t id; /* unique within the announcing process */
	uint8_t device_uuid[PROTO_UUID_LEN];
	uint64_t va;
	uint64_t size;
	enum region_class cls;
	uint64_t order; /* creation order within the process */
	uint64_t weights_version;
	int fd; /* the exported POSIX fd; owned by the message after decode */
};

struct proto_region_release {
	uint64_t id;
};

struct proto_error {
	int32_t code;	      /* a positive errno value */
	uint32_t in_reply_to; /* the refused message's type, 0 if none */
	char message[PROTO_MAX_STR + 1];
};

struct proto_region_fetch {
	uint32_t pid;
	uint64_t id;
};

struct proto_region_fd {
	uint32_t pid;
	struct proto_region region;
};

struct proto_ctl {
	enum ctl_cmd cmd;
	uint32_t pid;
	enum ctl_action act;
	int32_t dev;
	uint64_t arg;
	char engine_id[PROTO_MAX_STR + 1]; /* optional "eng" ("" when absent) */
};

struct proto_metric {
	char name[96];
	char labels[96];
	enum metric_kind kind;
	uint64_t value;
	/* value counts 1/scale of the metric's unit (1000000: a _seconds metric kept in
	 * microseconds); 0 or 1: whole units. Prometheus names use base units (seconds), which
	 * the exposition writes as value / scale. */
	uint32_t scale;
	char help[PROTO_MAX_STR + 1];
};

struct proto_worker_info {
	uint32_t pid;
	uint32_t uid;
	char engine_id[PROTO_MAX_STR + 1];
	enum worker_role role;
	int32_t rank;
	uint32_t n_devices;
	uint8_t device_uuid[PROTO_MAX_DEVICES][PROTO_UUID_LEN];
	enum worker_state state;
	uint32_t n_regions;
	uint64_t bytes;
	uint64_t age_ms;
	/* Optional (absent: 0): shadow promotion's view of the worker. */
	uint64_t layout_hash; /* "lay": a shadow's parked layout, a primary's computed one */
	uint32_t layout_n;    /* "nlay": entries of that layout */
	uint32_t parked;      /* "park": 1 when a shadow has parked */
	uint32_t port;	      /* "port": the HTTP port of its engine group (configured engines) */
	uint32_t ready;	      /* "rdy": 1 when that group serves (its probe answered) */
	/* Optional (absent: 0): what it holds, last measured (supervisor-footprint.h). */
	uint64_t device_used;	 /* "dmem": device bytes NVML reports for it + 1; 0: unknown */
	uint64_t rss;		 /* "rss": host resident bytes */
	uint64_t pss;		 /* "pss": host proportional set size */
	uint64_t pss_shmem;	 /* "pshm": of pss, shared memory (the emulator's device memory) */
	uint64_t canary_version; /* "cnv": a primary's engine has its canary answer recorded at
				    this weights version + 1; 0: none */
};

struct proto_region_info {
	uint32_t pid;
	char engine_id[PROTO_MAX_STR + 1];
	uint64_t id;
	uint8_t device_uuid[PROTO_UUID_LEN];
	uint64_t va;
	uint64_t size;
	enum region_class cls;
	uint64_t order;
	uint64_t weights_version;
	enum region_state state;
	uint64_t age_ms;
	uint64_t checksum;
	uint64_t checksum_version;
};

struct proto_config_entry {
	char key[64];
	char value[PROTO_MAX_STR + 1];
};

struct proto_event {
	uint64_t ts_us;
	enum event_kind kind;
	uint32_t pid;
	uint64_t id;
	char message[PROTO_MAX_STR + 1];
};

struct proto_health_info {
	enum health_check check;
	enum health_verdict verdict;
	int32_t dev;
	uint32_t pid;
	char message[PROTO_MAX_STR + 1];
};

struct proto_end {
	uint32_t in_reply_to;
	uint32_t count;
};

struct proto_shadow_region {
	uint64_t id;
	uint64_t va;
	uint64_t size;
	enum region_class cls;
	uint64_t order;
	uint8_t device_uuid[PROTO_UUID_LEN];
};

struct proto_shadow_parked {
	uint32_t n_entries;
	uint64_t hash;
};

struct proto_promote_map {
	uint64_t shadow_id;
	uint32_t primary_pid;
	uint64_t primary_id;
	uint64_t size;
	uint64_t weights_version;
	int fd; /* owned by the message after decode */
};

struct proto_mem_info {
	uint32_t device;
	uint32_t seq;
	uint8_t device_uuid[PROTO_UUID_LEN];
	uint64_t free;
	uint64_t total;
};

struct proto_promote_commit {
	uint32_t n_regions;
	uint64_t hash;
	uint64_t weights_version;
};

struct proto_promote_done {
	int32_t code; /* 0 or a positive errno value */
	uint32_t n_regions;
	uint64_t ns;
	char message[PROTO_MAX_STR + 1];
};

struct proto_env_request {
	enum env_op op;
	char env[64];
	char root[PROTO_MAX_STR + 1];		   /* optional */
	char cmd[PROTO_MAX_STR + 1];		   /* optional */
	char cgroup[PROTO_MAX_STR + 1];		   /* optional "cg" */
	uint32_t pid;				   /* optional */
	uint64_t turn, prefix_tokens, prefix_hash; /* optional */
	char ckpt[64];				   /* optional */
	char trajectory[PROTO_MAX_STR + 1];	   /* optional "traj" */
	uint32_t flags;				   /* optional "fl" */
	uint64_t pids, memory;			   /* optional "pids", "mem" */
	uint64_t cpu_millis;			   /* optional "cpu" */
	uint32_t net;				   /* optional enum env_net */
	char dst[64];				   /* optional: fork */
	uint32_t count;				   /* optional "n": fork, 0..ENV_FORK_MAX */
	uint64_t disk;				   /* optional "disk" */
	char image[PROTO_MAX_STR + 1];		   /* optional "img" (create) */
};

struct proto_env_info {
	char env[64];
	char ckpt[64];
	char parent[64];
	char trajectory[PROTO_MAX_STR + 1];
	uint64_t turn, prefix_tokens, prefix_hash;
	uint32_t pid, nproc;
	uint64_t fs_bytes, fs_files, criu_bytes, freeze_us, dump_us, fs_us, total_us;
	char root[PROTO_MAX_STR + 1];
	char cgroup[PROTO_MAX_STR + 1];
	uint32_t full_diff;
	uint32_t net;	    /* optional enum env_net */
	uint64_t commit_us; /* optional "commit": a checkpoint's commit phase (after the thaw) */
	char path[16];	    /* optional "path": its delta's path, "walk" or "dirty-set" */
	/* optional "kind": a checkpoint's, "full", "fs-only" or "skipped" (issue 23 item 3) */
	char kind[16];
	/* optional "mem": an environment's memory checkpoint mode ("full": every dump copies all
	 * memory; "pre-dump": only what changed since one), "sdirty": uint32 0..1, the kernel's
	 * soft-dirty page tracking */
	char mem[16];
	uint32_t soft_dirty;
	char why[PROTO_MAX_STR + 1]; /* optional "why": why its delta walked */
	/* optional "pcr", "pcb", "pcfb": a pre-copied checkpoint's rounds before the freeze, the
	 * bytes they copied, the bytes copied again frozen (issue 23 item 2; 0: not pre-copied) */
	uint64_t precopy_rounds, precopy_bytes, precopy_frozen_bytes;
};

struct proto_env_item {
	char kind[16];
	uint32_t pid;
	uint64_t ts_ns;
	char path[PROTO_MAX_STR + 1];
	char path2[PROTO_MAX_STR + 1];
	char text[PROTO_MAX_STR + 1];
};

/* A variable-length field (FIELD_BLOB, FIELD_STRV): on decode a heap copy that the message
 * owns (proto_msg_finish frees it); on encode the caller's. STRV: count strings, each followed
 * by its NUL, len bytes in all. */
struct proto_blob {
	void *data;
	uint32_t len, count;
};

struct proto_env_exec {
	char env[64];
	struct proto_blob argv;	  /* "argv": array of 1..256 str, PROTO_EXEC_ARGV_MAX */
	struct proto_blob envv;	  /* "envv": array of 0..256 "K=V" str, PROTO_EXEC_ENVV_MAX */
	char cwd[PROTO_PATH_MAX]; /* "" : the image's working directory, else / */
	char user[64];		  /* "uid[:gid]" or a name in the environment's /etc/passwd */
	uint32_t timeout_ms;	  /* "tmo": 0: the supervisor's default */
	uint32_t max_output;	  /* "max": bytes kept per stream; 0: the default */
	uint32_t flags;		  /* "fl": EXEC_FLAG_* */
	int fd;			  /* stdin: a regular file (memfd), read from offset 0 */
};

struct proto_env_exec_out {
	uint32_t stream;	/* "fd": 1 stdout, 2 stderr */
	struct proto_blob data; /* "data": bin of 1..PROTO_EXEC_CHUNK_MAX bytes */
};

struct proto_env_exec_done {
	int32_t exit_code;  /* "code": the exit status; -1 when killed by a signal or not run */
	uint32_t signal;    /* "sig" */
	uint32_t timed_out; /* "tmo": 0..1 */
	uint32_t truncated; /* "trunc": bit 0 stdout, bit 1 stderr */
	uint64_t wall_us;   /* "us" */
	uint64_t out_bytes, err_bytes; /* "nout", "nerr": what the command wrote, kept or not */
	uint32_t pid;		       /* "pid": the command's pid in the environment */
};

struct proto_env_file {
	char env[64];
	char path[PROTO_PATH_MAX];
	uint32_t mode;	   /* "mode": write: permission bits (0: 0644); data: the file's */
	char user[64];	   /* "user": write: the owner, as exec's --user ("": root) */
	uint64_t max;	   /* "max": read: refuse a larger file (0: the default) */
	uint64_t size;	   /* "size": data: its size */
	uint32_t uid, gid; /* "uid", "gid": data: the owner (as the host sees it) */
	int fd;		   /* write: the content (regular file); data: a sealed memfd */
};

struct proto_image_request {
	enum image_op op;
	char ref[PROTO_MAX_STR + 1];  /* optional */
	char name[PROTO_MAX_STR + 1]; /* optional */
};

struct proto_image_info {
	char id[80];		      /* sha256:<64 hex> */
	char name[PROTO_MAX_STR + 1]; /* "" when it has none */
	uint32_t n_layers;
	/* an import's: layers unpacked and found in the store, entries, bytes, µs */
	uint64_t unpacked, cached, entries, bytes, us;
};

struct proto_nccl_comm {
	uint64_t id;
	uint64_t hash;
	int32_t rank;
	uint32_t nranks;
	int32_t cuda_dev;
	uint8_t device_uuid[PROTO_UUID_LEN];
	uint64_t parent_id;
	enum nccl_origin origin;
	int fd; /* the counters' memfd; owned by the message after decode */
};

struct proto_nccl_comm_end {
	uint64_t id;
	enum nccl_end how;
};

struct proto_traj_step {
	enum traj_event ev;
	char trajectory[PROTO_MAX_STR + 1];
	char env[64];
	/* Optional (absent: 0). */
	uint64_t turn;
	uint64_t prompt_tokens;	   /* "plen" */
	uint64_t generated_tokens; /* "gen" */
	uint64_t decode_mtps;	   /* "mtps": tokens/s x 1000 */
	uint64_t output_tokens;	   /* "out" */
	uint64_t prefix_tokens;	   /* "pfx" */
	uint64_t prefix_hash;	   /* "phash" */
};

struct proto_traj_decision {
	enum traj_event ev;
	char trajectory[PROTO_MAX_STR + 1];
	char env[64];
	enum traj_action act;
	char why[32];
	uint64_t bubble_us;
	uint32_t bubble_err_pm;
	uint64_t cost_us;
	uint32_t cost_err_pm;
	uint64_t held_us;
	/* Optional (absent: 0 / ""); step-begin answers only. */
	char ckpt[64];	  /* "ckpt" */
	uint64_t ckpt_us; /* "ckus" */
	uint32_t aborted; /* "abrt": 0..1 */
};

struct proto_traj_list {
	char trajectory[PROTO_MAX_STR + 1]; /* "": all */
};

struct proto_traj_info {
	enum traj_info_kind kind;
	char trajectory[PROTO_MAX_STR + 1];
	char env[64];
	uint32_t unprotected_turns;
	uint64_t unprotected_us;
	uint64_t bubble_us;
	uint32_t bubble_err_pm;
	uint32_t n_lengths;
	uint64_t decode_mtps;
	uint32_t pending;
	uint64_t prompt_tokens, generated_tokens, last_output_tokens;
	uint32_t ckpt_done, ckpt_aborted;
	uint64_t cost_us, fs_bps, dump_bps;
	uint32_t cost_err_pm, cost_n;
};

struct proto_msg {
	enum proto_type type;
	union {
		struct proto_hello hello;
		struct proto_region region;
		struct proto_region_release release;
		struct proto_error error;
		struct proto_region_fetch fetch;
		struct proto_region_fd region_fd;
		struct proto_ctl ctl;
		struct proto_metric metric;
		struct proto_worker_info worker_info;
		struct proto_region_info region_info;
		struct proto_config_entry config_entry;
		struct proto_event event;
		struct proto_health_info health;
		struct proto_end end;
		struct proto_shadow_region shadow_region;
		struct proto_shadow_parked shadow_parked;
		struct proto_promote_map promote_map;
		struct proto_promote_commit promote_commit;
		struct proto_promote_done promote_done;
		struct proto_env_request env_request;
		struct proto_env_info env_info;
		struct proto_env_item env_item;
		struct proto_env_exec env_exec;
		struct proto_env_exec_out exec_out;
		struct proto_env_exec_done exec_done;
		struct proto_env_file env_file;
		struct proto_nccl_comm nccl_comm;
		struct proto_nccl_comm_end nccl_comm_end;
		struct proto_traj_step traj_step;
		struct proto_traj_decision traj_decision;
		struct proto_traj_list traj_list;
		struct proto_traj_info traj_info;
		struct proto_image_request image_request;
		struct proto_image_info image_info;
		struct proto_mem_info mem_info;
	};
};

/* How many fds a message of this type carries (0 or 1); -EINVAL for an unknown type. */
int proto_type_nfds(enum proto_type type);
/* The *_to_string functions return NULL for a value outside the enum. */
const char *proto_type_to_string(enum proto_type type);

const char *region_class_to_string(enum region_class cls);
int region_class_from_string(const char *s, enum region_class *ret);
const char *worker_role_to_string(enum worker_role role);
int worker_role_from_string(const char *s, enum worker_role *ret);
const char *ctl_cmd_to_string(enum ctl_cmd cmd);
const char *ctl_action_to_string(enum ctl_action act);
const char *env_op_to_string(enum env_op op);
int env_op_from_string(const char *s, enum env_op *ret);
/* "none", "slirp", "host" (ENV_NET_DEFAULT: "default"). */
const char *env_net_to_string(enum env_net net);
int env_net_from_string(const char *s, enum env_net *ret);
const char *image_op_to_string(enum image_op op);
int image_op_from_string(const char *s, enum image_op *ret);
int ctl_action_from_string(const char *s, enum ctl_action *ret);
const char *nccl_origin_to_string(enum nccl_origin o);
const char *nccl_end_to_string(enum nccl_end how);
const char *traj_event_to_string(enum traj_event ev);
const char *traj_info_kind_to_string(enum traj_info_kind k);
int traj_event_from_string(const char *s, enum traj_event *ret);
const char *traj_action_to_string(enum traj_action act);
const char *metric_kind_to_string(enum metric_kind kind);
const char *worker_state_to_string(enum worker_state state);
const char *region_state_to_string(enum region_state state);
const char *event_kind_to_string(enum event_kind kind);
const char *health_check_to_string(enum health_check check);
const char *health_verdict_to_string(enum health_verdict verdict);

/* Encodes m into buf. The fds to send beside it (m's fd fields, not duplicated) are put in
 * ret_fds[0..*ret_nfds); both may be NULL for a type that carries no fd. Returns 0, -ENOBUFS
 * when cap is too small, -EMSGSIZE when the message would exceed PROTO_MAX_MSG, -EINVAL for
 * an invalid message (unknown type, string too long, value out of range, missing fd): the
 * encoder refuses exactly what the decoder would reject. */
int proto_encode(const struct proto_msg *m, void *buf, size_t cap, size_t *ret_len,
		 int ret_fds[PROTO_MAX_FDS], size_t *ret_nfds);

/* Decodes one packet and the fds that came with it. On success the fds belong to *ret.
 * On failure returns -EBADMSG or -EPROTONOSUPPORT, *ret is zeroed (proto_msg_finish() on it
 * is a no-op) and the fds are left to the caller. */
int proto_decode(const void *buf, size_t len, const int *fds, size_t nfds, struct proto_msg *ret);

/* Whether a and b are the same message: every field of their type equal (blobs by content),
 * and their fd numbers too when fds. */
bool proto_msg_equal(const struct proto_msg *a, const struct proto_msg *b, bool fds);

/* Closes the fds and frees the blobs a decoded message owns. Accepts NULL. */
void proto_msg_finish(struct proto_msg *m);

/* Encode + fdpass_send. flags as for send(2) (MSG_DONTWAIT for the shim). */
int proto_send(int sock, const struct proto_msg *m, int flags);
/* fdpass_recv + decode. Returns 0, -ECONNRESET when the peer closed, or -errno; fds that
 * arrived with a packet that fails to decode are closed. */
int proto_recv(int sock, struct proto_msg *ret, int flags);

/* Convenience for replies. code may be given as -errno or errno (not 0). Sent with
 * MSG_DONTWAIT, so a reply never stalls an event loop: -EAGAIN when it does not fit now. */
int proto_send_error(int sock, int code, enum proto_type in_reply_to, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
