/* SPDX-License-Identifier: MIT */
/*
 * What each worker of a configured engine holds (issue 22 item 4: what a parked shadow really
 * costs): its device memory as NVML reports it per process (running compute processes,
 * usedGpuMemory, summed over the devices: on a real GPU its context, its own allocations and
 * the driver's for it; on the emulator the distinct allocations it maps), and its host memory
 * from /proc/PID/smaps_rollup (Rss, Pss and, of Pss, the shared-memory part: on the emulator
 * the device memory it maps is memfd pages, so it shows there too). Measured off the loop
 * every FOOTPRINT_MS for every alive worker of a configured engine, kept in the worker, shown
 * by `belayerctl workers` and its --json.
 */
#pragma once

#include <stdint.h>

#define FOOTPRINT_MS 2000

struct supervisor;
struct sv_worker;
struct proto_msg;

/* Starts a measurement when the last one is FOOTPRINT_MS old (engines_tick). */
void footprint_tick(struct supervisor *s);
/* w changed (a shadow parked): its measurements so far, and those in flight, say nothing of it
 * now; the next round starts at once. */
void footprint_restart(struct sv_worker *w);
/* Adds w's last measurement to its PROTO_WORKER_INFO. */
void footprint_worker_info(const struct sv_worker *w, struct proto_msg *m);

/* Rss, Pss and Pss_Shmem (bytes) of pid from its smaps_rollup. 0 or -errno. */
int footprint_smaps(pid_t pid, uint64_t *ret_rss, uint64_t *ret_pss, uint64_t *ret_shmem);
