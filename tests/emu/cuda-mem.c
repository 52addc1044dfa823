/* SPDX-License-Identifier: MIT */
/*
 * cuMemAlloc-style memory, its queries, copies and memsets. Execution is synchronous: an
 * Async call has completed when it returns, which the documentation allows ("may be
 * asynchronous").
 */
#include <string.h>

#include "cuda-internal.h"

/* Allocations are memfd-backed like everything else: a page is the smallest unit, which
 * keeps the 256-byte pointer alignment cuMemAlloc documents. */
static CUresult mem_alloc(CUdeviceptr *dptr, size_t bytesize)
{
	struct emu_reservation *r = NULL;
	struct emu_alloc *a = NULL;
	size_t size;
	CUdevice dev;
	CUresult cr;
	int e;

	if (!dptr || bytesize == 0) /* "If bytesize is 0, cuMemAlloc() returns
				     * CUDA_ERROR_INVALID_VALUE" */
		return CUDA_ERROR_INVALID_VALUE;
	cr = emu_current_device(&dev);
	if (cr != CUDA_SUCCESS)
		return cr;
	if (bytesize > SIZE_MAX - EMU_PAGE)
		return CUDA_ERROR_OUT_OF_MEMORY;
	size = (bytesize + EMU_PAGE - 1) & ~(EMU_PAGE - 1);

	pthread_mutex_lock(&emu_va_lock);
	e = emu_alloc_create(dev, size, NULL, &a);
	if (e < 0)
		goto out;
	e = emu_va_reserve(size, EMU_PAGE, 0, EMU_RES_MEMALLOC, &r);
	if (e < 0)
		goto out;
	r->user_size = bytesize;
	e = emu_va_map(r, 0, size, a);
	if (e < 0)
		goto out;
	r->maps[0].access[dev] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	*dptr = r->base;
	r = NULL;
out:
	if (r)
		emu_va_release(r);
	if (a) {
		a->handle_refs--; /* the mapping holds it; cuMemFree drops the mapping */
		emu_alloc_unref(a);
	}
	pthread_mutex_unlock(&emu_va_lock);
	if (e == -ENOMEM)
		return CUDA_ERROR_OUT_OF_MEMORY;
	return e < 0 ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS;
}

CUAPI CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	CUresult r;

	EMU_ENTER();
	/* The documented example of a call unsafe during capture (cudaMalloc). */
	r = emu_capture_unsafe();
	return r != CUDA_SUCCESS ? r : mem_alloc(dptr, bytesize);
}

/* The CUDA 2.x entry point with 32-bit device pointers: the emulator's device addresses do
 * not fit in one, so it is resolvable (cuGetProcAddress below 3020) but always fails. */
CUAPI CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
	EMU_ENTER();
	return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult mem_free(CUdeviceptr dptr)
{
	struct emu_reservation *r;
	CUresult ret = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find(dptr);
	if (r && r->base == dptr && r->kind == EMU_RES_MEMALLOC) {
		emu_va_release(r);
		ret = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

CUAPI CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	CUresult r;

	EMU_ENTER();
	/* cuMemFree synchronises the device, as cudaFree does. */
	r = emu_capture_unsafe();
	return r != CUDA_SUCCESS ? r : mem_free(dptr);
}

CUAPI CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
	EMU_ENTER();
	return mem_free(dptr);
}

CUAPI CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	CUresult r;

	EMU_ENTER();
	r = emu_stream_check(hStream);
	return r != CUDA_SUCCESS ? r : mem_alloc(dptr, bytesize);
}
EMU_VARIANT(cuMemAllocAsync_ptsz, cuMemAllocAsync,
	    (CUdeviceptr * dptr, size_t bytesize, CUstream hStream), (dptr, bytesize, hStream));

CUAPI CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				       CUstream hStream)
{
	CUresult r;

	EMU_ENTER();
	/* Pools are not modelled: every pool is the device's default pool. */
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	r = emu_stream_check(hStream);
	return r != CUDA_SUCCESS ? r : mem_alloc(dptr, bytesize);
}
EMU_VARIANT(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync,
	    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream),
	    (dptr, bytesize, pool, hStream));

CUAPI CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	CUresult r;

	EMU_ENTER();
	r = emu_stream_check(hStream);
	return r != CUDA_SUCCESS ? r : mem_free(dptr);
}
EMU_VARIANT(cuMemFreeAsync_ptsz, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream),
	    (dptr, hStream));

/* The default pool handle of each device: an opaque, stable, non-NULL value. */
static char pools[EMU_MAX_DEVICES];

static CUresult get_pool(CUmemoryPool *pool, CUdevice dev)
{
	if (!pool)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= emu_ndevices())
		return CUDA_ERROR_INVALID_DEVICE;
	*pool = (CUmemoryPool)(void *)&pools[dev];
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
	EMU_ENTER();
	return get_pool(pool_out, dev);
}

CUAPI CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	EMU_ENTER();
	return get_pool(pool, dev);
}

CUAPI CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
	CUdevice dev;
	CUresult r;
	uint64_t cap, used;

	EMU_ENTER();
	if (!free || !total)
		return CUDA_ERROR_INVALID_VALUE;
	r = emu_current_device(&dev);
	if (r != CUDA_SUCCESS)
		return r;
	/* emu_mem_used scans: memory freed by any process, or kept by any, is seen here. */
	cap = emu_state_capacity(emu_dev_index(dev));
	used = emu_mem_used(emu_dev_index(dev));
	*total = cap;
	*free = used >= cap ? 0 : cap - used;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
	size_t f, t;
	CUresult r;

	if (!free || !total)
		return CUDA_ERROR_INVALID_VALUE;
	r = cuMemGetInfo_v2(&f, &t);
	if (r == CUDA_SUCCESS) {
		*free = f > UINT32_MAX ? UINT32_MAX : (unsigned int)f;
		*total = t > UINT32_MAX ? UINT32_MAX : (unsigned int)t;
	}
	return r;
}

/* Base and size of the allocation containing dptr: a cuMemAlloc allocation, or one mapping
 * of a VMM reservation. */
static int allocation_range(CUdeviceptr dptr, CUdeviceptr *ret_base, size_t *ret_size)
{
	struct emu_reservation *r = emu_va_find(dptr);
	struct emu_mapping *m;

	if (!r)
		return -EFAULT;
	if (r->kind != EMU_RES_VMM) {
		if (dptr - r->base >= r->user_size)
			return -EFAULT;
		*ret_base = r->base;
		*ret_size = r->user_size;
		return 0;
	}
	m = emu_va_mapping(r, dptr - r->base);
	if (!m)
		return -EFAULT;
	*ret_base = r->base + m->offset;
	*ret_size = m->size;
	return 0;
}

CUAPI CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	CUdeviceptr base;
	size_t size;
	int e;

	EMU_ENTER();
	pthread_mutex_lock(&emu_va_lock);
	e = allocation_range(dptr, &base, &size);
	pthread_mutex_unlock(&emu_va_lock);
	if (e < 0)
		return CUDA_ERROR_NOT_FOUND;
	/* "Both parameters pbase and psize are optional." */
	if (pbase)
		*pbase = base;
	if (psize)
		*psize = size;
	return CUDA_SUCCESS;
}

/* ---- pointer attributes ---- */

static CUresult pointer_attribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	struct emu_reservation *r;
	struct emu_mapping *m;
	CUdeviceptr base;
	size_t size;
	CUresult ret = CUDA_SUCCESS;

	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find(ptr);
	m = r ? emu_va_mapping(r, ptr - r->base) : NULL;
	if (!m || allocation_range(ptr, &base, &size) < 0) {
		/* Not memory this driver knows: a plain host pointer. */
		pthread_mutex_unlock(&emu_va_lock);
		return CUDA_ERROR_INVALID_VALUE;
	}
	switch (attribute) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		*(CUdeviceptr *)data = ptr;
		break;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		ret = CUDA_ERROR_INVALID_VALUE; /* device memory is not host-accessible */
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = m->alloc->dev;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = base;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = size;
		break;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data = 1;
		break;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
	case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
		*(int *)data = 0;
		break;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		*(unsigned long long *)data = m->alloc->id;
		break;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(int *)data = r->kind == EMU_RES_MEMALLOC;
		break;
	case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
		*(unsigned long long *)data = r->kind == EMU_RES_VMM
						      ? m->alloc->prop.requestedHandleTypes
						      : CU_MEM_HANDLE_TYPE_NONE;
		break;
	case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
		*(int *)data = m->access[m->alloc->dev];
		break;
	case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
		/* cuMemAlloc memory on an RDMA-capable device is; VMM memory only when created
		 * with allocFlags.gpuDirectRDMACapable (CUmemAllocationProp: "This flag if set
		 * indicates that the memory will be used as a buffer for hardware accelerated
		 * ... RDMA"). */
		*(int *)data = r->kind == EMU_RES_VMM
				       ? m->alloc->prop.allocFlags.gpuDirectRDMACapable != 0
				       : 1;
		break;
	case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
		*(CUdeviceptr *)data = r->base + m->offset;
		break;
	case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
		*(size_t *)data = m->size;
		break;
	case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
		*(unsigned long long *)data = m->alloc->id;
		break;
	default:
		ret = CUDA_ERROR_NOT_SUPPORTED;
		break;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

CUAPI CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	EMU_ENTER();
	return pointer_attribute(data, attribute, ptr);
}

CUAPI CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
				      void **data, CUdeviceptr ptr)
{
	EMU_ENTER();
	if (!attributes || !data)
		return CUDA_ERROR_INVALID_VALUE;
	/* "Unlike cuPointerGetAttribute, this function will not return an error when the ptr
	 * encountered is not a valid CUDA pointer. Instead, the attributes are assigned default
	 * NULL values" -- zero here, of each attribute's size. */
	for (unsigned i = 0; i < numAttributes; i++) {
		if (!data[i])
			continue;
		if (pointer_attribute(data[i], attributes[i], ptr) == CUDA_SUCCESS)
			continue;
		switch (attributes[i]) {
		case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
		case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		case CU_POINTER_ATTRIBUTE_CONTEXT:
			memset(data[i], 0, sizeof(uint64_t));
			break;
		case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
			memset(data[i], 0, sizeof(size_t));
			break;
		case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
			*(int *)data[i] = -2; /* what the driver reports for host memory */
			break;
		default:
			memset(data[i], 0, sizeof(int));
			break;
		}
	}
	return CUDA_SUCCESS;
}

/* ---- copies ---- */

/* A unified address is device memory when the emulator maps it, else host memory. */
static void *resolve(CUdeviceptr p, size_t n, bool write, bool *ret_device)
{
	pthread_mutex_lock(&emu_va_lock);
	*ret_device = emu_va_find(p) != NULL;
	pthread_mutex_unlock(&emu_va_lock);
	if (!*ret_device)
		return (void *)(uintptr_t)p;
	return emu_translate(p, n, write);
}

static CUresult copy(void *dst, const void *src, size_t n)
{
	if (n && (!dst || !src))
		return CUDA_ERROR_INVALID_VALUE;
	if (n)
		memmove(dst, src, n);
	return CUDA_SUCCESS;
}

static CUresult htod(CUdeviceptr dst, const void *src, size_t n)
{
	return copy(emu_translate(dst, n, true), src, n);
}

static CUresult dtoh(void *dst, CUdeviceptr src, size_t n)
{
	return copy(dst, emu_translate(src, n, false), n);
}

static CUresult dtod(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return copy(emu_translate(dst, n, true), emu_translate(src, n, false), n);
}

static CUresult unified(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	bool ddev, sdev;
	void *d = resolve(dst, n, true, &ddev);
	const void *s = resolve(src, n, false, &sdev);

	return copy(d, s, n);
}

/* ---- memsets ---- */

static CUresult memset_n(CUdeviceptr dst, const void *value, size_t width, size_t n)
{
	uint8_t *h;

	if (dst % width) /* D16/D32 need naturally aligned destinations */
		return CUDA_ERROR_INVALID_VALUE;
	if (n > SIZE_MAX / width)
		return CUDA_ERROR_INVALID_VALUE;
	h = emu_translate(dst, n * width, true);
	if (!h)
		return CUDA_ERROR_INVALID_VALUE;
	if (width == 1) {
		memset(h, *(const uint8_t *)value, n);
		return CUDA_SUCCESS;
	}
	for (size_t i = 0; i < n; i++)
		memcpy(h + i * width, value, width);
	return CUDA_SUCCESS;
}

CUresult emu_mem_op_run(const struct emu_op *op)
{
	switch (op->kind) {
	case EMU_OP_HTOD:
		return htod(op->dst, op->hsrc, op->n);
	case EMU_OP_DTOH:
		return dtoh(op->hdst, op->src, op->n);
	case EMU_OP_DTOD:
		return dtod(op->dst, op->src, op->n);
	case EMU_OP_UNIFIED:
		return unified(op->dst, op->src, op->n);
	case EMU_OP_MEMSET:
		return memset_n(op->dst, &op->value, op->width, op->n);
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

/* A synchronous copy or memset runs on the legacy stream (and so conflicts with a blocking
 * stream's capture); an Async one on its stream, where a capture records it. */
static CUresult sync_op(const struct emu_op *op)
{
	CUresult r = emu_legacy_use();

	return r != CUDA_SUCCESS ? r : emu_mem_op_run(op);
}

#define HTOD(d, s, c) (&(struct emu_op){.kind = EMU_OP_HTOD, .dst = (d), .hsrc = (s), .n = (c)})
#define DTOH(d, s, c) (&(struct emu_op){.kind = EMU_OP_DTOH, .hdst = (d), .src = (s), .n = (c)})
#define DTOD(d, s, c) (&(struct emu_op){.kind = EMU_OP_DTOD, .dst = (d), .src = (s), .n = (c)})
#define UNIF(d, s, c) (&(struct emu_op){.kind = EMU_OP_UNIFIED, .dst = (d), .src = (s), .n = (c)})
#define MSET(d, v, w, c) \
	(&(struct emu_op){.kind = EMU_OP_MEMSET, .dst = (d), .value = (v), .width = (w), .n = (c)})

CUAPI CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	EMU_ENTER();
	return sync_op(HTOD(dstDevice, srcHost, ByteCount));
}
EMU_VARIANT(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2,
	    (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount),
	    (dstDevice, srcHost, ByteCount));

CUAPI CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	EMU_ENTER();
	return sync_op(DTOH(dstHost, srcDevice, ByteCount));
}
EMU_VARIANT(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2,
	    (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount),
	    (dstHost, srcDevice, ByteCount));

CUAPI CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	EMU_ENTER();
	return sync_op(DTOD(dstDevice, srcDevice, ByteCount));
}
EMU_VARIANT(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2,
	    (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount),
	    (dstDevice, srcDevice, ByteCount));

CUAPI CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	EMU_ENTER();
	return sync_op(UNIF(dst, src, ByteCount));
}
EMU_VARIANT(cuMemcpy_ptds, cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount),
	    (dst, src, ByteCount));

CUAPI CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
				    CUstream hStream)
{
	EMU_ENTER();
	return emu_stream_submit(hStream, HTOD(dstDevice, srcHost, ByteCount));
}
EMU_VARIANT(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2,
	    (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream),
	    (dstDevice, srcHost, ByteCount, hStream));

CUAPI CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
				    CUstream hStream)
{
	EMU_ENTER();
	return emu_stream_submit(hStream, DTOH(dstHost, srcDevice, ByteCount));
}
EMU_VARIANT(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2,
	    (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
	    (dstHost, srcDevice, ByteCount, hStream));

CUAPI CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
				    CUstream hStream)
{
	EMU_ENTER();
	return emu_stream_submit(hStream, DTOD(dstDevice, srcDevice, ByteCount));
}
EMU_VARIANT(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2,
	    (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream),
	    (dstDevice, srcDevice, ByteCount, hStream));

CUAPI CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	EMU_ENTER();
	return emu_stream_submit(hStream, UNIF(dst, src, ByteCount));
}
EMU_VARIANT(cuMemcpyAsync_ptsz, cuMemcpyAsync,
	    (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream),
	    (dst, src, ByteCount, hStream));

CUAPI CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	EMU_ENTER();
	return sync_op(MSET(dstDevice, uc, 1, N));
}
EMU_VARIANT(cuMemsetD8_v2_ptds, cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, size_t N),
	    (dstDevice, uc, N));

CUAPI CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
	EMU_ENTER();
	return sync_op(MSET(dstDevice, us, 2, N));
}
EMU_VARIANT(cuMemsetD16_v2_ptds, cuMemsetD16_v2,
	    (CUdeviceptr dstDevice, unsigned short us, size_t N), (dstDevice, us, N));

CUAPI CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
	EMU_ENTER();
	return sync_op(MSET(dstDevice, ui, 4, N));
}
EMU_VARIANT(cuMemsetD32_v2_ptds, cuMemsetD32_v2, (CUdeviceptr dstDevice, unsigned int ui, size_t N),
	    (dstDevice, ui, N));

CUAPI CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	EMU_ENTER();
	return emu_stream_submit(hStream, MSET(dstDevice, uc, 1, N));
}
EMU_VARIANT(cuMemsetD8Async_ptsz, cuMemsetD8Async,
	    (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream),
	    (dstDevice, uc, N, hStream));

CUAPI CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N,
				CUstream hStream)
{
	EMU_ENTER();
	return emu_stream_submit(hStream, MSET(dstDevice, us, 2, N));
}
EMU_VARIANT(cuMemsetD16Async_ptsz, cuMemsetD16Async,
	    (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream),
	    (dstDevice, us, N, hStream));

CUAPI CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
	EMU_ENTER();
	return emu_stream_submit(hStream, MSET(dstDevice, ui, 4, N));
}
EMU_VARIANT(cuMemsetD32Async_ptsz, cuMemsetD32Async,
	    (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream),
	    (dstDevice, ui, N, hStream));
