/* SPDX-License-Identifier: MIT */
/*
 * Legacy CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle) for memory the shim converted.
 *
 * The driver gives legacy IPC handles only for cuMemAlloc memory, never for VMM memory, but
 * programs export memory they believe came from cudaMalloc: vLLM's custom all-reduce exports
 * its buffers and, for CUDA graphs, every activation buffer it is handed, all of it from
 * PyTorch's caching allocator, i.e. converted by us. So for converted memory the shim serves
 * legacy IPC itself, over the fd it can export:
 *   - cuIpcGetMemHandle fills the 64-byte handle with a Belayer handle: magic, the exporter's
 *     pid, a random per-process token, the region id and the offset of the pointer;
 *   - cuIpcOpenMemHandle_v2 of such a handle, in another process under the shim, connects to
 *     the exporter's abstract socket (named after pid and token: only holders of a handle
 *     can find it), receives the region's fd, imports it, maps it and grants access;
 *   - cuIpcCloseMemHandle unmaps it.
 * Every other handle and pointer goes to the driver untouched. Both ends must run under the
 * shim, which the engines' worker processes do, since they inherit LD_PRELOAD.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fdpass.h"
#include "log.h"
#include "shim-capture.h"
#include "shim-device.h"
#include "shim-ipc.h"
#include "shim-real.h"
#include "shim-regions.h"
#include "shim-share.h"
#include "util.h"

#define IPC_MAGIC     UINT64_C(0x3143504952594c42) /* "BLYRIPC1" */
#define IPC_TOKEN_LEN 16

struct ipc_handle {
	uint64_t magic;
	uint32_t pid;
	uint8_t token[IPC_TOKEN_LEN];
	uint64_t id;
	uint64_t offset;
} __attribute__((packed));

_Static_assert(sizeof(struct ipc_handle) <= sizeof(CUipcMemHandle), "handle too large");

struct ipc_request {
	uint64_t magic;
	uint64_t id;
};

struct ipc_reply {
	int64_t status; /* 0 or -errno; on 0 the fd comes with it */
	uint64_t size;
};

/* An imported mapping, for close and for opening the same handle twice. */
struct ipc_open {
	uint32_t pid;
	uint8_t token[IPC_TOKEN_LEN];
	uint64_t id;
	CUdeviceptr va;
	uint64_t size;
	CUmemGenericAllocationHandle handle;
	unsigned refs;
	struct ipc_open *next;
};

static pthread_mutex_t ipc_lock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t server_token[IPC_TOKEN_LEN];
static bool server_started;
static struct ipc_open *opens;

static void socket_name(struct sockaddr_un *sa, socklen_t *len, uint32_t pid,
			const uint8_t token[IPC_TOKEN_LEN])
{
	int n;

	*sa = (struct sockaddr_un){.sun_family = AF_UNIX};
	/* Abstract: sun_path[0] stays NUL. */
	n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "belayer-ipc-%u-", pid);
	for (int i = 0; i < IPC_TOKEN_LEN; i++)
		n += snprintf(sa->sun_path + 1 + n, sizeof(sa->sun_path) - 1 - (size_t)n, "%02x",
			      token[i]);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void serve_one(int c)
{
	struct ipc_request req;
	struct ipc_reply rep = {.status = -EINVAL};
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	int fd = -1;

	/* Same user only, as the driver's own IPC requires the same user in practice. */
	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 || cred.uid != geteuid())
		rep.status = -EPERM;
	else if (recv(c, &req, sizeof(req), 0) == (ssize_t)sizeof(req) && req.magic == IPC_MAGIC) {
		capture_relax_thread();
		fd = regions_export_fd(req.id, &rep.size);
		rep.status = fd < 0 ? fd : 0;
	}
	(void)fdpass_send(c, &rep, sizeof(rep), fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, 0);
	safe_close(fd);
}

static void *server_thread(void *arg)
{
	int lfd = (int)(intptr_t)arg;

	for (;;) {
		int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			log_debug_errno(-errno, "IPC server stopped: %m");
			break;
		}
		serve_one(c);
		close(c);
	}
	close(lfd);
	return NULL;
}

/* With ipc_lock held. */
static int server_start(void)
{
	struct sockaddr_un sa;
	socklen_t len;
	sigset_t all, old;
	pthread_t t;
	int lfd, r;

	if (server_started)
		return 0;
	if (getrandom(server_token, sizeof(server_token), 0) != sizeof(server_token))
		return -EIO;
	lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (lfd < 0)
		return -errno;
	socket_name(&sa, &len, (uint32_t)getpid(), server_token);
	if (bind(lfd, (struct sockaddr *)&sa, len) < 0 || listen(lfd, 64) < 0) {
		r = -errno;
		close(lfd);
		return r;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	r = pthread_create(&t, NULL, server_thread, (void *)(intptr_t)lfd);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r != 0) {
		close(lfd);
		return -r;
	}
	pthread_detach(t);
	(void)pthread_setname_np(t, "belayer-ipc");
	server_started = true;
	return 0;
}

CUresult shim_ipc_get_mem_handle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	PFN_cuIpcGetMemHandle_v4010 real = REAL(cuIpcGetMemHandle);
	struct ipc_handle h = {.magic = IPC_MAGIC};
	uint64_t base, id, size;
	int r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (shim_busy || !handle || regions_converted_info(dptr, &base, &id, &size) < 0)
		return real(handle, dptr);
	/* Peers will map it: real memory, out of the layout (shim-share.c). */
	r = share_converted(id);
	if (r < 0) {
		log_debug_errno(r, "Cannot share converted region %" PRIu64 ": %m", id);
		return CUDA_ERROR_NOT_SUPPORTED;
	}

	pthread_mutex_lock(&ipc_lock);
	r = server_start();
	memcpy(h.token, server_token, sizeof(h.token));
	pthread_mutex_unlock(&ipc_lock);
	if (r < 0) {
		log_debug_errno(r, "Cannot serve IPC for converted memory: %m");
		return CUDA_ERROR_NOT_SUPPORTED; /* what the driver says of VMM memory */
	}
	h.pid = (uint32_t)getpid();
	h.id = id;
	h.offset = dptr - base;
	memset(handle, 0, sizeof(*handle));
	memcpy(handle->reserved, &h, sizeof(h));
	return CUDA_SUCCESS;
}

static int fetch_fd(const struct ipc_handle *h, uint64_t *ret_size)
{
	struct ipc_request req = {.magic = IPC_MAGIC, .id = h->id};
	struct ipc_reply rep;
	struct sockaddr_un sa;
	socklen_t len;
	_cleanup_close_ int c = -1;
	int fd = -1;
	size_t nfds = 0;
	ssize_t n;

	c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c < 0)
		return -errno;
	socket_name(&sa, &len, h->pid, h->token);
	if (connect(c, (struct sockaddr *)&sa, len) < 0)
		return -errno;
	if (send(c, &req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req))
		return -EIO;
	n = fdpass_recv(c, &rep, sizeof(rep), &fd, 1, &nfds, 0);
	if (n != (ssize_t)sizeof(rep) || rep.status < 0 || nfds != 1) {
		safe_close(fd);
		return n < 0 ? (int)n : rep.status < 0 ? (int)rep.status : -EBADMSG;
	}
	*ret_size = rep.size;
	return fd;
}

CUresult shim_ipc_open_mem_handle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	PFN_cuIpcOpenMemHandle_v11000 real = REAL(cuIpcOpenMemHandle_v2);
	const struct real_extra *x = real_extra();
	struct ipc_handle h;
	struct ipc_open *o;
	CUmemGenericAllocationHandle mh;
	CUdeviceptr va = 0;
	CUdevice dev;
	uint64_t size = 0;
	CUresult r;
	int fd;

	memcpy(&h, handle.reserved, sizeof(h));
	if (h.magic != IPC_MAGIC || shim_busy || !pdptr) {
		if (!real)
			return CUDA_ERROR_NOT_INITIALIZED;
		return real(pdptr, handle, flags);
	}
	if (!x->cuMemImportFromShareableHandle || !x->cuCtxGetDevice ||
	    !REAL(cuMemAddressReserve) || !REAL(cuMemMap) || !REAL(cuMemSetAccess))
		return CUDA_ERROR_NOT_SUPPORTED;

	pthread_mutex_lock(&ipc_lock);
	for (o = opens; o; o = o->next)
		if (o->pid == h.pid && o->id == h.id && !memcmp(o->token, h.token, IPC_TOKEN_LEN)) {
			o->refs++;
			*pdptr = o->va + h.offset;
			pthread_mutex_unlock(&ipc_lock);
			return CUDA_SUCCESS;
		}
	pthread_mutex_unlock(&ipc_lock);

	fd = fetch_fd(&h, &size);
	if (fd < 0) {
		log_debug_errno(fd, "Failed to fetch IPC memory of process %u: %m", h.pid);
		return CUDA_ERROR_INVALID_VALUE; /* as for a handle of a process that is gone */
	}
	shim_busy++;
	r = x->cuMemImportFromShareableHandle(&mh, (void *)(intptr_t)fd,
					      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	safe_close(fd);
	if (r != CUDA_SUCCESS)
		goto out;
	r = x->cuCtxGetDevice(&dev);
	if (r == CUDA_SUCCESS)
		r = REAL(cuMemAddressReserve)(&va, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		goto out_release;
	r = REAL(cuMemMap)(va, size, 0, mh, 0);
	if (r != CUDA_SUCCESS)
		goto out_free;
	r = shim_set_access(va, size, dev);
	if (r != CUDA_SUCCESS)
		goto out_unmap;
	o = calloc(1, sizeof(*o));
	if (!o) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out_unmap;
	}
	*o = (struct ipc_open){
		.pid = h.pid, .id = h.id, .va = va, .size = size, .handle = mh, .refs = 1};
	memcpy(o->token, h.token, IPC_TOKEN_LEN);
	pthread_mutex_lock(&ipc_lock);
	o->next = opens;
	opens = o;
	pthread_mutex_unlock(&ipc_lock);
	*pdptr = va + h.offset;
	shim_busy--;
	return CUDA_SUCCESS;

out_unmap:
	(void)CALL_REAL(cuMemUnmap, va, size);
out_free:
	(void)CALL_REAL(cuMemAddressFree, va, size);
out_release:
	(void)CALL_REAL(cuMemRelease, mh);
out:
	shim_busy--;
	return r;
}

CUresult shim_ipc_close_mem_handle(CUdeviceptr dptr)
{
	PFN_cuIpcCloseMemHandle_v4010 real = REAL(cuIpcCloseMemHandle);
	struct ipc_open **p, *o = NULL;

	pthread_mutex_lock(&ipc_lock);
	for (p = &opens; *p; p = &(*p)->next)
		if (dptr >= (*p)->va && dptr < (*p)->va + (*p)->size) {
			o = *p;
			if (--o->refs == 0)
				*p = o->next;
			break;
		}
	pthread_mutex_unlock(&ipc_lock);
	if (!o) {
		if (!real)
			return CUDA_ERROR_NOT_INITIALIZED;
		return real(dptr);
	}
	if (o->refs > 0)
		return CUDA_SUCCESS;
	shim_busy++;
	(void)CALL_REAL(cuMemUnmap, o->va, o->size);
	(void)CALL_REAL(cuMemAddressFree, o->va, o->size);
	(void)CALL_REAL(cuMemRelease, o->handle);
	shim_busy--;
	free(o);
	return CUDA_SUCCESS;
}

void ipc_reset_after_fork(void)
{
	/* The parent's server socket is not ours; a child serves its own, if it ever exports.
	 * Its imported mappings do not exist in the child's (new) CUDA state either. */
	pthread_mutex_init(&ipc_lock, NULL);
	server_started = false;
	while (opens) {
		struct ipc_open *o = opens;

		opens = o->next;
		free(o);
	}
}
