/* SPDX-License-Identifier: MIT */
/*
 * NCCL communicator tracking (DESIGN §1.4): a record per communicator the process creates
 * (rank, size, CUDA device, hash of its unique id), its progress counters in a memfd the
 * supervisor maps (common/nccl-counters.h), and completion observed by a shim thread that
 * polls CUDA events recorded after each operation, so the host thread never waits for it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <nccl.h>

#include "proto.h"

/* A communicator the real library just made. uid: its unique id (NULL when the shim did not
 * see one: InitAll); parent: the communicator it was split/shrunk from (NULL: none); salt
 * makes derived hashes differ (the split color, the shrink's excluded ranks). rank and nranks
 * may be -1: asked from the library then. in_progress: the call returned ncclInProgress (a
 * nonblocking communicator still initialising, whose queries NCCL refuses): rank, size and
 * device are asked, and the record announced, once ncclCommGetAsyncError says ncclSuccess.
 * Returns whether the shim tracks communicators: the caller starts the connection then
 * (conn_start). */
bool nccl_comm_created(ncclComm_t comm, const ncclUniqueId *uid, enum nccl_origin origin,
		       ncclComm_t parent, uint64_t salt, int rank, int nranks, bool in_progress);
/* ncclCommInitAll made comms[0..n): one clique, one hash. Returns as nccl_comm_created. */
bool nccl_initall_created(ncclComm_t *comms, int n);
/* A split/shrink of a nonblocking parent returned ncclInProgress: NCCL stores the child into
 * *newcomm when it is made, before the parent leaves ncclInProgress. The child is taken from
 * there by nccl_comm_polled, in the thread that sees the parent's ncclSuccess (the caller's
 * storage is alive while it polls for it). */
void nccl_split_pending(ncclComm_t parent, ncclComm_t *newcomm, enum nccl_origin origin,
			uint64_t salt);
/* ncclCommGetAsyncError(comm) just said state, in a caller's thread: comm is the parent of a
 * pending split (its children are taken on ncclSuccess) or a child NCCL already stored.
 * Returns whether a child communicator became tracked (the caller starts the connection
 * then). */
bool nccl_comm_polled(ncclComm_t comm, ncclResult_t state);
/* Before the real Finalize/Destroy/Abort: finalize marks it; destroy/abort stop the shim's
 * own calls on it (the poller's ncclCommGetAsyncError) and end the record once the real call
 * returned (nccl_comm_gone). */
void nccl_comm_ending(ncclComm_t comm, enum nccl_end how);
void nccl_comm_gone(ncclComm_t comm, enum nccl_end how);
/* Around one operation: begin counts it as issued (before the real call, so a rank blocked
 * inside shows it), end records its completion event on stream (or defers that to the
 * outermost ncclGroupEnd). When the call (or ncclGroupEnd) returned ncclInProgress, NCCL has
 * not necessarily put the work on the stream yet: the poller records the event once
 * ncclCommGetAsyncError says ncclSuccess. */
struct nccl_op_ticket {
	void *rec;
	uint64_t seq;
	bool p2p;
};
void nccl_op_begin(ncclComm_t comm, uint32_t op, uint64_t bytes, bool p2p,
		   struct nccl_op_ticket *ret);
void nccl_op_end(const struct nccl_op_ticket *t, cudaStream_t stream, ncclResult_t r);
void nccl_group_start(void);
void nccl_group_end(ncclResult_t r);
/* Split/shrink derive the child's hash from the parent's split ordinal: every rank splits
 * in the same order. Returns the parent's next ordinal (0 when unknown). */
uint64_t nccl_comm_next_split(ncclComm_t parent);

/* Connection thread: the announce of communicator id (dup of its memfd owned by the
 * message); false when gone. */
bool nccl_build_comm(uint64_t id, struct proto_msg *ret);
/* Connection thread, new session: announces every live communicator. */
int nccl_announce_all(int (*send)(const struct proto_msg *m));
void nccl_reset_after_fork(void);
