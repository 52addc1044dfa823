/* SPDX-License-Identifier: MIT */
/*
 * CUDA_VISIBLE_DEVICES (suite emu): a process sees the devices the variable lists, in its
 * order, numbered from 0; an invalid entry ends the list; GPU-UUID entries, abbreviated or
 * not, name a device; nothing visible fails cuInit. The renumbered device is still the same
 * GPU: its UUID, PCI bus id and memory are the run's device's (CUDA C Programming Guide, "CUDA
 * Environment Variables"). Each case runs this program again with the variable set (the
 * driver reads it once, at cuInit), in the run of the test.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "test-emu-cuda-util.h"

#define NDEV	 3
#define HOLD_MIB 4

/* The child: "count N" (or "init R", cuInit's error), then one "bus ID uuid HEX" line per
 * ordinal; with "hold", HOLD_MIB MiB allocated on its device 0, "held", and it waits. */
static int child(bool hold)
{
	int r = cu_load(), n = 0;

	if (r != CUDA_SUCCESS) {
		printf("init %d\n", r);
		return 0;
	}
	if (cu.cuDeviceGetCount(&n) != CUDA_SUCCESS)
		return 1;
	printf("count %d\n", n);
	for (int i = 0; i < n; i++) {
		char bus[32];
		CUuuid u;
		CUdevice d;

		if (cu.cuDeviceGet(&d, i) != CUDA_SUCCESS || d != i ||
		    cu.cuDeviceGetPCIBusId(bus, sizeof(bus), d) != CUDA_SUCCESS ||
		    cu.cuDeviceGetUuid(&u, d) != CUDA_SUCCESS)
			return 1;
		printf("bus %s uuid ", bus);
		for (int k = 0; k < 16; k++)
			printf("%02x", (unsigned char)u.bytes[k]);
		printf("\n");
	}
	if (hold) {
		CUdeviceptr p;
		size_t fr, tot;

		if (cu_use_device(0) != 0 || cu.cuMemAlloc(&p, (size_t)HOLD_MIB << 20) ||
		    cu.cuMemGetInfo(&fr, &tot))
			return 1;
		printf("held total %zu\n", tot);
		fflush(stdout);
		pause();
	}
	return 0;
}

/* Runs this program as the child with CUDA_VISIBLE_DEVICES=cvd (NULL: unset); its output
 * into out. With hold, returns once it holds its memory, its pid in *ret_pid. */
static void run(const char *cvd, bool hold, char *out, size_t cap, pid_t *ret_pid)
{
	int fds[2];
	size_t len = 0;
	pid_t pid;

	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fds[1], STDOUT_FILENO);
		close(fds[0]);
		close(fds[1]);
		if (cvd)
			setenv("CUDA_VISIBLE_DEVICES", cvd, 1);
		else
			unsetenv("CUDA_VISIBLE_DEVICES");
		execl("/proc/self/exe", "test-emu-cuda-visible", hold ? "hold" : "child",
		      (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	for (;;) {
		ssize_t n = read(fds[0], out + len, cap - 1 - len);

		if (n <= 0)
			break;
		len += (size_t)n;
		out[len] = '\0';
		if (hold && strstr(out, "held"))
			break;
	}
	out[len] = '\0';
	close(fds[0]);
	if (hold) {
		*ret_pid = pid;
		return;
	}
	assert_int_equal(test_wait_exit(pid, 10000), 0);
}

/* "bus ID uuid HEX" of the run's device index dev, as the parent (seeing all) has it. */
static void line_of(int dev, char *buf, size_t cap)
{
	char bus[32];
	CUuuid u;
	int off;

	assert_int_equal(cu.cuDeviceGetPCIBusId(bus, sizeof(bus), dev), CUDA_SUCCESS);
	assert_int_equal(cu.cuDeviceGetUuid(&u, dev), CUDA_SUCCESS);
	off = snprintf(buf, cap, "bus %s uuid ", bus);
	for (int k = 0; k < 16; k++)
		off += snprintf(buf + off, cap - (size_t)off, "%02x", (unsigned char)u.bytes[k]);
}

/* The "GPU-…" string of device dev, its first len characters. */
static void uuid_string(int dev, size_t len, char *buf)
{
	CUuuid u;
	const unsigned char *b = (const unsigned char *)u.bytes;

	assert_int_equal(cu.cuDeviceGetUuid(&u, dev), CUDA_SUCCESS);
	snprintf(buf, 64,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
		 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
		 b[14], b[15]);
	buf[len] = '\0';
}

/* Expects the child's output for cvd to list exactly the run's devices devs, in order. */
static void expect(const char *cvd, const int *devs, int n)
{
	char out[4096], want[4096], line[128];
	int off = snprintf(want, sizeof(want), "count %d\n", n);

	for (int i = 0; i < n; i++) {
		line_of(devs[i], line, sizeof(line));
		off += snprintf(want + off, sizeof(want) - (size_t)off, "%s\n", line);
	}
	run(cvd, false, out, sizeof(out), NULL);
	if (strcmp(out, want) != 0)
		fail_msg("CUDA_VISIBLE_DEVICES=%s: got\n%swant\n%s", cvd ? cvd : "(unset)", out,
			 want);
}

static void indices_select_and_order(void **state)
{
	(void)state;
	expect(NULL, (const int[]){0, 1, 2}, 3);
	/* "setting CUDA_VISIBLE_DEVICES to 2,1 causes device 0 to be invisible and device 2 to
	 * be enumerated before device 1" */
	expect("2,1", (const int[]){2, 1}, 2);
	expect("1", (const int[]){1}, 1);
	/* "Setting CUDA_VISIBLE_DEVICES to 0,2,-1,1 causes devices 0 and 2 to be visible and
	 * device 1 to be invisible" */
	expect("0,2,-1,1", (const int[]){0, 2}, 2);
	expect("2,7,0", (const int[]){2}, 1); /* 7: no such device */
	expect("2,x", (const int[]){2}, 1);
}

static void uuids_name_devices(void **state)
{
	char full[64], cvd[160], abbrev[64];

	(void)state;
	uuid_string(2, 40, full);
	expect(full, (const int[]){2}, 1);
	/* "abbreviated forms are allowed; simply specify enough digits from the beginning of
	 * the GPU UUID to uniquely identify that GPU" */
	uuid_string(1, 12, abbrev);
	snprintf(cvd, sizeof(cvd), "%s,%s", full, abbrev);
	expect(cvd, (const int[]){2, 1}, 2);
	/* "GPU-" alone names every GPU: not unique, so invalid, and nothing precedes it */
	snprintf(cvd, sizeof(cvd), "GPU-,%s", full);
	{
		char out[256];

		run(cvd, false, out, sizeof(out), NULL);
		assert_string_equal(out, "init 100\n"); /* CUDA_ERROR_NO_DEVICE */
	}
}

static void nothing_visible_fails_init(void **state)
{
	char out[256];

	(void)state;
	run("", false, out, sizeof(out), NULL);
	assert_string_equal(out, "init 100\n");
	run("-1", false, out, sizeof(out), NULL);
	assert_string_equal(out, "init 100\n");
}

/* A process that sees only device 2, as its device 0, allocates on device 2: the run's
 * device 2 has that much less free, device 0 none less. */
static void renumbered_device_is_the_same_gpu(void **state)
{
	char out[4096];
	size_t f0, f2, fr, tot;
	pid_t pid;

	(void)state;
	assert_int_equal(cu_use_device(0), 0);
	assert_int_equal(cu.cuMemGetInfo(&f0, &tot), CUDA_SUCCESS);
	assert_int_equal(cu_use_device(2), 0);
	assert_int_equal(cu.cuMemGetInfo(&f2, &tot), CUDA_SUCCESS);
	run("2", true, out, sizeof(out), &pid);
	assert_non_null(strstr(out, "held total"));
	assert_int_equal(cu.cuMemGetInfo(&fr, &tot), CUDA_SUCCESS);
	assert_true(fr == f2 - ((size_t)HOLD_MIB << 20));
	assert_int_equal(cu_use_device(0), 0);
	assert_int_equal(cu.cuMemGetInfo(&fr, &tot), CUDA_SUCCESS);
	assert_true(fr == f0);
	kill(pid, SIGKILL);
	assert_int_equal(test_wait_exit(pid, 10000), 1000 + SIGKILL);
}

static int setup(void **state)
{
	(void)state;
	unsetenv("CUDA_VISIBLE_DEVICES");
	setenv("BELAYER_EMU_DEVICES", "3", 1);
	return cu_setup("64M");
}

static int teardown(void **state)
{
	(void)state;
	return cu_teardown();
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(indices_select_and_order),
		cmocka_unit_test(uuids_name_devices),
		cmocka_unit_test(nothing_visible_fails_init),
		cmocka_unit_test(renumbered_device_is_the_same_gpu),
	};

	if (argc > 1)
		return child(strcmp(argv[1], "hold") == 0);
	return cmocka_run_group_tests(tests, setup, teardown);
}
