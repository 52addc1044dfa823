/* SPDX-License-Identifier: MIT */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu-check.h"

struct gpu_cu cu;

/* Each entry point is requested at the CUDA version of the prototype it is called with (the
 * typedef's suffix), as the runtime does: a newer version may return an entry point with a
 * different signature (cuCtxSynchronize_v2 in CUDA 13 takes a context). */

/* Host staging buffer for pattern copies: large enough to keep copies efficient, small
 * enough not to matter next to the device memory checked. */
#define CHUNK (8u << 20)

int gpu_cu_open(int dev)
{
	PFN_cuGetProcAddress_v12000 get_proc;
	CUdriverProcAddressQueryResult found;
	CUcontext ctx;
	CUresult r;

	cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cu.lib) {
		printf("summary: dlopen libcuda.so.1: %s\n", dlerror());
		return -1;
	}
	get_proc = (PFN_cuGetProcAddress_v12000)dlsym(cu.lib, "cuGetProcAddress_v2");
	if (!get_proc) {
		printf("summary: libcuda.so.1 has no cuGetProcAddress_v2\n");
		return -1;
	}
#define RESOLVE(name, ver)                                                                   \
	r = get_proc(#name, (void **)&cu.name, ver, CU_GET_PROC_ADDRESS_DEFAULT, &found);    \
	if (r != CUDA_SUCCESS || !cu.name) {                                                 \
		printf("summary: cuGetProcAddress_v2(%s, %d): result %d, query result %d\n", \
		       #name, ver, (int)r, (int)found);                                      \
		return -1;                                                                   \
	}
	GPU_CU_FUNCS(RESOLVE)
#undef RESOLVE

	r = cu.cuInit(0);
	if (r != CUDA_SUCCESS) {
		printf("summary: cuInit: %s\n", gpu_cu_name(r));
		return -1;
	}
	r = cu.cuDevicePrimaryCtxRetain(&ctx, dev);
	if (r == CUDA_SUCCESS)
		r = cu.cuCtxSetCurrent(ctx);
	if (r != CUDA_SUCCESS) {
		printf("summary: primary context of device %d: %s\n", dev, gpu_cu_name(r));
		return -1;
	}
	return 0;
}

const char *gpu_cu_name(CUresult r)
{
	static char buf[32];
	const char *s = NULL;

	if (cu.cuGetErrorName && cu.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
		return s;
	snprintf(buf, sizeof(buf), "CUresult %d", (int)r);
	return buf;
}

CUresult gpu_vmm_map(CUmemGenericAllocationHandle h, size_t size, int dev, CUdeviceptr *ret_va)
{
	CUmemAccessDesc access = {
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	CUdeviceptr va = 0;
	CUresult r;

	r = cu.cuMemAddressReserve(&va, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = cu.cuMemMap(va, size, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		(void)cu.cuMemAddressFree(va, size);
		return r;
	}
	r = cu.cuMemSetAccess(va, size, &access, 1);
	if (r != CUDA_SUCCESS) {
		(void)cu.cuMemUnmap(va, size);
		(void)cu.cuMemAddressFree(va, size);
		return r;
	}
	*ret_va = va;
	return CUDA_SUCCESS;
}

CUresult gpu_vmm_alloc(int dev, size_t size, CUmemGenericAllocationHandle *ret_handle,
		       CUdeviceptr *ret_va)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
	};
	CUmemGenericAllocationHandle h;
	CUresult r;

	r = cu.cuMemCreate(&h, size, &prop, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = gpu_vmm_map(h, size, dev, ret_va);
	if (r != CUDA_SUCCESS) {
		(void)cu.cuMemRelease(h);
		return r;
	}
	*ret_handle = h;
	return CUDA_SUCCESS;
}

CUresult gpu_pattern_fill(CUdeviceptr va, size_t size, uint64_t seed)
{
	uint64_t *buf = malloc(CHUNK);
	CUresult r = CUDA_SUCCESS;

	if (!buf)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (size_t off = 0; off < size && r == CUDA_SUCCESS; off += CHUNK) {
		size_t n = size - off < CHUNK ? size - off : CHUNK;

		for (size_t i = 0; i < n / 8; i++)
			buf[i] = gpu_pattern_word(seed, off / 8 + i);
		r = cu.cuMemcpyHtoD(va + off, buf, n);
	}
	if (r == CUDA_SUCCESS)
		r = cu.cuCtxSynchronize();
	free(buf);
	return r;
}

CUresult gpu_pattern_check(CUdeviceptr va, size_t size, uint64_t seed, uint64_t *ret_bad,
			   uint64_t *ret_first_bad)
{
	uint64_t *buf = malloc(CHUNK), bad = 0, first = size;
	CUresult r = CUDA_SUCCESS;

	if (!buf)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (size_t off = 0; off < size; off += CHUNK) {
		size_t n = size - off < CHUNK ? size - off : CHUNK;

		r = cu.cuMemcpyDtoH(buf, va + off, n);
		if (r != CUDA_SUCCESS)
			break;
		for (size_t i = 0; i < n / 8; i++)
			if (buf[i] != gpu_pattern_word(seed, off / 8 + i)) {
				if (!bad)
					first = off + i * 8;
				bad++;
			}
	}
	free(buf);
	*ret_bad = bad;
	*ret_first_bad = first;
	return r;
}

int gpu_send(int sock, int fd, uint64_t value)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u = {};
	struct iovec iov = {.iov_base = &value, .iov_len = sizeof(value)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;

	if (fd >= 0) {
		struct cmsghdr *c;

		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n == sizeof(value) ? 0 : -EIO;
}

int gpu_recv(int sock, int timeout_ms, int *ret_fd, uint64_t *ret_value)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	uint64_t value;
	struct iovec iov = {.iov_base = &value, .iov_len = sizeof(value)};
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = u.buf,
		.msg_controllen = sizeof(u.buf),
	};
	struct pollfd p = {.fd = sock, .events = POLLIN};
	struct cmsghdr *c;
	ssize_t n;
	int fd = -1, r;

	do
		r = poll(&p, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(&fd, CMSG_DATA(c), sizeof(int));
	if (n == 0)
		return -ECONNRESET;
	if (n != sizeof(value) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		if (fd >= 0)
			close(fd);
		return -EBADMSG;
	}
	*ret_value = value;
	if (ret_fd)
		*ret_fd = fd;
	else if (fd >= 0)
		close(fd);
	return 0;
}

pid_t gpu_fork(int (*fn)(void *arg), void *arg)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		int r = fn(arg);

		fflush(NULL);
		_exit(r);
	}
	return pid;
}

int gpu_wait(pid_t pid, int timeout_ms)
{
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	struct pollfd p = {.fd = pidfd, .events = POLLIN};
	int status, r;

	if (pidfd < 0)
		return -errno;
	do
		r = poll(&p, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	close(pidfd);
	if (r <= 0) {
		(void)kill(pid, SIGKILL);
		(void)waitpid(pid, &status, 0);
		return -ETIMEDOUT;
	}
	if (waitpid(pid, &status, 0) != pid)
		return -errno;
	return status;
}

double gpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int gpu_parse_size(const char *s, uint64_t *ret)
{
	unsigned long long v;
	unsigned shift = 0;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	switch (*end) {
	case 'K':
	case 'k':
		shift = 10, end++;
		break;
	case 'M':
	case 'm':
		shift = 20, end++;
		break;
	case 'G':
	case 'g':
		shift = 30, end++;
		break;
	default:
		break;
	}
	if (*end || v > (UINT64_MAX >> shift))
		return -EINVAL;
	*ret = (uint64_t)v << shift;
	return 0;
}
