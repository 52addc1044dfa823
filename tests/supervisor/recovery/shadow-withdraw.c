/* SPDX-License-Identifier: MIT */
/*
 * A minimal engine for tests/supervisor/recovery/test-shadow-withdraw.c, started by the supervisor from
 * [engine.w] under LD_PRELOAD=libbelayer.so on the emulated GPU, as primary or shadow:
 *   weights: two cuMemAlloc of WEIGHTS_MIB/2 (before the KV-sizing probe: class weights);
 *   the probe (cuMemGetInfo), then kv: one cuMemAlloc of KV_MIB.
 * With --withdraw it first allocates a third weights-sized region, and frees it once the
 * supervisor shows this shadow parked with it (4 layout entries: the shim described it with
 * SHADOW_REGION): the shim withdraws it (REGION_RELEASE of that id) and parks again, now with
 * the primary's layout. It then answers every HTTP request on 127.0.0.1:PORT with 200 (the
 * supervisor's readiness/liveness probe) until killed.
 *
 * Usage: shadow-withdraw --port PORT [--withdraw] WEIGHTS_MIB KV_MIB
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "proto.h"

#define PARK_WAIT_MS 30000

static int check(CUresult r, const char *what)
{
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "shadow-withdraw: %s failed: %d\n", what, (int)r);
		exit(1);
	}
	return 0;
}

/* Whether the supervisor lists this process as a parked shadow with n layout entries. */
static bool parked_with(uint32_t n)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct proto_msg m = {.type = PROTO_CTL};
	const char *path = getenv("BELAYER_SOCKET");
	bool found = false;
	int fd;

	if (!path || strlen(path) >= sizeof(sa.sun_path))
		return false;
	memcpy(sa.sun_path, path, strlen(path));
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto out;
	m.ctl.cmd = CTL_WORKERS;
	m.ctl.dev = -1;
	if (proto_send(fd, &m, 0) < 0)
		goto out;
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		bool end;

		if (poll(&p, 1, 5000) <= 0 || proto_recv(fd, &m, 0) < 0)
			break;
		end = m.type == PROTO_END || m.type == PROTO_ERROR;
		if (m.type == PROTO_WORKER_INFO && m.worker_info.pid == (uint32_t)getpid() &&
		    m.worker_info.parked && m.worker_info.layout_n == n)
			found = true;
		proto_msg_finish(&m);
		if (end)
			break;
	}
out:
	if (fd >= 0)
		close(fd);
	return found;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void serve(uint16_t port)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	static const char reply[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
				    "Connection: close\r\n\r\nok";
	int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 16) < 0) {
		perror("shadow-withdraw: listen");
		exit(1);
	}
	for (;;) {
		char buf[2048];
		int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);

		if (c < 0) {
			if (errno == EINTR)
				continue;
			perror("shadow-withdraw: accept");
			exit(1);
		}
		/* One read holds the probe's whole GET (no body). */
		if (read(c, buf, sizeof(buf)) > 0)
			(void)!write(c, reply, sizeof(reply) - 1);
		close(c);
	}
}

int main(int argc, char **argv)
{
	CUdeviceptr wa, wb, kv, gone;
	CUcontext ctx;
	CUdevice dev;
	size_t free_b, total_b, w, k;
	bool withdraw = false;
	long port = 0;
	int i = 1;

	for (; i < argc && argv[i][0] == '-'; i++)
		if (strcmp(argv[i], "--withdraw") == 0)
			withdraw = true;
		else if (strcmp(argv[i], "--port") == 0 && i + 1 < argc)
			port = strtol(argv[++i], NULL, 10);
		else
			break;
	if (argc - i != 2 || port <= 0 || port > 65535) {
		fprintf(stderr,
			"usage: shadow-withdraw --port PORT [--withdraw] WEIGHTS_MIB KV_MIB\n");
		return 2;
	}
	w = strtoul(argv[i], NULL, 10) << 20;
	k = strtoul(argv[i + 1], NULL, 10) << 20;
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
	if (withdraw)
		check(cuMemAlloc(&gone, w / 2), "cuMemAlloc (withdrawn)");
	check(cuMemAlloc(&wa, w / 2), "cuMemAlloc (weights)");
	check(cuMemAlloc(&wb, w / 2), "cuMemAlloc (weights)");
	check(cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
	check(cuMemAlloc(&kv, k), "cuMemAlloc (kv)");
	if (withdraw) {
		uint64_t deadline = mono_ms() + PARK_WAIT_MS;

		/* Parked with the extra region: the supervisor holds it in this shadow's layout. */
		while (!parked_with(4)) {
			if (mono_ms() > deadline) {
				fprintf(stderr,
					"shadow-withdraw: not parked with 4 regions within "
					"%d ms\n",
					PARK_WAIT_MS);
				return 1;
			}
			(void)poll(NULL, 0, 20);
		}
		check(cuMemFree(gone), "cuMemFree (withdrawn)");
	}
	printf("shadow-withdraw: allocated%s\n", withdraw ? " (one weights region withdrawn)" : "");
	fflush(stdout);
	serve((uint16_t)port);
	return 0;
}
