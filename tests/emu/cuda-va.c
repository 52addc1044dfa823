/* SPDX-License-Identifier: MIT */
/*
 * The memory model behind every allocation API: physical allocations (one memfd each) and
 * this process's device virtual address space.
 *
 * A device VA range is a PROT_NONE anonymous reservation, so host code that dereferences a
 * device pointer faults, as it would on a GPU. The bytes live in a second, host-side view of
 * the same size where each mapping maps its memfd MAP_FIXED at the same offset: adjacent
 * mappings of one reservation are contiguous there too, and only the emulator (copies,
 * kernels through belayer_emu_translate) touches it. With BELAYER_EMU_HOST_ACCESS=1 the view
 * is the device range itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>

#include "cuda-internal.h"

pthread_mutex_t emu_va_lock = PTHREAD_MUTEX_INITIALIZER;

static struct emu_alloc *allocs;     /* live allocation objects, to validate handles */
static struct emu_reservation **res; /* sorted by base */
static size_t nres, capres;

/* ---- physical allocations ---- */

int emu_alloc_create(int dev, size_t size, const CUmemAllocationProp *prop, struct emu_alloc **ret)
{
	struct emu_alloc *a = calloc(1, sizeof(*a));
	int fd;

	if (!a)
		return -ENOMEM;
	fd = emu_mem_create(emu_dev_index(dev), size, &a->id);
	if (fd < 0) {
		free(a);
		return fd;
	}
	a->fd = fd;
	a->dev = dev;
	a->size = size;
	if (prop)
		a->prop = *prop;
	a->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a->prop.location.id = dev;
	a->handle_refs = 1;
	a->next = allocs;
	allocs = a;
	*ret = a;
	return 0;
}

int emu_alloc_import(int fd, struct emu_alloc **ret)
{
	struct emu_alloc *a;
	char path[64], target[256];
	uint64_t bytes;
	ssize_t n;
	int dev, r;

	/* Only memfds of this run are allocations; the name says which device and how big. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0)
		return -EBADF;
	target[n] = '\0';
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	r = emu_mem_parse_name(target, &dev, &a->id, &bytes);
	if (r < 0) {
		free(a);
		return -EINVAL;
	}
	/* The name has the run's device index; this process knows the device by its ordinal.
	 * Memory of a device it cannot see is refused (-ENODEV): the documentation says nothing
	 * of importing it, and nothing here could map it. */
	dev = emu_dev_ordinal(dev);
	if (dev < 0) {
		free(a);
		return -ENODEV;
	}
	a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (a->fd < 0) {
		r = negative_errno();
		free(a);
		return r;
	}
	a->dev = dev;
	a->size = bytes;
	a->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	a->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a->prop.location.id = dev;
	a->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	a->handle_refs = 1;
	a->next = allocs;
	allocs = a;
	*ret = a;
	return 0;
}

struct emu_alloc *emu_alloc_lookup(CUmemGenericAllocationHandle h)
{
	for (struct emu_alloc *a = allocs; a; a = a->next)
		if ((CUmemGenericAllocationHandle)(uintptr_t)a == h)
			return a;
	return NULL;
}

void emu_alloc_unref(struct emu_alloc *a)
{
	if (a->handle_refs || a->map_refs)
		return;
	for (struct emu_alloc **p = &allocs; *p; p = &(*p)->next)
		if (*p == a) {
			*p = a->next;
			break;
		}
	/* The memfd's pages go when the last fd and mapping in any process do; the shared
	 * accounting learns it at its next scan (emu-state.h). */
	safe_close(a->fd);
	free(a);
}

/* ---- fork ---- */

/* CUDA state does not survive fork(); here a child keeps the driver initialized (tests rely
 * on it) but starts with no memory: the parent's memfds are closed so that they do not keep
 * the parent's allocations alive, and the parent's device ranges are released. */
static void atfork_prepare(void)
{
	pthread_mutex_lock(&emu_va_lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&emu_va_lock);
}

static void atfork_child(void)
{
	for (size_t i = 0; i < nres; i++) {
		(void)munmap((void *)(uintptr_t)res[i]->base, res[i]->size);
		free(res[i]->maps);
		free(res[i]);
	}
	nres = 0;
	while (allocs) {
		struct emu_alloc *a = allocs;
		allocs = a->next;
		safe_close(a->fd);
		free(a);
	}
	pthread_mutex_unlock(&emu_va_lock);
}

void emu_va_init(void)
{
	(void)pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ---- reservations ---- */

static size_t res_index(CUdeviceptr p)
{
	/* First reservation whose base is > p. */
	size_t lo = 0, hi = nres;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (res[mid]->base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct emu_reservation *emu_va_find(CUdeviceptr p)
{
	size_t i = res_index(p);
	if (i == 0)
		return NULL;
	if (p - res[i - 1]->base < res[i - 1]->size)
		return res[i - 1];
	return NULL;
}

struct emu_reservation *emu_va_find_ipc(uint64_t id)
{
	for (size_t i = 0; i < nres; i++)
		if (res[i]->kind == EMU_RES_IPC && res[i]->nmaps == 1 &&
		    res[i]->maps[0].alloc->id == id)
			return res[i];
	return NULL;
}

/* PROT_NONE, no backing, no commit charge: a hole that faults on access. */
static void *reserve_range(void *hint, size_t size, size_t align)
{
	const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
	uint8_t *p, *aligned;

	if (hint) {
		/* A hint, as cuMemAddressReserve documents: used when free and aligned. */
		p = mmap(hint, size, PROT_NONE, flags, -1, 0);
		if (p == MAP_FAILED)
			return NULL;
		if (p == hint && ((uintptr_t)p & (align - 1)) == 0)
			return p;
		(void)munmap(p, size);
	}
	p = mmap(NULL, size + align, PROT_NONE, flags, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	aligned = (uint8_t *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
	if (aligned > p)
		(void)munmap(p, aligned - p);
	if (aligned + size < p + size + align)
		(void)munmap(aligned + size, p + size + align - (aligned + size));
	return aligned;
}

int emu_va_reserve(size_t size, size_t align, CUdeviceptr hint, enum emu_res_kind kind,
		   struct emu_reservation **ret)
{
	struct emu_reservation *r;
	size_t i;

	if (size == 0 || align == 0 || (align & (align - 1)))
		return -EINVAL;
	if (nres == capres) {
		size_t cap = capres ? capres * 2 : 64;
		struct emu_reservation **v = realloc(res, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		res = v;
		capres = cap;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->base = (CUdeviceptr)(uintptr_t)reserve_range((void *)(uintptr_t)hint, size, align);
	if (!r->base) {
		free(r);
		return -ENOMEM;
	}
	if (emu_host_access)
		r->host = (uint8_t *)(uintptr_t)r->base;
	else {
		/* Aligned like the device range, so 2 MiB pages can back it. */
		r->host = reserve_range(NULL, size, MAX(align, EMU_PAGE));
		if (!r->host) {
			(void)munmap((void *)(uintptr_t)r->base, size);
			free(r);
			return -ENOMEM;
		}
		/* The host view must not reach a fork()ed child with the bytes of our memory. */
		(void)madvise(r->host, size, MADV_DONTFORK);
	}
	r->size = size;
	r->kind = kind;
	i = res_index(r->base);
	memmove(&res[i + 1], &res[i], (nres - i) * sizeof(*res));
	res[i] = r;
	nres++;
	*ret = r;
	return 0;
}

void emu_va_release(struct emu_reservation *r)
{
	size_t i;

	(void)emu_va_unmap(r, 0, r->size);
	if (!emu_host_access)
		(void)munmap(r->host, r->size);
	(void)munmap((void *)(uintptr_t)r->base, r->size);
	for (i = 0; i < nres && res[i] != r; i++)
		;
	if (i < nres) {
		memmove(&res[i], &res[i + 1], (nres - i - 1) * sizeof(*res));
		nres--;
	}
	free(r->maps);
	free(r);
}

/* ---- mappings ---- */

struct emu_mapping *emu_va_mapping(struct emu_reservation *r, size_t off)
{
	for (size_t i = 0; i < r->nmaps; i++)
		if (off >= r->maps[i].offset && off - r->maps[i].offset < r->maps[i].size)
			return &r->maps[i];
	return NULL;
}

int emu_va_map(struct emu_reservation *r, size_t off, size_t size, struct emu_alloc *a)
{
	size_t i;
	void *p;

	if (off > r->size || size > r->size - off || size > a->size)
		return -ERANGE;
	for (i = 0; i < r->nmaps; i++) {
		const struct emu_mapping *m = &r->maps[i];
		if (off < m->offset + m->size && m->offset < off + size)
			return -EBUSY;
		if (m->offset > off)
			break;
	}
	if (r->nmaps == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 4;
		struct emu_mapping *v = realloc(r->maps, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		r->maps = v;
		r->cap = cap;
	}
	p = mmap(r->host + off, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, a->fd, 0);
	if (p == MAP_FAILED)
		return negative_errno();
	if (!emu_host_access)
		(void)madvise(p, size, MADV_DONTFORK);
	/* A GPU maps VMM memory in 2 MiB pages; ask for the same, so mapping, unmapping and a
	 * holder's exit cost what they cost there instead of 4 KiB page-table work. Honoured when
	 * the kernel's shmem THP policy is "advise" or more (tools/dev setup). */
	(void)madvise(p, size, MADV_HUGEPAGE);
	memmove(&r->maps[i + 1], &r->maps[i], (r->nmaps - i) * sizeof(*r->maps));
	r->maps[i] = (struct emu_mapping){.offset = off, .size = size, .alloc = a};
	r->nmaps++;
	a->map_refs++;
	return 0;
}

int emu_va_unmap(struct emu_reservation *r, size_t off, size_t size)
{
	size_t i = 0;

	while (i < r->nmaps) {
		struct emu_mapping *m = &r->maps[i];
		struct emu_alloc *a;

		if (m->offset < off || m->offset + m->size > off + size) {
			i++;
			continue;
		}
		/* Back to a PROT_NONE hole, still reserved. */
		(void)mmap(r->host + m->offset, m->size, PROT_NONE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		a = m->alloc;
		memmove(&r->maps[i], &r->maps[i + 1], (r->nmaps - i - 1) * sizeof(*r->maps));
		r->nmaps--;
		a->map_refs--;
		emu_alloc_unref(a);
	}
	return 0;
}

static bool accessible(const struct emu_mapping *m, bool write)
{
	/* The emulator has no notion of which device touches memory: accessible means some
	 * device was granted access by cuMemSetAccess. */
	for (int d = 0; d < EMU_MAX_DEVICES; d++)
		if (m->access[d] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ||
		    (!write && m->access[d] == CU_MEM_ACCESS_FLAGS_PROT_READ))
			return true;
	return false;
}

void *emu_va_translate(CUdeviceptr p, size_t len, bool write)
{
	struct emu_reservation *r = emu_va_find(p);
	size_t off, end;

	if (!r)
		return NULL;
	off = p - r->base;
	if (len > r->size - off)
		return NULL;
	end = off + len;
	/* Every byte of the range must be in an accessible mapping; mappings are sorted. */
	for (size_t cur = off; cur < end || (len == 0 && cur == off);) {
		const struct emu_mapping *m = emu_va_mapping(r, cur);
		if (!m || !accessible(m, write))
			return NULL;
		cur = m->offset + m->size;
		if (len == 0)
			break;
	}
	return r->host + off;
}

void *emu_translate(CUdeviceptr p, size_t len, bool write)
{
	void *h;

	pthread_mutex_lock(&emu_va_lock);
	h = emu_va_translate(p, len, write);
	pthread_mutex_unlock(&emu_va_lock);
	return h;
}

_public_ void *belayer_emu_translate(CUdeviceptr p, size_t len)
{
	void *h = emu_translate(p, len, false);

	if (!h) {
		errno = EFAULT;
		/* In a kernel this is the load or store a GPU faults on (cuda-graph.c). */
		if (emu_in_kernel)
			emu_kernel_faulted = true;
	}
	return h;
}

_public_ int belayer_emu_alloc_id(CUdeviceptr p, uint64_t *ret_id, uint64_t *ret_offset)
{
	struct emu_reservation *r;
	struct emu_mapping *m;
	int ret = -EFAULT;

	pthread_mutex_lock(&emu_va_lock);
	r = emu_va_find(p);
	m = r ? emu_va_mapping(r, p - r->base) : NULL;
	if (m) {
		if (ret_id)
			*ret_id = m->alloc->id;
		if (ret_offset)
			*ret_offset = p - r->base - m->offset;
		ret = 0;
	}
	pthread_mutex_unlock(&emu_va_lock);
	return ret;
}

_public_ int64_t belayer_emu_live_allocations(int dev, uint64_t *ret_bytes)
{
	uint64_t count = 0, bytes = 0;
	int r = emu_mem_scan(dev, &count, &bytes);

	if (r < 0)
		return r;
	if (ret_bytes)
		*ret_bytes = bytes;
	return (int64_t)count;
}
