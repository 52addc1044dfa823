/* SPDX-License-Identifier: MIT */
/*
 * Collectives, point-to-point and groups of the emulated NCCL.
 *
 * Streams are synchronous here: an operation has completed when its call (or, inside a group,
 * ncclGroupEnd) returns. Every operation is a small state machine that advances without
 * blocking; one engine advances all the operations of a group together (nccl.h: group
 * semantics "permit concurrent progress of multiple send/receive operations" and let one
 * thread drive several communicators), and sleeps on the segment's futex in 10 ms slices
 * when none can move. A slice ends early on any peer's progress or on ncclCommAbort.
 *
 * Collectives go in steps of one slot: each rank writes its part to its own slot and raises
 * its posted counter, waits until every rank posted the step, reads what it needs from every
 * slot and raises consumed; a rank rewrites its slot only after every rank consumed the
 * previous step. Reductions run in rank order on every rank, so all ranks get bit-identical
 * results. A rank that died (or an injected hang) stops its counters: the others wait until
 * aborted, as with NCCL on a GPU. Send/recv stream bytes through a ring per ordered pair.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu-state.h"
#include "nccl-internal.h"

enum op_kind {
	OP_INIT,
	OP_ALLREDUCE,
	OP_BROADCAST,
	OP_REDUCE,
	OP_ALLGATHER,
	OP_REDUCESCATTER,
	OP_SEND,
	OP_RECV,
};

struct nccl_op {
	enum op_kind kind;
	struct ncclComm *comm;
	const uint8_t *send; /* device address, or host memory when host */
	uint8_t *recv;
	size_t count; /* elements: per rank for all-gather, the received part for reduce-scatter */
	size_t esize;
	ncclDataType_t type;
	ncclRedOp_t redop;
	int root;
	int peer;
	bool host;
	bool started;
	bool hung;
	bool done;
	int phase;
	size_t pos; /* elements done (collectives), bytes done (send/recv) */
	size_t len; /* elements of the current step */
	cudaStream_t stream;
};

struct group {
	int depth;
	struct nccl_op *ops;
	size_t n, cap;
	ncclResult_t error; /* first error of a call inside the group */
	int blocking;	    /* of its communicators: 1, 0, or -1 while it has none */
};

static __thread struct group group = {.blocking = -1};

#define WAIT_SLICE_MS 10

static bool is_collective(enum op_kind kind)
{
	return kind >= OP_ALLREDUCE && kind <= OP_REDUCESCATTER;
}

static int view(const struct nccl_op *op, const void *base, size_t off, size_t len, void **ret)
{
	const uint8_t *p = (const uint8_t *)base + off;

	if (op->host || len == 0) {
		*ret = (void *)p;
		return 0;
	}
	*ret = nccl_cuda_translate(p, len);
	if (!*ret) {
		nccl_set_last_error("rank %d: [%p, +%zu) is not mapped, accessible device memory",
				    op->comm->rank, (const void *)p, len);
		return -EFAULT;
	}
	return 0;
}

static size_t step_elems(const struct nccl_op *op)
{
	size_t slot = op->comm->shm.hdr->slot_bytes;

	if (op->kind == OP_REDUCESCATTER)
		return slot / (op->esize * (size_t)op->comm->nranks);
	return slot / op->esize;
}

static bool all_posted(const struct nccl_shm *shm, int n, uint64_t step)
{
	for (int i = 0; i < n; i++)
		if (atomic_load(&shm->ranks[i].posted) < step)
			return false;
	return true;
}

static bool all_consumed(const struct nccl_shm *shm, int n, uint64_t step)
{
	for (int i = 0; i < n; i++)
		if (atomic_load(&shm->ranks[i].consumed) < step)
			return false;
	return true;
}

static int coll_post(struct nccl_op *op)
{
	struct ncclComm *c = op->comm;
	struct nccl_shm *shm = &c->shm;
	uint8_t *slot = nccl_shm_slot(shm, c->rank);
	uint64_t step = c->step + 1;
	size_t bytes;
	void *src;
	int r;

	if (!all_consumed(shm, c->nranks, step - 1))
		return 0;
	op->len = MIN(op->count - op->pos, step_elems(op));
	bytes = op->len * op->esize;
	switch (op->kind) {
	case OP_BROADCAST:
		if (c->rank != op->root)
			break;
		/* fallthrough */
	case OP_ALLREDUCE:
	case OP_REDUCE:
	case OP_ALLGATHER:
		r = view(op, op->send, op->pos * op->esize, bytes, &src);
		if (r < 0)
			return r;
		memcpy(slot, src, bytes);
		break;
	case OP_REDUCESCATTER:
		for (int b = 0; b < c->nranks; b++) {
			r = view(op, op->send, ((size_t)b * op->count + op->pos) * op->esize, bytes,
				 &src);
			if (r < 0)
				return r;
			memcpy(slot + (size_t)b * bytes, src, bytes);
		}
		break;
	default:
		return -EINVAL;
	}
	atomic_store(&shm->ranks[c->rank].posted, step);
	c->step = step;
	op->phase = 1;
	nccl_shm_wake(shm);
	return 1;
}

/* Reduces the step's part at offset off of every slot, in rank order, into the communicator's
 * device buffer; returns its host view. */
static int reduce_slots(struct nccl_op *op, size_t off, void **ret_acc)
{
	struct ncclComm *c = op->comm;
	size_t bytes = op->len * op->esize;
	void *acc = nccl_cuda_translate((const void *)(uintptr_t)c->buf.va, bytes);

	if (!acc) {
		nccl_set_last_error("rank %d: the communicator's device buffer is not accessible",
				    c->rank);
		return -EIO;
	}
	memcpy(acc, nccl_shm_slot(&c->shm, 0) + off, bytes);
	for (int i = 1; i < c->nranks; i++)
		nccl_reduce(acc, nccl_shm_slot(&c->shm, i) + off, op->len, op->type, op->redop);
	if (op->redop == ncclAvg)
		nccl_reduce_avg_finish(acc, op->len, op->type, c->nranks);
	*ret_acc = acc;
	return 0;
}

static int coll_collect(struct nccl_op *op)
{
	struct ncclComm *c = op->comm;
	struct nccl_shm *shm = &c->shm;
	size_t bytes = op->len * op->esize;
	void *dst, *acc;
	int r;

	if (!all_posted(shm, c->nranks, c->step))
		return 0;
	switch (op->kind) {
	case OP_REDUCE:
		if (c->rank != op->root)
			break;
		/* fallthrough */
	case OP_ALLREDUCE:
		r = reduce_slots(op, 0, &acc);
		if (r < 0)
			return r;
		r = view(op, op->recv, op->pos * op->esize, bytes, &dst);
		if (r < 0)
			return r;
		memcpy(dst, acc, bytes);
		break;
	case OP_REDUCESCATTER:
		r = reduce_slots(op, (size_t)c->rank * bytes, &acc);
		if (r < 0)
			return r;
		r = view(op, op->recv, op->pos * op->esize, bytes, &dst);
		if (r < 0)
			return r;
		memcpy(dst, acc, bytes);
		break;
	case OP_BROADCAST:
		r = view(op, op->recv, op->pos * op->esize, bytes, &dst);
		if (r < 0)
			return r;
		memmove(dst, nccl_shm_slot(shm, op->root), bytes);
		break;
	case OP_ALLGATHER:
		for (int i = 0; i < c->nranks; i++) {
			r = view(op, op->recv, ((size_t)i * op->count + op->pos) * op->esize, bytes,
				 &dst);
			if (r < 0)
				return r;
			memcpy(dst, nccl_shm_slot(shm, i), bytes);
		}
		break;
	default:
		return -EINVAL;
	}
	atomic_store(&shm->ranks[c->rank].consumed, c->step);
	nccl_shm_wake(shm);
	op->pos += op->len;
	op->phase = 0;
	op->done = op->pos == op->count;
	return 1;
}

static int send_progress(struct nccl_op *op)
{
	struct ncclComm *c = op->comm;
	struct nccl_shm_chan *chan = nccl_shm_chan(&c->shm, c->rank, op->peer);
	uint8_t *ring = nccl_shm_chan_data(&c->shm, c->rank, op->peer);
	size_t cap = c->shm.hdr->chan_bytes, total = op->count * op->esize;
	uint64_t head = atomic_load_explicit(&chan->head, memory_order_relaxed);
	uint64_t tail = atomic_load_explicit(&chan->tail, memory_order_acquire);
	size_t n = MIN(cap - (size_t)(head - tail), total - op->pos);
	size_t at = head % cap, first = MIN(n, cap - at);
	void *src;
	int r;

	if (n == 0)
		return 0;
	r = view(op, op->send, op->pos, n, &src);
	if (r < 0)
		return r;
	memcpy(ring + at, src, first);
	memcpy(ring, (uint8_t *)src + first, n - first);
	atomic_store_explicit(&chan->head, head + n, memory_order_release);
	nccl_shm_wake(&c->shm);
	op->pos += n;
	op->done = op->pos == total;
	return 1;
}

static int recv_progress(struct nccl_op *op)
{
	struct ncclComm *c = op->comm;
	struct nccl_shm_chan *chan = nccl_shm_chan(&c->shm, op->peer, c->rank);
	const uint8_t *ring = nccl_shm_chan_data(&c->shm, op->peer, c->rank);
	size_t cap = c->shm.hdr->chan_bytes, total = op->count * op->esize;
	uint64_t head = atomic_load_explicit(&chan->head, memory_order_acquire);
	uint64_t tail = atomic_load_explicit(&chan->tail, memory_order_relaxed);
	size_t n = MIN((size_t)(head - tail), total - op->pos);
	size_t at = tail % cap, first = MIN(n, cap - at);
	void *dst;
	int r;

	if (n == 0)
		return 0;
	r = view(op, op->recv, op->pos, n, &dst);
	if (r < 0)
		return r;
	memcpy(dst, ring + at, first);
	memcpy((uint8_t *)dst + first, ring, n - first);
	atomic_store_explicit(&chan->tail, tail + n, memory_order_release);
	nccl_shm_wake(&c->shm);
	op->pos += n;
	op->done = op->pos == total;
	return 1;
}

static int init_progress(struct nccl_op *op)
{
	int r;

	if (op->phase == 0) {
		r = nccl_comm_join(op->comm);
		if (r < 0)
			return r;
		op->phase = 1;
		return 1;
	}
	if (!nccl_shm_all_joined(&op->comm->shm))
		return 0;
	r = nccl_comm_finish_init(op->comm);
	if (r < 0)
		return r;
	op->done = true;
	return 1;
}

/* The first operation of a kind on a communicator must finish before the next starts: the
 * same order on every rank is what matches them (collectives in call order, sends to one
 * peer in call order). Sends to different peers, receives and collectives move together. */
static bool waits_for_earlier(const struct nccl_op *ops, size_t i)
{
	const struct nccl_op *op = &ops[i];

	for (size_t j = 0; j < i; j++) {
		const struct nccl_op *e = &ops[j];

		if (e->done || e->comm != op->comm)
			continue;
		if (e->kind == OP_INIT)
			return true;
		if (is_collective(e->kind) && is_collective(op->kind))
			return true;
		if (e->kind == op->kind && (op->kind == OP_SEND || op->kind == OP_RECV) &&
		    e->peer == op->peer)
			return true;
	}
	return false;
}

static int op_progress(struct nccl_op *op)
{
	if (!op->started && op->kind != OP_INIT) {
		op->started = true;
		atomic_fetch_add(&op->comm->shm.ranks[op->comm->rank].colls, 1);
		/* emu-ctl's "make a collective hang": this operation never completes, as if a
		 * peer never arrived, until ncclCommAbort. */
		op->hung = emu_hang_get();
		if (op->count == 0) {
			op->done = !op->hung;
			return op->done ? 1 : 0;
		}
	}
	if (op->hung)
		return 0;
	switch (op->kind) {
	case OP_INIT:
		return init_progress(op);
	case OP_SEND:
		return send_progress(op);
	case OP_RECV:
		return recv_progress(op);
	default:
		return op->phase == 0 ? coll_post(op) : coll_collect(op);
	}
}

static int run_ops(struct nccl_op *ops, size_t n)
{
	int r = 0;

	for (size_t i = 0; i < n; i++)
		atomic_fetch_add(&ops[i].comm->inflight, 1);
	for (;;) {
		struct nccl_shm *wait_shm = NULL;
		uint32_t seen = 0;
		bool pending = false, progressed = false, several = false;

		for (size_t i = 0; i < n; i++) {
			struct nccl_op *op = &ops[i];
			struct nccl_shm *shm = &op->comm->shm;
			bool mapped = shm->hdr != NULL;
			uint32_t bell = mapped ? nccl_shm_doorbell(shm) : 0;
			int k;

			if (op->done)
				continue;
			/* Pairs with the store in ncclCommAbort: it waits for inflight to drop,
			 * so nothing below touches a segment it has unmapped. */
			if (atomic_load(&op->comm->aborted)) {
				nccl_set_last_error("rank %d: communicator aborted",
						    op->comm->rank);
				r = -ECANCELED;
				goto out;
			}
			pending = true;
			if (waits_for_earlier(ops, i))
				continue;
			k = op_progress(op);
			if (k < 0) {
				r = k;
				goto out;
			}
			if (k > 0) {
				progressed = true;
			} else if (mapped) {
				if (!wait_shm) {
					wait_shm = &op->comm->shm;
					seen = bell;
				} else if (wait_shm != shm) {
					several = true;
				}
			}
		}
		if (!pending)
			break;
		if (progressed)
			continue;
		if (wait_shm) {
			/* Several segments: their doorbells cannot be waited on together, so
			 * sleep briefly on one and look at all again. */
			nccl_shm_wait(wait_shm, seen, several ? 1 : WAIT_SLICE_MS);
		} else {
			struct timespec ts = {.tv_nsec = 1000000}; /* nothing to wait on: poll */

			(void)nanosleep(&ts, NULL);
		}
	}
out:
	/* An operation left half done leaves its communicator out of step with the peers: it
	 * is in error from now on, as NCCL's is after a failed or aborted kernel. */
	for (size_t i = 0; i < n; i++) {
		int none = ncclSuccess;

		if (r < 0 && !ops[i].done && ops[i].kind != OP_INIT)
			(void)atomic_compare_exchange_strong(&ops[i].comm->async_error, &none,
							     nccl_result_from_errno(r));
		atomic_fetch_sub(&ops[i].comm->inflight, 1);
	}
	return r;
}

bool nccl_in_group(void)
{
	return group.depth > 0;
}

static int group_append(const struct nccl_op *op)
{
	int blocking = nccl_comm_blocking(op->comm);

	/* group.cc: "Blocking and nonblocking communicators are not allowed in the same
	 * group." */
	if (group.blocking >= 0 && group.blocking != blocking) {
		nccl_set_last_error("Blocking and nonblocking communicators are not allowed in the "
				    "same group");
		return -EINVAL;
	}
	group.blocking = blocking;
	if (group.n == group.cap) {
		size_t cap = group.cap ? 2 * group.cap : 16;
		struct nccl_op *ops = reallocarray(group.ops, cap, sizeof(*ops));

		if (!ops)
			return -ENOMEM;
		group.ops = ops;
		group.cap = cap;
	}
	group.ops[group.n++] = *op;
	return 0;
}

int nccl_group_add_init(struct ncclComm *comm)
{
	struct nccl_op op = {.kind = OP_INIT, .comm = comm};

	return group_append(&op);
}

int nccl_group_run_init(struct ncclComm *comm)
{
	struct nccl_op op = {.kind = OP_INIT, .comm = comm};

	return run_ops(&op, 1);
}

int nccl_split_exchange(struct ncclComm *comm, const int32_t mine[2], int32_t *ret_all)
{
	struct nccl_op op = {
		.kind = OP_ALLGATHER,
		.comm = comm,
		.send = (const uint8_t *)mine,
		.recv = (uint8_t *)ret_all,
		.count = 2,
		.esize = sizeof(int32_t),
		.type = ncclInt32,
		.host = true,
	};

	return run_ops(&op, 1);
}

static ncclResult_t group_fail(ncclResult_t res)
{
	if (group.depth > 0 && group.error == ncclSuccess)
		group.error = res;
	return res;
}

/* A captured collective, at a graph replay: a fresh copy of it runs (run_ops advances it). */
static void replay_op(void *arg)
{
	struct nccl_op op = *(const struct nccl_op *)arg;
	int r = run_ops(&op, 1);

	if (r < 0)
		nccl_set_last_error("rank %d: a collective replayed from a graph failed (%d)",
				    op.comm->rank, r);
}

/* The operations of a nonblocking call (nccl-async.c): ops[0..n) then n, in one block. */
struct ops_job {
	struct nccl_op *ops;
	size_t n;
};

static void *nccl_job_ops(struct nccl_op *ops, size_t n)
{
	struct ops_job *j = malloc(sizeof(*j));

	if (j)
		*j = (struct ops_job){.ops = ops, .n = n};
	return j;
}

static int job_run(void *arg)
{
	const struct ops_job *j = arg;

	return run_ops(j->ops, j->n);
}

static void job_free(void *arg, int r)
{
	struct ops_job *j = arg;

	(void)r;
	free(j->ops);
	free(j);
}

/* Validates, then runs now (a nonblocking communicator: on a job thread), captures it, or
 * queues it for ncclGroupEnd. */
static ncclResult_t submit(struct nccl_op *op, size_t send_elems, size_t recv_elems)
{
	struct ncclComm *c = op->comm;
	int r;

	if (!nccl_comm_valid(c)) {
		nccl_set_last_error("invalid communicator");
		return group_fail(ncclInvalidArgument);
	}
	if (nccl_comm_ensure_ready(c) < 0)
		return group_fail(ncclInvalidArgument);
	if (!c->initialized && !nccl_in_group()) {
		nccl_set_last_error("communicator not initialized");
		return group_fail(ncclInvalidUsage);
	}
	/* Like ncclCommEnsureReady: a communicator in error takes no more work. */
	if (atomic_load(&c->async_error) != ncclSuccess) {
		nccl_set_last_error("rank %d: communicator is in error %d", c->rank,
				    atomic_load(&c->async_error));
		return group_fail((ncclResult_t)atomic_load(&c->async_error));
	}
	op->esize = nccl_type_size(op->type);
	if (op->esize == 0) {
		nccl_set_last_error("data type %d is not emulated", (int)op->type);
		return group_fail(ncclInvalidArgument);
	}
	if (is_collective(op->kind) && op->kind != OP_ALLGATHER && op->kind != OP_BROADCAST &&
	    !nccl_op_valid(op->redop)) {
		nccl_set_last_error("reduction operation %d is not emulated", (int)op->redop);
		return group_fail(ncclInvalidArgument);
	}
	if ((op->kind == OP_BROADCAST || op->kind == OP_REDUCE) &&
	    (op->root < 0 || op->root >= c->nranks)) {
		nccl_set_last_error("root %d out of range", op->root);
		return group_fail(ncclInvalidArgument);
	}
	if ((op->kind == OP_SEND || op->kind == OP_RECV) &&
	    (op->peer < 0 || op->peer >= c->nranks)) {
		nccl_set_last_error("peer %d out of range", op->peer);
		return group_fail(ncclInvalidArgument);
	}
	if (op->count > SIZE_MAX / op->esize / (size_t)c->nranks)
		return group_fail(ncclInvalidArgument);
	/* Like NCCL_CHECK_POINTERS: buffers must be device memory this process can reach. */
	if ((send_elems && !nccl_cuda_translate(op->send, send_elems * op->esize)) ||
	    (recv_elems && !nccl_cuda_translate(op->recv, recv_elems * op->esize))) {
		nccl_set_last_error("rank %d: buffer is not device memory", c->rank);
		return group_fail(ncclInvalidArgument);
	}
	if (nccl_in_group()) {
		r = group_append(op);
		return r < 0 ? group_fail(nccl_result_from_errno(r)) : ncclSuccess;
	}
	if (nccl_cuda_capturing(op->stream)) {
		/* NCCL's kernels are captured into the stream's graph and run at every replay;
		 * here the collective is a host node that runs it then (never freed: a graph may
		 * be replayed for the life of the process). */
		struct nccl_op *copy = malloc(sizeof(*copy));

		if (!copy)
			return ncclSystemError;
		*copy = *op;
		r = nccl_cuda_host_func(op->stream, replay_op, copy);
		if (r < 0)
			free(copy);
		return nccl_result_from_errno(r);
	}
	if (!nccl_comm_blocking(c)) {
		struct nccl_op *copy = malloc(sizeof(*copy));
		void *job = copy ? nccl_job_ops(copy, 1) : NULL;

		if (!job) {
			free(copy);
			return ncclSystemError;
		}
		*copy = *op;
		r = nccl_async_launch(&c, 1, job_run, job_free, job);
		if (r < 0) {
			job_free(job, r);
			return ncclSystemError;
		}
		return ncclInProgress;
	}
	return nccl_result_from_errno(run_ops(op, 1));
}

#define FAULT_POINT(name)                                                             \
	do {                                                                          \
		int fault_;                                                           \
		if (nccl_lib_init() == 0 && emu_fault_take(name, &fault_)) {          \
			nccl_set_last_error("%s: injected failure %d", name, fault_); \
			return group_fail((ncclResult_t)fault_);                      \
		}                                                                     \
	} while (0)

_public_ ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
				    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
				    cudaStream_t stream)
{
	struct nccl_op o = {.kind = OP_ALLREDUCE,
			    .comm = comm,
			    .send = sendbuff,
			    .recv = recvbuff,
			    .count = count,
			    .type = datatype,
			    .redop = op,
			    .stream = stream};

	FAULT_POINT("ncclAllReduce");
	return submit(&o, count, count);
}
NCCL_ALIAS(ncclAllReduce);

_public_ ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
				    ncclDataType_t datatype, int root, ncclComm_t comm,
				    cudaStream_t stream)
{
	bool is_root = nccl_comm_valid(comm) && comm->rank == root;
	struct nccl_op o = {.kind = OP_BROADCAST,
			    .comm = comm,
			    .send = sendbuff,
			    .recv = recvbuff,
			    .count = count,
			    .type = datatype,
			    .root = root,
			    .stream = stream};

	FAULT_POINT("ncclBroadcast");
	return submit(&o, is_root ? count : 0, count);
}
NCCL_ALIAS(ncclBroadcast);

_public_ ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
				ncclComm_t comm, cudaStream_t stream)
{
	bool is_root = nccl_comm_valid(comm) && comm->rank == root;
	struct nccl_op o = {.kind = OP_BROADCAST,
			    .comm = comm,
			    .send = buff,
			    .recv = buff,
			    .count = count,
			    .type = datatype,
			    .root = root,
			    .stream = stream};

	FAULT_POINT("ncclBcast");
	return submit(&o, is_root ? count : 0, count);
}
NCCL_ALIAS(ncclBcast);

/* nccl.h: "recvbuff may be NULL on all calls except for root device." */
_public_ ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
				 ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
				 cudaStream_t stream)
{
	bool is_root = nccl_comm_valid(comm) && comm->rank == root;
	struct nccl_op o = {.kind = OP_REDUCE,
			    .comm = comm,
			    .send = sendbuff,
			    .recv = recvbuff,
			    .count = count,
			    .type = datatype,
			    .redop = op,
			    .root = root,
			    .stream = stream};

	FAULT_POINT("ncclReduce");
	return submit(&o, count, is_root ? count : 0);
}
NCCL_ALIAS(ncclReduce);

_public_ ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
				    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
	size_t n = nccl_comm_valid(comm) ? (size_t)comm->nranks : 1;
	struct nccl_op o = {.kind = OP_ALLGATHER,
			    .comm = comm,
			    .send = sendbuff,
			    .recv = recvbuff,
			    .count = sendcount,
			    .type = datatype,
			    .stream = stream};

	FAULT_POINT("ncclAllGather");
	if (n > 1 && sendcount > SIZE_MAX / n)
		return group_fail(ncclInvalidArgument);
	return submit(&o, sendcount, sendcount * n);
}
NCCL_ALIAS(ncclAllGather);

_public_ ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
					ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
					cudaStream_t stream)
{
	size_t n = nccl_comm_valid(comm) ? (size_t)comm->nranks : 1;
	struct nccl_op o = {.kind = OP_REDUCESCATTER,
			    .comm = comm,
			    .send = sendbuff,
			    .recv = recvbuff,
			    .count = recvcount,
			    .type = datatype,
			    .redop = op,
			    .stream = stream};

	FAULT_POINT("ncclReduceScatter");
	if (n > 1 && recvcount > SIZE_MAX / n)
		return group_fail(ncclInvalidArgument);
	return submit(&o, recvcount * n, recvcount);
}
NCCL_ALIAS(ncclReduceScatter);

/* nccl.h: "This operation is blocking for the GPU. If multiple ncclSend and ncclRecv
 * operations need to progress concurrently to complete, they must be fused within a
 * ncclGroupStart/ncclGroupEnd section." */
_public_ ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
			       int peer, ncclComm_t comm, cudaStream_t stream)
{
	struct nccl_op o = {.kind = OP_SEND,
			    .comm = comm,
			    .send = sendbuff,
			    .count = count,
			    .type = datatype,
			    .peer = peer,
			    .stream = stream};

	FAULT_POINT("ncclSend");
	return submit(&o, count, 0);
}
NCCL_ALIAS(ncclSend);

_public_ ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
			       ncclComm_t comm, cudaStream_t stream)
{
	struct nccl_op o = {.kind = OP_RECV,
			    .comm = comm,
			    .recv = recvbuff,
			    .count = count,
			    .type = datatype,
			    .peer = peer,
			    .stream = stream};

	FAULT_POINT("ncclRecv");
	return submit(&o, 0, count);
}
NCCL_ALIAS(ncclRecv);

_public_ ncclResult_t ncclGroupStart(void)
{
	FAULT_POINT("ncclGroupStart");
	group.depth++;
	return ncclSuccess;
}
NCCL_ALIAS(ncclGroupStart);

/* The distinct communicators of ops[0..n), into ret (n entries at most); how many. */
static size_t ops_comms(const struct nccl_op *ops, size_t n, struct ncclComm **ret)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		size_t j = 0;

		while (j < k && ret[j] != ops[i].comm)
			j++;
		if (j == k)
			ret[k++] = ops[i].comm;
	}
	return k;
}

/* A group of nonblocking communicators: its operations run on a job thread and ncclGroupEnd
 * returns ncclInProgress (group.cc launches the group job of a nonblocking group on a thread
 * and returns ncclInProgress). */
static ncclResult_t group_end_async(void)
{
	struct nccl_op *ops = malloc(group.n * sizeof(*ops));
	struct ncclComm **comms = malloc(group.n * sizeof(*comms));
	void *job;
	int r = -ENOMEM;

	if (ops && comms) {
		memcpy(ops, group.ops, group.n * sizeof(*ops));
		job = nccl_job_ops(ops, group.n);
		if (job) {
			r = nccl_async_launch(comms, ops_comms(ops, group.n, comms), job_run,
					      job_free, job);
			if (r < 0)
				job_free(job, r);
			ops = NULL; /* the job's, or freed with it */
		}
	}
	free(comms);
	if (r < 0) {
		free(ops);
		return ncclSystemError;
	}
	return ncclInProgress;
}

/* Runs what the outermost group queued. After an error inside the group nothing runs, and
 * communicators whose initialization was queued are released (NCCL fails the whole group). */
_public_ ncclResult_t ncclGroupEnd(void)
{
	ncclResult_t res;
	int r = 0;

	FAULT_POINT("ncclGroupEnd");
	if (group.depth == 0) {
		nccl_set_last_error("ncclGroupEnd without ncclGroupStart");
		return ncclInvalidUsage;
	}
	if (--group.depth > 0)
		return ncclSuccess;
	res = group.error;
	if (res == ncclSuccess && group.n > 0 && group.blocking == 0) {
		res = group_end_async();
		if (res == ncclInProgress)
			goto out;
	} else if (res == ncclSuccess && group.n > 0) {
		r = run_ops(group.ops, group.n);
		res = nccl_result_from_errno(r);
	}
	for (size_t i = 0; i < group.n; i++)
		if (res != ncclSuccess && group.ops[i].kind == OP_INIT &&
		    !group.ops[i].comm->initialized && r != -ECANCELED)
			nccl_comm_release(group.ops[i].comm);
out:
	group.n = 0;
	group.error = ncclSuccess;
	group.blocking = -1;
	return res;
}
NCCL_ALIAS(ncclGroupEnd);
