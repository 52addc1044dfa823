/* SPDX-License-Identifier: MIT */
/*
 * State shared by every process of one emulated-GPU run: device capacity accounting, injected
 * faults, NVML events. It lives in one file, $BELAYER_EMU_DIR/state (default
 * /tmp/belayer-emu-$UID), mapped MAP_SHARED by libcuda.so.1, libnccl.so.2, libnvidia-ml.so.1
 * and the emu-ctl tool, updated with atomics and a robust process-shared mutex. Statically
 * linked into each of them (libemu-state.a). Test-only.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EMU_MAX_DEVICES	  8
#define EMU_MAX_FAULTS	  32
#define EMU_MAX_EVENTS	  64
#define EMU_FUNC_NAME_MAX 64

/* Configuration read once per run from the environment, first process wins:
 *   BELAYER_EMU_DEVICES  number of devices (default 2)
 *   BELAYER_EMU_MEM      capacity per device, with K/M/G suffix (default 8G)
 *   BELAYER_EMU_DIR      run directory holding the state file */
int emu_state_open(void); /* idempotent; 0 or -errno */
int emu_state_ndevices(void);
uint64_t emu_state_capacity(int dev);
const char *emu_state_dir(void);
/* Random id chosen when the state file is created; it prefixes the name of every memfd of the
 * run, so that runs sharing a machine do not count each other's memory. */
const char *emu_state_run_id(void);
/* Identity of device dev, the same in libcuda (cuDeviceGetUuid, cuDeviceGetPCIBusId) and
 * libnvidia-ml: a UUID derived from the run id and the index (stable for the run), and the
 * PCI bus id "0000:BB:00.0" with bus 0x18 + dev. 0 or -EINVAL. */
int emu_state_uuid(int dev, unsigned char ret_uuid[16]);
int emu_state_pci_bus_id(int dev, char *buf, size_t len);
/* "GPU-" and the 16 UUID bytes as 8-4-4-4-12 lowercase hex digits (nvidia-smi's form, which
 * nvmlDeviceGetUUID returns and CUDA_VISIBLE_DEVICES takes). 0, -EINVAL or -ENOSPC. */
int emu_state_uuid_string(int dev, char *buf, size_t len);

/* Physical memory accounting, per device. charge fails with -ENOMEM past capacity. Memory is
 * uncharged when the last reference to it goes away, whichever process that is.
 *
 * How: the kernel is the truth. Every allocation is one memfd named
 * "belayer-emu:<run-id>:d<dev>:<alloc-id>:<bytes>"; it is live while any process holds an fd
 * or a mapping of it (found by scanning /proc/PID/fd and /proc/PID/maps). The shared counter
 * is only an upper bound kept for the fast path: charges add to it, frees do not subtract, and
 * it is reset to the scanned truth whenever a charge would exceed capacity and whenever
 * emu_mem_used() is asked. uncharge is a no-op kept for callers of the original interface. */
int emu_mem_charge(int dev, uint64_t bytes);
void emu_mem_uncharge(int dev, uint64_t bytes);
uint64_t emu_mem_used(int dev); /* scans: exact */

/* Creates the memfd of a new allocation of bytes on dev and charges it, atomically with
 * respect to every other process's charges and scans. Returns the fd (O_CLOEXEC) or -errno
 * (-ENOMEM past capacity); *ret_id receives the allocation id, unique within the run. */
int emu_mem_create(int dev, uint64_t bytes, uint64_t *ret_id);
/* Scans the kernel's view: live allocations on dev (-1: all devices) and their bytes. */
int emu_mem_scan(int dev, uint64_t *ret_count, uint64_t *ret_bytes);
/* Parses a memfd name (as /proc shows it, with or without "/memfd:" and " (deleted)") of this
 * run. Returns 0 and fills the out-parameters, or -EINVAL for any other name. */
int emu_mem_parse_name(const char *name, int *ret_dev, uint64_t *ret_id, uint64_t *ret_bytes);
/* XORs mask into the byte at offset of allocation id, through any process's fd of it
 * (/proc/PID/fd/N), so it works whoever holds the memory. -ENOENT if no longer live,
 * -ERANGE past its end. */
int emu_mem_flip(uint64_t id, uint64_t offset, uint8_t mask);

/* Per process, what NVML's running-process queries report: fn(pid, bytes) for every process
 * that maps allocations of this run on dev (-1: any), bytes the sum of the distinct
 * allocations it maps (a handle mapped at many addresses, a shadow's scratch granule, counts
 * once; a handle only held as an fd, an imported one not mapped yet, not at all). Stops at the
 * first fn returning nonzero and returns that; else 0 or -errno. */
int emu_mem_for_each_process(int dev, int (*fn)(int pid, uint64_t bytes, void *userdata),
			     void *userdata);

/* Fault injection: "the next N calls of FUNC return RESULT" (RESULT a CUresult, ncclResult_t
 * or nvmlReturn_t as the library of FUNC defines). Returns true and sets *ret_result when a
 * rule for func fired for this call. Costs one atomic load while no rule is set. */
int emu_fault_add(const char *func, unsigned count, int result);
bool emu_fault_take(const char *func, int *ret_result);
/* True while any rule has calls left: one atomic load, for callers that check several names. */
bool emu_fault_armed(void);
/* Number of rules with calls left (for status output). */
unsigned emu_fault_pending(void);
/* Calls left and result of the rule at index i (< EMU_MAX_FAULTS); false when that slot is
 * empty. */
bool emu_fault_get(unsigned i, char ret_func[EMU_FUNC_NAME_MAX], unsigned *ret_count,
		   int *ret_result);

/* XID events, per device, as NVML delivers them. Readers keep a cursor. */
int emu_xid_raise(int dev, unsigned xid);
/* Returns true and the next event at or after *cursor, advancing it. */
bool emu_xid_next(int dev, uint64_t *cursor, unsigned *ret_xid);
uint64_t emu_xid_count(int dev); /* all events ever raised on dev */
uint64_t emu_ecc_count(int dev, bool uncorrected);
int emu_ecc_raise(int dev, bool uncorrected, uint64_t count);

/* Collective hang injection: while set, the next collective on any communicator of the run
 * blocks as if a peer never arrived (until ncclCommAbort). */
int emu_hang_set(bool on);
bool emu_hang_get(void);
