/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdpass.h"
#include "test-emu-cuda-util.h"
#include "test-util.h"

extern char **environ;

struct cu_api cu;
static char *run_dir;

int cu_setup(const char *mem)
{
	run_dir = test_mkdtemp("belayer-emu-test");
	if (!run_dir)
		return -1;
	setenv("BELAYER_EMU_DIR", run_dir, 1);
	if (mem)
		setenv("BELAYER_EMU_MEM", mem, 1);
	return cu_load() == CUDA_SUCCESS ? 0 : -1;
}

int cu_load(void)
{
	CUdriverProcAddressQueryResult status;

	cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cu.lib) {
		fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
		return -1;
	}
	cu.getProcAddress = (PFN_cuGetProcAddress_v12000)dlsym(cu.lib, "cuGetProcAddress_v2");
	if (!cu.getProcAddress)
		return -1;
#define CU_RESOLVE(name, ver)                                                               \
	if (cu.getProcAddress(#name, (void **)&cu.name, 13000, CU_GET_PROC_ADDRESS_DEFAULT, \
			      &status) != CUDA_SUCCESS ||                                   \
	    !cu.name) {                                                                     \
		fprintf(stderr, "cannot resolve %s\n", #name);                              \
		return -1;                                                                  \
	}
	CU_FUNCS(CU_RESOLVE)
#undef CU_RESOLVE
	cu.translate = dlsym(cu.lib, "belayer_emu_translate");
	cu.live_allocations = dlsym(cu.lib, "belayer_emu_live_allocations");
	cu.alloc_id = dlsym(cu.lib, "belayer_emu_alloc_id");
	if (!cu.translate || !cu.live_allocations || !cu.alloc_id)
		return -1;
	return (int)cu.cuInit(0);
}

int cu_teardown(void)
{
	if (run_dir) {
		(void)test_rmtree(run_dir);
		free(run_dir);
		run_dir = NULL;
	}
	return 0;
}

int cu_use_device(int dev)
{
	CUcontext ctx;
	CUresult r = cu.cuDevicePrimaryCtxRetain(&ctx, dev);

	if (r != CUDA_SUCCESS)
		return r;
	return cu.cuCtxSetCurrent(ctx);
}

CUresult cu_vmm_create(int dev, size_t size, bool exportable, CUmemGenericAllocationHandle *ret)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
		.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
						   : CU_MEM_HANDLE_TYPE_NONE,
	};

	return cu.cuMemCreate(ret, size, &prop, 0);
}

CUresult cu_vmm_map(CUmemGenericAllocationHandle h, size_t size, int dev, CUdeviceptr *ret)
{
	CUmemAccessDesc access = {
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	CUdeviceptr p;
	CUresult r;

	r = cu.cuMemAddressReserve(&p, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = cu.cuMemMap(p, size, 0, h, 0);
	if (r == CUDA_SUCCESS)
		r = cu.cuMemSetAccess(p, size, &access, 1);
	if (r != CUDA_SUCCESS) {
		(void)cu.cuMemUnmap(p, size);
		(void)cu.cuMemAddressFree(p, size);
		return r;
	}
	*ret = p;
	return CUDA_SUCCESS;
}

void cu_vmm_unmap(CUdeviceptr p, size_t size)
{
	(void)cu.cuMemUnmap(p, size);
	(void)cu.cuMemAddressFree(p, size);
}

pid_t test_fork(int (*fn)(void *arg), void *arg)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0)
		_exit(fn(arg));
	return pid;
}

int test_wait(pid_t pid, int timeout_ms)
{
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	struct pollfd p = {.fd = pidfd, .events = POLLIN};
	int status, r;

	if (pidfd < 0)
		return -errno;
	r = poll(&p, 1, timeout_ms);
	close(pidfd);
	if (r == 0) {
		kill(pid, SIGKILL);
		(void)waitpid(pid, &status, 0);
		return -ETIMEDOUT;
	}
	if (waitpid(pid, &status, 0) != pid)
		return -errno;
	return status;
}

int test_wait_exit(pid_t pid, int timeout_ms)
{
	int status = test_wait(pid, timeout_ms);

	if (status < 0)
		return -1;
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 1000 + WTERMSIG(status);
	return -1;
}

int test_send_fd(int sock, int fd, uint64_t value)
{
	ssize_t n = fdpass_send(sock, &value, sizeof(value), &fd, 1, 0);
	return n == (ssize_t)sizeof(value) ? 0 : (n < 0 ? (int)n : -EIO);
}

int test_recv_fd(int sock, uint64_t *ret_value)
{
	int fds[1];
	size_t nfds = 0;
	uint64_t v;
	ssize_t n;

	for (;;) {
		n = fdpass_recv(sock, &v, sizeof(v), fds, 1, &nfds, 0);
		if (n != -EINTR)
			break;
	}
	if (n != (ssize_t)sizeof(v) || nfds != 1)
		return n < 0 ? (int)n : -EBADMSG;
	if (ret_value)
		*ret_value = v;
	return fds[0];
}

int test_send_u64(int sock, uint64_t value)
{
	ssize_t n = fdpass_send(sock, &value, sizeof(value), NULL, 0, 0);
	return n == (ssize_t)sizeof(value) ? 0 : (n < 0 ? (int)n : -EIO);
}

int test_recv_u64(int sock, uint64_t *ret_value)
{
	size_t nfds = 0;
	ssize_t n;

	for (;;) {
		n = fdpass_recv(sock, ret_value, sizeof(*ret_value), NULL, 0, &nfds, 0);
		if (n != -EINTR)
			break;
	}
	return n == (ssize_t)sizeof(*ret_value) ? 0 : (n < 0 ? (int)n : -EBADMSG);
}

int test_emu_ctl(const char *const *args)
{
	const char *tool = getenv("EMU_CTL");
	char *argv[16];
	size_t n = 0;
	pid_t pid;

	if (!tool)
		return -1;
	argv[n++] = (char *)tool;
	for (; args[n - 1] && n < (sizeof(argv) / sizeof(argv[0]) - 1); n++)
		argv[n] = (char *)args[n - 1];
	argv[n] = NULL;
	if (posix_spawn(&pid, tool, NULL, NULL, argv, environ) != 0)
		return -1;
	return test_wait_exit(pid, 10000);
}
