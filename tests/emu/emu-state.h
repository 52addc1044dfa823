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

#define EMU_MAX_DEVICES 8
#define EMU_MAX_FAULTS 32
#define EMU_MAX_EVENTS 64
#define EMU_FUNC_NAME_MAX 64

/* Configuration read once per run from the environment, first process wins:
 *   BELAYER_EMU_DEVICES  number of devices (default 2)
 *   BELAYER_EMU_MEM      capacity per device, with K/M/G suffix (default 8G)
 *   BELAYER_EMU_DIR      run directory holding the state file */
int emu_state_open(void);	/* idempotent; 0 or -errno */
int emu_state_ndevices(void);
uint64_t emu_state_capacity(int dev);
const char *emu_state_dir(void);

/* Physical memory accounting, per device. charge fails with -ENOMEM past capacity. Memory is
 * uncharged when the last reference to it goes away, whichever process that is. */
int emu_mem_charge(int dev, uint64_t bytes);
void emu_mem_uncharge(int dev, uint64_t bytes);
uint64_t emu_mem_used(int dev);

/* Fault injection: "the next N calls of FUNC return RESULT" (RESULT a CUresult, ncclResult_t
 * or nvmlReturn_t as the library of FUNC defines). Returns true and sets *ret_result when a
 * rule for func fired for this call. */
int emu_fault_add(const char *func, unsigned count, int result);
bool emu_fault_take(const char *func, int *ret_result);

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
