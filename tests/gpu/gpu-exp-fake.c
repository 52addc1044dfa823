/* SPDX-License-Identifier: MIT */
/*
 * gpu-exp-fake (experiment E5 of the shim review, tests/gpu/README.md): what does the real
 * driver do with the handles a shadow hands out: a fake handle (shim-shadow-scratch.c,
 * 0xb1a7...) passed to the calls the shim does not intercept for it, and a handle retained
 * from a scratch-mapped address exported as a POSIX fd (what a peer's IPC fetch does)?
 * cuda.h documents only "If handle is not a valid handle the behavior is undefined"
 * (cuMemRelease), so each call runs in its own child process: a SIGSEGV is a result, not a
 * crash of the experiment.
 *
 * Verdict: PASS "clean errors" when every call returned (an error code, or success), FAIL
 * naming the calls that killed their process: those must never reach the driver.
 *
 * Usage: gpu-exp-fake [--device N]
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu-check.h"

#define FAKE_HANDLE	((CUmemGenericAllocationHandle)0xb1a7000000000001ull)
#define CALL_TIMEOUT_MS 20000

static int dev;

static int fake_export(void)
{
	int fd = -1;
	CUresult r = cu.cuMemExportToShareableHandle(&fd, FAKE_HANDLE,
						     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);

	printf("%s, fd %d", gpu_cu_name(r), fd);
	return 0;
}

static int fake_properties(void)
{
	CUmemAllocationProp prop;
	CUresult r;

	memset(&prop, 0, sizeof(prop));
	r = cu.cuMemGetAllocationPropertiesFromHandle(&prop, FAKE_HANDLE);
	printf("%s", gpu_cu_name(r));
	return 0;
}

static int fake_release(void)
{
	printf("%s", gpu_cu_name(cu.cuMemRelease(FAKE_HANDLE)));
	return 0;
}

static int fake_map(void)
{
	CUdeviceptr va = 0;
	CUresult r = cu.cuMemAddressReserve(&va, 2u << 20, 0, 0, 0);

	if (r == CUDA_SUCCESS)
		r = cu.cuMemMap(va, 2u << 20, 0, FAKE_HANDLE, 0);
	printf("%s", gpu_cu_name(r));
	return 0;
}

/* A scratch unit (no shareable type requested, like shim-shadow-scratch.c) mapped at two VAs;
 * the handle retained from the second is exported. */
static int scratch_retain_export(void)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
	};
	CUmemGenericAllocationHandle h, h2;
	CUdeviceptr a, b;
	CUresult r;
	int fd = -1;

	r = cu.cuMemCreate(&h, 2u << 20, &prop, 0);
	if (r == CUDA_SUCCESS)
		r = gpu_vmm_map(h, 2u << 20, dev, &a);
	if (r == CUDA_SUCCESS)
		r = gpu_vmm_map(h, 2u << 20, dev, &b);
	if (r != CUDA_SUCCESS) {
		printf("setting up the scratch mappings failed: %s", gpu_cu_name(r));
		return 1;
	}
	r = cu.cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(b + 4096));
	printf("retain %s (%s the creating handle)", gpu_cu_name(r),
	       r == CUDA_SUCCESS && h2 == h ? "equal to" : "not");
	if (r != CUDA_SUCCESS)
		return 0;
	r = cu.cuMemExportToShareableHandle(&fd, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	printf(", export %s, fd %d", gpu_cu_name(r), fd);
	return 0;
}

static const struct {
	const char *name;
	int (*fn)(void);
} calls[] = {
	{"cuMemExportToShareableHandle(fake, POSIX_FD)", fake_export},
	{"cuMemGetAllocationPropertiesFromHandle(fake)", fake_properties},
	{"cuMemRelease(fake)", fake_release},
	{"cuMemMap(reserved VA, fake)", fake_map},
	{"cuMemRetainAllocationHandle(scratch VA) + export POSIX_FD", scratch_retain_export},
};

static int child(void *arg)
{
	int i = *(int *)arg;

	if (gpu_cu_open(dev) < 0)
		return 2;
	return calls[i].fn();
}

int main(int argc, char **argv)
{
	int n = (int)(sizeof(calls) / sizeof(calls[0])), crashed = 0, other = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && strcmp(argv[1], "--device") == 0)
		dev = atoi(argv[2]);
	else if (argc != 1) {
		fprintf(stderr, "usage: gpu-exp-fake [--device N]\n");
		return 2;
	}
	for (int i = 0; i < n; i++) {
		int pipefd[2], st;
		char out[512] = "";
		ssize_t len;
		pid_t pid;

		if (pipe(pipefd) < 0)
			return 1;
		fflush(NULL);
		pid = fork();
		if (pid == 0) {
			(void)dup2(pipefd[1], STDOUT_FILENO);
			close(pipefd[0]);
			st = child(&i);
			fflush(stdout);
			_exit(st);
		}
		close(pipefd[1]);
		st = gpu_wait(pid, CALL_TIMEOUT_MS);
		len = read(pipefd[0], out, sizeof(out) - 1);
		out[len > 0 ? len : 0] = '\0';
		close(pipefd[0]);
		/* the child's words go on one detail line */
		for (char *c = out; *c; c++)
			if (*c == '\n')
				*c = c[1] ? ' ' : '\0';
		if (st == -ETIMEDOUT) {
			printf("%s: hung (killed after %d s) %s\n", calls[i].name,
			       CALL_TIMEOUT_MS / 1000, out);
			crashed++;
		} else if (st >= 0 && WIFSIGNALED(st)) {
			printf("%s: killed its process with signal %d (%s) %s\n", calls[i].name,
			       WTERMSIG(st), strsignal(WTERMSIG(st)), out);
			crashed++;
		} else if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
			printf("%s: returned %s\n", calls[i].name, out);
		} else {
			printf("%s: the child failed (status %d): %s\n", calls[i].name, st, out);
			other++;
		}
	}
	if (crashed)
		printf("summary: %d of %d calls crashed or hung their process: undefined behaviour "
		       "reaches the host process\n",
		       crashed, n);
	else if (other)
		printf("summary: %d of %d calls could not be tried (above)\n", other, n);
	else
		printf("summary: clean errors: all %d calls returned to the caller (results "
		       "above)\n",
		       n);
	return crashed || other ? 1 : 0;
}
