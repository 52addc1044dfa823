/* SPDX-License-Identifier: MIT */
/* The process's tracked regions (shim-regions.c), under one reader-writer lock. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "proto.h"

enum region_kind {
	REGION_KIND_CONVERTED, /* a cuMemAlloc_v2 the shim served with VMM */
	REGION_KIND_USER,      /* a cuMemCreate handle of the program */
};

struct region {
	uint64_t id;
	uint64_t order;
	enum region_kind kind;
	enum region_class cls;
	CUmemGenericAllocationHandle handle;
	int dev;
	uint64_t va;	   /* 0 until mapped (user regions) */
	uint64_t size;	   /* physical (mapped) size */
	uint64_t req_size; /* what cuMemAlloc_v2 was asked for */
	uint64_t weights_version;
	bool exportable;
	uint32_t retains;     /* user region: cuMemRetainAllocationHandle references not released */
	bool released;	      /* user region: cuMemRelease seen, waiting for the unmap */
	bool announce_queued; /* an announce of it waits in the queue */
	bool announced;	      /* the current session has been told about it */
	/* Shadow mode (shim-shadow.c). A scratch region is backed by the device's scratch
	 * allocation mapped chunk by chunk over [va, va + size); it is not exportable. A user
	 * scratch region's handle is a fake one the program holds (shadow_handle_is_fake). */
	bool scratch;
	bool priv; /* scratch region backed by its own allocation (handle), not the shared one */
	bool has_pending;		      /* an imported primary region waits in pending */
	CUmemGenericAllocationHandle pending; /* imported by PROMOTE_MAP */
	CUmemGenericAllocationHandle backing; /* user region promoted: the memory it maps */
	int pending_error;		      /* the last PROMOTE_MAP's import failure, -errno */
	CUmemAllocationProp prop;	      /* user scratch region: what the program asked for */
};

/* Converted allocation: inserted mapped. Returns 0 or -ENOMEM. */
int regions_add_converted(CUmemGenericAllocationHandle h, int dev, uint64_t va, uint64_t size,
			  uint64_t req_size, enum region_class cls, bool exportable, bool scratch,
			  bool priv);
/* Removes the converted allocation based at va into *ret (copy). -ENOENT: not ours;
 * -EINVAL: va is inside one of ours but not its base. */
int regions_remove_converted(uint64_t va, struct region *ret);
/* Base and requested size of the converted allocation holding va; -ENOENT otherwise. */
int regions_converted_range(uint64_t va, uint64_t *ret_base, uint64_t *ret_size);
bool regions_is_converted(uint64_t va);
/* For legacy IPC of converted memory: base, id and mapped size of the converted allocation
 * holding va; -ENOENT otherwise. */
int regions_converted_info(uint64_t va, uint64_t *ret_base, uint64_t *ret_id, uint64_t *ret_size);
/* A fresh POSIX fd of converted region id (still alive, of that size). */
int regions_export_fd(uint64_t id, uint64_t *ret_size);

/* prop: the program's (kept for a scratch region, whose fake handle the shim answers for). */
int regions_add_user(CUmemGenericAllocationHandle h, int dev, uint64_t size, enum region_class cls,
		     bool exportable, bool scratch, const CUmemAllocationProp *prop);
/* A reservation [va, va + size) is freed: what was mapped there is no longer to be inherited
 * (regions_user_mapped). */
void regions_forget_va(uint64_t va, uint64_t size);
/* cuMemRelease(h): whether it drops a retain's reference rather than the creation's. */
bool regions_user_unretain(CUmemGenericAllocationHandle h);
/* Shadow: whether va starts a mapped user scratch region (its device in *ret_dev). */
bool regions_user_scratch_at(uint64_t va, int *ret_dev);
/* The memory a promoted fake handle maps now; 0 when h is no promoted region's. */
CUmemGenericAllocationHandle regions_user_backing(CUmemGenericAllocationHandle h);
/* The device of user region h, fallback when unknown. */
int regions_user_device(CUmemGenericAllocationHandle h, int fallback);
/* Whether h is a live user scratch region's handle. */
bool regions_user_is_scratch(CUmemGenericAllocationHandle h);
void regions_user_mapped(CUmemGenericAllocationHandle h, uint64_t va);
void regions_user_unmapped(uint64_t va, uint64_t size);
void regions_user_released(CUmemGenericAllocationHandle h);

/* A write of len bytes at va happened: bumps versions of weights regions it touches. */
void regions_note_write(uint64_t va, uint64_t len);
bool regions_have_weights(void);

/* For the connection: fills a message for region id; false when it is gone. Exports the fd
 * (owned by the message). */
bool regions_build_announce(uint64_t id, struct proto_msg *ret);
/* The SHADOW_REGION message for region id; false when it is gone or not scratch. */
bool regions_build_shadow_region(uint64_t id, struct proto_msg *ret);
/* Runs under_lock with the regions locked, then lists every region to announce. New regions
 * after under_lock ran are queued as usual, so nothing is announced twice or missed. */
int regions_snapshot(void (*under_lock)(void), uint64_t **ret_ids, size_t *ret_n,
		     uint64_t **ret_shadow_ids, size_t *ret_shadow_n);
void regions_lock(void);
void regions_unlock(void);
/* With the lock held: every record, in id (= creation) order. */
struct region *const *regions_all_locked(size_t *ret_n);
/* With the lock held: a record by id, NULL when gone. */
struct region *regions_get_locked(uint64_t id);
/* With the lock held: the mapped region holding va, or the newest user region of handle h;
 * NULL when none. */
struct region *regions_at_locked(uint64_t va);
struct region *regions_by_handle_locked(CUmemGenericAllocationHandle h);
/* With the lock held: r's class becomes cls. */
void regions_set_class_locked(struct region *r, enum region_class cls);
/* With the lock held: when (CLOCK_MONOTONIC ms) a tracked allocation or a scratch region
 * last appeared or went, and a generation that changes with the scratch layout (the shadow
 * parks once both stay quiet). */
void regions_last_change_locked(uint64_t *ret_ms, uint64_t *ret_layout_gen);
/* With the lock held: releases the imported primary memory r still holds (PROMOTE_MAP). */
void regions_drop_pending_locked(struct region *r);
void regions_reset_after_fork(void);
/* With the lock held: r's class changed; the supervisor hears about it again. */
void regions_reannounce_locked(struct region *r);
/* With the lock held: scratch region r now has memory of its own (r->handle); it leaves the
 * shadow's layout (the supervisor is told it is gone) and is announced like other memory. */
void regions_unscratch_locked(struct region *r);
