/* SPDX-License-Identifier: MIT */
/*
 * Which class a new region gets, most specific rule first:
 *   1. the thread's explicit tag (belayer_set_tag), then torch_memory_saver's current tag
 *      while its region is active on this thread;
 *   2. the calling library: memory allocated from inside libnccl is NCCL's;
 *   3. the engine's phase. Engines load weights, then size the KV cache from cuMemGetInfo
 *      and allocate it. A cuMemGetInfo counts as that probe only once some weights exist
 *      (vLLM and SGLang also query memory before loading); the first large allocation after
 *      it opens the KV window, consecutive large allocations of the same size as that first
 *      one stay in it, and any other tracked allocation, a tracked free or a new cuMemGetInfo
 *      closes it. Before the first probe everything is weights; after it, what is not KV is
 *      other.
 * Why the same size: engines allocate the KV cache as equal tensors (vLLM: one per layer or
 * per KV-cache group, sized alike; SGLang: a K and a V buffer per layer), and put index and
 * metadata buffers right next to them (vLLM's block tables and slot mapping, SGLang's
 * free-slot list), which are large too but of another size. Those must not be KV: in a
 * shadow KV is scratch, aliased with every other scratch region, and an index table there
 * reads back what the KV writes put over it (review finding 2). As `other` they get real
 * memory of their own in a shadow and stay out of the layout: an engine rebuilds them every
 * step.
 * The end of the load phase (the first KV allocation) is also when writes into weights
 * regions start to count as weight updates.
 *
 * Positive mode (review finding 2): the phase heuristic cannot tell an index table allocated
 * before the probe (vLLM's block tables at runner init) from a weight, nor one of a KV
 * tensor's size from KV. So once a process tags anything (belayer_set_tag, a
 * torch_memory_saver tag we know, belayer_tags_only() as the Python import hook calls it,
 * or BELAYER_CLASSIFY=tags from the start), the heuristic is off for good: only what is
 * allocated under a weights/kv tag is weights/kv, and every other allocation is `other`
 * (real memory in a shadow, never scratch, never swapped). Engines that tag nothing keep the
 * heuristic.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "belayer.h"
#include "shim-classify.h"
#include "shim-config.h"
#include "util.h"

static __thread int explicit_class __attribute__((tls_model("initial-exec"))) = -1;
static __thread int tms_class __attribute__((tls_model("initial-exec"))) = -1;
static __thread bool tms_active __attribute__((tls_model("initial-exec")));

static pthread_mutex_t phase_lock = PTHREAD_MUTEX_INITIALIZER;
static bool weights_seen;
static bool probe_armed;
static bool kv_window;
static uint64_t kv_size; /* the size of the KV window's first allocation */
static bool load_done;
static bool tags_only; /* positive mode: set once, never cleared (not even by fork) */

static int tag_to_class(const char *tag, enum region_class *ret)
{
	if (region_class_from_string(tag, ret) == 0)
		return 0;
	if (strncmp(tag, "weight", 6) == 0 || strcmp(tag, "model") == 0) {
		*ret = REGION_WEIGHTS;
		return 0;
	}
	if (strncmp(tag, "kv", 2) == 0) {
		*ret = REGION_KV;
		return 0;
	}
	return -EINVAL;
}

_public_ int belayer_set_tag(const char *tag)
{
	enum region_class cls;

	if (!tag || tag_to_class(tag, &cls) < 0)
		return -EINVAL;
	__atomic_store_n(&tags_only, true, __ATOMIC_RELEASE);
	explicit_class = (int)cls;
	return 0;
}

_public_ void belayer_tags_only(void)
{
	__atomic_store_n(&tags_only, true, __ATOMIC_RELEASE);
}

_public_ void belayer_clear_tag(void)
{
	explicit_class = -1;
}

/* torch_memory_saver keeps its tag in a C++ thread_local with setters only, which Python
 * calls through ctypes (dlsym): the shim sees the setters go by. Unknown tags ("default",
 * "cuda_graph") do not classify; the next rule decides. */
static void (*real_tms_set_current_tag)(const char *);
static void (*real_tms_set_interesting_region)(bool);

static void tms_set_current_tag_hook(const char *tag)
{
	enum region_class cls;

	tms_class = tag && tag_to_class(tag, &cls) == 0 ? (int)cls : -1;
	if (tms_class >= 0)
		__atomic_store_n(&tags_only, true, __ATOMIC_RELEASE);
	if (real_tms_set_current_tag)
		real_tms_set_current_tag(tag);
}

static void tms_set_interesting_region_hook(bool on)
{
	tms_active = on;
	if (real_tms_set_interesting_region)
		real_tms_set_interesting_region(on);
}

void *tms_hook_for(const char *name, void *real)
{
	if (strcmp(name, "tms_set_current_tag") == 0) {
		if (real != (void *)tms_set_current_tag_hook)
			__atomic_store_n(&real_tms_set_current_tag,
					 (__typeof__(real_tms_set_current_tag))real,
					 __ATOMIC_RELEASE);
		return (void *)tms_set_current_tag_hook;
	}
	if (strcmp(name, "tms_set_interesting_region") == 0) {
		if (real != (void *)tms_set_interesting_region_hook)
			__atomic_store_n(&real_tms_set_interesting_region,
					 (__typeof__(real_tms_set_interesting_region))real,
					 __ATOMIC_RELEASE);
		return (void *)tms_set_interesting_region_hook;
	}
	return real;
}

static bool caller_is_nccl(const void *caller)
{
	Dl_info info;
	const char *base;

	if (!caller || dladdr(caller, &info) == 0 || !info.dli_fname)
		return false;
	base = strrchr(info.dli_fname, '/');
	base = base ? base + 1 : info.dli_fname;
	return strncmp(base, "libnccl", 7) == 0;
}

enum region_class classify_region(const void *caller, uint64_t size)
{
	enum region_class cls;
	bool large = size >= shim_config()->kv_min;

	if (explicit_class >= 0)
		cls = (enum region_class)explicit_class;
	else if (tms_active && tms_class >= 0)
		cls = (enum region_class)tms_class;
	else if (caller_is_nccl(caller))
		return REGION_NCCL;
	else if (__atomic_load_n(&tags_only, __ATOMIC_ACQUIRE) || shim_config()->classify_tags)
		return REGION_OTHER;
	else {
		pthread_mutex_lock(&phase_lock);
		if (large && probe_armed) {
			probe_armed = false;
			kv_window = true;
			kv_size = size;
			cls = REGION_KV;
		} else if (large && kv_window && size == kv_size)
			cls = REGION_KV;
		else {
			kv_window = false;
			cls = load_done ? REGION_OTHER : REGION_WEIGHTS;
		}
		if (cls == REGION_KV)
			__atomic_store_n(&load_done, true, __ATOMIC_RELEASE);
		if (cls == REGION_WEIGHTS)
			weights_seen = true;
		pthread_mutex_unlock(&phase_lock);
		return cls;
	}

	/* A tag still tells us about the phase. */
	pthread_mutex_lock(&phase_lock);
	if (cls == REGION_KV)
		__atomic_store_n(&load_done, true, __ATOMIC_RELEASE);
	else if (cls == REGION_WEIGHTS)
		weights_seen = true;
	pthread_mutex_unlock(&phase_lock);
	return cls;
}

void classify_note_mem_get_info(void)
{
	pthread_mutex_lock(&phase_lock);
	kv_window = false;
	/* Armed once: engines query free memory again after the KV cache exists (vLLM's
	 * capture_model and sleep, SGLang's get_available_gpu_memory), and what follows those
	 * (graph pools, per-step buffers) is no KV cache. */
	if (weights_seen && !__atomic_load_n(&load_done, __ATOMIC_ACQUIRE))
		probe_armed = true;
	pthread_mutex_unlock(&phase_lock);
}

void classify_note_tracked_free(void)
{
	pthread_mutex_lock(&phase_lock);
	kv_window = false;
	pthread_mutex_unlock(&phase_lock);
}

bool classify_load_done(void)
{
	return __atomic_load_n(&load_done, __ATOMIC_ACQUIRE);
}

void classify_reset_after_fork(void)
{
	pthread_mutex_init(&phase_lock, NULL);
	weights_seen = probe_armed = kv_window = false;
	kv_size = 0;
	__atomic_store_n(&load_done, false, __ATOMIC_RELEASE);
}
