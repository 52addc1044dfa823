/* SPDX-License-Identifier: MIT */
/*
 * The supervisor's configuration: /etc/belayer/belayer.conf (INI, read with inih). Every key
 * is a row of one table (supervisor-config.c) with its section, type, default and meaning, so
 * the defaults, the parser, `belayerctl config` and `--dump-config` cannot disagree.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/types.h>

#define CONFIG_DEFAULT_PATH "/etc/belayer/belayer.conf"
#define CONFIG_LIST_MAX	    64

/* [policy] mode (supervisor-policy.h decides with it). */
enum policy_mode {
	POLICY_NEVER = 0,
	POLICY_EVERY_TURN = 1,
	POLICY_ADAPTIVE = 2,
	_POLICY_MODE_MAX,
};

const char *policy_mode_to_string(enum policy_mode m);
/* "never", "every-turn", "adaptive" -> 0 and *ret; anything else -EINVAL. */
int policy_mode_from_string(const char *s, enum policy_mode *ret);

enum content_method {
	CONTENT_AUTO = 0,   /* read the fd as a file when it is one, else through the driver */
	CONTENT_FILE = 1,   /* the fd as a file only (emulator memfds) */
	CONTENT_DRIVER = 2, /* import through libcuda and copy to the host */
};

struct id_list {
	size_t n;
	uint32_t ids[CONFIG_LIST_MAX];
};

#define CONFIG_ENGINES_MAX 8
#define CONFIG_COMMAND_MAX 1024

enum verify_mode {
	VERIFY_SAMPLED = 0, /* CRC over 64 KiB every 16 MiB plus the last 64 KiB of each region */
	VERIFY_FULL = 1,    /* CRC over every byte */
	VERIFY_NONE = 2,    /* trust the memory: no content check */
};

/* One [engine.NAME] section: a rollout engine the supervisor launches (or pairs, when its
 * primary is started elsewhere), keeps a shadow group for, and recovers (supervisor-engines.h,
 * supervisor-promote.h). Commands run through /bin/sh -c with "{port}" replaced. */
struct sv_engine_config {
	char section[80]; /* "engine.NAME" */
	char name[64];
	char primary[CONFIG_COMMAND_MAX];      /* command, or "external" */
	char shadow[CONFIG_COMMAND_MAX];       /* "" : no shadow (every recovery is cold) */
	char cold_restart[CONFIG_COMMAND_MAX]; /* "": the primary command */
	char env[CONFIG_COMMAND_MAX];	       /* "K=V K2=V2" for the children */
	char devices[64];     /* CUDA_VISIBLE_DEVICES for the children ("": as is) */
	char health_url[256]; /* readiness and liveness probe */
	uint32_t tp;
	uint32_t port, shadow_port;
	enum verify_mode verify;
	uint64_t liveness_timeout_ms; /* 0: no hang detection */
	uint64_t probe_interval_ms;
	uint64_t promote_timeout_ms;
	uint64_t ready_timeout_ms;
	uint64_t checksum_settle_ms;
	/* the gateway in front of the engine (supervisor-gateway.h) */
	char gateway_listen[64]; /* "ADDRESS:PORT"; "": no gateway */
	uint64_t gateway_max_body;
	uint64_t gateway_max_header;	    /* request line + headers */
	uint64_t gateway_header_timeout_ms; /* 0: none */
	uint64_t gateway_body_timeout_ms;   /* 0: none */
	uint32_t gateway_max_connections;
	uint64_t gateway_client_buffer;
	uint64_t gateway_recovery_timeout_ms;
	uint64_t gateway_detect_grace_ms;
	uint32_t gateway_max_requests;
	uint32_t gateway_max_waiting;
	uint32_t gateway_upstream_connections;
	uint32_t gateway_journal_tokens;
	char gateway_seed[16];
	/* the canary before traffic (supervisor-canary.h) */
	char canary_path[128];
	struct id_list canary_prompt;
	uint32_t canary_tokens;
};

struct sv_config {
	/* [supervisor] */
	char socket[108];
	char socket_group[64];
	uint32_t socket_mode;
	char state_dir[256];
	char log_level[16];
	bool fd_store;
	/* [limits] */
	uint32_t max_connections;
	uint32_t max_regions_per_worker;
	uint32_t max_fds;
	uint32_t max_message_size;
	uint64_t max_queued_bytes;
	uint32_t max_client_errors;
	/* [retention] */
	uint64_t retention_timeout;
	uint64_t memory_budget;
	uint64_t resync_grace;
	/* [security] */
	struct id_list allowed_uids, allowed_gids;
	struct id_list fetch_uids, fetch_gids;
	bool allow_inject;
	/* [health] */
	uint64_t health_interval;
	struct id_list fatal_xids;
	char nvml_library[128];
	char cuda_library[128];
	enum content_method content_method;
	/* [journal] */
	bool journal;
	uint64_t journal_max_size;
	/* [events] */
	uint32_t event_history;
	/* [metrics] */
	char http_address[64];
	uint32_t http_port;
	/* [env] */
	bool env_trace;
	bool env_trace_preload;
	bool env_activity;
	char env_pin_dir[256];
	char env_criu[256];
	char env_cgroup[256];
	uint32_t env_keep;
	uint32_t env_workers;
	uint64_t env_ghost_limit;
	uint32_t env_pids_max;
	uint64_t env_memory_max;
	uint32_t env_cpu_max;
	uint32_t env_net; /* enum env_net (proto.h), never ENV_NET_DEFAULT */
	bool env_allow_host_net;
	char env_slirp4netns[256];
	bool env_userns;
	uint32_t env_userns_base;
	uint64_t env_disk_max;
	/* [nccl] */
	uint64_t nccl_hang_timeout_ms;
	uint64_t nccl_stall_timeout_ms;
	uint64_t nccl_poll_ms;
	bool nccl_recover;
	/* [policy] (supervisor-policy.h) */
	enum policy_mode policy_mode;
	uint32_t policy_confidence_pct;
	uint64_t policy_max_delay_ms;
	uint32_t policy_max_turns;
	uint64_t policy_max_unprotected_ms;
	/* [recovery] */
	bool recovery_canary;
	uint64_t canary_timeout_ms;
	/* [engine.NAME] sections, in file order */
	uint32_t n_engines;
	struct sv_engine_config engines[CONFIG_ENGINES_MAX];
};

/* Fills c with every default. */
void config_init_defaults(struct sv_config *c);
/* Reads path over the current values. A missing file is fine when missing_ok (the defaults
 * stand); unknown keys are warned about and ignored; an invalid value is an error (-EINVAL,
 * logged with file and line); a line longer than the INI parser's buffer (198 characters with
 * Debian's libinih) is refused with its number (-E2BIG) rather than split. */
int config_load(struct sv_config *c, const char *path, bool missing_ok);
/* Sets one key ("section.key" or section + key) from a string, as the file would. */
int config_set(struct sv_config *c, const char *section, const char *key, const char *value);

/* Iterates the effective configuration: i from 0 until it returns false. ret_value holds the
 * value formatted as the file would take it. */
bool config_entry(const struct sv_config *c, size_t i, const char **ret_section,
		  const char **ret_key, char *ret_value, size_t cap, const char **ret_doc);
/* Writes the effective configuration as an INI file (with each key's documentation). */
void config_dump(const struct sv_config *c, FILE *f);

bool id_list_contains(const struct id_list *l, uint32_t id);
const char *verify_mode_to_string(enum verify_mode v);
/* The engine named name, or NULL. */
const struct sv_engine_config *config_engine(const struct sv_config *c, const char *name);
