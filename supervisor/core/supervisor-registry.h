/* SPDX-License-Identifier: MIT */
/*
 * What the supervisor knows: workers (one per process that said hello, or that the journal
 * says was alive), worker groups (the workers of one engine id), and regions with the fds
 * that keep their memory alive. Plain lists: a node has tens of workers and thousands of
 * regions, and every walk here is off any CUDA path.
 *
 * Region lifetime: OWNED while its owner lives (the shim holds the memory, we hold a copy of
 * the fd), RETAINED once the owner died (our fd alone keeps the memory) until the retention
 * timeout or memory budget releases it, PENDING when restored from the journal (no fd: it
 * arrives with the re-announce, or the record is dropped after the resync grace).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"

struct sv_client;

struct sv_region {
	struct sv_region *next; /* in the owner's list, creation order */
	struct sv_worker *owner;
	uint64_t id;
	uint8_t device_uuid[PROTO_UUID_LEN];
	uint64_t va, size;
	enum region_class cls;
	uint64_t order;
	uint64_t weights_version;
	int fd;
	enum region_state state;
	uint64_t since_ms;	   /* announced (owned) or owner died (retained), monotonic */
	bool confirmed;		   /* announced during the owner's current session */
	uint64_t checksum;	   /* of the contents at checksum_version - 1 */
	uint64_t checksum_version; /* weights version + 1 the checksum was taken at; 0: none */
	/* Recorded while the owner lived (supervisor-promote.c), what promotion compares:
	 * a checksum taken at death would bless memory corrupted before it. */
	uint64_t live_sum;
	uint64_t live_sum_version; /* weights version + 1; 0: none */
	int live_sum_mode;	   /* enum verify_mode it was taken with */
	bool live_sum_pending;	   /* a job computes it */
};

/* A shadow's scratch-backed region (PROTO_SHADOW_REGION), and what was sent for it. */
struct sv_shadow_region {
	uint64_t id, va, size, order;
	enum region_class cls;
	uint8_t device_uuid[PROTO_UUID_LEN];
	uint32_t map_pid; /* PROMOTE_MAP sent: primary pid, region id, weights version */
	uint64_t map_id, map_wver;
};

struct sv_group {
	struct sv_group *next;
	char engine_id[PROTO_MAX_STR + 1];
	unsigned n_workers;
};

struct sv_worker {
	struct sv_worker *next;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	uint64_t starttime; /* /proc/PID/stat field 22: tells a reused pid from ours */
	struct sv_group *group;
	enum worker_role role;
	int32_t rank;
	uint32_t n_devices;
	uint8_t device_uuid[PROTO_MAX_DEVICES][PROTO_UUID_LEN];
	enum worker_state state;
	int pidfd;
	void *watch; /* the event loop's watch on pidfd */
	struct sv_client *client;
	uint64_t since_ms;	     /* hello (alive) or death (dead), monotonic */
	uint64_t resync_deadline_ms; /* unconfirmed regions are dropped after it; 0: none */
	struct sv_region *regions;
	uint32_t n_regions;
	uint64_t bytes;
	/* Shadow promotion (supervisor-shadow.c). */
	pid_t pgid; /* at hello: the launched group it belongs to */
	struct sv_shadow_region *shadow_regions;
	uint32_t n_shadow_regions, cap_shadow_regions;
	bool parked;	      /* PROTO_SHADOW_PARKED received */
	uint32_t layout_n;    /* its layout, as PARKED said */
	uint64_t layout_hash; /* for a primary: computed from its regions when asked */
	bool committing;      /* PROMOTE_COMMIT sent, DONE awaited */
	bool promoted;	      /* promoted: its shim's next hello (as primary) is expected */
	bool replaced;	      /* killed with a group already replaced: its death is no news */
	bool rank_from_comm;  /* rank taken from its NCCL communicator, not from its hello */
	/* What it holds, last measured (supervisor-footprint.h); fp_ms 0: never. */
	uint64_t fp_ms;
	uint64_t fp_device; /* device memory NVML reports for it, all devices */
	bool fp_device_known;
	uint64_t fp_rss, fp_pss, fp_shmem; /* host: smaps_rollup Rss, Pss, Pss_Shmem */
	uint64_t fp_after_ms; /* rounds started before are dropped (it changed since) */
};

struct sv_registry {
	struct sv_worker *workers;
	struct sv_group *groups;
	uint32_t n_fds; /* region fds held */
	/* Called as a worker record goes (its regions gone already); NULL: nothing to tell. */
	void (*worker_removed)(struct sv_worker *w);
};

struct supervisor;

const char *worker_engine(const struct sv_worker *w);

struct sv_worker *registry_worker_find(struct sv_registry *reg, pid_t pid);
/* Creates a worker record (no pidfd yet). engine_id may be "". */
struct sv_worker *registry_worker_add(struct sv_registry *reg, pid_t pid, uid_t uid, gid_t gid,
				      const char *engine_id);
/* Moves w to another engine group (a hello can name a different engine than the journal). */
int registry_worker_set_engine(struct sv_registry *reg, struct sv_worker *w, const char *engine_id);
/* Drops the worker and every region it has (closing their fds). */
void registry_worker_remove(struct sv_registry *reg, struct sv_worker *w);

struct sv_region *registry_region_find(struct sv_worker *w, uint64_t id);
/* Adds a region (state OWNED unless the owner is dead, then RETAINED) taking fd. */
struct sv_region *registry_region_add(struct sv_registry *reg, struct sv_worker *w,
				      const struct proto_region *r, uint64_t now_ms);
/* Replaces a known region's record and fd (an update: a new weights version, a re-announce). */
void registry_region_update(struct sv_registry *reg, struct sv_region *rg,
			    const struct proto_region *r, uint64_t now_ms);
void registry_region_remove(struct sv_registry *reg, struct sv_region *rg);

/* Totals over every region of a state (or every state when state < 0). */
void registry_totals(const struct sv_registry *reg, int state, uint64_t *ret_count,
		     uint64_t *ret_bytes);
void registry_finish(struct sv_registry *reg);

/* Fills an info message from the registry's records. */
void region_to_info(const struct sv_region *rg, uint64_t now_ms, struct proto_msg *ret);
void worker_to_info(const struct sv_worker *w, uint64_t now_ms, struct proto_msg *ret);
