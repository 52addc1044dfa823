/* SPDX-License-Identifier: MIT */
/*
 * Internals shared by the shim's modules. The exported wrappers (hooks-*.c) stay thin and call
 * into the logic declared here; nothing here is exported.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "hooks-table.h"
#include "proto.h"

/* cuda.h renames cuGetProcAddress to its _v2; the shim exports both under their own names. */
#undef cuGetProcAddress

/* Every hooked driver symbol, declared with its cudaTypedefs.h type: a wrapper whose
 * definition disagrees with cuda.h fails to compile. */
#define X(sym, proc, version, ptds, pfn) \
	extern __typeof__(*(pfn)0) sym __attribute__((visibility("default")));
BELAYER_CUDA_HOOKS(X)
#undef X

/* Set while the shim itself is inside the driver, so a driver that calls its own exported
 * entry points (or a callback that re-enters us) passes straight through. initial-exec: the
 * shim is preloaded, and a dynamic TLS lookup would cost every hooked call. */
extern __thread int shim_busy __attribute__((tls_model("initial-exec")));

/* ---- real functions (shim-real.c) ---- */

enum hook_id {
#define X(sym, proc, version, ptds, pfn) HOOK_##sym,
	BELAYER_CUDA_HOOKS(X)
#undef X
	_HOOK_CUDA_MAX,
};

enum nccl_hook_id {
#define X(sym, ret, params, args) NCCL_HOOK_##sym,
	BELAYER_NCCL_HOOKS(X)
#undef X
	_NCCL_HOOK_MAX,
};

struct hook_info {
	const char *name;
	const char *proc;
	int version;
	int ptds;
	void *wrapper;
};

extern const struct hook_info cuda_hooks[_HOOK_CUDA_MAX];
extern const struct hook_info nccl_hooks[_NCCL_HOOK_MAX];

/* Real function of a hooked symbol, resolved on first use; NULL when the driver lacks it. */
void *real_cuda(enum hook_id id);
void *real_nccl(enum nccl_hook_id id);
#define REAL(sym)      ((__typeof__(&sym))real_cuda(HOOK_##sym))
#define REAL_NCCL(sym) ((__typeof__(&sym))real_nccl(NCCL_HOOK_##sym))
/* Calls the real function, or reports the driver as not initialized when it has none. */
#define CALL_REAL(sym, ...) (REAL(sym) ? REAL(sym)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

/* Remembers where a hooked symbol really lives when a program found it through dlsym or
 * cuGetProcAddress, for drivers that are not reachable by name from the shim. */
void real_cuda_learn(enum hook_id id, void *fn);
void real_nccl_learn(enum nccl_hook_id id, void *fn);

/* Unhooked driver functions the shim calls itself. Any of them may be NULL. */
struct real_extra {
	PFN_cuCtxGetDevice_v2000 cuCtxGetDevice;
	PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute;
	PFN_cuDeviceGetCount_v2000 cuDeviceGetCount;
	PFN_cuDeviceGet_v2000 cuDeviceGet;
	PFN_cuDeviceGetUuid_v11040 cuDeviceGetUuid_v2;
	PFN_cuDeviceCanAccessPeer_v4000 cuDeviceCanAccessPeer;
	PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity;
	PFN_cuStreamSynchronize_v2000 cuStreamSynchronize;
	PFN_cuStreamSynchronize_v7000_ptsz cuStreamSynchronize_ptsz;
	PFN_cuCtxSynchronize_v2000 cuCtxSynchronize;
	PFN_cuMemImportFromShareableHandle_v10020 cuMemImportFromShareableHandle;
	PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent;
};
const struct real_extra *real_extra(void);

/* A function of the library with this soname if it is loaded, else from the global scope
 * after us; never loads anything. */
void *real_lookup(const char *soname, const char *name);

/* glibc's dlsym, never ours. */
void *real_dlsym(void *handle, const char *name);

/* ---- configuration (shim-config.c), read once ---- */

enum alloc_policy {
	ALLOC_POLICY_VMM,
	ALLOC_POLICY_PASSTHROUGH,
};

struct shim_config {
	enum alloc_policy policy;
	uint64_t alloc_threshold; /* cuMemAlloc_v2 of at least this many bytes is converted */
	uint64_t kv_min;	  /* the phase heuristic's "large allocation" */
	uint32_t queue_max;
	char socket_path[108];
	char engine_id[PROTO_MAX_STR + 1];
	enum worker_role role; /* as started; shim_role() is the current one */
	int32_t rank;
	uint64_t park_quiet_ms; /* shadow: quiet time after the KV allocation before parking */
	uint64_t private_max;	/* shadow: converted weights/kv regions up to this get their own
				 * memory instead of scratch (index buffers live there) */
};
const struct shim_config *shim_config(void);

/* ---- classification (shim-classify.c) ---- */

/* The class a region created now, by code at caller, of size bytes, gets. */
enum region_class classify_region(const void *caller, uint64_t size);
void classify_note_mem_get_info(void);
void classify_note_tracked_free(void);
bool classify_load_done(void);
void classify_reset_after_fork(void);
/* torch_memory_saver: dlsym of its setters returns these, which record and forward. */
void *tms_hook_for(const char *name, void *real);

/* ---- regions (shim-regions.c) ---- */

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

int regions_add_user(CUmemGenericAllocationHandle h, int dev, uint64_t size, enum region_class cls,
		     bool exportable, bool scratch);
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
void regions_reset_after_fork(void);

/* ---- supervisor connection (shim-conn.c) ---- */

enum conn_item {
	CONN_ANNOUNCE = 1,
	CONN_RELEASE = 2,
	CONN_SHADOW_REGION = 3,
	/* NCCL communicators (shim-nccl.c); the id is the communicator's. */
	CONN_NCCL_COMM = 4,
	CONN_NCCL_FINALIZE = 5,
	CONN_NCCL_DESTROY = 6,
	CONN_NCCL_ABORT = 7,
};

/* Starts the connection thread once per process (after fork, once per child). */
void conn_start(void);
/* Queues an item; called with the regions lock held. Never blocks. */
void conn_enqueue_locked(enum conn_item item, uint64_t id);
bool conn_active_locked(void);

/* ---- shadow mode and promotion (shim-shadow.c) ---- */

/* The current role: the configured one until a promotion makes a shadow a primary. */
enum worker_role shim_role(void);
/* Shadow: whether a new region of this class is backed by scratch. */
bool shadow_wants_scratch(enum region_class cls);
/* With shim_busy held: maps the device's scratch allocation over [va, va + size) chunk by
 * chunk and grants access. Returns a CUresult; on failure nothing stays mapped. */
CUresult shadow_scratch_map(int dev, uint64_t va, uint64_t size);
/* With shim_busy held: unmaps the scratch chunks of [va, va + size) (all of them, whatever
 * fails; the first failure is returned). */
CUresult shadow_scratch_unmap(int dev, uint64_t va, uint64_t size);
/* Size of one scratch chunk on dev (the allocation granularity), 0 when unknown. */
size_t shadow_granularity(int dev);
/* A fresh fake handle for a program's scratch-backed cuMemCreate. */
CUmemGenericAllocationHandle shadow_fake_handle(void);
bool shadow_handle_is_fake(CUmemGenericAllocationHandle h);
/* Called by the regions module, lock held, when a tracked allocation or a scratch region
 * appears or goes: restarts the quiet period, changes the layout. */
void shadow_note_alloc_locked(bool layout_changed);
/* With the lock held: releases what a region about to be deleted still holds of promotion. */
void shadow_region_forget_locked(struct region *r);
/* Connection thread: a new session began (re-send regions and parked state). */
void shadow_session_reset(void);
/* Connection thread: ms until shadow_tick wants to run again (it may send PARKED). */
long shadow_tick(int (*send)(const struct proto_msg *m));
/* Connection thread: handles a message from the supervisor; replies through send. Returns
 * 1 when the process just became a primary (a new hello and full announce must follow). */
int shadow_on_message(struct proto_msg *m, int (*send)(const struct proto_msg *m));
/* The SHADOW_REGION message for region id; false when it is gone or not scratch. */
bool regions_build_shadow_region(uint64_t id, struct proto_msg *ret);
void shadow_reset_after_fork(void);

/* ---- the logic behind the CUDA wrappers (shim-alloc.c) ---- */

void shim_first_use(void);
/* The device's UUID (cached), zeros when unknown. */
void shim_device_uuid(CUdevice dev, uint8_t uuid[PROTO_UUID_LEN]);
CUresult shim_mem_alloc(CUdeviceptr *dptr, size_t bytesize, const void *caller);
CUresult shim_mem_free(CUdeviceptr dptr);
CUresult shim_mem_free_async(CUdeviceptr dptr, CUstream stream, bool ptsz);
CUresult shim_mem_get_address_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
CUresult shim_mem_create(CUmemGenericAllocationHandle *handle, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags,
			 const void *caller);
CUresult shim_mem_release(CUmemGenericAllocationHandle handle);
CUresult shim_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
		      CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult shim_mem_unmap(CUdeviceptr ptr, size_t size);
CUresult shim_pointer_get_attribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr);
CUresult shim_pointer_get_attributes(unsigned int n, CUpointer_attribute *attrs, void **data,
				     CUdeviceptr ptr);
CUresult shim_ipc_get_mem_handle(CUipcMemHandle *handle, CUdeviceptr dptr);
CUresult shim_ipc_open_mem_handle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
CUresult shim_ipc_close_mem_handle(CUdeviceptr dptr);
void ipc_reset_after_fork(void);
/* Access for dev and every peer that can reach it, as cudaMalloc memory offers. */
CUresult shim_set_access(CUdeviceptr va, size_t size, CUdevice dev);
CUresult shim_mem_get_info(size_t *free_bytes, size_t *total_bytes);
void shim_note_write(CUdeviceptr dst, size_t len);

/* cuGetProcAddress post-processing: the wrapper for what the driver returned, or fn. */
void *shim_proc_address(const char *symbol, void *fn, int version, cuuint64_t flags);
/* dlsym post-processing: our wrapper when name is hooked (learning fn), else fn. */
void *shim_dlsym_result(const char *name, void *fn);
