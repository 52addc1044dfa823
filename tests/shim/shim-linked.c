/* SPDX-License-Identifier: MIT */
/*
 * A program linked against libcuda.so.1 that calls cuMemCreate directly without asking for
 * any shareable handle type, as vLLM's CuMemAllocator and torch_memory_saver do. It prints
 * "exportable=1" when the handle can be exported as a POSIX fd anyway (the shim's doing:
 * without it the driver refuses), writes a known pattern at the start of the mapping, and
 * holds until stdin reaches EOF.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#define CHECK(call)                                                                      \
	do {                                                                             \
		CUresult r_ = (call);                                                    \
		if (r_ != CUDA_SUCCESS) {                                                \
			fprintf(stderr, "shim-linked: %s failed: %d\n", #call, (int)r_); \
			exit(1);                                                         \
		}                                                                        \
	} while (0)

int main(void)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
	};
	CUmemAccessDesc acc = {.location = prop.location,
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	unsigned char pattern[16];
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	CUcontext ctx;
	CUdevice dev;
	size_t gran, size;
	int fd = -1;
	char line[16];

	CHECK(cuInit(0));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CHECK(cuCtxSetCurrent(ctx));
	CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	size = 2 * gran;
	CHECK(cuMemCreate(&h, size, &prop, 0));
	CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
	CHECK(cuMemMap(va, size, 0, h, 0));
	CHECK(cuMemSetAccess(va, size, &acc, 1));
	for (int i = 0; i < 16; i++)
		pattern[i] = (unsigned char)(0xa0 + i);
	CHECK(cuMemcpyHtoD(va, pattern, sizeof(pattern)));

	printf("exportable=%d\n",
	       cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
		       CUDA_SUCCESS);
	fflush(stdout);
	if (fd >= 0)
		close(fd);
	while (fgets(line, sizeof(line), stdin))
		;
	CHECK(cuMemUnmap(va, size));
	CHECK(cuMemRelease(h));
	CHECK(cuMemAddressFree(va, size));
	return 0;
}
