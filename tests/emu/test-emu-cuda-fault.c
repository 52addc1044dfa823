/* SPDX-License-Identifier: MIT */
/*
 * Fault injection through the emu-ctl tool, observed through the driver (and through
 * emu-state for what NVML reports): failing calls, bit flips, XID/ECC events, hangs.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "emu-state.h"
#include "test-emu-cuda-util.h"
#include "test-util.h"

#define GRAN	    (2u << 20)
#define CU_OK(call) assert_int_equal((call), CUDA_SUCCESS)
#define CTL(...)    test_emu_ctl((const char *const[]){__VA_ARGS__, NULL})

static int group_setup(void **state)
{
	return cu_setup(NULL);
}

static int group_teardown(void **state)
{
	return cu_teardown();
}

static int setup(void **state)
{
	return cu_use_device(0) == CUDA_SUCCESS ? 0 : -1;
}

static void test_fail_next_calls(void **state)
{
	CUdeviceptr p;
	char buf[8] = "abc";

	assert_int_equal(CTL("fail", "cuMemAlloc", "2", "CUDA_ERROR_OUT_OF_MEMORY"), 0);
	assert_int_equal(cu.cuMemAlloc(&p, 4096), CUDA_ERROR_OUT_OF_MEMORY);
	assert_int_equal(cu.cuMemAlloc(&p, 4096), CUDA_ERROR_OUT_OF_MEMORY);
	CU_OK(cu.cuMemAlloc(&p, 4096));
	/* a numeric result, and a rule on the versioned name */
	assert_int_equal(CTL("fail", "cuMemcpyHtoD_v2", "1", "700"), 0);
	assert_int_equal(cu.cuMemcpyHtoD(p, buf, sizeof(buf)), CUDA_ERROR_ILLEGAL_ADDRESS);
	CU_OK(cu.cuMemcpyHtoD(p, buf, sizeof(buf)));
	CU_OK(cu.cuMemFree(p));
	/* bad usage is refused */
	assert_int_equal(CTL("fail", "cuMemAlloc", "0", "2"), 2);
	assert_int_equal(CTL("fail", "cuMemAlloc", "1", "CUDA_ERROR_NO_SUCH_THING"), 2);
}

static int fail_child(void *arg)
{
	CUdeviceptr p;

	/* the rule set by the parent's emu-ctl applies here too */
	CHILD_CHECK(cu.cuMemAlloc(&p, 4096) == CUDA_ERROR_LAUNCH_FAILED);
	CHILD_CU(cu.cuMemAlloc(&p, 4096));
	return 0;
}

static void test_fail_applies_to_every_process(void **state)
{
	CUdeviceptr p;

	assert_int_equal(CTL("fail", "cuMemAlloc", "1", "CUDA_ERROR_LAUNCH_FAILED"), 0);
	assert_int_equal(test_wait_exit(test_fork(fail_child, NULL), 10000), 0);
	/* the child consumed the only failure */
	CU_OK(cu.cuMemAlloc(&p, 4096));
	CU_OK(cu.cuMemFree(p));
}

static void test_flip_own_memory(void **state)
{
	CUdeviceptr p;
	uint64_t id, off;
	uint8_t b[2] = {0xff, 0xff};
	char sid[32], soff[32];

	CU_OK(cu.cuMemAlloc(&p, 8192));
	CU_OK(cu.cuMemsetD8(p, 0, 8192));
	assert_int_equal(cu.alloc_id(p + 5000, &id, &off), 0);
	assert_int_equal(off, 5000);
	snprintf(sid, sizeof(sid), "%" PRIu64, id);
	snprintf(soff, sizeof(soff), "%" PRIu64, off);
	assert_int_equal(CTL("flip", sid, soff, "0x80"), 0);
	CU_OK(cu.cuMemcpyDtoH(b, p + 4999, 2));
	assert_int_equal(b[0], 0);
	assert_int_equal(b[1], 0x80);
	/* past the end of the allocation */
	assert_int_equal(CTL("flip", sid, "99999999"), 1);
	CU_OK(cu.cuMemFree(p));
	/* gone with its last reference */
	assert_int_equal(CTL("flip", sid, "0"), 1);
}

struct peer {
	int sock;
};

/* Holds an imported allocation; reports the byte at 100 when asked. */
static int holder_child(void *arg)
{
	struct peer *p = arg;
	CUmemGenericAllocationHandle h;
	CUdeviceptr d;
	uint64_t word;
	uint8_t b;
	int fd = test_recv_fd(p->sock, &word);

	CHILD_CHECK(fd >= 0);
	CHILD_CU(cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd);
	CHILD_CU(cu_vmm_map(h, GRAN, 0, &d));
	CHILD_CHECK(test_send_u64(p->sock, 0) == 0);
	CHILD_CHECK(test_recv_u64(p->sock, &word) == 0);
	CHILD_CU(cu.cuMemcpyDtoH(&b, d + 100, 1));
	CHILD_CHECK(test_send_u64(p->sock, b) == 0);
	(void)test_recv_u64(p->sock, &word);
	return 0;
}

static void test_flip_seen_by_other_process(void **state)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr d;
	struct peer peer;
	uint64_t id, off, word;
	char sid[32];
	int sv[2], fd;
	pid_t pid;

	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	peer.sock = sv[1];
	pid = test_fork(holder_child, &peer);
	assert_true(pid > 0);
	CU_OK(cu_vmm_create(0, GRAN, true, &h));
	CU_OK(cu_vmm_map(h, GRAN, 0, &d));
	CU_OK(cu.cuMemsetD8(d, 0x0f, GRAN));
	assert_int_equal(cu.alloc_id(d, &id, &off), 0);
	CU_OK(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	assert_int_equal(test_send_fd(sv[0], fd, 0), 0);
	close(fd);
	assert_int_equal(test_recv_u64(sv[0], &word), 0);
	/* only the child holds the memory now */
	cu_vmm_unmap(d, GRAN);
	CU_OK(cu.cuMemRelease(h));
	snprintf(sid, sizeof(sid), "%" PRIu64, id);
	assert_int_equal(CTL("flip", sid, "100", "0xf0"), 0);
	assert_int_equal(test_send_u64(sv[0], 0), 0);
	assert_int_equal(test_recv_u64(sv[0], &word), 0);
	assert_int_equal(word, 0xff);
	assert_int_equal(test_send_u64(sv[0], 0), 0);
	assert_int_equal(test_wait_exit(pid, 10000), 0);
	close(sv[0]);
	close(sv[1]);
}

static void test_xid_ecc_hang(void **state)
{
	uint64_t xids = emu_xid_count(1), cursor = xids;
	uint64_t corrected = emu_ecc_count(0, false), uncorrected = emu_ecc_count(0, true);
	unsigned xid;

	assert_int_equal(CTL("xid", "1", "79"), 0);
	assert_int_equal(CTL("xid", "1", "48"), 0);
	assert_int_equal(emu_xid_count(1), xids + 2);
	assert_true(emu_xid_next(1, &cursor, &xid));
	assert_int_equal(xid, 79);
	assert_true(emu_xid_next(1, &cursor, &xid));
	assert_int_equal(xid, 48);
	assert_false(emu_xid_next(1, &cursor, &xid));
	assert_int_equal(CTL("xid", "5", "79"), 2); /* no such device */

	assert_int_equal(CTL("ecc", "0", "--uncorrected", "3"), 0);
	assert_int_equal(CTL("ecc", "0", "5"), 0);
	assert_int_equal(emu_ecc_count(0, true), uncorrected + 3);
	assert_int_equal(emu_ecc_count(0, false), corrected + 5);

	assert_int_equal(CTL("hang", "on"), 0);
	assert_true(emu_hang_get());
	assert_int_equal(CTL("hang", "off"), 0);
	assert_false(emu_hang_get());
	assert_int_equal(CTL("hang", "maybe"), 2);
	assert_int_equal(CTL("status"), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_fail_next_calls, setup),
		cmocka_unit_test_setup(test_fail_applies_to_every_process, setup),
		cmocka_unit_test_setup(test_flip_own_memory, setup),
		cmocka_unit_test_setup(test_flip_seen_by_other_process, setup),
		cmocka_unit_test_setup(test_xid_ecc_hang, setup),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
