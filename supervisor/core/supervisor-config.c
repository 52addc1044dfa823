/* SPDX-License-Identifier: MIT */
/*
 * One table row per configuration key. Defaults are strings parsed by the same code as the
 * file, so a default can never be a value the parser would refuse.
 */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include "log.h"
#include "proto.h"
#include "supervisor-config.h"

static const char *const mode_names[] = {
	[POLICY_NEVER] = "never",
	[POLICY_EVERY_TURN] = "every-turn",
	[POLICY_ADAPTIVE] = "adaptive",
};

const char *policy_mode_to_string(enum policy_mode m)
{
	return (unsigned)m < _POLICY_MODE_MAX ? mode_names[m] : "?";
}

int policy_mode_from_string(const char *s, enum policy_mode *ret)
{
	for (unsigned i = 0; i < _POLICY_MODE_MAX; i++)
		if (strcmp(s, mode_names[i]) == 0) {
			*ret = i;
			return 0;
		}
	return -EINVAL;
}

enum key_type {
	KEY_STRING, /* char[size] */
	KEY_U32,    /* uint32_t in [min, max] */
	KEY_SIZE,   /* uint64_t bytes, K/M/G/T suffixes (powers of 1024) */
	KEY_SECS,   /* uint64_t seconds, s/m/h/d suffixes */
	KEY_MODE,   /* uint32_t octal file mode */
	KEY_BOOL,   /* yes/no, true/false, on/off, 1/0 */
	KEY_UIDS,   /* comma-separated user names or numbers */
	KEY_GIDS,   /* comma-separated group names or numbers */
	KEY_INTS,   /* comma-separated numbers */
	KEY_CONTENT,
	KEY_LOGLEVEL,
	KEY_MS,	    /* uint64_t milliseconds, ms/s/m/h suffixes (none: seconds) */
	KEY_VERIFY, /* enum verify_mode */
	KEY_POLICY, /* enum policy_mode (supervisor-policy.h) */
	KEY_NET,    /* uint32_t enum env_net (proto.h), "default" refused */
};

struct key {
	const char *section, *name;
	enum key_type type;
	size_t offset, size;
	uint64_t min, max;
	const char *def;
	const char *doc;
};

#define AT(m) offsetof(struct sv_config, m)
#define SZ(m) sizeof(((struct sv_config *)0)->m)
#define STR(sec, k, m, d, doc)                                 \
	{                                                      \
		sec, k, KEY_STRING, AT(m), SZ(m), 0, 0, d, doc \
	}
#define U32(sec, k, m, lo, hi, d, doc)                        \
	{                                                     \
		sec, k, KEY_U32, AT(m), SZ(m), lo, hi, d, doc \
	}
#define SIZE(sec, k, m, lo, hi, d, doc)                        \
	{                                                      \
		sec, k, KEY_SIZE, AT(m), SZ(m), lo, hi, d, doc \
	}
#define TYPED(sec, k, t, m, d, doc)                   \
	{                                             \
		sec, k, t, AT(m), SZ(m), 0, 0, d, doc \
	}

static const struct key keys[] = {
	STR("supervisor", "socket", socket, "/run/belayer/supervisor.sock",
	    "Unix SOCK_SEQPACKET socket for shims and belayerctl; its directory is created 0755."),
	STR("supervisor", "socket_group", socket_group, "",
	    "Group owning the socket (empty: the supervisor's own group)."),
	TYPED("supervisor", "socket_mode", KEY_MODE, socket_mode, "0660",
	      "Permissions of the socket (octal)."),
	STR("supervisor", "state_dir", state_dir, "/var/lib/belayer",
	    "Directory holding the journal (created 0700)."),
	TYPED("supervisor", "log_level", KEY_LOGLEVEL, log_level, "info",
	      "error, warning, info or debug (BELAYER_LOG_LEVEL overrides)."),
	TYPED("supervisor", "fd_store", KEY_BOOL, fd_store, "yes",
	      "Under systemd, also keep every region fd in the service's fd store "
	      "(FileDescriptorStoreMax=), so a restarted supervisor gets all retained memory "
	      "back, even that of workers that died before the restart."),

	U32("limits", "max_connections", max_connections, 1, 1000000, "256",
	    "Connections served at once; more are refused with an error reply."),
	U32("limits", "max_regions_per_worker", max_regions_per_worker, 1, 10000000, "4096",
	    "Regions one worker may announce; more are refused."),
	U32("limits", "max_fds", max_fds, 1, 10000000, "8192",
	    "Region fds held in total; announcements past it are refused."),
	U32("limits", "max_message_size", max_message_size, 64, PROTO_MAX_MSG, "65536",
	    "Largest packet accepted, in bytes (at most the protocol's 65536)."),
	TYPED("limits", "max_queued_bytes", KEY_SIZE, max_queued_bytes, "8M",
	      "Replies/events queued for one slow reader before it is disconnected."),
	U32("limits", "max_client_errors", max_client_errors, 1, 1000000, "16",
	    "Malformed or refused messages from one connection before it is closed."),

	TYPED("retention", "timeout", KEY_SECS, retention_timeout, "10m",
	      "How long a dead worker's regions are retained (0: until consumed)."),
	TYPED("retention", "memory_budget", KEY_SIZE, memory_budget, "0",
	      "Bytes of dead workers' regions retained at most; the oldest dead worker's "
	      "regions are released first (0: no budget)."),
	TYPED("retention", "resync_grace", KEY_SECS, resync_grace, "30s",
	      "After a worker (re)connects, how long regions it does not re-announce are kept."),

	TYPED("security", "allowed_uids", KEY_UIDS, allowed_uids, "",
	      "Users that may connect besides root and the supervisor's user (empty with "
	      "allowed_gids empty: anyone the socket's permissions let in)."),
	TYPED("security", "allowed_gids", KEY_GIDS, allowed_gids, "",
	      "Groups whose members (primary group) may connect, as allowed_uids."),
	TYPED("security", "fetch_uids", KEY_UIDS, fetch_uids, "",
	      "Users that may fetch regions owned by another user of the same engine group."),
	TYPED("security", "fetch_gids", KEY_GIDS, fetch_gids, "",
	      "Groups whose members may fetch regions owned by another user of the same engine."),
	TYPED("security", "allow_inject", KEY_BOOL, allow_inject, "yes",
	      "Whether belayerctl inject works (root or the worker's own user only)."),

	TYPED("health", "interval", KEY_SECS, health_interval, "30s",
	      "Period of the background GPU health check (0: only on request)."),
	TYPED("health", "fatal_xids", KEY_INTS, fatal_xids,
	      "48,61,62,63,64,74,79,92,94,95,119,120,140",
	      "XIDs that fail the GPU check when seen since the last good check. Hardware and "
	      "driver faults only: application faults (13, 31, 43, 45) are what a crashing worker "
	      "causes, and leave the memory of other allocations intact."),
	STR("health", "nvml_library", nvml_library, "libnvidia-ml.so.1",
	    "NVML library dlopen()ed for GPU checks (missing: verdict unknown)."),
	STR("health", "cuda_library", cuda_library, "libcuda.so.1",
	    "CUDA driver dlopen()ed to read device memory for content checks."),
	TYPED("health", "content_method", KEY_CONTENT, content_method, "auto",
	      "How region contents are read for checksums: file (the fd is a memfd, as on the "
	      "emulator), driver (import through libcuda and copy), or auto (file, else driver)."),

	TYPED("journal", "enabled", KEY_BOOL, journal, "yes",
	      "Journal workers and regions so a restarted supervisor knows what to expect."),
	TYPED("journal", "max_size", KEY_SIZE, journal_max_size, "4M",
	      "Journal size that triggers compaction into a snapshot."),

	TYPED("env", "trace", KEY_BOOL, env_trace, "yes",
	      "Trace agent environments' side effects with eBPF (dirty paths, side-effect log); "
	      "when BPF is unavailable the supervisor says so once and runs without it."),
	TYPED("env", "activity", KEY_BOOL, env_activity, "yes",
	      "Count each environment's process activity (two eBPF programs on every syscall of "
	      "every process on the node, tens of ns each): a turn whose processes did not run "
	      "checkpoints its files only and an unchanged turn is skipped; no: every checkpoint "
	      "of an environment with processes dumps them."),
	TYPED("env", "trace_preload", KEY_BOOL, env_trace_preload, "no",
	      "Load the tracer at start rather than at the first environment (loading and "
	      "attaching its programs takes about a second)."),
	STR("env", "pin_dir", env_pin_dir, "",
	    "bpffs directory for the tracer's pinned maps and programs, this supervisor's alone "
	    "(empty: /sys/fs/bpf/belayer/NAME-HASH from state_dir's canonical path; belayerctl "
	    "bpf names it). A directory another running supervisor holds is refused: tracing "
	    "stays off, its pins untouched."),
	STR("env", "criu", env_criu, "",
	    "CRIU >= 4 binary for environment checkpoints (empty: $BELAYER_CRIU, else "
	    "/usr/local/sbin/criu, else criu on PATH)."),
	STR("env", "cgroup", env_cgroup, "/sys/fs/cgroup/unified/belayer-envs",
	    "cgroup v2 directory under which each environment gets its own cgroup (this "
	    "machine's cgroup v2 is at /sys/fs/cgroup/unified: a hybrid layout)."),
	U32("env", "keep", env_keep, 1, 100000, "8",
	    "Checkpoints kept per environment; older ones are garbage-collected (the oldest kept "
	    "one absorbs the data it still needs)."),
	U32("env", "workers", env_workers, 1, 64, "4",
	    "Threads that run environment jobs (checkpoint, restore, create, rebuild): different "
	    "environments' jobs run side by side, one job per environment at a time."),
	SIZE("env", "ghost_limit", env_ghost_limit, 1, UINT32_MAX, "64M",
	     "Largest deleted-but-open file (what pytest's output capture and other temporary "
	     "files are; also a base file replaced or deleted while held open) a checkpoint "
	     "copies into its CRIU images; a bigger one fails the "
	     "checkpoint, and its error names the file (CRIU's own default is 1M; at most 4G-1)."),

	U32("env", "pids_max", env_pids_max, 0, 4194304, "4096",
	    "Tasks (processes and threads) an environment may have at once; a fork bomb gets "
	    "EAGAIN (0: no limit). cgroup v2's pids controller where the environment's cgroup has "
	    "it, else v1's."),
	SIZE("env", "memory_max", env_memory_max, 0, UINT64_MAX, "4G",
	     "Memory an environment may use, swap included; past it the kernel reclaims, then "
	     "kills inside the environment (0: no limit). v2's memory controller, else v1's."),
	U32("env", "cpu_max", env_cpu_max, 0, 1024000, "0",
	    "CPU an environment may use, in thousandths of a CPU (1500: one and a half; 0: no "
	    "limit). v2's cpu.max, else v1's CFS quota."),
	TYPED("env", "net", KEY_NET, env_net, "none",
	      "An environment's network unless its create asks for another (belayerctl env "
	      "create --net): none (its own network namespace, loopback only), slirp (its own, "
	      "with user-mode egress through slirp4netns; the host's loopback services stay out "
	      "of reach) or host (the host's network namespace: needs allow_host_net)."),
	TYPED("env", "allow_host_net", KEY_BOOL, env_allow_host_net, "no",
	      "Whether an environment may share the host's network namespace (net = host or "
	      "--net host): it then reaches every service of the host, loopback ones included. "
	      "Refused otherwise."),
	STR("env", "slirp4netns", env_slirp4netns, "slirp4netns",
	    "The slirp4netns binary (Debian's slirp4netns package) that gives net = slirp "
	    "environments their egress (a name without '/': searched on PATH)."),
	TYPED("env", "userns", KEY_BOOL, env_userns, "yes",
	      "Run each environment created from now on with net = none in a user namespace of its "
	      "own whose root "
	      "is host uid and gid userns_base (65536 ids from there; the base image idmapped so "
	      "that its files are the environment's root's): an escape is an unprivileged user on "
	      "the host. CRIU checkpoints and restores it (no: the environment's root is host "
	      "root, less its capabilities)."),
	U32("env", "userns_base", env_userns_base, 1, UINT32_MAX - 65536, "100000",
	    "The host uid and gid an environment's root is with userns = yes; its uid N is host "
	    "userns_base + N. Every environment shares the range."),
	SIZE("env", "disk_max", env_disk_max, 0, UINT64_MAX, "0",
	     "Bytes an environment may write into its writable layer; past them a write gets "
	     "ENOSPC (0: no limit, the layer stays on the state directory's file system). The "
	     "layer then lives on a tmpfs of that size, whose pages count against memory_max."),

	TYPED("nccl", "hang_timeout", KEY_MS, nccl_hang_timeout_ms, "10s",
	      "A communicator with a collective in flight and no progress for this long, while "
	      "a rank that has not caught up is stopped (SIGSTOP, a debugger) or blocked in "
	      "another communicator, is declared hung. A dead rank is declared at once."),
	TYPED("nccl", "stall_timeout", KEY_MS, nccl_stall_timeout_ms, "60s",
	      "Every rank inside the same collective, none completing, for this long: declared "
	      "hung (the least advanced rank is named)."),
	TYPED("nccl", "poll_interval", KEY_MS, nccl_poll_ms, "100ms",
	      "How often the communicators' progress counters are read."),
	TYPED("nccl", "recover", KEY_BOOL, nccl_recover, "yes",
	      "Stop a hung group: configured engines through their recovery (shadow promotion "
	      "or cold restart), other processes sharing the communicator by SIGKILL (no: only "
	      "report the diagnosis)."),

	TYPED("policy", "mode", KEY_POLICY, policy_mode, "adaptive",
	      "When agent environments of trajectories that report step events (traj step-begin "
	      "/ step-end) are checkpointed: never; every-turn (at every step end, the next action "
	      "waits for it); adaptive (inside the inference bubble when it is predicted to hide "
	      "the checkpoint, or when forced by max_turns / max_unprotected)."),
	U32("policy", "confidence", policy_confidence_pct, 0, 100, "90",
	    "Adaptive: how sure, in percent, the policy must be that the inference bubble outlasts "
	    "the checkpoint before it starts one: the share of the remembered generation lengths "
	    "(the trajectory's, or the fleet's until it has 8) whose remainder outlasts the "
	    "checkpoint's predicted cost grown by its error estimate (0: whenever a bubble is "
	    "predicted)."),
	TYPED("policy", "max_delay", KEY_MS, policy_max_delay_ms, "50ms",
	      "Adaptive: longest an action waits for a checkpoint still running when it arrives; "
	      "past it the checkpoint is aborted and the turn stays unprotected."),
	U32("policy", "max_turns", policy_max_turns, 0, 1000000, "8",
	    "Adaptive: force a checkpoint when more dirty turns than this are unprotected (0: "
	    "never forced by turns)."),
	TYPED("policy", "max_unprotected", KEY_MS, policy_max_unprotected_ms, "5m",
	      "Adaptive: force a checkpoint when the last one (or the last clean step end) is "
	      "older than this (0: never forced by time)."),

	U32("events", "history", event_history, 0, 1000000, "256",
	    "Recent events kept for `belayerctl events` to replay."),

	STR("metrics", "http_address", http_address, "127.0.0.1",
	    "Address of the Prometheus listener; only loopback addresses are accepted."),
	U32("metrics", "http_port", http_port, 0, 65535, "0",
	    "Port of the Prometheus /metrics listener (0: off)."),

	TYPED("recovery", "canary", KEY_BOOL, recovery_canary, "yes",
	      "Before a promoted shadow group is marked primary and gets traffic, it answers the "
	      "engine's canary prompt (greedy) and the answer must equal the one recorded from "
	      "the primary at the same weights version; otherwise cold restart."),
	TYPED("recovery", "canary_timeout", KEY_MS, canary_timeout_ms, "10s",
	      "How long the canary request (and each recording from the primary) may take; "
	      "past it, at a promotion, cold restart."),
};

static const char *const content_names[] = {"auto", "file", "driver"};
static const char *const verify_names[] = {"sampled", "full", "none"};

/* The keys of an [engine.NAME] section; offsets are within struct sv_engine_config. */
#define EAT(m) offsetof(struct sv_engine_config, m)
#define ESZ(m) sizeof(((struct sv_engine_config *)0)->m)
#define ESTR(k, m, d, doc)                                            \
	{                                                             \
		"engine", k, KEY_STRING, EAT(m), ESZ(m), 0, 0, d, doc \
	}
#define ETYPED(k, t, m, d, doc)                              \
	{                                                    \
		"engine", k, t, EAT(m), ESZ(m), 0, 0, d, doc \
	}
static const struct key engine_keys[] = {
	ESTR("primary", primary, "external",
	     "The engine's command (run with /bin/sh -c, \"{port}\" replaced by its port), or "
	     "\"external\": started elsewhere with BELAYER_ENGINE_ID=NAME; the supervisor pairs "
	     "it."),
	ESTR("shadow", shadow, "",
	     "The shadow's command: the same engine with a dummy weight load and the primary's "
	     "explicit KV size; run with BELAYER_ROLE=shadow (empty: no shadow, recovery is a "
	     "cold restart)."),
	ESTR("cold_restart", cold_restart, "",
	     "Command of a cold restart, when promotion is impossible (empty: the primary's)."),
	ESTR("env", env, "",
	     "Environment for the engine's processes: space-separated NAME=VALUE (e.g. "
	     "LD_PRELOAD=/usr/lib/libbelayer.so). BELAYER_ENGINE_ID, BELAYER_ROLE and "
	     "BELAYER_SOCKET are set by the supervisor."),
	ESTR("devices", devices, "",
	     "CUDA_VISIBLE_DEVICES for the engine's processes (empty: inherited)."),
	{"engine", "tp", KEY_U32, EAT(tp), ESZ(tp), 1, 64, "1",
	 "Tensor-parallel size: worker processes (ranks) per group, all recovered together."},
	{"engine", "port", KEY_U32, EAT(port), ESZ(port), 0, 65535, "8000",
	 "HTTP port of the first primary. The primary and the shadow swap ports at each "
	 "promotion: the promoted shadow keeps serving on its own, the new shadow gets the "
	 "dead primary's."},
	{"engine", "shadow_port", KEY_U32, EAT(shadow_port), ESZ(shadow_port), 0, 65535, "8001",
	 "HTTP port of the first shadow."},
	ESTR("health_url", health_url, "http://127.0.0.1:{port}/health",
	     "Readiness and liveness probe: GET must answer 200 (\"{port}\" replaced)."),
	ETYPED("verify", KEY_VERIFY, verify, "sampled",
	       "Content check of the weights before promotion: sampled (CRC of 64 KiB every "
	       "16 MiB and the last 64 KiB of each region), full (every byte), none."),
	ETYPED("liveness_timeout", KEY_MS, liveness_timeout_ms, "0",
	       "A serving primary whose probe fails this long while its process lives is hung: "
	       "its group is SIGKILLed and recovered (0: no hang detection)."),
	ETYPED("probe_interval", KEY_MS, probe_interval_ms, "500ms",
	       "Period of the health_url probe (readiness after a start, then liveness)."),
	ETYPED("promote_timeout", KEY_MS, promote_timeout_ms, "10s",
	       "How long the shadow ranks have to report the remap done; past it, cold restart."),
	ETYPED("ready_timeout", KEY_MS, ready_timeout_ms, "10m",
	       "How long a started primary has to answer its probe before it is restarted."),
	ETYPED("checksum_settle", KEY_MS, checksum_settle_ms, "500ms",
	       "A weights region's checksum is recorded once its weights version has not changed "
	       "for this long (its writes are done)."),
	ESTR("gateway_listen", gateway_listen, "",
	     "ADDRESS:PORT of the engine's gateway: a reverse proxy that journals every in-flight "
	     "request's tokens and resumes it on the recovered worker (empty: no gateway)."),
	ETYPED("gateway_max_body", KEY_SIZE, gateway_max_body, "8M",
	       "Largest request body the gateway accepts (larger: 413)."),
	{"engine", "gateway_max_header", KEY_SIZE, EAT(gateway_max_header), ESZ(gateway_max_header),
	 1024, 16 << 20, "64K",
	 "Largest request line and headers the gateway accepts (larger: 431)."},
	ETYPED("gateway_header_timeout", KEY_MS, gateway_header_timeout_ms, "10s",
	       "How long a client has to send a request's line and headers, from its connection "
	       "(a kept-alive one's: from its first byte) (later: 408 and closed; 0: no bound)."),
	ETYPED("gateway_body_timeout", KEY_MS, gateway_body_timeout_ms, "60s",
	       "How long a client has to send a request's whole body, from its headers' end "
	       "(later: 408 and closed; 0: no bound)."),
	{"engine", "gateway_max_connections", KEY_U32, EAT(gateway_max_connections),
	 ESZ(gateway_max_connections), 1, 1000000, "4096",
	 "Client connections the gateway keeps open at once (more: answered 503 and closed)."},
	ETYPED("gateway_client_buffer", KEY_SIZE, gateway_client_buffer, "1M",
	       "Bytes queued for a slow client above which the gateway stops reading the "
	       "engine's stream until they drain."),
	ETYPED("gateway_recovery_timeout", KEY_MS, gateway_recovery_timeout_ms, "60s",
	       "How long a request waits for the engine's recovery (in flight when it failed, "
	       "or arriving meanwhile) before it fails (502 / 503)."),
	ETYPED("gateway_detect_grace", KEY_MS, gateway_detect_grace_ms, "3s",
	       "After an engine connection fails while the engine seems healthy, how long the "
	       "gateway waits for a recovery to start before it answers 502."),
	{"engine", "gateway_max_requests", KEY_U32, EAT(gateway_max_requests),
	 ESZ(gateway_max_requests), 1, 1000000, "4096",
	 "Requests the gateway holds at once (more: 503)."},
	{"engine", "gateway_max_waiting", KEY_U32, EAT(gateway_max_waiting),
	 ESZ(gateway_max_waiting), 0, 1000000, "1024",
	 "Requests arriving during a recovery that wait for it (more: 503)."},
	{"engine", "gateway_upstream_connections", KEY_U32, EAT(gateway_upstream_connections),
	 ESZ(gateway_upstream_connections), 1, 65536, "1024",
	 "Keep-alive connections the gateway keeps to the engine, busy and idle (requests beyond "
	 "them wait for one). Above the engine's batch (vLLM's max_num_seqs: 256), so that the "
	 "engine has requests queued to admit at each step."},
	{"engine", "gateway_journal_tokens", KEY_U32, EAT(gateway_journal_tokens),
	 ESZ(gateway_journal_tokens), 1, 16777216, "131072",
	 "Journal bound per request: prompt + generated tokens (a longer request is served "
	 "but not resumable)."},
	ESTR("gateway_seed", gateway_seed, "derived",
	     "Seed of a resumed seeded sampled request: derived (mix of the seed and the tokens "
	     "generated), advance (seed + n * 0x9e3779b97f4a7c15: exact for a per-request Weyl "
	     "generator such as the engine stand-in's) or same."),
	ESTR("canary_path", canary_path, "/generate",
	     "Path of the canary request: /generate (SGLang: input_ids, sampling_params) or "
	     "any other (vLLM's /v1/completions: a token-id prompt, max_tokens, "
	     "return_token_ids); its output_ids / token_ids are compared."),
	ETYPED("canary_prompt", KEY_INTS, canary_prompt, "1,2,3,4",
	       "Token ids of the canary prompt (within the model's vocabulary)."),
	{"engine", "canary_tokens", KEY_U32, EAT(canary_tokens), ESZ(canary_tokens), 1, 32, "4",
	 "Tokens the canary generates (greedy)."},
};

static void *at(struct sv_config *c, const struct key *k)
{
	return (char *)c + k->offset;
}

static const void *at_const(const struct sv_config *c, const struct key *k)
{
	return (const char *)c + k->offset;
}

static int parse_u64(const char *s, uint64_t *ret, char **ret_end)
{
	char *end;
	unsigned long long v;

	while (isspace((unsigned char)*s))
		s++;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0)
		return -EINVAL;
	*ret = v;
	*ret_end = end;
	return 0;
}

static int parse_scaled(const char *s, const char *suffixes, const uint64_t *scales, uint64_t *ret)
{
	uint64_t v, scale = 1;
	char *end;
	const char *p;

	if (parse_u64(s, &v, &end) < 0)
		return -EINVAL;
	if (*end && (p = strchr(suffixes, tolower((unsigned char)*end)))) {
		scale = scales[p - suffixes];
		end++;
		if (*end == 'i' || *end == 'I' || *end == 'b' || *end == 'B')
			end += *end == 'i' || *end == 'I' ? 1 : 0;
		if (*end == 'b' || *end == 'B')
			end++;
	}
	while (isspace((unsigned char)*end))
		end++;
	if (*end)
		return -EINVAL;
	if (v > UINT64_MAX / scale)
		return -ERANGE;
	*ret = v * scale;
	return 0;
}

static int parse_ids(const char *s, bool users, bool names, struct id_list *ret)
{
	char buf[1024], *save = NULL, *tok;

	ret->n = 0;
	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, s);
	for (tok = strtok_r(buf, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
		uint64_t v;
		char *end;

		if (ret->n >= CONFIG_LIST_MAX)
			return -E2BIG;
		if (parse_u64(tok, &v, &end) == 0 && *end == '\0') {
			if (v > UINT32_MAX - 1)
				return -ERANGE;
		} else if (!names) {
			return -EINVAL;
		} else if (users) {
			struct passwd *pw = getpwnam(tok);

			if (!pw)
				return -ENOENT;
			v = pw->pw_uid;
		} else {
			struct group *gr = getgrnam(tok);

			if (!gr)
				return -ENOENT;
			v = gr->gr_gid;
		}
		ret->ids[ret->n++] = (uint32_t)v;
	}
	return 0;
}

static int key_parse(struct sv_config *c, const struct key *k, const char *value)
{
	static const uint64_t size_scales[] = {1ull << 10, 1ull << 20, 1ull << 30, 1ull << 40};
	static const uint64_t secs_scales[] = {1, 60, 3600, 86400};
	void *p = at(c, k);
	enum log_level level;
	uint64_t v;
	char *end;
	int r;

	switch (k->type) {
	case KEY_STRING:
		if (strlen(value) >= k->size)
			return -ENAMETOOLONG;
		strcpy(p, value);
		return 0;
	case KEY_U32:
		if (parse_u64(value, &v, &end) < 0 || *end)
			return -EINVAL;
		if (v < k->min || v > k->max)
			return -ERANGE;
		*(uint32_t *)p = (uint32_t)v;
		return 0;
	case KEY_SIZE:
		r = parse_scaled(value, "kmgt", size_scales, &v);
		if (r < 0)
			return r;
		if (k->max && (v < k->min || v > k->max))
			return -ERANGE;
		*(uint64_t *)p = v;
		return 0;
	case KEY_SECS:
		return parse_scaled(value, "smhd", secs_scales, p);
	case KEY_MODE:
		errno = 0;
		v = strtoull(value, &end, 8);
		if (errno || end == value || *end || v > 07777)
			return -EINVAL;
		*(uint32_t *)p = (uint32_t)v;
		return 0;
	case KEY_BOOL:
		if (!strcasecmp(value, "yes") || !strcasecmp(value, "true") ||
		    !strcasecmp(value, "on") || !strcmp(value, "1"))
			*(bool *)p = true;
		else if (!strcasecmp(value, "no") || !strcasecmp(value, "false") ||
			 !strcasecmp(value, "off") || !strcmp(value, "0"))
			*(bool *)p = false;
		else
			return -EINVAL;
		return 0;
	case KEY_UIDS:
		return parse_ids(value, true, true, p);
	case KEY_GIDS:
		return parse_ids(value, false, true, p);
	case KEY_INTS:
		return parse_ids(value, false, false, p);
	case KEY_CONTENT:
		for (size_t i = 0; i < ARRAY_SIZE(content_names); i++)
			if (strcmp(value, content_names[i]) == 0) {
				*(enum content_method *)p = (enum content_method)i;
				return 0;
			}
		return -EINVAL;
	case KEY_MS: {
		static const uint64_t ms_scales[] = {1000, 60000, 3600000};

		/* "500ms" first: parse_scaled would read the 'm' as minutes. */
		if (parse_u64(value, &v, &end) < 0)
			return -EINVAL;
		if (!strcasecmp(end, "ms")) {
			*(uint64_t *)p = v;
			return 0;
		}
		if (!*end) {
			if (v > UINT64_MAX / 1000)
				return -ERANGE;
			*(uint64_t *)p = v * 1000;
			return 0;
		}
		return parse_scaled(value, "smh", ms_scales, p);
	}
	case KEY_POLICY:
		return policy_mode_from_string(value, p);
	case KEY_NET: {
		enum env_net net;

		if (env_net_from_string(value, &net) < 0 || net == ENV_NET_DEFAULT)
			return -EINVAL;
		*(uint32_t *)p = net;
		return 0;
	}
	case KEY_VERIFY:
		for (size_t i = 0; i < ARRAY_SIZE(verify_names); i++)
			if (strcmp(value, verify_names[i]) == 0) {
				*(enum verify_mode *)p = (enum verify_mode)i;
				return 0;
			}
		return -EINVAL;
	case KEY_LOGLEVEL:
		r = log_level_from_string(value, &level);
		if (r < 0)
			return r;
		if (strlen(value) >= k->size)
			return -EINVAL;
		strcpy(p, value);
		return 0;
	}
	return -EINVAL;
}

static const struct key *key_find(const char *section, const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++)
		if (strcmp(keys[i].section, section) == 0 && strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

void config_init_defaults(struct sv_config *c)
{
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		int r = key_parse(c, &keys[i], keys[i].def);

		/* The table is ours: a default the parser refuses is a bug caught by every test. */
		if (r < 0) {
			log_error_errno(r, "Default of %s.%s is invalid: %m", keys[i].section,
					keys[i].name);
			abort();
		}
	}
}

/* The key k of engine section as a row addressing c (the engine's slot), or -errno. */
static int engine_key(struct sv_config *c, const char *section, const char *name, struct key *ret,
		      bool create)
{
	const char *engine = section + strlen("engine.");
	size_t i;

	if (!*engine || strlen(engine) >= sizeof(c->engines[0].name) || strchr(engine, ' '))
		return -EINVAL;
	for (i = 0; i < c->n_engines; i++)
		if (strcmp(c->engines[i].name, engine) == 0)
			break;
	if (i == c->n_engines) {
		struct sv_engine_config *e;

		if (!create)
			return -ENOENT;
		if (c->n_engines == CONFIG_ENGINES_MAX)
			return -E2BIG;
		e = &c->engines[c->n_engines];
		memset(e, 0, sizeof(*e));
		snprintf(e->name, sizeof(e->name), "%s", engine);
		snprintf(e->section, sizeof(e->section), "engine.%s", engine);
		for (size_t j = 0; j < ARRAY_SIZE(engine_keys); j++) {
			struct key k = engine_keys[j];
			int r;

			k.offset += offsetof(struct sv_config, engines) + i * sizeof(*e);
			r = key_parse(c, &k, k.def);
			if (r < 0)
				abort(); /* our table's default: a bug every test catches */
		}
		c->n_engines++;
	}
	for (size_t j = 0; j < ARRAY_SIZE(engine_keys); j++)
		if (strcmp(engine_keys[j].name, name) == 0) {
			*ret = engine_keys[j];
			ret->offset += offsetof(struct sv_config, engines) +
				       i * sizeof(struct sv_engine_config);
			return 0;
		}
	return -ENOENT;
}

int config_set(struct sv_config *c, const char *section, const char *key, const char *value)
{
	const struct key *k;
	struct key ek;
	char sec[128];
	const char *dot;
	int r;

	if (!section && strncmp(key, "engine.", 7) == 0) {
		/* engine.NAME.key: the section is everything up to the last dot. */
		dot = strrchr(key, '.');
		if (dot == key + 6 || (size_t)(dot - key) >= sizeof(sec))
			return -ENOENT;
		memcpy(sec, key, (size_t)(dot - key));
		sec[dot - key] = '\0';
		section = sec;
		key = dot + 1;
	}
	if (section && strncmp(section, "engine.", 7) == 0) {
		/* Validate the key before the section may create an engine. */
		bool known = false;

		for (size_t j = 0; j < ARRAY_SIZE(engine_keys); j++)
			known |= strcmp(engine_keys[j].name, key) == 0;
		if (!known)
			return -ENOENT;
		r = engine_key(c, section, key, &ek, true);
		if (r < 0)
			return r;
		return key_parse(c, &ek, value);
	}
	if (!section) {
		dot = strchr(key, '.');
		if (!dot || (size_t)(dot - key) >= sizeof(sec))
			return -ENOENT;
		memcpy(sec, key, (size_t)(dot - key));
		sec[dot - key] = '\0';
		section = sec;
		key = dot + 1;
	}
	k = key_find(section, key);
	if (!k)
		return -ENOENT;
	return key_parse(c, k, value);
}

struct load_ctx {
	struct sv_config *c;
	const char *path;
	int error;
	FILE *f;
	int line;     /* lines read so far */
	int too_long; /* the first line longer than libinih's buffer, 0: none */
	int cap;      /* libinih's buffer */
};

/* libinih reads through a fixed buffer (Debian's: 200 bytes) and would split a longer line
 * silently, then report a syntax error on a line that does not exist. This reader stops at
 * such a line instead, so that the error names it. */
static char *read_line(char *buf, int cap, void *user)
{
	struct load_ctx *ctx = user;
	char *r = fgets(buf, cap, ctx->f);
	size_t n;

	if (!r)
		return NULL;
	ctx->line++;
	n = strlen(buf);
	if (n + 1 == (size_t)cap && buf[n - 1] != '\n' && !feof(ctx->f)) {
		ctx->too_long = ctx->line;
		ctx->cap = cap;
		return NULL;
	}
	return r;
}

/* Debian's libinih is built without INI_HANDLER_LINENO: no line numbers in the callback. */
static int ini_cb(void *user, const char *section, const char *name, const char *value)
{
	struct load_ctx *ctx = user;
	int r = config_set(ctx->c, section, name, value);

	if (r == -ENOENT) {
		log_warning("%s: unknown key [%s] %s, ignoring.", ctx->path, section, name);
		return 1;
	}
	if (r < 0) {
		log_error_errno(r, "%s: invalid value for [%s] %s: \"%s\": %m", ctx->path, section,
				name, value);
		ctx->error = r;
	}
	return 1;
}

int config_load(struct sv_config *c, const char *path, bool missing_ok)
{
	struct load_ctx ctx = {.c = c, .path = path};
	_cleanup_fclose_ FILE *f = fopen(path, "re");
	int r;

	if (!f) {
		r = negative_errno();
		if (r == -ENOENT && missing_ok) {
			log_debug("No %s, using the defaults.", path);
			return 0;
		}
		return log_error_errno(r, "Failed to open %s: %m", path);
	}
	ctx.f = f;
	r = ini_parse_stream(read_line, &ctx, ini_cb, &ctx);
	if (ctx.too_long)
		return log_error_errno(-E2BIG,
				       "%s:%d: line too long for the INI parser (at most %d "
				       "characters); move a long engine command into a script.",
				       path, ctx.too_long, ctx.cap - 2);
	if (r > 0)
		return log_error_errno(-EINVAL, "%s:%d: syntax error.", path, r);
	if (r < 0)
		return log_error_errno(-EIO, "Failed to parse %s.", path);
	return ctx.error;
}

static void format_ids(const struct id_list *l, char *buf, size_t cap)
{
	size_t off = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < l->n && off < cap; i++)
		off += (size_t)snprintf(buf + off, cap - off, "%s%" PRIu32, i ? "," : "",
					l->ids[i]);
}

static void format_scaled(uint64_t v, const char *suffixes, const uint64_t *scales, size_t n,
			  char *buf, size_t cap)
{
	for (size_t i = n; i-- > 0;)
		if (v && v % scales[i] == 0) {
			snprintf(buf, cap, "%" PRIu64 "%c", v / scales[i], suffixes[i]);
			return;
		}
	snprintf(buf, cap, "%" PRIu64, v);
}

static void key_format(const struct sv_config *c, const struct key *k, char *buf, size_t cap)
{
	static const uint64_t size_scales[] = {1ull << 10, 1ull << 20, 1ull << 30, 1ull << 40};
	static const uint64_t secs_scales[] = {60, 3600, 86400};
	const void *p = at_const(c, k);
	uint64_t v;

	switch (k->type) {
	case KEY_STRING:
	case KEY_LOGLEVEL:
		snprintf(buf, cap, "%s", (const char *)p);
		return;
	case KEY_U32:
		snprintf(buf, cap, "%" PRIu32, *(const uint32_t *)p);
		return;
	case KEY_SIZE:
		format_scaled(*(const uint64_t *)p, "KMGT", size_scales, 4, buf, cap);
		return;
	case KEY_SECS:
		v = *(const uint64_t *)p;
		if (v == 0)
			snprintf(buf, cap, "0");
		else if (v % 60)
			snprintf(buf, cap, "%" PRIu64 "s", v);
		else
			format_scaled(v, "mhd", secs_scales, 3, buf, cap);
		return;
	case KEY_MODE:
		snprintf(buf, cap, "%04" PRIo32, *(const uint32_t *)p);
		return;
	case KEY_BOOL:
		snprintf(buf, cap, "%s", *(const bool *)p ? "yes" : "no");
		return;
	case KEY_UIDS:
	case KEY_GIDS:
	case KEY_INTS:
		format_ids(p, buf, cap);
		return;
	case KEY_CONTENT:
		snprintf(buf, cap, "%s", content_names[*(const enum content_method *)p]);
		return;
	case KEY_MS:
		v = *(const uint64_t *)p;
		if (v && v % 1000 == 0)
			snprintf(buf, cap, "%" PRIu64 "s", v / 1000);
		else
			snprintf(buf, cap, "%" PRIu64 "ms", v);
		if (v == 0)
			snprintf(buf, cap, "0");
		return;
	case KEY_VERIFY:
		snprintf(buf, cap, "%s", verify_names[*(const enum verify_mode *)p]);
		return;
	case KEY_POLICY:
		snprintf(buf, cap, "%s", policy_mode_to_string(*(const enum policy_mode *)p));
		return;
	case KEY_NET:
		snprintf(buf, cap, "%s", env_net_to_string(*(const uint32_t *)p) ?: "?");
		return;
	}
	snprintf(buf, cap, "?");
}

static struct key engine_row(size_t engine, size_t j)
{
	struct key k = engine_keys[j];

	k.offset += offsetof(struct sv_config, engines) + engine * sizeof(struct sv_engine_config);
	return k;
}

bool config_entry(const struct sv_config *c, size_t i, const char **ret_section,
		  const char **ret_key, char *ret_value, size_t cap, const char **ret_doc)
{
	if (i >= ARRAY_SIZE(keys)) {
		size_t e = (i - ARRAY_SIZE(keys)) / ARRAY_SIZE(engine_keys),
		       j = (i - ARRAY_SIZE(keys)) % ARRAY_SIZE(engine_keys);
		struct key k;

		if (e >= c->n_engines)
			return false;
		k = engine_row(e, j);
		*ret_section = c->engines[e].section;
		*ret_key = k.name;
		if (ret_doc)
			*ret_doc = k.doc;
		key_format(c, &k, ret_value, cap);
		return true;
	}
	*ret_section = keys[i].section;
	*ret_key = keys[i].name;
	if (ret_doc)
		*ret_doc = keys[i].doc;
	key_format(c, &keys[i], ret_value, cap);
	return true;
}

void config_dump(const struct sv_config *c, FILE *f)
{
	const char *section = NULL;

	for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
		char value[1024];

		if (!section || strcmp(section, keys[i].section) != 0) {
			section = keys[i].section;
			fprintf(f, "%s[%s]\n", i ? "\n" : "", section);
		}
		key_format(c, &keys[i], value, sizeof(value));
		fprintf(f, "# %s\n%s =%s%s\n", keys[i].doc, keys[i].name, value[0] ? " " : "",
			value);
	}
	for (size_t e = 0; e < c->n_engines; e++) {
		fprintf(f, "\n[%s]\n", c->engines[e].section);
		for (size_t j = 0; j < ARRAY_SIZE(engine_keys); j++) {
			struct key k = engine_row(e, j);
			char value[CONFIG_COMMAND_MAX];

			key_format(c, &k, value, sizeof(value));
			fprintf(f, "# %s\n%s =%s%s\n", k.doc, k.name, value[0] ? " " : "", value);
		}
	}
	if (c->n_engines == 0) {
		/* The template of a section, with the defaults an engine starts from. */
		struct sv_config *t = calloc(1, sizeof(*t));

		if (!t || config_set(t, "engine.NAME", "tp", "1") < 0) {
			free(t);
			return;
		}
		fprintf(f,
			"\n# One [engine.NAME] section per rollout engine the supervisor launches "
			"(or pairs)\n# with a shadow group and recovers by promotion (at most "
			"%d):\n#[engine.NAME]\n",
			CONFIG_ENGINES_MAX);
		for (size_t j = 0; j < ARRAY_SIZE(engine_keys); j++) {
			struct key k = engine_row(0, j);
			char value[CONFIG_COMMAND_MAX];

			key_format(t, &k, value, sizeof(value));
			fprintf(f, "# %s\n#%s =%s%s\n", k.doc, k.name, value[0] ? " " : "", value);
		}
		free(t);
	}
}

const char *verify_mode_to_string(enum verify_mode v)
{
	return (unsigned)v < ARRAY_SIZE(verify_names) ? verify_names[v] : NULL;
}

const struct sv_engine_config *config_engine(const struct sv_config *c, const char *name)
{
	for (size_t i = 0; i < c->n_engines; i++)
		if (strcmp(c->engines[i].name, name) == 0)
			return &c->engines[i];
	return NULL;
}

bool id_list_contains(const struct id_list *l, uint32_t id)
{
	for (size_t i = 0; i < l->n; i++)
		if (l->ids[i] == id)
			return true;
	return false;
}
