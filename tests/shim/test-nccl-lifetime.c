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

void *real_lookup(const char *soname, const char *name)
{
	(void)soname;
	(void)name;
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(abort_during_a_call),
		cmocka_unit_test(abort_inside_a_group),
		cmocka_unit_test(address_reused),
		cmocka_unit_test(thread_exit_drops_its_cache),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
