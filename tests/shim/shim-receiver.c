/* SPDX-License-Identifier: MIT */
/*
 * A stand-in for the supervisor's shim socket, for tests: listens on a SOCK_SEQPACKET socket,
 * accepts any number of shims, and writes one line per message received to OUTPUT (flushed
 * per line, so a test can wait for a count):
 *   hello pid=P conn=C engine=E role=R rank=N ndev=D dev0=UUID hello_pid=P
 *   announce pid=P conn=C id=I va=0xV size=S class=C order=O version=W dev=UUID fd=ok
 *   release pid=P conn=C id=I
 *   shadow-region pid=P conn=C id=I va=0xV size=S class=C order=O   (a shadow's scratch region)
 *   eof pid=P
 *   bytes pid=P id=I hex=HEX        (with --map, after that peer's eof)
 * pid is the peer's, from SO_PEERCRED; conn numbers connections in the order accepted. With --map the receiver keeps each announced fd and,
 * once the announcing process has gone, imports it through the emulated driver, maps it and
 * prints its first 16 bytes: the fd is the allocation's memory, and it outlived its owner.
 * Prints "ready" on stdout once listening; runs until killed.
 *
 * Usage: shim-receiver [--map] SOCKET OUTPUT
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cuda.h>

#include "belayer-emu.h"
#include "proto.h"
#include "util.h"

#define MAX_CLIENTS 64
#define MAX_KEPT    1024

struct kept {
	pid_t pid;
	uint64_t id;
	uint64_t size;
	int fd;
};

static struct kept kept[MAX_KEPT];
static size_t n_kept;

static bool do_map;
static bool cuda_ready;

static int map_bytes(int fd, uint64_t size, char hex[33])
{
	CUmemGenericAllocationHandle h;
	CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUdeviceptr va = 0;
	const unsigned char *p;
	int r = -EIO;

	if (!cuda_ready) {
		CUcontext ctx;
		CUdevice dev;

		if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
		    cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
		    cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
			return -EIO;
		cuda_ready = true;
	}
	if (cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
					   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
	    CUDA_SUCCESS)
		return -EIO;
	if (cuMemAddressReserve(&va, size, 0, 0, 0) != CUDA_SUCCESS)
		goto out_release;
	if (cuMemMap(va, size, 0, h, 0) != CUDA_SUCCESS)
		goto out_free;
	if (cuMemSetAccess(va, size, &acc, 1) == CUDA_SUCCESS &&
	    (p = belayer_emu_translate(va, 16))) {
		for (int i = 0; i < 16; i++)
			snprintf(hex + 2 * i, 3, "%02x", p[i]);
		r = 0;
	}
	(void)cuMemUnmap(va, size);
out_free:
	(void)cuMemAddressFree(va, size);
out_release:
	(void)cuMemRelease(h);
	return r;
}

static void print_kept(FILE *out, pid_t pid)
{
	for (size_t i = 0; i < n_kept; i++) {
		char hex[33] = "";

		if (kept[i].pid != pid)
			continue;
		if (map_bytes(kept[i].fd, kept[i].size, hex) < 0)
			snprintf(hex, sizeof(hex), "unmappable");
		fprintf(out, "bytes pid=%d id=%" PRIu64 " hex=%s\n", pid, kept[i].id, hex);
		close(kept[i].fd);
		kept[i--] = kept[--n_kept];
	}
	fflush(out);
}

static const char *uuid_hex(const uint8_t *u, char buf[2 * PROTO_UUID_LEN + 1])
{
	for (int i = 0; i < PROTO_UUID_LEN; i++)
		snprintf(buf + 2 * i, 3, "%02x", u[i]);
	return buf;
}

static void print_msg(FILE *out, pid_t pid, unsigned conn, struct proto_msg *m)
{
	char uuid[2 * PROTO_UUID_LEN + 1];

	switch (m->type) {
	case PROTO_HELLO:
		fprintf(out,
			"hello pid=%d conn=%u engine=%s role=%s rank=%d ndev=%u dev0=%s "
			"hello_pid=%u\n",
			pid, conn, m->hello.engine_id[0] ? m->hello.engine_id : "-",
			worker_role_to_string(m->hello.role), m->hello.rank, m->hello.n_devices,
			m->hello.n_devices ? uuid_hex(m->hello.device_uuid[0], uuid) : "-",
			m->hello.pid);
		break;
	case PROTO_REGION_ANNOUNCE:
		fprintf(out,
			"announce pid=%d conn=%u id=%" PRIu64 " va=0x%" PRIx64 " size=%" PRIu64
			" class=%s order=%" PRIu64 " version=%" PRIu64 " dev=%s fd=%s\n",
			pid, conn, m->region.id, m->region.va, m->region.size,
			region_class_to_string(m->region.cls), m->region.order,
			m->region.weights_version, uuid_hex(m->region.device_uuid, uuid),
			m->region.fd >= 0 ? "ok" : "none");
		if (do_map && m->region.fd >= 0 && n_kept < MAX_KEPT) {
			kept[n_kept++] =
				(struct kept){pid, m->region.id, m->region.size, m->region.fd};
			m->region.fd = -1;
		}
		break;
	case PROTO_REGION_RELEASE:
		fprintf(out, "release pid=%d conn=%u id=%" PRIu64 "\n", pid, conn, m->release.id);
		break;
	case PROTO_SHADOW_REGION:
		fprintf(out,
			"shadow-region pid=%d conn=%u id=%" PRIu64 " va=0x%" PRIx64 " size=%" PRIu64
			" class=%s order=%" PRIu64 "\n",
			pid, conn, m->shadow_region.id, m->shadow_region.va, m->shadow_region.size,
			region_class_to_string(m->shadow_region.cls), m->shadow_region.order);
		break;
	default:
		fprintf(out, "other pid=%d type=%d\n", pid, (int)m->type);
		break;
	}
	fflush(out);
}

int main(int argc, char **argv)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct pollfd fds[MAX_CLIENTS + 1];
	pid_t pids[MAX_CLIENTS + 1];
	unsigned conns[MAX_CLIENTS + 1], next_conn = 1;
	size_t n = 1;
	int argi = 1, lfd;
	FILE *out;

	if (argc > 1 && strcmp(argv[1], "--map") == 0) {
		do_map = true;
		argi++;
	}
	if (argc - argi != 2) {
		fprintf(stderr, "usage: %s [--map] SOCKET OUTPUT\n", argv[0]);
		return 2;
	}
	out = fopen(argv[argi + 1], "we");
	if (!out)
		return 1;
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (lfd < 0)
		return 1;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", argv[argi]);
	(void)unlink(sa.sun_path);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 64) < 0) {
		perror("bind/listen");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);

	fds[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
	for (;;) {
		if (poll(fds, n, -1) < 0) {
			if (errno == EINTR)
				continue;
			return 1;
		}
		if (fds[0].revents & POLLIN) {
			int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
			struct ucred cred;
			socklen_t len = sizeof(cred);

			if (c >= 0 && n <= MAX_CLIENTS &&
			    getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
				fds[n] = (struct pollfd){.fd = c, .events = POLLIN};
				conns[n] = next_conn++;
				pids[n++] = cred.pid;
			} else if (c >= 0)
				close(c);
		}
		for (size_t i = 1; i < n; i++) {
			struct proto_msg m;
			int r;

			if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			r = proto_recv(fds[i].fd, &m, 0);
			if (r == 0) {
				print_msg(out, pids[i], conns[i], &m);
				proto_msg_finish(&m);
				continue;
			}
			if (r != -ECONNRESET)
				fprintf(out, "error pid=%d r=%d\n", pids[i], r);
			if (do_map)
				print_kept(out, pids[i]);
			fprintf(out, "eof pid=%d\n", pids[i]);
			fflush(out);
			close(fds[i].fd);
			fds[i] = fds[n - 1];
			pids[i] = pids[n - 1];
			conns[i] = conns[n - 1];
			n--;
			i--;
		}
	}
}
