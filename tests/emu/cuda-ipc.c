/* SPDX-License-Identifier: MIT */
/*
 * Legacy CUDA IPC for cuMemAlloc memory. The 64-byte handle names the exporting process, the
 * exporter's fd of the memfd and the allocation id; the importer opens the memory through
 * /proc/PID/fd/N. So a handle only opens while its exporter is alive and still has the memory
 * (cuMemFree closes that fd): an exporter that freed or died makes cuIpcOpenMemHandle fail.
 */
#include <fcntl.h>
#include <string.h>

#include "cuda-internal.h"

#define IPC_MAGIC 0x42495043u /* "BIPC" */

struct ipc_handle {
	uint32_t magic;
	int32_t pid;
	int32_t fd;
	uint32_t pad;
	uint64_t id;
	char run_id[32];
};

_Static_assert(sizeof(struct ipc_handle) <= CU_IPC_HANDLE_SIZE, "CUipcMemHandle too small");

CUAPI CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	struct emu_reservation *r;
	struct ipc_handle h = {.magic = IPC_MAGIC};
	CUresult ret = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	if (!pHandle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find(dptr);
	/* "dptr - Base pointer to previously allocated device memory": cuMemAlloc memory. */
	if (r && r->kind == EMU_RES_MEMALLOC && r->base == dptr && r->nmaps == 1) {
		h.pid = getpid();
		h.fd = r->maps[0].alloc->fd;
		h.id = r->maps[0].alloc->id;
		snprintf(h.run_id, sizeof(h.run_id), "%s", emu_state_run_id());
		memset(pHandle, 0, sizeof(*pHandle));
		memcpy(pHandle->reserved, &h, sizeof(h));
		ret = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

/* The exporter's memfd, if the handle still names one: same run, same allocation id. */
static int open_exported(const struct ipc_handle *h)
{
	char path[64], target[256];
	uint64_t id;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", h->pid, h->fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -ENOENT;
	/* The fd number may have been reused since: check what we opened. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0) {
		close(fd);
		return -ENOENT;
	}
	target[n] = '\0';
	if (emu_mem_parse_name(target, NULL, &id, NULL) < 0 || id != h->id) {
		close(fd);
		return -ENOENT;
	}
	return fd;
}

CUAPI CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	struct ipc_handle h;
	struct emu_reservation *r = NULL;
	struct emu_alloc *a = NULL;
	CUdevice dev;
	CUresult ret;
	int fd, e;

	EMU_ENTER();
	if (!pdptr || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
		return CUDA_ERROR_INVALID_VALUE;
	ret = emu_current_device(&dev);
	if (ret != CUDA_SUCCESS)
		return ret;
	memcpy(&h, handle.reserved, sizeof(h));
	if (h.magic != IPC_MAGIC || strncmp(h.run_id, emu_state_run_id(), sizeof(h.run_id)) != 0)
		return CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&emu_va_lock);
	/* "If the memory handle has already been opened by the current context, the reference
	 * count on the handle is incremented by 1 and the existing device pointer is
	 * returned." */
	r = emu_va_find_ipc(h.id);
	if (r) {
		r->ipc_refs++;
		*pdptr = r->base;
		r = NULL;
		ret = CUDA_SUCCESS;
		goto out;
	}
	fd = open_exported(&h);
	if (fd < 0) {
		ret = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	e = emu_alloc_import(fd, &a);
	close(fd);
	if (e < 0) {
		ret = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	e = emu_va_reserve(a->size, EMU_PAGE, 0, EMU_RES_IPC, &r);
	if (e == 0)
		e = emu_va_map(r, 0, a->size, a);
	if (e < 0) {
		ret = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	memset(r->maps[0].access, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, sizeof(r->maps[0].access));
	r->user_size = a->size;
	r->ipc_refs = 1;
	*pdptr = r->base;
	r = NULL;
	ret = CUDA_SUCCESS;
out:
	if (r)
		emu_va_release(r);
	if (a) {
		a->handle_refs--;
		emu_alloc_unref(a);
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}
EMU_VARIANT(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2,
	    (CUdeviceptr * pdptr, CUipcMemHandle handle, unsigned int Flags),
	    (pdptr, handle, Flags));

CUAPI CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	struct emu_reservation *r;
	CUresult ret = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find(dptr);
	if (r && r->kind == EMU_RES_IPC && r->base == dptr) {
		if (--r->ipc_refs == 0)
			emu_va_release(r);
		ret = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}
