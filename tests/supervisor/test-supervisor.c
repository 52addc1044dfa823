/* SPDX-License-Identifier: MIT */
/*
 * belayer-supervisor end to end: a real daemon process, real workers (shim-workload under
 * LD_PRELOAD=libbelayer.so on the emulated GPU), real peers over its socket, belayerctl.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <zlib.h>

#include "belayer-emu.h"
#include "fdpass.h"
#include "proto.h"
#include "sv-test.h"
#include "test-util.h"
#include "util.h"

#define MIB ((uint64_t)1 << 20)

static struct sv sv;

static int setup(void **state)
{
	sv_setup(&sv);
	return 0;
}

static int teardown(void **state)
{
	sv_teardown(&sv);
	return 0;
}

/* The 16 bytes shim-workload's fill(p, seed) writes at the start of a region. */
static void expect_fill(const uint8_t *p, uint8_t seed)
{
	for (int i = 0; i < 16; i++)
		if (p[i] != (uint8_t)(seed + i))
			fail_msg("byte %d is %#x, want %#x", i, p[i], (uint8_t)(seed + i));
}

/* Fetches region id of pid over fd (a hello'd connection). Returns 0 with *ret holding the
 * REGION_FD reply (its fd ours), or -code of the ERROR reply. */
static int fetch(int fd, pid_t pid, uint64_t id, struct proto_msg *ret)
{
	struct proto_msg m = {.type = PROTO_REGION_FETCH};

	m.fetch.pid = (uint32_t)pid;
	m.fetch.id = id;
	assert_int_equal(proto_send(fd, &m, 0), 0);
	assert_int_equal(client_recv(fd, ret, SV_WAIT_MS), 0);
	if (ret->type == PROTO_ERROR)
		return -ret->error.code;
	assert_int_equal(ret->type, PROTO_REGION_FD);
	return 0;
}

/* Reads the region's first bytes the way a shadow worker would: import the fd through the
 * (emulated) driver, map it at a VA of ours, and look through the emulator's translation.
 * In a child: each test has its own emulated-GPU run, and a process joins one run only. */
static void read_through_driver(int fd, uint64_t size, uint8_t out[16], uint64_t *ret_alloc_id)
{
	struct {
		uint8_t bytes[16];
		uint64_t alloc_id;
		int ok;
	} res = {0};
	int p[2], status;
	pid_t pid;

	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
				       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
		CUmemGenericAllocationHandle h;
		CUdeviceptr va = 0;
		CUcontext ctx;
		CUdevice dev;
		uint64_t off;
		const uint8_t *b;

		if (cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
		    cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS &&
		    cuCtxSetCurrent(ctx) == CUDA_SUCCESS &&
		    cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
			    CUDA_SUCCESS &&
		    cuMemAddressReserve(&va, size, 0, 0, 0) == CUDA_SUCCESS &&
		    cuMemMap(va, size, 0, h, 0) == CUDA_SUCCESS &&
		    cuMemSetAccess(va, size, &acc, 1) == CUDA_SUCCESS &&
		    (b = belayer_emu_translate(va, 16)) &&
		    belayer_emu_alloc_id(va, &res.alloc_id, &off) == 0) {
			memcpy(res.bytes, b, 16);
			res.ok = 1;
		}
		(void)!write(p[1], &res, sizeof(res));
		_exit(0);
	}
	close(p[1]);
	assert_int_equal(read(p[0], &res, sizeof(res)), (ssize_t)sizeof(res));
	close(p[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(res.ok, 1);
	memcpy(out, res.bytes, 16);
	if (ret_alloc_id)
		*ret_alloc_id = res.alloc_id;
}

/* Bytes of emulated device memory any process still references, asked in a child: the
 * emulator binds a process to the run it first touches, and each test has its own run. */
static uint64_t live_bytes(void)
{
	uint64_t bytes = 0;
	int p[2], status;
	pid_t pid;

	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (belayer_emu_live_allocations(-1, &bytes) < 0)
			bytes = 0;
		(void)!write(p[1], &bytes, sizeof(bytes));
		_exit(0);
	}
	close(p[1]);
	assert_int_equal(read(p[0], &bytes, sizeof(bytes)), (ssize_t)sizeof(bytes));
	close(p[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	return bytes;
}

static pid_t fork_checked(void)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	return pid;
}

static int wait_child(pid_t pid)
{
	int status;

	while (waitpid(pid, &status, 0) < 0)
		assert_int_equal(errno, EINTR);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The "engine" workload's RL update (its last write) reaches the supervisor through the
 * shim's queue after the sixth region: wait for it, or what follows (a kill, a restart) can
 * come first and the test would check a version the supervisor was or was not told about. */
static void wait_rl_update(pid_t pid)
{
	struct proto_msg m[16];

	for (uint64_t deadline = mono_ms() + SV_WAIT_MS;; (void)poll(NULL, 0, 10)) {
		int n = ctl_collect(&sv, CTL_REGIONS, (uint32_t)pid, CTL_ACT_NONE, -1, m, 16);

		if (n == 6 && m[1].region_info.weights_version == 1)
			break;
		if (mono_ms() > deadline)
			fail_msg("the RL update never reached the supervisor (%d regions)", n);
	}
}

/* The main retention test: a real engine-like worker registers its regions through the real
 * shim, is SIGKILLed, and the supervisor still holds the memory; a permitted process (same
 * uid, same engine group) receives the fds and reads the bytes the worker wrote. */
static void retains_memory_of_killed_worker(void **state)
{
	struct proto_msg m[16], r;
	struct worker w;
	uint64_t live_before, bytes;
	uint8_t got[16];
	int fd;

	sv_start(&sv, NULL);
	worker_start(&w, &sv, "engine-a", "engine");
	assert_true(wait_regions(&sv, w.pid, REGION_OWNED, 6));
	assert_int_equal(metric(&sv, "belayer_workers", "state=\"alive\""), 1);
	wait_rl_update(w.pid);

	pid_t dead = w.pid;
	int status = worker_kill(&w, SIGKILL);

	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	/* Seen through the pidfd: every region becomes retained, none is lost. */
	assert_true(wait_regions(&sv, dead, REGION_RETAINED, 6));
	assert_int_equal(metric(&sv, "belayer_region_bytes", "state=\"retained\""), 66 * MIB);
	assert_int_equal(metric(&sv, "belayer_worker_exits_total", ""), 1);
	/* The emulator counts the memory as alive: only the supervisor's fds hold it now. */
	bytes = live_bytes();
	assert_true(bytes >= 66 * MIB);
	live_before = bytes;

	/* The regions in creation order: 1 and 2 are the weights. */
	assert_int_equal(ctl_collect(&sv, CTL_REGIONS, (uint32_t)dead, CTL_ACT_NONE, -1, m, 16), 6);
	assert_int_equal(m[0].region_info.cls, REGION_WEIGHTS);
	assert_int_equal(m[1].region_info.cls, REGION_WEIGHTS);
	assert_int_equal(m[1].region_info.weights_version, 1);

	fd = client_hello(&sv, "engine-a");
	assert_true(fd >= 0);
	assert_int_equal(fetch(fd, dead, m[0].region_info.id, &r), 0);
	assert_int_equal(r.region_fd.pid, (uint32_t)dead);
	assert_int_equal(r.region_fd.region.size, 8 * MIB);
	assert_int_equal(r.region_fd.region.cls, REGION_WEIGHTS);
	read_through_driver(r.region_fd.region.fd, r.region_fd.region.size, got, NULL);
	expect_fill(got, 1);
	proto_msg_finish(&r);

	/* The second weights region holds the RL update (fill seed 3 after 2). */
	assert_int_equal(fetch(fd, dead, m[1].region_info.id, &r), 0);
	{
		const uint8_t *p = mmap(NULL, 16, PROT_READ, MAP_SHARED, r.region_fd.region.fd, 0);

		assert_true(p != MAP_FAILED);
		expect_fill(p, 3);
		munmap((void *)p, 16);
	}
	proto_msg_finish(&r);
	close(fd);
	assert_int_equal(metric(&sv, "belayer_regions_fetched_total", ""), 2);

	/* Still held after the fetcher is gone: fetching never consumes. */
	assert_int_equal(count_regions(&sv, dead, REGION_RETAINED), 6);
	assert_int_equal(live_bytes(), live_before);
}

/* A process of another engine group, or of another uid, gets no fd. */
static void fetch_refused_to_other_group_and_uid(void **state)
{
	static const char *const settings[] = {"supervisor.socket_mode=0666", NULL};
	struct proto_msg r;
	struct worker w;
	pid_t dead, child;
	int fd, before;

	TEST_REQUIRE(test_is_root(), "switching uid needs root");
	sv_start(&sv, settings);
	/* The socket directory must let another uid reach the socket. */
	assert_int_equal(chmod(sv.dir, 0755), 0);
	worker_start(&w, &sv, "engine-b", "small");
	assert_true(wait_regions(&sv, w.pid, REGION_OWNED, 1));
	dead = w.pid;
	(void)worker_kill(&w, SIGKILL);
	assert_true(wait_regions(&sv, dead, REGION_RETAINED, 1));

	/* Same uid, other engine: EPERM. */
	fd = client_hello(&sv, "engine-other");
	assert_int_equal(fetch(fd, dead, 1, &r), -EPERM);
	close(fd);
	/* From here on this process is a known (shadow) worker: its pidfd is held. The checksum
	 * recorded at the worker's death runs off the loop with a dup of the region's fd: a
	 * health request queues behind it, so once answered that dup is closed. */
	{
		struct proto_msg m[8];

		assert_true(ctl_collect(&sv, CTL_HEALTH, 0, CTL_ACT_NONE, -1, m, 8) > 0);
	}
	before = sv_count_fds(&sv);
	/* No engine at all: EPERM as well. */
	fd = client_hello(&sv, "");
	assert_int_equal(fetch(fd, dead, 1, &r), -EPERM);
	close(fd);
	/* No hello: the engine group is unknown, EPROTO. */
	fd = client_connect(&sv);
	assert_int_equal(fetch(fd, dead, 1, &r), -EPROTO);
	close(fd);

	/* Same engine, other uid: EACCES, and no fd in the reply. */
	child = fork_checked();
	if (child == 0) {
		struct proto_msg rr;
		int cfd, e;

		if (setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
			_exit(10);
		cfd = client_hello(&sv, "engine-b");
		if (cfd < 0)
			_exit(11);
		e = fetch(cfd, dead, 1, &rr);
		_exit(e == -EACCES ? 0 : 12);
	}
	assert_int_equal(wait_child(child), 0);
	assert_true(metric(&sv, "belayer_rejected_total", "reason=\"unauthorized\"") >= 3);
	assert_int_equal(metric(&sv, "belayer_regions_fetched_total", ""), 0);
	/* The other uid's process was a worker for a moment: its pidfd goes once it exits. */
	assert_true(sv_wait_fds(&sv, before));

	/* Same engine, same uid: allowed. */
	fd = client_hello(&sv, "engine-b");
	assert_int_equal(fetch(fd, dead, 1, &r), 0);
	proto_msg_finish(&r);
	close(fd);
}

/* A good client's request still works. */
static void good_client_works(void)
{
	struct worker w;

	worker_start(&w, &sv, "good", "small");
	assert_true(wait_regions(&sv, w.pid, REGION_OWNED, 1));
	worker_end(&w);
}

static void send_raw(int fd, const void *p, size_t len, const int *fds, size_t nfds)
{
	assert_int_equal(fdpass_send(fd, p, len, fds, nfds, 0), (ssize_t)len);
}

/* Garbage, truncated and oversized packets, unknown versions, replies sent as requests:
 * each refused with an error reply; the connection is closed after max_client_errors. */
static void hostile_packets_refused(void **state)
{
	static const char *const settings[] = {"limits.max_client_errors=8",
					       "limits.max_message_size=4096", NULL};
	static uint8_t big[8192];
	uint8_t buf[PROTO_MAX_MSG];
	struct proto_msg m = {.type = PROTO_REGION_RELEASE}, r;
	size_t len, nfds;
	int fd, errors = 0;

	sv_start(&sv, settings);
	fd = client_connect(&sv);
	send_raw(fd, "\xc1garbage", 8, NULL, 0);
	m.release.id = 1;
	assert_int_equal(proto_encode(&m, buf, sizeof(buf), &len, NULL, &nfds), 0);
	send_raw(fd, buf, len - 1, NULL, 0); /* truncated */
	memset(big, 0x90, sizeof(big));
	send_raw(fd, big, sizeof(big), NULL, 0); /* over max_message_size */
	buf[2] = 7;				 /* "v": 7 */
	send_raw(fd, buf, len, NULL, 0);
	m.type = PROTO_END; /* a reply is not a request */
	m.end.in_reply_to = 1;
	assert_int_equal(proto_send(fd, &m, 0), 0);
	m.type = PROTO_REGION_RELEASE; /* before hello */
	assert_int_equal(proto_send(fd, &m, 0), 0);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(client_recv(fd, &r, SV_WAIT_MS), 0);
		assert_int_equal(r.type, PROTO_ERROR);
		errors++;
	}
	/* Two more errors use up the budget of 8: the supervisor closes. */
	send_raw(fd, "\x00", 1, NULL, 0);
	send_raw(fd, "\x00", 1, NULL, 0);
	for (;;) {
		int e = client_recv(fd, &r, SV_WAIT_MS);

		if (e == -ECONNRESET)
			break;
		assert_int_equal(e, 0);
		assert_int_equal(r.type, PROTO_ERROR);
		assert_true(++errors <= 8);
	}
	close(fd);
	assert_true(metric(&sv, "belayer_rejected_total", "reason=\"bad_message\"") >= 5);
	assert_int_equal(metric(&sv, "belayer_rejected_total", "reason=\"message_size\""), 1);
	assert_int_equal(metric(&sv, "belayer_rejected_total", "reason=\"no_hello\""), 1);
	assert_int_equal(metric(&sv, "belayer_rejected_total", "reason=\"too_many_errors\""), 1);
	good_client_works();
}

/* Packets carrying more fds than any message, announcements past max_fds and past
 * max_regions_per_worker, and fds that are not memory: refused, and every fd closed. */
static void fd_floods_refused(void **state)
{
	static const char *const settings[] = {"limits.max_fds=8",
					       "limits.max_regions_per_worker=5",
					       "limits.max_client_errors=1000", NULL};
	struct proto_msg m = {.type = PROTO_REGION_ANNOUNCE}, r;
	int fds[FDPASS_MAX_FDS], fd, base, sp[2];
	uint8_t junk[4] = {0x80};

	sv_start(&sv, settings);
	base = sv_count_fds(&sv);
	fd = client_hello(&sv, "flood");
	for (int i = 0; i < FDPASS_MAX_FDS; i++) {
		fds[i] = memfd_create("flood", MFD_CLOEXEC);
		assert_int_equal(ftruncate(fds[i], 4096), 0);
	}
	/* 200 packets of 16 fds each. */
	for (int i = 0; i < 200; i++) {
		send_raw(fd, junk, 1, fds, FDPASS_MAX_FDS);
		assert_int_equal(client_recv(fd, &r, SV_WAIT_MS), 0);
		assert_int_equal(r.type, PROTO_ERROR);
	}
	/* 5 regions are allowed for this worker, the 6th is refused (EDQUOT). */
	for (int i = 0; i < 6; i++) {
		m.region.id = (uint64_t)i + 1;
		m.region.size = 4096;
		m.region.fd = fds[i];
		assert_int_equal(proto_send(fd, &m, 0), 0);
	}
	assert_int_equal(client_recv(fd, &r, SV_WAIT_MS), 0);
	assert_int_equal(r.type, PROTO_ERROR);
	assert_int_equal(r.error.code, EDQUOT);
	/* A second worker (a child: one process is one worker) takes 3 more: the 9th fd
	 * overall is past max_fds=8 (ENFILE). */
	pid_t child = fork_checked();

	if (child == 0) {
		struct proto_msg cm = {.type = PROTO_REGION_ANNOUNCE}, cr;
		int cfd = client_hello(&sv, "flood2"), e = 0;

		for (int i = 0; i < 4; i++) {
			cm.region.id = (uint64_t)i + 1;
			cm.region.size = 4096;
			cm.region.fd = fds[i];
			if (proto_send(cfd, &cm, 0) < 0)
				_exit(10);
		}
		if (client_recv(cfd, &cr, SV_WAIT_MS) < 0 || cr.type != PROTO_ERROR)
			_exit(11);
		e = cr.error.code;
		_exit(e == ENFILE ? 0 : 12);
	}
	assert_int_equal(wait_child(child), 0);
	/* Its 3 regions are retained now that it exited. */
	assert_true(wait_regions(&sv, 0, -1, 8));
	assert_int_equal(metric(&sv, "belayer_fds_held", ""), 8);
	assert_int_equal(metric(&sv, "belayer_rejected_total", "reason=\"fd_limit\""), 1);
	assert_int_equal(metric(&sv, "belayer_rejected_total", "reason=\"region_limit\""), 1);

	/* A socket is never a memory handle. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp), 0);
	m.region.id = 99;
	m.region.fd = sp[0];
	assert_int_equal(proto_send(fd, &m, 0), 0);
	assert_int_equal(client_recv(fd, &r, SV_WAIT_MS), 0);
	assert_int_equal(r.type, PROTO_ERROR);
	assert_int_equal(r.error.code, EBADF);
	close(sp[0]);
	close(sp[1]);
	/* Nothing beyond the 8 held fds and our connection stayed open in the supervisor. */
	/* Held: the 8 region fds and the pidfd of this process (a worker since its hello). */
	assert_true(sv_wait_fds(&sv, base + 8 + 1));
	for (int i = 0; i < FDPASS_MAX_FDS; i++)
		close(fds[i]);
	close(fd);
}

/* A subscriber that never reads is disconnected once its queue passes max_queued_bytes; the
 * supervisor never waits for it. */
static void slow_reader_disconnected(void **state)
{
	static const char *const settings[] = {"limits.max_queued_bytes=64K", NULL};
	struct proto_msg m = {.type = PROTO_CTL};
	uint64_t deadline;
	int slow, rcv = 4096;

	sv_start(&sv, settings);
	slow = client_connect(&sv);
	assert_int_equal(setsockopt(slow, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv)), 0);
	m.ctl.cmd = CTL_EVENTS;
	m.ctl.dev = -1;
	assert_int_equal(proto_send(slow, &m, 0), 0);
	/* Announce + release pairs make two events each, cheaply. */
	{
		struct proto_msg a = {.type = PROTO_REGION_ANNOUNCE};
		struct proto_msg rel = {.type = PROTO_REGION_RELEASE};
		int fd = client_hello(&sv, "events"), mfd = memfd_create("ev", MFD_CLOEXEC);

		assert_int_equal(ftruncate(mfd, 4096), 0);
		a.region.size = 4096;
		a.region.fd = mfd;
		deadline = mono_ms() + SV_WAIT_MS;
		for (uint64_t i = 1;; i++) {
			a.region.id = rel.release.id = i;
			assert_int_equal(proto_send(fd, &a, 0), 0);
			assert_int_equal(proto_send(fd, &rel, 0), 0);
			if (i % 200 == 0 &&
			    metric(&sv, "belayer_rejected_total", "reason=\"slow_reader\"") > 0)
				break;
			assert_true(mono_ms() < deadline);
		}
		close(mfd);
		close(fd);
	}
	/* The slow one sees its connection end after what was queued. */
	{
		struct proto_msg r;
		int e;

		while ((e = client_recv(slow, &r, SV_WAIT_MS)) == 0)
			;
		assert_int_equal(e, -ECONNRESET);
	}
	close(slow);
	good_client_works();
}

/* A status query on an open connection; returns the value of metric name{labels}. */
static uint64_t metric_on(int fd, const char *name, const char *labels)
{
	struct proto_msg m = {.type = PROTO_CTL}, r;
	uint64_t v = UINT64_MAX;

	m.ctl.cmd = CTL_STATUS;
	m.ctl.dev = -1;
	assert_int_equal(proto_send(fd, &m, 0), 0);
	for (;;) {
		assert_int_equal(client_recv(fd, &r, SV_WAIT_MS), 0);
		if (r.type == PROTO_END)
			break;
		assert_int_equal(r.type, PROTO_METRIC);
		if (!strcmp(r.metric.name, name) && !strcmp(r.metric.labels, labels))
			v = r.metric.value;
	}
	assert_true(v != UINT64_MAX);
	return v;
}

/* 1000 clients connect at once; past max_connections they are refused with an error reply
 * and closed, and a good client that was there first keeps working throughout. */
static void thousand_clients(void **state)
{
	static const char *const settings[] = {"limits.max_connections=100", NULL};
	struct rlimit rl = {.rlim_cur = 4096, .rlim_max = 4096};
	static int fds[1000];
	int good, base;

	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	TEST_REQUIRE(rl.rlim_cur >= 1100, "needs 1100 fds, RLIMIT_NOFILE is %llu",
		     (unsigned long long)rl.rlim_cur);
	sv_start(&sv, settings);
	base = sv_count_fds(&sv);
	good = client_connect(&sv);
	assert_true(good >= 0);
	assert_int_equal(metric_on(good, "belayer_connections", ""), 1);
	for (int i = 0; i < 1000; i++) {
		fds[i] = client_connect(&sv);
		assert_true(fds[i] >= 0);
		if (i % 250 == 0) /* the good client is served during the storm */
			assert_true(metric_on(good, "belayer_connections", "") >= 1);
	}
	/* Accepted in order: the first 99 join the good client, every later one gets EUSERS
	 * and is closed. */
	for (int i = 99; i < 1000; i++) {
		struct proto_msg r;

		assert_int_equal(client_recv(fds[i], &r, SV_WAIT_MS), 0);
		assert_int_equal(r.type, PROTO_ERROR);
		assert_int_equal(r.error.code, EUSERS);
		assert_int_equal(client_recv(fds[i], &r, SV_WAIT_MS), -ECONNRESET);
		fds[i] = safe_close(fds[i]);
	}
	assert_int_equal(metric_on(good, "belayer_connections", ""), 100);
	assert_int_equal(metric_on(good, "belayer_rejected_total", "reason=\"max_connections\""),
			 901);
	/* The refused ones hold nothing in the supervisor. */
	assert_true(sv_wait_fds(&sv, base));
	for (int i = 0; i < 99; i++)
		fds[i] = safe_close(fds[i]);
	{
		uint64_t deadline = mono_ms() + SV_WAIT_MS;

		while (metric_on(good, "belayer_connections", "") > 1)
			assert_true(mono_ms() < deadline);
	}
	close(good);
	good_client_works();
}

/* The supervisor is SIGKILLed and restarted: the live worker's shim reconnects and
 * re-announces, and the supervisor converges on the same regions; a worker that died while
 * the supervisor was down is reported lost. */
static void restart_converges(void **state)
{
	static struct proto_msg before[16], after[16];
	struct worker live, doomed;
	int n;

	sv_start(&sv, NULL);
	worker_start(&live, &sv, "engine-live", "engine");
	worker_start(&doomed, &sv, "engine-doomed", "small");
	assert_true(wait_regions(&sv, live.pid, REGION_OWNED, 6));
	assert_true(wait_regions(&sv, doomed.pid, REGION_OWNED, 1));
	wait_rl_update(live.pid);
	n = ctl_collect(&sv, CTL_REGIONS, (uint32_t)live.pid, CTL_ACT_NONE, -1, before, 16);
	assert_int_equal(n, 6);

	assert_true(WIFSIGNALED(sv_kill(&sv, SIGKILL)));
	pid_t doomed_pid = doomed.pid;

	(void)worker_kill(&doomed, SIGKILL);

	sv_start(&sv, NULL);
	/* Restored from the journal: the live worker's regions are expected back. They are
	 * listed as owned at once, from the journal; the worker is alive again once its shim
	 * (reconnecting with a backoff) said hello, and its regions' fds are held once it
	 * re-announced them: wait for both before looking and before the kill below. */
	for (uint64_t deadline = mono_ms() + SV_WAIT_MS;
	     metric(&sv, "belayer_workers", "state=\"alive\"") != 1 ||
	     metric(&sv, "belayer_fds_held", "") != 6;
	     (void)poll(NULL, 0, 10))
		if (mono_ms() > deadline)
			fail_msg("the live worker did not reconnect and re-announce within %d ms",
				 SV_WAIT_MS);
	assert_true(wait_regions(&sv, live.pid, REGION_OWNED, 6));
	assert_int_equal(
		ctl_collect(&sv, CTL_REGIONS, (uint32_t)live.pid, CTL_ACT_NONE, -1, after, 16), 6);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(after[i].region_info.id, before[i].region_info.id);
		assert_int_equal(after[i].region_info.va, before[i].region_info.va);
		assert_int_equal(after[i].region_info.size, before[i].region_info.size);
		assert_int_equal(after[i].region_info.cls, before[i].region_info.cls);
		assert_int_equal(after[i].region_info.weights_version,
				 before[i].region_info.weights_version);
		assert_string_equal(after[i].region_info.engine_id, "engine-live");
	}
	assert_int_equal(count_regions(&sv, doomed_pid, -1), 0);
	assert_int_equal(metric(&sv, "belayer_regions_lost_total", ""), 1);
	assert_int_equal(metric(&sv, "belayer_workers", "state=\"alive\""), 1);

	/* And the converged view retains as before. */
	pid_t pid = live.pid;

	(void)worker_kill(&live, SIGKILL);
	assert_true(wait_regions(&sv, pid, REGION_RETAINED, 6));
}

static int health(enum health_check check, struct proto_msg *m, int n, int dev)
{
	for (int i = 0; i < n; i++)
		if (m[i].health.check == check && (dev < 0 || m[i].health.dev == dev))
			return (int)m[i].health.verdict;
	fail_msg("no %s verdict", health_check_to_string(check));
	return -1;
}

/* No NVML: "unknown", never a crash. With NVML: ok, until a fatal XID is injected. */
static void gpu_verdicts(void **state)
{
	static const char *const no_nvml[] = {"health.nvml_library=libnvidia-ml-absent.so.1", NULL};
	const char *xid[] = {EMU_CTL_PATH, "xid", "0", "79", NULL};
	const char *benign[] = {EMU_CTL_PATH, "xid", "1", "999", NULL};
	const char *ecc[] = {EMU_CTL_PATH, "ecc", "1", "--uncorrected", "2", NULL};
	struct proto_msg m[8];
	int n;

	sv_start(&sv, no_nvml);
	n = ctl_collect(&sv, CTL_HEALTH, 0, CTL_ACT_NONE, -1, m, 8);
	assert_int_equal(n, 1);
	assert_int_equal(m[0].health.verdict, VERDICT_UNKNOWN);
	assert_non_null(strstr(m[0].health.message, "NVML not available"));
	assert_int_equal(sv_kill(&sv, SIGTERM), 0);

	sv_start(&sv, NULL);
	n = ctl_collect(&sv, CTL_HEALTH, 0, CTL_ACT_NONE, -1, m, 8);
	assert_int_equal(n, 2);
	assert_int_equal(health(HEALTH_GPU, m, n, 0), VERDICT_OK);
	assert_int_equal(health(HEALTH_GPU, m, n, 1), VERDICT_OK);

	assert_int_equal(run_tool(&sv, xid, NULL), 0);
	assert_int_equal(run_tool(&sv, benign, NULL), 0);
	n = ctl_collect(&sv, CTL_HEALTH, 0, CTL_ACT_NONE, -1, m, 8);
	assert_int_equal(n, 2);
	assert_int_equal(health(HEALTH_GPU, m, n, 0), VERDICT_FAILED);
	assert_non_null(strstr(m[0].health.message, "XID 79"));
	assert_int_equal(health(HEALTH_GPU, m, n, 1), VERDICT_OK);

	assert_int_equal(run_tool(&sv, ecc, NULL), 0);
	n = ctl_collect(&sv, CTL_HEALTH, 0, CTL_ACT_NONE, 1, m, 8);
	assert_int_equal(n, 1);
	assert_int_equal(health(HEALTH_GPU, m, n, 1), VERDICT_FAILED);
	assert_non_null(strstr(m[0].health.message, "ECC"));
	assert_true(metric(&sv, "belayer_health_verdicts_total",
			   "check=\"gpu\",verdict=\"failed\"") >= 2);
}

/* Owner check fails while the owner lives; content checksums recorded at death match until a
 * bit of the retained memory flips. */
static void owner_and_content_checks(void **state)
{
	char id_arg[32], off_arg[32];
	const char *flip[] = {EMU_CTL_PATH, "flip", id_arg, off_arg, NULL};
	struct proto_msg m[16], r;
	struct worker w;
	uint64_t alloc_id;
	uint8_t got[16];
	pid_t pid;
	int n, fd;

	sv_start(&sv, NULL);
	worker_start(&w, &sv, "engine-c", "engine");
	assert_true(wait_regions(&sv, w.pid, REGION_OWNED, 6));
	pid = w.pid;
	n = ctl_collect(&sv, CTL_HEALTH, (uint32_t)pid, CTL_ACT_NONE, -1, m, 16);
	assert_true(n >= 1);
	assert_int_equal(health(HEALTH_OWNER, m, n, -1), VERDICT_FAILED);

	(void)worker_kill(&w, SIGKILL);
	assert_true(wait_regions(&sv, pid, REGION_RETAINED, 6));
	n = ctl_collect(&sv, CTL_HEALTH, (uint32_t)pid, CTL_ACT_NONE, -1, m, 16);
	assert_int_equal(health(HEALTH_OWNER, m, n, -1), VERDICT_OK);
	for (int i = 0; i < n; i++)
		if (m[i].health.check == HEALTH_CONTENT)
			assert_int_equal(m[i].health.verdict, VERDICT_OK);
	assert_int_equal(health(HEALTH_CONTENT, m, n, -1), VERDICT_OK);

	/* Corrupt one byte of the first weights region, through the emulator. */
	fd = client_hello(&sv, "engine-c");
	assert_int_equal(fetch(fd, pid, 1, &r), 0);
	read_through_driver(r.region_fd.region.fd, r.region_fd.region.size, got, &alloc_id);
	proto_msg_finish(&r);
	close(fd);
	snprintf(id_arg, sizeof(id_arg), "%" PRIu64, alloc_id);
	snprintf(off_arg, sizeof(off_arg), "%d", 4096);
	assert_int_equal(run_tool(&sv, flip, NULL), 0);
	n = ctl_collect(&sv, CTL_HEALTH, (uint32_t)pid, CTL_ACT_NONE, -1, m, 16);
	assert_int_equal(health(HEALTH_CONTENT, m, n, -1), VERDICT_FAILED);
}

/* belayerctl: every subcommand answers, in text and in JSON; inject signals a worker. */
static void belayerctl_commands(void **state)
{
	char pid_arg[32];
	const char *status_json[] = {BELAYERCTL_PATH, "--json", "status", NULL};
	const char *regions_json[] = {BELAYERCTL_PATH, "regions", "--json", NULL};
	const char *workers[] = {BELAYERCTL_PATH, "workers", NULL};
	const char *config_json[] = {BELAYERCTL_PATH, "config", "--json", NULL};
	const char *events[] = {BELAYERCTL_PATH, "--json",	"events", "--replay",
				"100",		 "--no-follow", NULL};
	const char *hang[] = {BELAYERCTL_PATH, "inject", "hang", pid_arg, NULL};
	const char *resume[] = {BELAYERCTL_PATH, "inject", "resume", pid_arg, NULL};
	const char *kill9[] = {BELAYERCTL_PATH, "--json", "inject", "kill", pid_arg, NULL};
	const char *bogus[] = {BELAYERCTL_PATH, "inject", "kill", "1", NULL};
	const char *gpu[] = {BELAYERCTL_PATH, "inject", "gpu", "xid", "0", "48", NULL};
	struct worker w;
	char *out;
	int status;

	sv_start(&sv, NULL);
	worker_start(&w, &sv, "engine-d", "engine");
	assert_true(wait_regions(&sv, w.pid, REGION_OWNED, 6));
	snprintf(pid_arg, sizeof(pid_arg), "%d", w.pid);

	assert_int_equal(run_tool(&sv, status_json, &out), 0);
	assert_non_null(strstr(out, "\"workers_alive\": 1"));
	assert_non_null(strstr(out, "\"bytes_owned\": 69206016"));
	assert_non_null(strstr(out, "belayer_rejected_total"));
	free(out);
	assert_int_equal(run_tool(&sv, regions_json, &out), 0);
	assert_non_null(strstr(out, "\"class\": \"kv\""));
	assert_non_null(strstr(out, "\"engine\": \"engine-d\""));
	free(out);
	assert_int_equal(run_tool(&sv, workers, &out), 0);
	assert_non_null(strstr(out, pid_arg));
	free(out);
	assert_int_equal(run_tool(&sv, config_json, &out), 0);
	assert_non_null(strstr(out, "\"retention.timeout\": \"10m\""));
	free(out);

	/* hang: the worker stops (state T); resume: it runs again. */
	assert_int_equal(run_tool(&sv, hang, NULL), 0);
	assert_int_equal(waitpid(w.pid, &status, WUNTRACED), w.pid);
	assert_true(WIFSTOPPED(status) && WSTOPSIG(status) == SIGSTOP);
	assert_int_equal(run_tool(&sv, resume, NULL), 0);
	assert_int_equal(waitpid(w.pid, &status, WCONTINUED), w.pid);
	assert_true(WIFCONTINUED(status));
	/* Only workers can be signalled. */
	assert_int_not_equal(run_tool(&sv, bogus, NULL), 0);
	assert_int_equal(run_tool(&sv, kill9, &out), 0);
	free(out);
	assert_int_equal(waitpid(w.pid, &status, 0), w.pid);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	w.pid = 0;
	worker_end(&w);
	assert_true(wait_regions(&sv, 0, REGION_RETAINED, 6));

	assert_int_equal(run_tool(&sv, events, &out), 0);
	/* JSON Lines: one compact object per event. */
	assert_non_null(strstr(out, "\"kind\":\"worker-hello\""));
	assert_non_null(strstr(out, "\"kind\":\"inject\""));
	assert_non_null(strstr(out, "\"kind\":\"worker-exit\""));
	free(out);

	/* GPU faults pass through to the emulator's emu-ctl (test-only). */
	setenv("BELAYER_EMU_CTL", EMU_CTL_PATH, 1);
	assert_int_equal(run_tool(&sv, gpu, NULL), 0);
	unsetenv("BELAYER_EMU_CTL");
}

/* belayerctl events follows: a running follower sees an event that happens after it started. */
static void events_follow(void **state)
{
	/* --replay: whichever comes first, the subscription or the event, the event is seen. */
	const char *argv[] = {BELAYERCTL_PATH, "--json", "events", "--replay", "64", NULL};
	char buf[8192];
	size_t len = 0;
	uint64_t deadline;
	struct worker w;
	int out[2];
	pid_t pid;

	sv_start(&sv, NULL);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	pid = fork_checked();
	if (pid == 0) {
		dup2(out[1], 1);
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	close(out[1]);
	/* The follower is subscribed once the supervisor counts 2 connections... of which ours
	 * is the query itself. */
	deadline = mono_ms() + SV_WAIT_MS;
	while (metric(&sv, "belayer_connections", "") < 2)
		assert_true(mono_ms() < deadline);
	worker_start(&w, &sv, "engine-e", "small");
	while (!strstr(buf, "worker-hello")) {
		struct pollfd p = {.fd = out[0], .events = POLLIN};
		ssize_t n;

		assert_true(mono_ms() < deadline);
		if (poll(&p, 1, 100) <= 0)
			continue;
		n = read(out[0], buf + len, sizeof(buf) - 1 - len);
		assert_true(n > 0);
		len += (size_t)n;
		buf[len] = '\0';
	}
	worker_end(&w);
	kill(pid, SIGTERM);
	(void)wait_child(pid);
	close(out[0]);
}

/* Past the memory budget the oldest dead worker's regions go first, whole; the rest go when
 * the retention timeout passes. */
static void retention_budget_and_timeout(void **state)
{
	static const char *const settings[] = {"retention.memory_budget=6M", "retention.timeout=3s",
					       NULL};
	struct worker a, b;
	pid_t pa, pb;
	uint64_t died;

	sv_start(&sv, settings);
	worker_start(&a, &sv, "engine-r", "small");
	worker_start(&b, &sv, "engine-r", "small");
	assert_true(wait_regions(&sv, a.pid, REGION_OWNED, 1));
	assert_true(wait_regions(&sv, b.pid, REGION_OWNED, 1));
	pa = a.pid;
	pb = b.pid;
	(void)worker_kill(&a, SIGKILL);
	assert_true(wait_regions(&sv, pa, REGION_RETAINED, 1));
	/* 4 MiB + 4 MiB > 6 MiB: a, the older, is released. */
	died = mono_ms();
	(void)worker_kill(&b, SIGKILL);
	assert_true(wait_regions(&sv, pb, REGION_RETAINED, 1));
	assert_true(wait_regions(&sv, pa, -1, 0));
	assert_int_equal(metric(&sv, "belayer_regions_expired_total", "reason=\"budget\""), 1);
	/* b goes after the 3 s timeout, not before. */
	assert_int_equal(count_regions(&sv, pb, REGION_RETAINED), 1);
	assert_true(wait_regions(&sv, pb, -1, 0));
	assert_true(mono_ms() - died >= 3000);
	assert_int_equal(metric(&sv, "belayer_regions_expired_total", "reason=\"timeout\""), 1);
	assert_int_equal(metric(&sv, "belayer_workers", "state=\"dead\""), 0);
}

/* A worker that reconnects re-announces what it still has; what it does not re-announce
 * within the resync grace was released while the supervisor could not hear it. */
static void resync_drops_what_is_not_reannounced(void **state)
{
	static const char *const settings[] = {"retention.resync_grace=1s", NULL};
	struct proto_msg a = {.type = PROTO_REGION_ANNOUNCE};
	int fd, mfd = memfd_create("resync", MFD_CLOEXEC);

	assert_int_equal(ftruncate(mfd, 4096), 0);
	sv_start(&sv, settings);
	fd = client_hello(&sv, "engine-s");
	a.region.size = 4096;
	a.region.fd = mfd;
	for (uint64_t id = 1; id <= 3; id++) {
		a.region.id = id;
		assert_int_equal(proto_send(fd, &a, 0), 0);
	}
	assert_true(wait_regions(&sv, getpid(), REGION_OWNED, 3));
	close(fd);
	/* A new session re-announces 1 and 3 only. */
	fd = client_hello(&sv, "engine-s");
	for (uint64_t id = 1; id <= 3; id += 2) {
		a.region.id = id;
		assert_int_equal(proto_send(fd, &a, 0), 0);
	}
	assert_true(wait_regions(&sv, getpid(), REGION_OWNED, 2));
	assert_int_equal(metric(&sv, "belayer_regions_expired_total", "reason=\"resync\""), 1);
	close(fd);
	close(mfd);
}

/* Under systemd (Type=notify): READY=1 once the socket listens, a STATUS= line, and
 * WATCHDOG=1 at half of WATCHDOG_USEC. systemd's side is a datagram socket we hold. */
static void systemd_notify_protocol(void **state)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char path[sizeof(sa.sun_path)], buf[4096];
	bool ready = false, status = false;
	int ns, watchdogs = 0, one = 1;
	uint64_t deadline;

	snprintf(path, sizeof(path), "%s/notify", sv.dir);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	ns = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(ns >= 0);
	assert_int_equal(bind(ns, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(setsockopt(ns, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
	setenv("NOTIFY_SOCKET", path, 1);
	setenv("WATCHDOG_USEC", "200000", 1);
	sv_start(&sv, NULL);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");

	deadline = mono_ms() + SV_WAIT_MS;
	while (!(ready && status && watchdogs >= 3)) {
		struct pollfd p = {.fd = ns, .events = POLLIN};
		ssize_t n;

		assert_true(mono_ms() < deadline);
		if (poll(&p, 1, 100) <= 0)
			continue;
		n = recv(ns, buf, sizeof(buf) - 1, 0);
		assert_true(n > 0);
		buf[n] = '\0';
		ready |= strstr(buf, "READY=1") != NULL;
		status |= strstr(buf, "STATUS=") != NULL;
		/* The watchdog pings only once the daemon is ready. */
		if (strstr(buf, "WATCHDOG=1")) {
			assert_true(ready);
			watchdogs++;
		}
	}
	close(ns);
}

/* The part of systemd's service manager that keeps a service's fd store. Like systemd it takes
 * notifications as they come, on a thread of its own: sd_notify blocks the supervisor's loop
 * once 10 datagrams (net.unix.max_dgram_qlen) wait, and draining only between the test's own
 * requests left it blocked while the test waited for an answer. lock guards n, fds, names. */
struct fd_store {
	int sock;
	pthread_t thread;
	pthread_mutex_t lock;
	atomic_bool stop;
	size_t n;
	int fds[64];
	char names[64][64];
	const char *name_ptrs[64];
};

static void fd_store_open(struct fd_store *st, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	memset(st, 0, sizeof(*st));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	st->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	assert_true(st->sock >= 0);
	assert_int_equal(bind(st->sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(pthread_mutex_init(&st->lock, NULL), 0);
}

/* Takes every pending notification: FDSTORE=1 adds its fd under FDNAME, FDSTOREREMOVE=1
 * drops every fd of that name. With st->lock held. */
static void fd_store_drain_locked(struct fd_store *st)
{
	for (;;) {
		char buf[4096], *name;
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * 16)];
		} ctl;
		struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
		struct msghdr mh = {.msg_iov = &iov,
				    .msg_iovlen = 1,
				    .msg_control = &ctl,
				    .msg_controllen = sizeof(ctl)};
		int fd = -1;
		ssize_t n = recvmsg(st->sock, &mh, MSG_CMSG_CLOEXEC);

		if (n < 0) {
			assert_int_equal(errno, EAGAIN);
			return;
		}
		buf[n] = '\0';
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
				memcpy(&fd, CMSG_DATA(c), sizeof(int));
		name = strstr(buf, "FDNAME=");
		if (!name) {
			(void)safe_close(fd);
			continue;
		}
		name += 7;
		name[strcspn(name, "\n")] = '\0';
		if (strstr(buf, "FDSTOREREMOVE=1")) {
			for (size_t i = 0; i < st->n; i++)
				if (strcmp(st->names[i], name) == 0) {
					close(st->fds[i]);
					st->fds[i] = st->fds[st->n - 1];
					memcpy(st->names[i], st->names[st->n - 1], 64);
					st->n--;
					i--;
				}
		} else if (strstr(buf, "FDSTORE=1") && fd >= 0) {
			assert_true(st->n < 64);
			st->fds[st->n] = fd;
			snprintf(st->names[st->n], 64, "%s", name);
			st->n++;
		} else {
			(void)safe_close(fd);
		}
	}
}

static void *fd_store_thread(void *userdata)
{
	struct fd_store *st = userdata;

	while (!atomic_load(&st->stop)) {
		(void)poll(&(struct pollfd){.fd = st->sock, .events = POLLIN}, 1, 20);
		pthread_mutex_lock(&st->lock);
		fd_store_drain_locked(st);
		pthread_mutex_unlock(&st->lock);
	}
	return NULL;
}

static void fd_store_start(struct fd_store *st)
{
	assert_int_equal(pthread_create(&st->thread, NULL, fd_store_thread, st), 0);
}

static size_t fd_store_count(struct fd_store *st)
{
	size_t n;

	pthread_mutex_lock(&st->lock);
	n = st->n;
	pthread_mutex_unlock(&st->lock);
	return n;
}

static void fd_store_close(struct fd_store *st)
{
	atomic_store(&st->stop, true);
	assert_int_equal(pthread_join(st->thread, NULL), 0);
	for (size_t i = 0; i < st->n; i++)
		close(st->fds[i]);
	close(st->sock);
	pthread_mutex_destroy(&st->lock);
}

/* Under systemd the fd store keeps the region fds: a supervisor that is SIGKILLed and restarted
 * gets back even the memory of a worker that died before the restart, bytes intact. */
static void fd_store_survives_restart(void **state)
{
	struct fd_store st;
	int fds[64];
	size_t n_fds;
	char path[256];
	struct proto_msg r;
	struct worker w;
	uint64_t deadline;
	uint8_t got[16];
	pid_t dead;
	int fd;

	snprintf(path, sizeof(path), "%s/notify", sv.dir);
	fd_store_open(&st, path);
	fd_store_start(&st);
	setenv("NOTIFY_SOCKET", path, 1);
	deadline = mono_ms() + SV_WAIT_MS;
	sv_start(&sv, NULL);
	worker_start(&w, &sv, "engine-f", "engine");
	while (count_regions(&sv, w.pid, REGION_OWNED) != 6)
		assert_true(mono_ms() < deadline);
	dead = w.pid;
	(void)worker_kill(&w, SIGKILL);
	while (fd_store_count(&st) != 6 || count_regions(&sv, dead, REGION_RETAINED) != 6)
		assert_true(mono_ms() < deadline);

	assert_true(WIFSIGNALED(sv_kill(&sv, SIGKILL)));
	/* What the killed supervisor sent is all queued by now: take it, and the fds as stored. */
	pthread_mutex_lock(&st.lock);
	fd_store_drain_locked(&st);
	n_fds = st.n;
	for (size_t i = 0; i < st.n; i++) {
		fds[i] = st.fds[i];
		st.name_ptrs[i] = st.names[i];
	}
	pthread_mutex_unlock(&st.lock);
	assert_int_equal(n_fds, 6);
	sv_start_with_fds(&sv, NULL, fds, st.name_ptrs, n_fds);
	unsetenv("NOTIFY_SOCKET");

	/* Journal + fd store: the dead worker's regions are retained again, nothing lost. */
	assert_true(wait_regions(&sv, dead, REGION_RETAINED, 6));
	assert_int_equal(metric(&sv, "belayer_regions_lost_total", ""), 0);
	assert_int_equal(metric(&sv, "belayer_fds_held", ""), 6);
	fd = client_hello(&sv, "engine-f");
	assert_int_equal(fetch(fd, dead, 1, &r), 0);
	read_through_driver(r.region_fd.region.fd, r.region_fd.region.size, got, NULL);
	expect_fill(got, 1);
	proto_msg_finish(&r);
	close(fd);
	fd_store_close(&st);
}

/* The content check's driver path (what a real GPU needs: import the fd through libcuda, map,
 * copy to the host) computes the same checksum as reading the memfd directly. */
static void content_checksum_through_driver(void **state)
{
	static const char *const settings[] = {"health.content_method=driver", NULL};
	struct proto_msg m[16], r;
	struct worker w;
	uint8_t *buf;
	uLong crc;
	pid_t dead;
	int n, fd;

	sv_start(&sv, settings);
	worker_start(&w, &sv, "engine-g", "engine");
	assert_true(wait_regions(&sv, w.pid, REGION_OWNED, 6));
	dead = w.pid;
	(void)worker_kill(&w, SIGKILL);
	assert_true(wait_regions(&sv, dead, REGION_RETAINED, 6));
	/* Recorded at death through the driver; a check now compares through it again. */
	n = ctl_collect(&sv, CTL_HEALTH, (uint32_t)dead, CTL_ACT_NONE, -1, m, 16);
	assert_int_equal(health(HEALTH_CONTENT, m, n, -1), VERDICT_OK);
	n = ctl_collect(&sv, CTL_REGIONS, (uint32_t)dead, CTL_ACT_NONE, -1, m, 16);
	assert_int_equal(n, 6);
	assert_int_equal(m[0].region_info.cls, REGION_WEIGHTS);
	assert_int_equal(m[0].region_info.checksum_version, m[0].region_info.weights_version + 1);

	/* The same bytes read as a file give the same CRC32. */
	fd = client_hello(&sv, "engine-g");
	assert_int_equal(fetch(fd, dead, m[0].region_info.id, &r), 0);
	buf = malloc(r.region_fd.region.size);
	assert_non_null(buf);
	assert_int_equal(pread(r.region_fd.region.fd, buf, r.region_fd.region.size, 0),
			 (ssize_t)r.region_fd.region.size);
	crc = crc32(crc32(0, NULL, 0), buf, (uInt)r.region_fd.region.size);
	assert_int_equal(m[0].region_info.checksum, crc);
	free(buf);
	proto_msg_finish(&r);
	close(fd);
}

static char *http_get(int port, const char *path)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				.sin_port = htons((uint16_t)port)};
	static char buf[65536];
	size_t len = 0;
	char req[256];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
	assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	for (;;) {
		ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);

		assert_true(n >= 0);
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	return buf;
}

/* Prometheus text on the optional loopback listener; never on another address. */
static void prometheus_listener(void **state)
{
	char port_setting[64];
	const char *settings[] = {port_setting, NULL};
	const char *public[] = {SUPERVISOR_PATH,
				"--config",
				"/dev/null",
				"--socket",
				sv.sock,
				"--state-dir",
				sv.state,
				"-o",
				"metrics.http_port=9",
				"-o",
				"metrics.http_address=0.0.0.0",
				NULL};
	struct worker w;
	const char *text;
	int port = sv_free_port();

	snprintf(port_setting, sizeof(port_setting), "metrics.http_port=%d", port);
	sv_start(&sv, settings);
	worker_start(&w, &sv, "engine-h", "small");
	assert_true(wait_regions(&sv, w.pid, REGION_OWNED, 1));
	text = http_get(port, "/metrics");
	assert_non_null(strstr(text, "HTTP/1.0 200") ? text : strstr(text, "HTTP/1.1 200"));
	assert_non_null(strstr(text, "text/plain; version=0.0.4"));
	assert_non_null(strstr(text, "# TYPE belayer_workers gauge"));
	assert_non_null(strstr(text, "belayer_workers{state=\"alive\"} 1"));
	assert_non_null(strstr(text, "belayer_region_bytes{state=\"owned\"} 4194304"));
	assert_non_null(strstr(text, "# TYPE belayer_rejected_total counter"));
	text = http_get(port, "/other");
	assert_non_null(strstr(text, " 404 "));
	worker_end(&w);
	assert_int_equal(sv_kill(&sv, SIGTERM), 0);

	/* 0.0.0.0 is refused: the daemon does not start. */
	assert_int_not_equal(run_tool(&sv, public, NULL), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(retains_memory_of_killed_worker, setup, teardown),
		cmocka_unit_test_setup_teardown(fetch_refused_to_other_group_and_uid, setup,
						teardown),
		cmocka_unit_test_setup_teardown(hostile_packets_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(fd_floods_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(slow_reader_disconnected, setup, teardown),
		cmocka_unit_test_setup_teardown(thousand_clients, setup, teardown),
		cmocka_unit_test_setup_teardown(restart_converges, setup, teardown),
		cmocka_unit_test_setup_teardown(gpu_verdicts, setup, teardown),
		cmocka_unit_test_setup_teardown(owner_and_content_checks, setup, teardown),
		cmocka_unit_test_setup_teardown(belayerctl_commands, setup, teardown),
		cmocka_unit_test_setup_teardown(events_follow, setup, teardown),
		cmocka_unit_test_setup_teardown(retention_budget_and_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(resync_drops_what_is_not_reannounced, setup,
						teardown),
		cmocka_unit_test_setup_teardown(systemd_notify_protocol, setup, teardown),
		cmocka_unit_test_setup_teardown(fd_store_survives_restart, setup, teardown),
		cmocka_unit_test_setup_teardown(content_checksum_through_driver, setup, teardown),
		cmocka_unit_test_setup_teardown(prometheus_listener, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	/* SV_TEST_FILTER=name runs one test (cmocka's glob). */
	if (getenv("SV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("SV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
