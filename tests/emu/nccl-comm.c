/* SPDX-License-Identifier: MIT */
/*
 * Communicator lifecycle of the emulated libnccl.so.2, following nccl.h (NCCL 2.28): unique
 * ids, ncclCommInitRank(Config)/InitAll/Split, Finalize/Destroy/Abort, the queries and the
 * error strings. The data path is in nccl-coll.c, the transport in nccl-shm.c.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "emu-state.h"
#include "nccl-internal.h"

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static int lib_error;
static pthread_mutex_t last_error_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[512];

static void lib_load(void)
{
	lib_error = emu_state_open();
}

int nccl_lib_init(void)
{
	(void)pthread_once(&lib_once, lib_load);
	return lib_error;
}

/* Like NCCL, silent unless NCCL_DEBUG asks; the message stays for ncclGetLastError. */
void nccl_set_last_error(const char *fmt, ...)
{
	const char *debug = secure_getenv("NCCL_DEBUG");
	va_list ap;

	pthread_mutex_lock(&last_error_lock);
	va_start(ap, fmt);
	(void)vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	if (debug && (strcasecmp(debug, "WARN") == 0 || strcasecmp(debug, "INFO") == 0 ||
		      strcasecmp(debug, "TRACE") == 0))
		fprintf(stderr, "NCCL WARN [emu %d] %s\n", (int)getpid(), last_error);
	pthread_mutex_unlock(&last_error_lock);
}

ncclResult_t nccl_result_from_errno(int r)
{
	switch (r) {
	case 0:
		return ncclSuccess;
	case -ECANCELED: /* aborted: what NCCL's host-side waits return when the abort flag rises */
		return ncclInternalError;
	case -EINVAL:
	case -EFAULT:
	case -ERANGE:
		return ncclInvalidArgument;
	case -EADDRINUSE:
	case -EPROTO:
	case -EBUSY:
		return ncclInvalidUsage;
	case -EIO:
		return ncclUnhandledCudaError;
	default:
		return ncclSystemError;
	}
}

/* Its address identifies this copy of the library (see struct ncclComm's owner). */
static const char this_library;

bool nccl_comm_valid(const struct ncclComm *comm)
{
	return comm && atomic_load(&((struct ncclComm *)comm)->magic) == NCCL_COMM_MAGIC &&
	       comm->owner == &this_library;
}

struct ncclComm *nccl_comm_new(int nranks, int rank, int dev,
			       const uint8_t nonce[NCCL_EMU_NONCE_BYTES],
			       const ncclConfig_t *config)
{
	ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
	struct ncclComm *comm = calloc(1, sizeof(*comm));

	if (!comm)
		return NULL;
	comm->nranks = nranks;
	comm->rank = rank;
	comm->dev = dev;
	memcpy(comm->nonce, nonce, NCCL_EMU_NONCE_BYTES);
	comm->config = defaults;
	/* Older callers pass a smaller ncclConfig_t (its size field says so): copy what they
	 * have, keep defaults for the rest. */
	if (config)
		memcpy(&comm->config, config, MIN(config->size, sizeof(comm->config)));
	comm->config.size = sizeof(comm->config);
	pthread_mutex_init(&comm->lock, NULL);
	comm->owner = &this_library;
	atomic_store(&comm->magic, NCCL_COMM_MAGIC);
	return comm;
}

/*
 * Frees what the communicator holds and leaves a tombstone. nccl.h: after ncclCommDestroy or
 * ncclCommAbort the handle is invalid; keeping the few bytes of the struct turns a later use
 * into ncclInvalidArgument instead of a use-after-free, and lets a thread that an abort
 * interrupted read the struct's flags safely.
 */
void nccl_comm_release(struct ncclComm *comm)
{
	nccl_cuda_vmm_free(&comm->buf);
	nccl_shm_unmap(&comm->shm);
	atomic_store(&comm->magic, NCCL_COMM_DEAD);
}

int nccl_comm_join(struct ncclComm *comm)
{
	int r = nccl_shm_join(&comm->shm, comm->nonce, comm->nranks, comm->rank,
			      nccl_cuda_bus_id(comm->dev));

	if (r == -EINVAL)
		nccl_set_last_error("rank %d: nranks %d differs from the other ranks'", comm->rank,
				    comm->nranks);
	else if (r == -EADDRINUSE)
		nccl_set_last_error("rank %d already joined this unique id", comm->rank);
	else if (r < 0)
		nccl_set_last_error("rank %d: rendezvous failed: %s", comm->rank, strerror(-r));
	return r;
}

/* After every rank joined. NCCL refuses two ranks of one communicator on one GPU ("Duplicate
 * GPU detected"), every rank alike: one GPU is one PCI bus id (NCCL compares busId), not one
 * ordinal, which CUDA_VISIBLE_DEVICES renumbers per process. Then the device buffer: one collective slot, what a step
 * of a reduction accumulates. */
int nccl_comm_finish_init(struct ncclComm *comm)
{
	int r;

	for (int i = 0; i < comm->nranks; i++) {
		if (i != comm->rank && comm->shm.ranks[i].bus == comm->shm.ranks[comm->rank].bus) {
			nccl_set_last_error("Duplicate GPU detected: rank %d and rank %d both on "
					    "CUDA device %d",
					    MIN(i, comm->rank), MAX(i, comm->rank), comm->dev);
			return -EBUSY;
		}
	}
	r = nccl_cuda_vmm_alloc(comm->dev, comm->shm.hdr->slot_bytes, &comm->buf);
	if (r < 0) {
		nccl_set_last_error("rank %d: allocating the device buffer on device %d failed",
				    comm->rank, comm->dev);
		return r;
	}
	comm->initialized = true;
	return 0;
}

#define FAULT_POINT(name)                                                             \
	do {                                                                          \
		int fault_;                                                           \
		if (nccl_lib_init() == 0 && emu_fault_take(name, &fault_)) {          \
			nccl_set_last_error("%s: injected failure %d", name, fault_); \
			return (ncclResult_t)fault_;                                  \
		}                                                                     \
	} while (0)

_public_ ncclResult_t ncclGetVersion(int *version)
{
	FAULT_POINT("ncclGetVersion");
	if (!version)
		return ncclInvalidArgument;
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}
NCCL_ALIAS(ncclGetVersion);

_public_ ncclResult_t ncclGetUniqueId(ncclUniqueId *unique_id)
{
	uint8_t *p;

	FAULT_POINT("ncclGetUniqueId");
	if (!unique_id)
		return ncclInvalidArgument;
	if (nccl_lib_init() < 0)
		return ncclSystemError;
	memset(unique_id, 0, sizeof(*unique_id));
	memcpy(unique_id->internal, NCCL_EMU_ID_MAGIC, sizeof(NCCL_EMU_ID_MAGIC));
	p = (uint8_t *)unique_id->internal + sizeof(NCCL_EMU_ID_MAGIC);
	if (getrandom(p, NCCL_EMU_NONCE_BYTES, 0) != NCCL_EMU_NONCE_BYTES)
		return ncclSystemError;
	return ncclSuccess;
}
NCCL_ALIAS(ncclGetUniqueId);

static const uint8_t *id_nonce(const ncclUniqueId *id)
{
	if (memcmp(id->internal, NCCL_EMU_ID_MAGIC, sizeof(NCCL_EMU_ID_MAGIC)) != 0)
		return NULL;
	return (const uint8_t *)id->internal + sizeof(NCCL_EMU_ID_MAGIC);
}

static bool config_valid(const ncclConfig_t *config)
{
	/* nccl.h: "Not initialized config will result in NCCL error." */
	return !config ||
	       (config->magic == 0xcafebeef && config->size >= offsetof(ncclConfig_t, blocking));
}

static int init_run(void *arg)
{
	return nccl_group_run_init(arg);
}

/* Creates rank's communicator on dev. Inside a group its rendezvous is deferred to
 * ncclGroupEnd, where the ranks this thread creates progress together (nccl.h: "Both
 * collective communication and ncclCommInitRank can be used in conjunction of
 * ncclGroupStart/ncclGroupEnd"). Async (a nonblocking config, outside a group): the handle is
 * returned at once, with ncclInProgress, and the rendezvous runs on a job thread (NCCL's
 * ncclCommInitRankDev hands out the new communicator before its init job has run; ncclComm
 * queries refuse it until then, ncclCommEnsureReady). */
static ncclResult_t comm_init(ncclComm_t *ret, int nranks, const uint8_t *nonce, int rank, int dev,
			      const ncclConfig_t *config, bool async)
{
	struct ncclComm *comm;
	int r;

	comm = nccl_comm_new(nranks, rank, dev, nonce, config);
	if (!comm)
		return ncclSystemError;
	if (nccl_in_group()) {
		r = nccl_group_add_init(comm);
		if (r < 0) {
			nccl_comm_release(comm);
			return nccl_result_from_errno(r);
		}
		*ret = comm;
		return ncclSuccess;
	}
	if (async) {
		r = nccl_async_launch(&comm, 1, init_run, NULL, comm);
		if (r < 0) {
			nccl_comm_release(comm);
			return ncclSystemError;
		}
		*ret = comm;
		return ncclInProgress;
	}
	r = nccl_group_run_init(comm);
	if (r < 0) {
		nccl_comm_release(comm);
		return nccl_result_from_errno(r);
	}
	*ret = comm;
	return ncclSuccess;
}

static ncclResult_t init_rank_checked(ncclComm_t *comm, int nranks, const ncclUniqueId *id,
				      int rank, const ncclConfig_t *config)
{
	const uint8_t *nonce;
	int dev, r;

	if (!comm || nranks < 1 || nranks > NCCL_EMU_MAX_RANKS || rank < 0 || rank >= nranks) {
		nccl_set_last_error("invalid argument: nranks %d rank %d (at most %d ranks)",
				    nranks, rank, NCCL_EMU_MAX_RANKS);
		return ncclInvalidArgument;
	}
	nonce = id_nonce(id);
	if (!nonce) {
		nccl_set_last_error("invalid unique id: not made by ncclGetUniqueId");
		return ncclInvalidArgument;
	}
	if (!config_valid(config)) {
		nccl_set_last_error("config not initialized with NCCL_CONFIG_INITIALIZER");
		return ncclInvalidArgument;
	}
	if (nccl_lib_init() < 0)
		return ncclSystemError;
	r = nccl_cuda_current_device(&dev);
	if (r < 0)
		return nccl_result_from_errno(r);
	return comm_init(comm, nranks, nonce, rank, dev, config,
			 config && config->size > offsetof(ncclConfig_t, blocking) &&
				 config->blocking == 0);
}

_public_ ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId comm_id,
					     int rank, ncclConfig_t *config)
{
	FAULT_POINT("ncclCommInitRankConfig");
	return init_rank_checked(comm, nranks, &comm_id, rank, config);
}
NCCL_ALIAS(ncclCommInitRankConfig);

_public_ ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId comm_id, int rank)
{
	FAULT_POINT("ncclCommInitRank");
	return init_rank_checked(comm, nranks, &comm_id, rank, NULL);
}
NCCL_ALIAS(ncclCommInitRank);

/* nccl.h: "Creates a clique of communicators (single process version) ... If devlist is NULL,
 * the first ndev CUDA devices are used." All ranks join from this thread, in one group. */
_public_ ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
	ncclUniqueId id;
	ncclResult_t res, end;

	FAULT_POINT("ncclCommInitAll");
	if (!comms || ndev < 1 || ndev > NCCL_EMU_MAX_RANKS)
		return ncclInvalidArgument;
	if (nccl_lib_init() < 0)
		return ncclSystemError;
	for (int i = 0; i < ndev; i++) {
		int dev = devlist ? devlist[i] : i;
		if (dev < 0 || dev >= emu_state_ndevices()) {
			nccl_set_last_error("ncclCommInitAll: invalid device %d", dev);
			return ncclInvalidArgument;
		}
	}
	res = ncclGetUniqueId(&id);
	if (res != ncclSuccess)
		return res;
	res = ncclGroupStart();
	if (res != ncclSuccess)
		return res;
	for (int i = 0; i < ndev && res == ncclSuccess; i++)
		res = comm_init(&comms[i], ndev, id_nonce(&id), i, devlist ? devlist[i] : i, NULL,
				false);
	end = ncclGroupEnd();
	return res != ncclSuccess ? res : end;
}
NCCL_ALIAS(ncclCommInitAll);

/* The child's rendezvous name, computed alike by every rank of the color: splitmix64 over
 * the parent's nonce, the split's ordinal and the color. */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void split_nonce(const struct ncclComm *parent, int color, uint8_t ret[NCCL_EMU_NONCE_BYTES])
{
	uint64_t a, b;

	memcpy(&a, parent->nonce, 8);
	memcpy(&b, parent->nonce + 8, 8);
	a = mix64(a ^ mix64(parent->nsplits + 0x9e3779b97f4a7c15ULL));
	b = mix64(b ^ mix64(((uint64_t)(uint32_t)color << 1) | 1));
	a = mix64(a ^ b);
	b = mix64(b ^ a);
	memcpy(ret, &a, 8);
	memcpy(ret + 8, &b, 8);
}

/* The split's agreement over the parent (every rank of it takes part, NOCOLOR too): the
 * child's rendezvous name, this rank's place in it and its size. */
static int split_agree(struct ncclComm *comm, int color, int key,
		       uint8_t ret_nonce[NCCL_EMU_NONCE_BYTES], int *ret_rank, int *ret_n)
{
	_cleanup_free_ int32_t *all = calloc((size_t)comm->nranks * 2, sizeof(*all));
	int32_t mine[2] = {color, key};
	int r;

	if (!all)
		return -ENOMEM;
	r = nccl_split_exchange(comm, mine, all);
	if (r < 0)
		return r;
	split_nonce(comm, color, ret_nonce);
	comm->nsplits++;
	*ret_rank = *ret_n = 0;
	for (int i = 0; i < comm->nranks; i++) {
		if (all[2 * i] != color)
			continue;
		(*ret_n)++;
		if (all[2 * i + 1] < key || (all[2 * i + 1] == key && i < comm->rank))
			(*ret_rank)++;
	}
	return 0;
}

/* A split of a nonblocking parent, on a job thread. */
struct split_job {
	struct ncclComm *parent, *child; /* child: NULL for NCCL_SPLIT_NOCOLOR */
	ncclComm_t *newcomm;
	int color, key;
};

static int split_run(void *arg)
{
	struct split_job *s = arg;
	uint8_t nonce[NCCL_EMU_NONCE_BYTES];
	int rank, n, r;

	r = split_agree(s->parent, s->color, s->key, nonce, &rank, &n);
	if (r < 0 || !s->child)
		return r;
	s->child->nranks = n;
	s->child->rank = rank;
	memcpy(s->child->nonce, nonce, sizeof(nonce));
	return nccl_group_run_init(s->child);
}

/* NCCL's init job stores the child into *newcomm when it ends, failed or not (a failed one
 * carries its error), before the parent's state leaves ncclInProgress. */
static void split_finish(void *arg, int r)
{
	struct split_job *s = arg;

	(void)r;
	if (s->child)
		__atomic_store_n(s->newcomm, s->child, __ATOMIC_RELEASE);
	free(s);
}

static ncclResult_t split_async(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
				const ncclConfig_t *config)
{
	struct split_job *s = calloc(1, sizeof(*s));
	struct ncclComm *comms[2] = {comm, NULL};
	int r;

	if (!s)
		return ncclSystemError;
	*s = (struct split_job){.parent = comm, .newcomm = newcomm, .color = color, .key = key};
	if (color != NCCL_SPLIT_NOCOLOR) {
		s->child = nccl_comm_new(0, 0, comm->dev, comm->nonce, config);
		if (!s->child) {
			free(s);
			return ncclSystemError;
		}
		comms[1] = s->child;
	}
	r = nccl_async_launch(comms, s->child ? 2 : 1, split_run, split_finish, s);
	if (r < 0) {
		if (s->child)
			nccl_comm_release(s->child);
		free(s);
		return ncclSystemError;
	}
	return ncclInProgress;
}

/* nccl.h: "Ranks with the same color will end up in the same communicator. Within the new
 * communicator, key will be used to order ranks" (ties by parent rank, as NCCL orders them).
 * "NCCL_SPLIT_NOCOLOR ... will therefore return a NULL communicator." "If config is NULL,
 * the new communicator will inherit the original communicator's configuration."
 * A nonblocking parent: the split is a job of the parent (NCCL's ncclCommInitChildComm
 * launches it with ncclAsyncLaunch(..., comm)), so it returns ncclInProgress, the parent
 * reports ncclInProgress until the child is made, and "*newcomm should be NCCL_COMM_NULL
 * until comm split fully complete" (init.cc): the job stores it then. */
_public_ ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
				    ncclConfig_t *config)
{
	uint8_t nonce[NCCL_EMU_NONCE_BYTES];
	int newrank = 0, newn = 0;
	int r;

	FAULT_POINT("ncclCommSplit");
	if (!nccl_comm_valid(comm) || !newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR) ||
	    !config_valid(config))
		return ncclInvalidArgument;
	r = nccl_comm_ensure_ready(comm);
	if (r < 0)
		return nccl_result_from_errno(r);
	if (!comm->initialized)
		return ncclInvalidArgument;
	if (nccl_in_group()) {
		nccl_set_last_error("ncclCommSplit inside a group is not emulated");
		return ncclInvalidUsage;
	}
	*newcomm = NULL;
	if (!nccl_comm_blocking(comm))
		return split_async(comm, color, key, newcomm, config ? config : &comm->config);
	r = split_agree(comm, color, key, nonce, &newrank, &newn);
	if (r < 0)
		return nccl_result_from_errno(r);
	if (color == NCCL_SPLIT_NOCOLOR)
		return ncclSuccess;
	return comm_init(newcomm, newn, nonce, newrank, comm->dev, config ? config : &comm->config,
			 false);
}
NCCL_ALIAS(ncclCommSplit);

/* Synchronous streams: every operation has completed when its call returned, so there is
 * nothing to flush. */
_public_ ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	FAULT_POINT("ncclCommFinalize");
	if (!nccl_comm_valid(comm))
		return ncclInvalidArgument;
	comm->finalized = true;
	return ncclSuccess;
}
NCCL_ALIAS(ncclCommFinalize);

/*
 * Both end a communicator the same way here: raise the abort flag so that an operation still
 * blocked in it (a peer died, a hang was injected) returns within one wait slice, wait until
 * no thread is inside, then free. nccl.h, ncclCommAbort: "Frees resources associated with
 * communicator object and aborts any operations that might still be running on the device";
 * "Calling ncclCommDestroy while the collective operations are running ... will now result in
 * the collective operations being aborted" (NVIDIA/nccl pull request 140, which added abort).
 */
static ncclResult_t comm_end(ncclComm_t comm)
{
	if (!comm)
		return ncclSuccess; /* NCCL accepts a NULL communicator here */
	pthread_mutex_lock(&comm->lock);
	if (!nccl_comm_valid(comm)) {
		pthread_mutex_unlock(&comm->lock);
		return ncclInvalidArgument;
	}
	atomic_store(&comm->aborted, 1);
	if (comm->shm.hdr)
		nccl_shm_wake(&comm->shm);
	while (atomic_load(&comm->inflight) > 0) {
		struct timespec ts = {.tv_nsec = 1000000};
		(void)nanosleep(&ts, NULL);
	}
	nccl_comm_release(comm);
	pthread_mutex_unlock(&comm->lock);
	return ncclSuccess;
}

_public_ ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	FAULT_POINT("ncclCommDestroy");
	return comm_end(comm);
}
NCCL_ALIAS(ncclCommDestroy);

_public_ ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	FAULT_POINT("ncclCommAbort");
	return comm_end(comm);
}
NCCL_ALIAS(ncclCommAbort);

/* Like NCCL between ranks of one node, a dead peer is not an asynchronous error: the others
 * only stop progressing. The error an abort inflicted on an operation is reported. */
_public_ ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
	uint64_t magic;

	FAULT_POINT("ncclCommGetAsyncError");
	if (!comm || !async_error)
		return ncclInvalidArgument;
	magic = atomic_load(&comm->magic);
	if ((magic != NCCL_COMM_MAGIC && magic != NCCL_COMM_DEAD) || comm->owner != &this_library)
		return ncclInvalidArgument;
	*async_error = (ncclResult_t)atomic_load(&comm->async_error);
	return ncclSuccess;
}
NCCL_ALIAS(ncclCommGetAsyncError);

_public_ ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	FAULT_POINT("ncclCommCount");
	if (!nccl_comm_valid(comm) || !count)
		return ncclInvalidArgument;
	/* "init thread must be joined before we access the attributes of comm"
	 * (init.cc): ncclCommEnsureReady. */
	if (nccl_comm_ensure_ready(comm) < 0)
		return ncclInvalidArgument;
	*count = comm->nranks;
	return ncclSuccess;
}
NCCL_ALIAS(ncclCommCount);

_public_ ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
	FAULT_POINT("ncclCommCuDevice");
	if (!nccl_comm_valid(comm) || !device)
		return ncclInvalidArgument;
	/* "init thread must be joined before we access the attributes of comm"
	 * (init.cc): ncclCommEnsureReady. */
	if (nccl_comm_ensure_ready(comm) < 0)
		return ncclInvalidArgument;
	*device = comm->dev;
	return ncclSuccess;
}
NCCL_ALIAS(ncclCommCuDevice);

_public_ ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	FAULT_POINT("ncclCommUserRank");
	if (!nccl_comm_valid(comm) || !rank)
		return ncclInvalidArgument;
	/* "init thread must be joined before we access the attributes of comm"
	 * (init.cc): ncclCommEnsureReady. */
	if (nccl_comm_ensure_ready(comm) < 0)
		return ncclInvalidArgument;
	*rank = comm->rank;
	return ncclSuccess;
}
NCCL_ALIAS(ncclCommUserRank);

_public_ const char *ncclGetErrorString(ncclResult_t result)
{
	switch (result) {
	case ncclSuccess:
		return "no error";
	case ncclUnhandledCudaError:
		return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError:
		return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError:
		return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument:
		return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage:
		return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError:
		return "remote process exited or there was a network error";
	case ncclInProgress:
		return "NCCL operation in progress";
	default:
		return "unknown result code";
	}
}
NCCL_ALIAS(ncclGetErrorString);

_public_ const char *ncclGetLastError(ncclComm_t comm)
{
	return last_error;
}
NCCL_ALIAS(ncclGetLastError);
