/* SPDX-License-Identifier: MIT */
/*
 * Virtual memory management (cuMemCreate, cuMemAddressReserve, cuMemMap, ...), with the rules
 * cuda.h documents enforced rather than assumed: see README.md for the line each check
 * follows.
 */
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>

#include "cuda-internal.h"

#define GRAN EMU_VMM_GRANULARITY

static bool aligned(uint64_t v, uint64_t a)
{
	return (v & (a - 1)) == 0;
}

static CUresult errno_to_cu(int e)
{
	switch (e) {
	case 0:
		return CUDA_SUCCESS;
	case -ENOMEM:
		return CUDA_ERROR_OUT_OF_MEMORY;
	case -EINVAL:
	case -ERANGE:
	case -EBUSY:
	case -EBADF:
		return CUDA_ERROR_INVALID_VALUE;
	default:
		return CUDA_ERROR_UNKNOWN;
	}
}

static CUresult check_prop(const CUmemAllocationProp *prop)
{
	if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	if (prop->location.id < 0 || prop->location.id >= emu_ndevices())
		return CUDA_ERROR_INVALID_DEVICE;
	/* Only POSIX file descriptors can be exported from this emulator. */
	if (prop->requestedHandleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
					     CUmemAllocationGranularity_flags option)
{
	CUresult r;

	EMU_ENTER();
	if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
			     option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
		return CUDA_ERROR_INVALID_VALUE;
	r = check_prop(prop);
	if (r != CUDA_SUCCESS)
		return r;
	*granularity = GRAN;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
			   const CUmemAllocationProp *prop, unsigned long long flags)
{
	struct emu_alloc *a;
	CUresult r;
	int e;

	EMU_ENTER();
	if (!handle || flags != 0 || size == 0 || !aligned(size, GRAN))
		return CUDA_ERROR_INVALID_VALUE;
	r = check_prop(prop);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&emu_va_lock);
	e = emu_alloc_create(prop->location.id, size, prop, &a);
	pthread_mutex_unlock(&emu_va_lock);
	if (e < 0)
		return errno_to_cu(e);
	*handle = (CUmemGenericAllocationHandle)(uintptr_t)a;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct emu_alloc *a;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	pthread_mutex_lock(&emu_va_lock);
	a = emu_alloc_lookup(handle);
	if (a && a->handle_refs) {
		/* Mappings keep the memory: "The generic memory handle can be freed when there
		 * are still outstanding mappings made with this handle." */
		a->handle_refs--;
		emu_alloc_unref(a);
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return r;
}

CUAPI CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
				   CUdeviceptr addr, unsigned long long flags)
{
	struct emu_reservation *r;
	int e;

	EMU_ENTER();
	/* "The size and address parameters must be a multiple of the host page size and the
	 * alignment must be a power of two or zero for default alignment." */
	if (!ptr || flags != 0 || size == 0 || !aligned(size, EMU_PAGE) ||
	    !aligned(addr, EMU_PAGE) || (alignment & (alignment - 1)))
		return CUDA_ERROR_INVALID_VALUE;
	if (alignment < GRAN)
		alignment = GRAN; /* so that granularity-aligned mappings can start at ptr */
	pthread_mutex_lock(&emu_va_lock);
	e = emu_va_reserve(size, alignment, addr, EMU_RES_VMM, &r);
	if (e == 0)
		*ptr = r->base;
	pthread_mutex_unlock(&emu_va_lock);
	return errno_to_cu(e);
}

CUAPI CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	struct emu_reservation *r;
	CUresult ret = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find(ptr);
	/* "The size must match what was given to memAddressReserve and the ptr given must match
	 * what was returned from memAddressReserve." Still-mapped ranges are refused: freeing
	 * them is undocumented, and callers must cuMemUnmap first. */
	if (r && r->kind == EMU_RES_VMM && r->base == ptr && r->size == size && r->nmaps == 0) {
		emu_va_release(r);
		ret = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

CUAPI CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	struct emu_reservation *r;
	struct emu_alloc *a;
	CUresult ret = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	/* "offset ... Note: currently must be zero"; ptr and size multiples of the minimum
	 * granularity; flags must be zero. */
	if (offset != 0 || flags != 0 || size == 0 || !aligned(ptr, GRAN) || !aligned(size, GRAN))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&emu_va_lock);
	a = emu_alloc_lookup(handle);
	r = emu_va_find(ptr);
	/* "This range must be an address reservation previously reserved with
	 * cuMemAddressReserve, and offset + size must be less than the size of the memory
	 * allocation." "cuMemMap can only create mappings on VA range reservations that are
	 * not currently mapped." */
	if (a && a->handle_refs && r && r->kind == EMU_RES_VMM && size <= a->size &&
	    size <= r->size - (ptr - r->base))
		ret = errno_to_cu(emu_va_map(r, ptr - r->base, size, a));
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

CUAPI CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	struct emu_reservation *r;
	CUresult ret = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find(ptr);
	if (r && r->kind == EMU_RES_VMM && size > 0 && size <= r->size - (ptr - r->base)) {
		/* "The range must be the entire contiguous address range that was mapped to":
		 * every mapping it touches must lie wholly inside it, and it must start and end
		 * on mapping boundaries. */
		size_t off = ptr - r->base, end = off + size, covered = 0;
		bool ok = true;

		for (size_t i = 0; i < r->nmaps; i++) {
			const struct emu_mapping *m = &r->maps[i];
			if (m->offset + m->size <= off || m->offset >= end)
				continue;
			if (m->offset < off || m->offset + m->size > end)
				ok = false;
			covered += m->size;
		}
		if (ok && covered == size) {
			(void)emu_va_unmap(r, off, size);
			ret = CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

CUAPI CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
			      size_t count)
{
	struct emu_reservation *r;
	size_t off, end, cur;
	CUresult ret = CUDA_SUCCESS;

	EMU_ENTER();
	if (!desc || count == 0 || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
			return CUDA_ERROR_NOT_SUPPORTED;
		if (desc[i].location.id < 0 || desc[i].location.id >= emu_ndevices())
			return CUDA_ERROR_INVALID_DEVICE;
		if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
		    desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			return CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find(ptr);
	if (!r || r->kind != EMU_RES_VMM || size > r->size - (ptr - r->base)) {
		ret = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* "The range must be a fully mapped address range containing all allocations created
	 * by cuMemMap / cuMemCreate." */
	off = ptr - r->base;
	end = off + size;
	for (cur = off; cur < end;) {
		struct emu_mapping *m = emu_va_mapping(r, cur);
		if (!m || m->offset < off || m->offset + m->size > end) {
			ret = CUDA_ERROR_INVALID_VALUE;
			goto out;
		}
		cur = m->offset + m->size;
	}
	for (cur = off; cur < end;) {
		struct emu_mapping *m = emu_va_mapping(r, cur);
		for (size_t i = 0; i < count; i++)
			m->access[desc[i].location.id] = (uint8_t)desc[i].flags;
		cur = m->offset + m->size;
	}
out:
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

CUAPI CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
			      CUdeviceptr ptr)
{
	struct emu_reservation *r;
	struct emu_mapping *m;
	CUresult ret = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    location->id < 0 || location->id >= emu_ndevices())
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find(ptr);
	m = r ? emu_va_mapping(r, ptr - r->base) : NULL;
	if (m) {
		*flags = m->access[location->id];
		ret = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

CUAPI CUresult cuMemExportToShareableHandle(void *shareableHandle,
					    CUmemGenericAllocationHandle handle,
					    CUmemAllocationHandleType handleType,
					    unsigned long long flags)
{
	struct emu_alloc *a;
	CUresult ret = CUDA_ERROR_INVALID_VALUE;
	int fd;

	EMU_ENTER();
	if (!shareableHandle || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&emu_va_lock);
	a = emu_alloc_lookup(handle);
	/* Only handle types requested at creation (CUmemAllocationProp::requestedHandleTypes)
	 * can be exported. */
	if (a && a->handle_refs &&
	    (a->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
		/* A new open file description of the same memfd: it keeps the memory alive on
		 * its own, in whatever process ends up holding it. */
		char path[64];
		snprintf(path, sizeof(path), "/proc/self/fd/%d", a->fd);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd >= 0) {
			*(int *)shareableHandle = fd;
			ret = CUDA_SUCCESS;
		} else
			ret = CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

CUAPI CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
					      CUmemAllocationHandleType shHandleType)
{
	struct emu_alloc *a;
	int e;

	EMU_ENTER();
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&emu_va_lock);
	/* For POSIX fds, osHandle is the fd itself: "(void *)(uintptr_t)fd". The caller keeps
	 * its fd; the handle holds a duplicate. */
	e = emu_alloc_import((int)(intptr_t)osHandle, &a);
	pthread_mutex_unlock(&emu_va_lock);
	if (e < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*handle = (CUmemGenericAllocationHandle)(uintptr_t)a;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
						      CUmemGenericAllocationHandle handle)
{
	struct emu_alloc *a;
	CUresult ret = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	if (!prop)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&emu_va_lock);
	a = emu_alloc_lookup(handle);
	if (a) {
		*prop = a->prop;
		ret = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

CUAPI CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	struct emu_reservation *r;
	struct emu_mapping *m;
	CUresult ret = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find((CUdeviceptr)(uintptr_t)addr);
	m = r && r->kind == EMU_RES_VMM ? emu_va_mapping(r, (uintptr_t)addr - r->base) : NULL;
	if (m) {
		/* "The handle is guaranteed to be the same handle value used to map the
		 * memory ... must be released with corresponding number of calls to
		 * cuMemRelease." */
		m->alloc->handle_refs++;
		*handle = (CUmemGenericAllocationHandle)(uintptr_t)m->alloc;
		ret = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}
