/* SPDX-License-Identifier: MIT */
/*
 * The shim's communicator records outlive every operation that uses them (review A9): PyTorch's
 * watchdog and engines' fault handlers abort a communicator from another thread while a
 * collective call still runs, and the shim's ncclCommAbort hook then drops the record while
 * that call's nccl_op_end is still to come. shim-nccl.c is linked alone here, with the driver
 * and the supervisor connection stubbed (no driver: every operation completes "untracked"),
 * so the interleavings are played deterministically in one thread; the ASan build (suite
 * unit) turns a use after free into a failure, and the plain build faults on the counters'
 * unmapped page.
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "nccl-counters.h"
#include "shim-conn-queue.h"
#include "shim-device.h"
#include "shim-nccl.h"
#include "shim-real.h"
#include "shim-regions.h"

/* ---- what shim-nccl.c needs from the rest of the shim ---------------------------------- */

__thread int shim_busy __attribute__((tls_model("initial-exec")));
static struct real_extra no_extra;
static unsigned announced;

/* The library's side of nonblocking communicators: the state ncclCommGetAsyncError reports
 * (set by the tests), a current context, and the identity queries. Every other real pointer
 * is NULL: operations complete "untracked". */
static ncclResult_t lib_state = ncclSuccess;
static ncclComm_t ended; /* a communicator inside ncclCommAbort: the shim must not ask */
static unsigned asked_ended;

static ncclResult_t fake_get_async_error(ncclComm_t comm, ncclResult_t *st)
{
	if (comm == __atomic_load_n(&ended, __ATOMIC_ACQUIRE))
		__atomic_add_fetch(&asked_ended, 1, __ATOMIC_RELAXED);
	*st = __atomic_load_n(&lib_state, __ATOMIC_ACQUIRE);
	return ncclSuccess;
}

static CUresult fake_ctx_get_current(CUcontext *ctx)
{
	*ctx = (CUcontext)(uintptr_t)0x100;
	return CUDA_SUCCESS;
}

static ncclResult_t fake_user_rank(const ncclComm_t comm, int *rank)
{
	(void)comm;
	*rank = 3;
	return ncclSuccess;
}

static ncclResult_t fake_count(const ncclComm_t comm, int *count)
{
	(void)comm;
	*count = 4;
	return ncclSuccess;
}

void *real_lookup(const char *soname, const char *name)
{
	(void)soname;
	if (strcmp(name, "ncclCommGetAsyncError") == 0)
		return (void *)fake_get_async_error;
	if (strcmp(name, "cuCtxGetCurrent") == 0)
		return (void *)fake_ctx_get_current;
	if (strcmp(name, "ncclCommUserRank") == 0)
		return (void *)fake_user_rank;
	if (strcmp(name, "ncclCommCount") == 0)
		return (void *)fake_count;
	return NULL;
}

const struct real_extra *real_extra(void)
{
	return &no_extra;
}

void regions_lock(void)
{
}

void regions_unlock(void)
{
}

bool conn_active_locked(void)
{
	return true;
}

void conn_enqueue_locked(enum conn_item item, uint64_t id)
{
	(void)item;
	(void)id;
	announced++;
}

void shim_device_uuid(CUdevice dev, uint8_t uuid[PROTO_UUID_LEN])
{
	(void)dev;
	memset(uuid, 0, PROTO_UUID_LEN);
}

/* ---- helpers --------------------------------------------------------------------------- */

static ncclComm_t fake_comm(uintptr_t n)
{
	return (ncclComm_t)(0x1000 * n);
}

/* The counters the supervisor would map for the communicator announced last. */
static struct nccl_counters *counters_of(uint64_t id)
{
	struct proto_msg m;
	void *p;

	assert_true(nccl_build_comm(id, &m));
	p = mmap(NULL, NCCL_COUNTERS_SIZE, PROT_READ, MAP_SHARED, m.nccl_comm.fd, 0);
	assert_true(p != MAP_FAILED);
	(void)close(m.nccl_comm.fd);
	return p;
}

static uint64_t newest_id(void)
{
	uint64_t last = 0;

	for (uint64_t id = 1; id < 1000; id++) {
		struct proto_msg m;

		if (nccl_build_comm(id, &m)) {
			(void)close(m.nccl_comm.fd);
			last = id;
		}
	}
	return last;
}

/* ---- tests ----------------------------------------------------------------------------- */

static void abort_during_a_call(void **state)
{
	struct nccl_op_ticket t;
	struct nccl_counters *c;
	ncclComm_t comm = fake_comm(1);

	(void)state;
	assert_true(nccl_comm_created(comm, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 1, 0, 2, false));
	c = counters_of(newest_id());
	nccl_op_begin(comm, NCCL_OP_ALL_REDUCE, 4096, false, &t);
	assert_int_equal(__atomic_load_n(&c->in_call, __ATOMIC_ACQUIRE), 1);
	/* Another thread aborts while this one is still inside ncclAllReduce. */
	nccl_comm_gone(comm, NCCL_END_ABORT);
	assert_int_equal(__atomic_load_n(&c->state, __ATOMIC_ACQUIRE), NCCL_COMM_ENDED);
	/* The call returns (NCCL reports the abort) and the hook ends the operation. */
	nccl_op_end(&t, NULL, ncclSuccess);
	assert_int_equal(__atomic_load_n(&c->in_call, __ATOMIC_ACQUIRE), 0);
	/* The same with a failed call, and a call begun after the abort is not tracked. */
	assert_true(nccl_comm_created(comm, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 2, 0, 2, false));
	nccl_op_begin(comm, NCCL_OP_ALL_REDUCE, 4096, false, &t);
	nccl_comm_gone(comm, NCCL_END_ABORT);
	nccl_op_end(&t, NULL, ncclRemoteError);
	nccl_op_begin(comm, NCCL_OP_ALL_REDUCE, 4096, false, &t);
	assert_null(t.rec);
	nccl_op_end(&t, NULL, ncclInvalidUsage);
	(void)munmap(c, NCCL_COUNTERS_SIZE);
}

static void abort_inside_a_group(void **state)
{
	struct nccl_op_ticket t[2];
	ncclComm_t a = fake_comm(3), b = fake_comm(4);

	(void)state;
	assert_true(nccl_comm_created(a, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 3, 0, 2, false));
	assert_true(nccl_comm_created(b, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 4, 0, 2, false));
	nccl_group_start();
	/* Two communicators in one group: the second replaces the first in the lookup cache,
	 * and the entry deferred to ncclGroupEnd must still hold the first. */
	nccl_op_begin(a, NCCL_OP_SEND, 64, true, &t[0]);
	nccl_op_end(&t[0], NULL, ncclSuccess);
	nccl_op_begin(b, NCCL_OP_RECV, 64, true, &t[1]);
	nccl_op_end(&t[1], NULL, ncclSuccess);
	nccl_comm_gone(a, NCCL_END_ABORT);
	nccl_comm_gone(b, NCCL_END_DESTROY);
	nccl_group_end(ncclSuccess);
	nccl_group_start();
	assert_true(nccl_comm_created(a, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 5, 0, 2, false));
	nccl_op_begin(a, NCCL_OP_SEND, 64, true, &t[0]);
	nccl_op_end(&t[0], NULL, ncclSuccess);
	nccl_comm_gone(a, NCCL_END_ABORT);
	nccl_group_end(ncclSystemError);
}

/* The same address reused by a new communicator: the lookup cache must not hand out the old
 * record (its counters would move instead of the new one's). */
static void address_reused(void **state)
{
	struct nccl_op_ticket t;
	struct nccl_counters *c;
	ncclComm_t comm = fake_comm(6);

	(void)state;
	assert_true(nccl_comm_created(comm, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 6, 0, 2, false));
	nccl_op_begin(comm, NCCL_OP_ALL_REDUCE, 8, false, &t);
	nccl_op_end(&t, NULL, ncclSuccess);
	nccl_comm_gone(comm, NCCL_END_DESTROY);
	assert_true(nccl_comm_created(comm, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 7, 0, 2, false));
	c = counters_of(newest_id());
	nccl_op_begin(comm, NCCL_OP_ALL_REDUCE, 8, false, &t);
	nccl_op_end(&t, NULL, ncclSuccess);
	assert_int_equal(__atomic_load_n(&c->coll_enqueued, __ATOMIC_ACQUIRE), 1);
	assert_int_equal(__atomic_load_n(&c->coll_completed, __ATOMIC_ACQUIRE), 1);
	nccl_comm_gone(comm, NCCL_END_DESTROY);
	(void)munmap(c, NCCL_COUNTERS_SIZE);
}

/* A thread that used a communicator exits after it was destroyed: its cached reference goes
 * with it (LeakSanitizer in the ASan build sees a record left behind). */
static void *one_call(void *arg)
{
	struct nccl_op_ticket t;

	nccl_op_begin(arg, NCCL_OP_BROADCAST, 8, false, &t);
	nccl_op_end(&t, NULL, ncclSuccess);
	nccl_comm_gone(arg, NCCL_END_DESTROY);
	return NULL;
}

static void thread_exit_drops_its_cache(void **state)
{
	pthread_t th;
	ncclComm_t comm = fake_comm(8);

	(void)state;
	assert_true(nccl_comm_created(comm, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 8, 0, 2, false));
	assert_int_equal(pthread_create(&th, NULL, one_call, comm), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
}

static void set_state(ncclResult_t st)
{
	__atomic_store_n(&lib_state, st, __ATOMIC_RELEASE);
}

/* Waits (bounded) until *v reaches want, as the shim's poller advances it. */
static bool reaches(const uint64_t *v, uint64_t want)
{
	for (int i = 0; i < 5000; i++) {
		if (__atomic_load_n(v, __ATOMIC_ACQUIRE) >= want)
			return true;
		(void)poll(NULL, 0, 1);
	}
	return false;
}

static bool announced_reaches(unsigned want)
{
	for (int i = 0; i < 5000; i++) {
		if (__atomic_load_n(&announced, __ATOMIC_ACQUIRE) >= want)
			return true;
		(void)poll(NULL, 0, 1);
	}
	return false;
}

/* Review B4: a collective that returned ncclInProgress is not complete, nor one issued after
 * it, while the library says ncclInProgress; both complete once it says ncclSuccess. */
static void nonblocking_waits_for_the_library(void **state)
{
	struct nccl_op_ticket t;
	struct nccl_counters *c;
	ncclComm_t comm = fake_comm(9);

	(void)state;
	set_state(ncclInProgress);
	assert_true(nccl_comm_created(comm, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 9, 0, 2, false));
	c = counters_of(newest_id());
	nccl_op_begin(comm, NCCL_OP_ALL_REDUCE, 8, false, &t);
	nccl_op_end(&t, NULL, ncclInProgress);
	nccl_op_begin(comm, NCCL_OP_ALL_REDUCE, 8, false, &t);
	nccl_op_end(&t, NULL, ncclSuccess);
	assert_int_equal(__atomic_load_n(&c->coll_enqueued, __ATOMIC_ACQUIRE), 2);
	/* Nothing can complete them while the state is ncclInProgress. */
	assert_int_equal(__atomic_load_n(&c->coll_completed, __ATOMIC_ACQUIRE), 0);
	set_state(ncclSuccess);
	assert_true(reaches(&c->coll_completed, 2));
	nccl_comm_gone(comm, NCCL_END_DESTROY);
	(void)munmap(c, NCCL_COUNTERS_SIZE);
}

/* An abort while an operation waits: from nccl_comm_ending on, the poller asks the library
 * nothing about the communicator being freed (20 ms of polling at 500 us would). */
static void nonblocking_abort_stops_the_questions(void **state)
{
	struct nccl_op_ticket t;
	ncclComm_t comm = fake_comm(10);

	(void)state;
	set_state(ncclInProgress);
	assert_true(nccl_comm_created(comm, NULL, NCCL_ORIGIN_INIT_RANK, NULL, 10, 0, 2, false));
	nccl_op_begin(comm, NCCL_OP_ALL_REDUCE, 8, false, &t);
	nccl_op_end(&t, NULL, ncclInProgress);
	nccl_comm_ending(comm, NCCL_END_ABORT);
	__atomic_store_n(&ended, comm, __ATOMIC_RELEASE);
	(void)poll(NULL, 0, 20); /* the real ncclCommAbort runs */
	nccl_comm_gone(comm, NCCL_END_ABORT);
	assert_int_equal(__atomic_load_n(&asked_ended, __ATOMIC_ACQUIRE), 0);
	__atomic_store_n(&ended, NULL, __ATOMIC_RELEASE);
	set_state(ncclSuccess);
}

/* An init that returned ncclInProgress is announced, with the library's rank and size, only
 * once it says ncclSuccess; a nonblocking split's child is taken from *newcomm when the
 * caller's ncclCommGetAsyncError on the parent says ncclSuccess. */
static void nonblocking_init_and_split(void **state)
{
	ncclComm_t comm = fake_comm(11), child = NULL;
	struct proto_msg m;
	unsigned before;
	uint64_t id, parent_id;

	(void)state;
	set_state(ncclInProgress);
	before = __atomic_load_n(&announced, __ATOMIC_ACQUIRE);
	assert_true(
		nccl_comm_created(comm, NULL, NCCL_ORIGIN_INIT_RANK_CONFIG, NULL, 11, 1, 2, true));
	assert_int_equal(__atomic_load_n(&announced, __ATOMIC_ACQUIRE), before);
	set_state(ncclSuccess);
	assert_true(announced_reaches(before + 1));
	parent_id = newest_id();
	assert_true(nccl_build_comm(parent_id, &m));
	assert_int_equal(m.nccl_comm.rank, 1); /* given by the call: kept */
	assert_int_equal(m.nccl_comm.nranks, 2);
	(void)close(m.nccl_comm.fd);

	nccl_split_pending(comm, &child, NCCL_ORIGIN_SPLIT, 7);
	assert_false(nccl_comm_polled(comm, ncclInProgress));
	child = fake_comm(12); /* NCCL stores it, then the parent says ncclSuccess */
	assert_true(nccl_comm_polled(comm, ncclSuccess));
	assert_true(announced_reaches(before + 2));
	id = newest_id();
	assert_true(id > parent_id);
	assert_true(nccl_build_comm(id, &m));
	assert_int_equal(m.nccl_comm.rank, 3); /* asked from the library, not 0 of 1 */
	assert_int_equal(m.nccl_comm.nranks, 4);
	assert_int_equal(m.nccl_comm.parent_id, parent_id);
	(void)close(m.nccl_comm.fd);
	/* Polled again: the split was taken once. */
	assert_false(nccl_comm_polled(comm, ncclSuccess));
	nccl_comm_gone(child, NCCL_END_DESTROY);

	/* A caller that polls the child NCCL stored, not the parent. */
	child = NULL;
	nccl_split_pending(comm, &child, NCCL_ORIGIN_SPLIT, 8);
	child = fake_comm(13);
	before = __atomic_load_n(&announced, __ATOMIC_ACQUIRE);
	assert_true(nccl_comm_polled(child, ncclSuccess));
	assert_true(announced_reaches(before + 1));
	assert_true(nccl_build_comm(newest_id(), &m));
	assert_int_equal(m.nccl_comm.parent_id, parent_id);
	(void)close(m.nccl_comm.fd);
	nccl_comm_gone(child, NCCL_END_DESTROY);
	nccl_comm_gone(comm, NCCL_END_DESTROY);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(abort_during_a_call),
		cmocka_unit_test(abort_inside_a_group),
		cmocka_unit_test(address_reused),
		cmocka_unit_test(thread_exit_drops_its_cache),
		cmocka_unit_test(nonblocking_waits_for_the_library),
		cmocka_unit_test(nonblocking_abort_stops_the_questions),
		cmocka_unit_test(nonblocking_init_and_split),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
