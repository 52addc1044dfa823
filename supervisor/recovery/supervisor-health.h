/* SPDX-License-Identifier: MIT */
/*
 * Health checks the recovery path calls before it reuses retained memory (DESIGN §1.2):
 *   owner   - the region's owner and every other primary of its engine group are gone
 *             (pidfds, checked now), so nothing can still write the memory;
 *   gpu     - NVML (dlopen'ed): the device answers, no fatal XID and no new uncorrected ECC
 *             error since the last good check. No NVML: verdict "unknown", never a crash;
 *   content - a checksum of the region's bytes, recorded per weights version and compared on
 *             later checks. Bytes are read from the fd as a file (memfd-backed emulator)
 *             or through the CUDA driver (import the fd, map, copy to the host).
 * The GPU and content checks may block (driver calls, big reads): they run on the offload
 * thread. The owner check reads the registry and runs on the loop.
 */
#pragma once

#include <stdint.h>

#include "proto.h"
#include "supervisor-config.h"
#include "supervisor.h"

struct health_result {
	enum health_check check;
	enum health_verdict verdict;
	int32_t dev;
	uint32_t pid;
	char message[PROTO_MAX_STR + 1];
};

int health_owner_check(struct supervisor *s, struct sv_worker *w, struct health_result *ret);

struct health_gpu;

/* Loads NVML and starts collecting events. Never fails: without NVML every verdict is
 * "unknown" with the reason. */
struct health_gpu *health_gpu_new(const char *nvml_library, const struct id_list *fatal_xids);
void health_gpu_free(struct health_gpu *g);
/* Checks device dev (-1: every device) into ret[0..max). Returns the number of results. */
size_t health_gpu_check(struct health_gpu *g, int dev, struct health_result *ret, size_t max);
/* The same verdicts for the recovery path, on its critical path: "the device answers" is the
 * uncorrected-ECC query instead of the memory query (which the emulator answers by scanning
 * /proc, and which a recovery does not need). */
size_t health_gpu_check_fast(struct health_gpu *g, int dev, struct health_result *ret, size_t max);

/* Device memory each of pids[0..n) uses, summed over the devices (NVML's running compute
 * processes: usedGpuMemory), into ret_bytes (UINT64_MAX: listed on no device, or without a
 * figure: NVML's pids are those of its own pid namespace, so a supervisor in another one
 * finds none). 0, or -EOPNOTSUPP (no NVML or no nvmlDeviceGetComputeRunningProcesses_v3),
 * -EIO (no device answered). */
int health_gpu_process_memory(struct health_gpu *g, const pid_t *pids, size_t n,
			      uint64_t *ret_bytes);

/* Checksum (zlib crc32) of the first size bytes of the memory behind fd on the device whose
 * UUID is dev_uuid. Returns 0 or -errno (-EOPNOTSUPP: no way to read this memory). */
int health_content_checksum(enum content_method method, const char *cuda_library, int fd,
			    uint64_t size, const uint8_t dev_uuid[PROTO_UUID_LEN],
			    uint64_t *ret_sum);
