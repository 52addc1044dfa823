/* SPDX-License-Identifier: MIT */
/*
 * Communicator records and progress counters (see shim-nccl.h).
 *
 * Hot path, per operation: two atomic adds on the counters, one lookup in a short array, and
 * one cuEventRecord through the real driver on the operation's stream (an event from a free
 * list, created once), then one cuEventQuery (it never waits): an operation already done
 * (the emulator's synchronous streams, a tiny collective) is completed right there. Otherwise
 * the "completed" counter is advanced by the poller thread, which queries the oldest pending
 * event of each communicator every BELAYER_NCCL_POLL_US (default 500) while events are
 * pending and sleeps otherwise.
 * Events of one communicator are completed in issue order, so "completed == N" means the
 * first N operations are done. On a real GPU the event fires when the collective's kernel
 * has finished; on the emulated driver streams are synchronous and it fires at once.
 *
 * Lifetime: a record is referenced by the table (until ncclCommDestroy/Abort), by each thread
 * whose one-entry lookup cache holds it, and by each operation between nccl_op_begin and its
 * completion being recorded (a ticket, or an entry deferred to ncclGroupEnd). PyTorch's
 * watchdog and engines' fault handlers abort a communicator from another thread while a
 * collective call may still run: the abort takes the record out of the table and drops the
 * table's reference, and the memory goes with the last reference, never under a caller.
 *
 * A stream being captured into a CUDA graph gets no event (recording one would put it into
 * the graph, and the capture's replays are invisible to us): such operations count as issued
 * and, at once, complete ("untracked").
 *
 * Nonblocking communicators (config.blocking = 0, review B4): a call that returns
 * ncclInProgress has not necessarily put its kernels on the stream yet, so an event recorded
 * then could fire before them. Its ring entry waits instead ("wait"), and the poller asks
 * ncclCommGetAsyncError: once it says ncclSuccess the work is on the stream (NCCL: "Before
 * the state becomes ncclSuccess, do not issue CUDA kernels on streams used by NCCL"), and the
 * event is recorded there; an error means the work will never run (untracked). Likewise a
 * communicator whose init returned ncclInProgress answers no query (ncclCommEnsureReady):
 * its rank, size and device are asked, and it is announced, once it says ncclSuccess. A
 * split of a nonblocking parent gets its child only when done (NCCL stores *newcomm then):
 * the caller's own ncclCommGetAsyncError on the parent takes it (nccl_comm_polled).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "nccl-counters.h"
#include "shim-capture.h"
#include "shim-conn-queue.h"
#include "shim-device.h"
#include "shim-nccl.h"
#include "shim-real.h"
#include "shim-regions.h"
#include "util.h"

#define MAX_COMMS   256
#define MAX_PENDING 4096 /* events in flight per communicator; beyond: untracked */
#define MAX_DEFER   1024 /* operations of one ncclGroupStart/End section */
#define MAX_SPLITS  64	 /* nonblocking splits in progress */

enum pend_kind {
	PEND_EVENT,	/* ev recorded after the operation */
	PEND_WAIT,	/* NCCL may not have enqueued it yet: no event so far */
	PEND_UNTRACKED, /* no event will come: complete once it reaches the head */
};

struct pend {
	CUevent ev;
	CUcontext ctx;
	CUstream stream; /* PEND_WAIT: where the event goes */
	uint64_t seq;
	bool p2p;
	uint8_t kind;
};

struct spare {
	CUevent ev;
	CUcontext ctx;
};

struct rec {
	ncclComm_t comm;
	uint64_t id, hash, parent_id, nsplits;
	int32_t rank, nranks, dev;
	enum nccl_origin origin;
	int memfd;
	struct nccl_counters *ctr;
	struct pend *ring;
	size_t head, count;
	struct spare *spares;
	size_t n_spares;
	size_t n_waiting;  /* PEND_WAIT entries in ring */
	bool init_pending; /* init returned ncclInProgress, not yet seen ncclSuccess */
	bool announced;	   /* the supervisor was told of it */
	bool ending;	   /* inside ncclCommDestroy/Abort: the shim calls NCCL on it no more */
	bool gone;	   /* out of the table (destroyed or aborted); under the lock */
	unsigned refs;	   /* atomic: see "Lifetime" above */
};

/* A split of a nonblocking parent whose child NCCL has yet to store into *newcomm. */
struct split_wait {
	ncclComm_t parent;
	ncclComm_t *newcomm;
	enum nccl_origin origin;
	uint64_t salt;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static struct rec *recs[MAX_COMMS];
static size_t n_recs;
static uint64_t next_id = 1, initall_calls;
static bool poller_started;
static long poll_us = 500;
static bool track_on = true; /* BELAYER_NCCL_TRACK=0: no records (measures the counters' cost) */
static struct split_wait splits[MAX_SPLITS];
static size_t n_splits; /* under the lock; read without it (atomic) by nccl_comm_polled */

struct defer {
	struct rec *rec;
	uint64_t seq;
	bool p2p;
	cudaStream_t stream;
};
/* Bumped (under the lock) whenever a record goes: a thread's cached lookup is valid while it
 * has not moved, so the hot path takes no lock for a communicator it used last. */
static uint64_t generation;
static __thread ncclComm_t cached_comm;
static __thread struct rec *cached_rec;
static __thread uint64_t cached_gen;
static pthread_key_t cache_key; /* its destructor drops an exiting thread's cached reference */
static bool cache_key_ok;
static __thread int group_depth;
static __thread struct defer *deferred;
static __thread size_t n_deferred;

static struct {
	pthread_once_t once;
	PFN_cuEventCreate_v2000 cuEventCreate;
	PFN_cuEventRecord_v2000 cuEventRecord;
	PFN_cuEventQuery_v2000 cuEventQuery;
	PFN_cuEventDestroy_v4000 cuEventDestroy;
	PFN_cuCtxGetCurrent_v4000 cuCtxGetCurrent;
	PFN_cuStreamIsCapturing_v10000 cuStreamIsCapturing;
	ncclResult_t (*ncclCommUserRank)(const ncclComm_t, int *);
	ncclResult_t (*ncclCommCount)(const ncclComm_t, int *);
	ncclResult_t (*ncclCommCuDevice)(const ncclComm_t, int *);
	ncclResult_t (*ncclCommGetAsyncError)(ncclComm_t, ncclResult_t *);
} fn = {.once = PTHREAD_ONCE_INIT};

static void rec_put(struct rec *r);

static void cache_key_gone(void *r)
{
	rec_put(r);
}

static void resolve(void)
{
	const char *s = secure_getenv("BELAYER_NCCL_POLL_US");

	if (s) {
		long v = strtol(s, NULL, 10);
		if (v >= 10 && v <= 1000000)
			poll_us = v;
	}
	s = secure_getenv("BELAYER_NCCL_TRACK");
	if (s && strcmp(s, "0") == 0)
		track_on = false;
	cache_key_ok = pthread_key_create(&cache_key, cache_key_gone) == 0;
	shim_busy++;
#define C(f, n) fn.f = (__typeof__(fn.f))real_lookup("libcuda.so.1", n)
	C(cuEventCreate, "cuEventCreate");
	C(cuEventRecord, "cuEventRecord");
	C(cuEventQuery, "cuEventQuery");
	C(cuEventDestroy, "cuEventDestroy_v2");
	C(cuCtxGetCurrent, "cuCtxGetCurrent");
	C(cuStreamIsCapturing, "cuStreamIsCapturing");
#undef C
#define N(f) fn.f = (__typeof__(fn.f))real_lookup("libnccl.so.2", #f)
	N(ncclCommUserRank);
	N(ncclCommCount);
	N(ncclCommCuDevice);
	N(ncclCommGetAsyncError);
#undef N
	shim_busy--;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

#define FNV_INIT 0xcbf29ce484222325ull

static struct rec *find_locked(ncclComm_t comm)
{
	for (size_t i = 0; i < n_recs; i++)
		if (recs[i]->comm == comm && !recs[i]->gone)
			return recs[i];
	return NULL;
}

static struct rec *find_id_locked(uint64_t id)
{
	for (size_t i = 0; i < n_recs; i++)
		if (recs[i]->id == id)
			return recs[i];
	return NULL;
}

static void announce(enum conn_item item, uint64_t id)
{
	regions_lock();
	if (conn_active_locked())
		conn_enqueue_locked(item, id);
	regions_unlock();
}

static int counters_create(struct nccl_counters **ret)
{
	_cleanup_close_ int fd = memfd_create("belayer-nccl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	struct nccl_counters *c;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, NCCL_COUNTERS_SIZE) < 0)
		return -errno;
	/* The supervisor maps it: it must never shrink under that mapping. */
	(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	c = mmap(NULL, NCCL_COUNTERS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (c == MAP_FAILED)
		return -errno;
	c->version = NCCL_COUNTERS_VERSION;
	__atomic_store_n(&c->magic, NCCL_COUNTERS_MAGIC, __ATOMIC_RELEASE);
	*ret = c;
	return TAKE_FD(fd);
}

static void *poller(void *arg);

static void start_poller_locked(void)
{
	sigset_t all, old;
	pthread_attr_t attr;
	pthread_t t;

	if (poller_started)
		return;
	poller_started = true;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 128 * 1024);
	if (pthread_create(&t, &attr, poller, NULL) != 0) {
		poller_started = false;
		log_debug("Failed to start the NCCL poller: completions stay untracked.");
	} else
		(void)pthread_setname_np(t, "belayer-nccl");
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* With shim_busy held: comm's rank, size and CUDA device from the library (-1 where it
 * does not answer; a rank or size already known is kept); the device falls back to the
 * current context's. */
static void identify(ncclComm_t comm, int32_t *rank, int32_t *nranks, int32_t *dev)
{
	int v;

	if (*rank < 0 && fn.ncclCommUserRank && fn.ncclCommUserRank(comm, &v) == ncclSuccess)
		*rank = v;
	if (*nranks < 0 && fn.ncclCommCount && fn.ncclCommCount(comm, &v) == ncclSuccess)
		*nranks = v;
	v = -1;
	if (fn.ncclCommCuDevice && fn.ncclCommCuDevice(comm, &v) != ncclSuccess)
		v = -1;
	if (v < 0 && real_extra()->cuCtxGetDevice) {
		CUdevice d;
		if (real_extra()->cuCtxGetDevice(&d) == CUDA_SUCCESS)
			v = (int)d;
	}
	*dev = v;
}

/* What the record says when the library did not tell: rank 0 of 1. */
static void identity_defaults(struct rec *r)
{
	if (r->rank < 0)
		r->rank = 0;
	if (r->nranks < 1)
		r->nranks = 1;
}

/* Adds the record of comm with this hash (parent_id 0: none). Returns whether the shim tracks
 * communicators (the caller then makes sure the connection runs, even if this one record
 * could not be made). in_progress: see nccl_comm_created. */
static bool comm_add(ncclComm_t comm, uint64_t hash, uint64_t parent_id, enum nccl_origin origin,
		     int rank, int nranks, bool in_progress)
{
	struct nccl_counters *ctr = NULL;
	struct rec *r;
	int32_t rk = rank, nr = nranks, dev = -1;
	int fd;

	if (!comm)
		return false;
	(void)pthread_once(&fn.once, resolve);
	if (!track_on)
		return false;
	if (!in_progress) {
		shim_busy++;
		identify(comm, &rk, &nr, &dev);
		shim_busy--;
	}
	fd = counters_create(&ctr);
	if (fd < 0) {
		log_debug("No counters for a communicator (%d), not tracking it.", fd);
		return true;
	}
	r = calloc(1, sizeof(*r));
	if (r) {
		r->ring = calloc(MAX_PENDING, sizeof(*r->ring));
		r->spares = calloc(MAX_PENDING, sizeof(*r->spares));
	}
	pthread_mutex_lock(&lock);
	if (!r || !r->ring || !r->spares || n_recs == MAX_COMMS) {
		pthread_mutex_unlock(&lock);
		log_debug("Out of memory or too many communicators, not tracking one more.");
		if (r) {
			free(r->ring);
			free(r->spares);
		}
		free(r);
		(void)munmap(ctr, NCCL_COUNTERS_SIZE);
		(void)close(fd);
		return true;
	}
	r->comm = comm;
	r->rank = rk;
	r->nranks = nr;
	r->dev = dev;
	r->origin = origin;
	r->memfd = fd;
	r->ctr = ctr;
	r->hash = hash;
	r->parent_id = parent_id;
	r->id = next_id++;
	r->refs = 1; /* the table's */
	r->init_pending = in_progress;
	r->announced = !in_progress;
	if (!in_progress)
		identity_defaults(r);
	recs[n_recs++] = r;
	__atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
	start_poller_locked();
	if (in_progress)
		pthread_cond_signal(&wake);
	pthread_mutex_unlock(&lock);
	if (!in_progress)
		announce(CONN_NCCL_COMM, r->id);
	return true;
}

bool nccl_comm_created(ncclComm_t comm, const ncclUniqueId *uid, enum nccl_origin origin,
		       ncclComm_t parent, uint64_t salt, int rank, int nranks, bool in_progress)
{
	uint64_t h = FNV_INIT, parent_id = 0;
	struct rec *p;

	pthread_mutex_lock(&lock);
	p = parent ? find_locked(parent) : NULL;
	if (p) {
		h = fnv1a(h, &p->hash, sizeof(p->hash));
		parent_id = p->id;
	}
	pthread_mutex_unlock(&lock);
	if (uid)
		h = fnv1a(h, uid->internal, sizeof(uid->internal));
	h = fnv1a(h, &salt, sizeof(salt));
	h = fnv1a(h, &origin, sizeof(origin));
	return comm_add(comm, h, parent_id, origin, rank, nranks, in_progress);
}

bool nccl_initall_created(ncclComm_t *comms, int n)
{
	bool tracked = false;
	/* Every rank is in this process: one hash per call. */
	pid_t pid = getpid();
	uint64_t h = FNV_INIT, k;

	pthread_mutex_lock(&lock);
	k = ++initall_calls;
	pthread_mutex_unlock(&lock);
	h = fnv1a(fnv1a(h, &pid, sizeof(pid)), &k, sizeof(k));
	for (int i = 0; i < n; i++)
		tracked = comm_add(comms[i], h, 0, NCCL_ORIGIN_INIT_ALL, i, n, false) || tracked;
	return tracked;
}

uint64_t nccl_comm_next_split(ncclComm_t parent)
{
	struct rec *p;
	uint64_t n = 0;

	pthread_mutex_lock(&lock);
	p = find_locked(parent);
	if (p)
		n = ++p->nsplits;
	pthread_mutex_unlock(&lock);
	return n;
}

void nccl_split_pending(ncclComm_t parent, ncclComm_t *newcomm, enum nccl_origin origin,
			uint64_t salt)
{
	bool full;

	(void)pthread_once(&fn.once, resolve);
	if (!track_on || !parent || !newcomm)
		return;
	pthread_mutex_lock(&lock);
	full = n_splits == MAX_SPLITS;
	if (!full) {
		splits[n_splits] = (struct split_wait){
			.parent = parent, .newcomm = newcomm, .origin = origin, .salt = salt};
		__atomic_store_n(&n_splits, n_splits + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lock);
	if (full)
		log_debug("Too many nonblocking splits in progress, not tracking one more.");
}

/* With the lock held: forgets the pending splits of parent. */
static void splits_drop_locked(ncclComm_t parent)
{
	for (size_t i = 0; i < n_splits;)
		if (splits[i].parent == parent) {
			splits[i] = splits[n_splits - 1];
			__atomic_store_n(&n_splits, n_splits - 1, __ATOMIC_RELEASE);
		} else {
			i++;
		}
}

bool nccl_comm_polled(ncclComm_t comm, ncclResult_t state)
{
	struct split_wait found[MAX_SPLITS];
	ncclComm_t child[MAX_SPLITS];
	size_t n = 0;
	bool tracked = false;

	if (state == ncclInProgress || __atomic_load_n(&n_splits, __ATOMIC_ACQUIRE) == 0)
		return false;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < n_splits;) {
		/* NCCL stored it (atomically) before the parent left ncclInProgress. A caller
		 * may also wait for *newcomm to be set and poll the child itself (PyTorch's
		 * waitReady polls the communicator it holds): that child is taken too. */
		ncclComm_t c = __atomic_load_n(splits[i].newcomm, __ATOMIC_ACQUIRE);

		if (splits[i].parent != comm && (!comm || c != comm)) {
			i++;
			continue;
		}
		found[n] = splits[i];
		child[n++] = state == ncclSuccess || splits[i].parent != comm ? c : NULL;
		splits[i] = splits[n_splits - 1];
		__atomic_store_n(&n_splits, n_splits - 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lock);
	/* The child finished its init inside the parent's job, but its own state is asked
	 * again before its identity (in_progress): a library that says ncclInProgress a little
	 * longer for it costs one poll. */
	for (size_t i = 0; i < n; i++)
		if (child[i])
			tracked = nccl_comm_created(child[i], NULL, found[i].origin,
						    found[i].parent, found[i].salt, -1, -1, true) ||
				  tracked;
	return tracked;
}

void nccl_comm_ending(ncclComm_t comm, enum nccl_end how)
{
	struct rec *r;
	uint64_t id = 0;

	pthread_mutex_lock(&lock);
	r = find_locked(comm);
	if (r && how == NCCL_END_FINALIZE) {
		__atomic_store_n(&r->ctr->state, NCCL_COMM_FINALIZED, __ATOMIC_RELEASE);
		if (r->announced)
			id = r->id;
	} else if (r) {
		/* The poller asks the library about it under this lock: from now on it does
		 * not, so it never asks about a communicator being freed. */
		r->ending = true;
	}
	if (how != NCCL_END_FINALIZE)
		splits_drop_locked(comm);
	pthread_mutex_unlock(&lock);
	if (id)
		announce(CONN_NCCL_FINALIZE, id);
}

/* With the lock held: r leaves the table; its events go now (only the table's users touch
 * them), its counters with its last reference. */
static void rec_retire_locked(struct rec *r)
{
	r->gone = true;
	for (size_t i = 0; i < n_recs; i++)
		if (recs[i] == r) {
			recs[i] = recs[--n_recs];
			break;
		}
	__atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
	shim_busy++;
	for (size_t i = 0; i < r->count; i++) {
		struct pend *p = &r->ring[(r->head + i) % MAX_PENDING];

		if (p->kind == PEND_EVENT && fn.cuEventDestroy)
			(void)fn.cuEventDestroy(p->ev);
	}
	for (size_t i = 0; i < r->n_spares; i++)
		if (fn.cuEventDestroy)
			(void)fn.cuEventDestroy(r->spares[i].ev);
	shim_busy--;
	r->count = r->n_spares = r->n_waiting = 0;
	r->init_pending = false;
	(void)safe_close(r->memfd);
	r->memfd = -EBADF;
}

/* Drops one reference (NULL: none); the last one frees r (its memfd stays with the
 * supervisor). */
static void rec_put(struct rec *r)
{
	if (!r || __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	(void)munmap(r->ctr, NCCL_COUNTERS_SIZE);
	free(r->ring);
	free(r->spares);
	free(r);
}

void nccl_comm_gone(ncclComm_t comm, enum nccl_end how)
{
	struct rec *r;
	uint64_t id = 0;

	pthread_mutex_lock(&lock);
	r = find_locked(comm);
	if (r) {
		__atomic_store_n(&r->ctr->state, NCCL_COMM_ENDED, __ATOMIC_RELEASE);
		if (r->announced)
			id = r->id;
		rec_retire_locked(r);
	}
	pthread_mutex_unlock(&lock);
	rec_put(r); /* the table's: operations still in a call keep theirs */
	if (id)
		announce(how == NCCL_END_ABORT ? CONN_NCCL_ABORT : CONN_NCCL_DESTROY, id);
}

void nccl_op_begin(ncclComm_t comm, uint32_t op, uint64_t bytes, bool p2p,
		   struct nccl_op_ticket *ret)
{
	struct rec *r;

	*ret = (struct nccl_op_ticket){0};
	if (comm && comm == cached_comm &&
	    __atomic_load_n(&generation, __ATOMIC_ACQUIRE) == cached_gen)
		r = cached_rec;
	else {
		struct rec *old = cached_rec;

		pthread_mutex_lock(&lock);
		r = find_locked(comm);
		if (r)
			__atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED); /* the cache's */
		cached_comm = comm;
		cached_rec = r;
		cached_gen = generation;
		pthread_mutex_unlock(&lock);
		if (cache_key_ok)
			(void)pthread_setspecific(cache_key, r);
		rec_put(old);
	}
	if (!r)
		return;
	/* The ticket's: the cache's reference keeps r alive until this one is taken. */
	__atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED);
	ret->rec = r;
	ret->p2p = p2p;
	if (p2p)
		ret->seq = __atomic_add_fetch(&r->ctr->p2p_enqueued, 1, __ATOMIC_RELEASE);
	else {
		__atomic_store_n(&r->ctr->last_op, op, __ATOMIC_RELAXED);
		__atomic_store_n(&r->ctr->last_bytes, bytes, __ATOMIC_RELAXED);
		__atomic_store_n(&r->ctr->enqueue_ns, now_ns(), __ATOMIC_RELAXED);
		ret->seq = __atomic_add_fetch(&r->ctr->coll_enqueued, 1, __ATOMIC_RELEASE);
	}
	__atomic_add_fetch(&r->ctr->in_call, 1, __ATOMIC_RELEASE);
}

/* With the lock held: the operation counts complete now (no event to wait for). */
static void complete_locked(struct rec *r, uint64_t seq, bool p2p)
{
	uint64_t *c = p2p ? &r->ctr->p2p_completed : &r->ctr->coll_completed;

	if (__atomic_load_n(c, __ATOMIC_RELAXED) < seq)
		__atomic_store_n(c, seq, __ATOMIC_RELEASE);
	if (!p2p)
		__atomic_store_n(&r->ctr->complete_ns, now_ns(), __ATOMIC_RELEASE);
}

/* An operation the library may not have put on its stream yet (the call returned
 * ncclInProgress): a PEND_WAIT entry, for the poller. */
static void track_later(struct rec *r, uint64_t seq, bool p2p, cudaStream_t stream)
{
	CUcontext ctx = NULL;

	(void)pthread_once(&fn.once, resolve);
	shim_busy++;
	if (!fn.cuCtxGetCurrent || fn.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
		ctx = NULL;
	shim_busy--;
	pthread_mutex_lock(&lock);
	if (r->gone) {
		pthread_mutex_unlock(&lock);
		return;
	}
	if (ctx && r->count < MAX_PENDING && fn.ncclCommGetAsyncError) {
		r->ring[(r->head + r->count) % MAX_PENDING] =
			(struct pend){.ctx = ctx,
				      .stream = (CUstream)stream,
				      .seq = seq,
				      .p2p = p2p,
				      .kind = PEND_WAIT};
		r->count++;
		r->n_waiting++;
		pthread_cond_signal(&wake);
	} else {
		__atomic_add_fetch(&r->ctr->untracked, 1, __ATOMIC_RELAXED);
		if (r->count == 0)
			complete_locked(r, seq, p2p);
		else if (r->ring[(r->head + r->count - 1) % MAX_PENDING].p2p == p2p)
			r->ring[(r->head + r->count - 1) % MAX_PENDING].seq = seq;
	}
	pthread_mutex_unlock(&lock);
}

/* Records the completion event of one operation on stream. */
static void track(struct rec *r, uint64_t seq, bool p2p, cudaStream_t stream)
{
	CUstream s = (CUstream)stream;
	CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
	struct spare ev = {0};
	bool have = false, ok = false, done = false;

	CUstreamCaptureMode mode;

	(void)pthread_once(&fn.once, resolve);
	shim_busy++;
	/* The engine's thread may itself be capturing on another stream (GLOBAL mode), where
	 * the event query below would invalidate its capture. */
	mode = capture_relax_begin();
	if (fn.cuStreamIsCapturing && fn.cuStreamIsCapturing(s, &cap) != CUDA_SUCCESS)
		cap = CU_STREAM_CAPTURE_STATUS_NONE;
	if (cap == CU_STREAM_CAPTURE_STATUS_NONE && fn.cuEventRecord && fn.cuCtxGetCurrent &&
	    fn.cuCtxGetCurrent(&ev.ctx) == CUDA_SUCCESS) {
		pthread_mutex_lock(&lock);
		if (!r->gone) {
			/* A spare of this context, or a new event below. */
			for (size_t i = r->n_spares; i-- > 0;)
				if (r->spares[i].ctx == ev.ctx) {
					ev = r->spares[i];
					r->spares[i] = r->spares[--r->n_spares];
					have = true;
					break;
				}
		}
		pthread_mutex_unlock(&lock);
		if (!have && fn.cuEventCreate &&
		    fn.cuEventCreate(&ev.ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS)
			have = true;
		if (have)
			ok = fn.cuEventRecord(ev.ev, s) == CUDA_SUCCESS;
		/* Already done (a synchronous stream, a tiny collective): completed here, and
		 * the poller is not woken for it. cuEventQuery never waits. */
		if (ok && fn.cuEventQuery && fn.cuEventQuery(ev.ev) == CUDA_SUCCESS)
			done = true;
	}
	capture_relax_end(mode);
	shim_busy--;

	pthread_mutex_lock(&lock);
	if (r->gone) {
		pthread_mutex_unlock(&lock);
		if (have && fn.cuEventDestroy) {
			shim_busy++;
			(void)fn.cuEventDestroy(ev.ev);
			shim_busy--;
		}
		return;
	}
	if (done && r->count == 0) {
		complete_locked(r, seq, p2p);
		if (r->n_spares < MAX_PENDING)
			r->spares[r->n_spares++] = ev;
		else if (fn.cuEventDestroy) {
			shim_busy++;
			(void)fn.cuEventDestroy(ev.ev);
			shim_busy--;
		}
	} else if (ok && r->count < MAX_PENDING) {
		r->ring[(r->head + r->count) % MAX_PENDING] =
			(struct pend){.ev = ev.ev, .ctx = ev.ctx, .seq = seq, .p2p = p2p};
		if (r->count++ == 0)
			pthread_cond_signal(&wake);
	} else {
		if (have && r->n_spares < MAX_PENDING)
			r->spares[r->n_spares++] = ev;
		else if (have && fn.cuEventDestroy) {
			shim_busy++;
			(void)fn.cuEventDestroy(ev.ev);
			shim_busy--;
		}
		__atomic_add_fetch(&r->ctr->untracked, 1, __ATOMIC_RELAXED);
		/* Only when nothing older is pending: completion stays in order. */
		if (r->count == 0)
			complete_locked(r, seq, p2p);
		else {
			/* Rides on the newest pending event of its kind: done when that is. */
			struct pend *last = &r->ring[(r->head + r->count - 1) % MAX_PENDING];

			if (last->p2p == p2p)
				last->seq = seq;
		}
	}
	pthread_mutex_unlock(&lock);
}

void nccl_op_end(const struct nccl_op_ticket *t, cudaStream_t stream, ncclResult_t res)
{
	struct rec *r = t->rec;

	if (!r)
		return;
	__atomic_sub_fetch(&r->ctr->in_call, 1, __ATOMIC_RELEASE);
	if (res != ncclSuccess && res != ncclInProgress) {
		/* Not enqueued: nothing will complete it but us. */
		pthread_mutex_lock(&lock);
		if (!r->gone && r->count == 0)
			complete_locked(r, t->seq, t->p2p);
		pthread_mutex_unlock(&lock);
		rec_put(r);
		return;
	}
	if (group_depth == 0 && res == ncclInProgress) {
		track_later(r, t->seq, t->p2p, stream);
		rec_put(r);
		return;
	}
	if (group_depth > 0) {
		/* Launched by the outermost ncclGroupEnd: the event is recorded after it. */
		if (!deferred)
			deferred = calloc(MAX_DEFER, sizeof(*deferred));
		if (deferred && n_deferred < MAX_DEFER) {
			deferred[n_deferred++] = (struct defer){
				.rec = r, .seq = t->seq, .p2p = t->p2p, .stream = stream};
			return; /* the entry holds the ticket's reference */
		}
	}
	track(r, t->seq, t->p2p, stream);
	rec_put(r);
}

void nccl_group_start(void)
{
	group_depth++;
}

void nccl_group_end(ncclResult_t res)
{
	if (group_depth > 0)
		group_depth--;
	if (group_depth > 0 || n_deferred == 0)
		return;
	for (size_t i = 0; i < n_deferred; i++) {
		struct defer *d = &deferred[i];

		if (res == ncclSuccess)
			track(d->rec, d->seq, d->p2p, d->stream);
		else if (res == ncclInProgress)
			track_later(d->rec, d->seq, d->p2p, d->stream);
		else {
			pthread_mutex_lock(&lock);
			if (!d->rec->gone && d->rec->count == 0)
				complete_locked(d->rec, d->seq, d->p2p);
			pthread_mutex_unlock(&lock);
		}
		rec_put(d->rec);
	}
	n_deferred = 0;
}

/* With the lock held, in the poller: an event for the waiting entry p, recorded on its stream
 * now that the library has put the operation there. false: none (the stream is being
 * captured, or a call failed): p completes untracked. */
static bool record_late_locked(struct rec *r, struct pend *p, CUcontext *cur)
{
	CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
	struct spare ev = {.ctx = p->ctx};
	bool have = false;

	if (p->ctx != *cur) {
		if (!real_extra()->cuCtxSetCurrent ||
		    real_extra()->cuCtxSetCurrent(p->ctx) != CUDA_SUCCESS)
			return false;
		*cur = p->ctx;
	}
	/* Recording into a capture would put the event into the graph (see the top). */
	if (!fn.cuStreamIsCapturing || !fn.cuEventRecord ||
	    fn.cuStreamIsCapturing(p->stream, &cap) != CUDA_SUCCESS ||
	    cap != CU_STREAM_CAPTURE_STATUS_NONE)
		return false;
	for (size_t i = r->n_spares; i-- > 0;)
		if (r->spares[i].ctx == p->ctx) {
			ev = r->spares[i];
			r->spares[i] = r->spares[--r->n_spares];
			have = true;
			break;
		}
	if (!have && fn.cuEventCreate &&
	    fn.cuEventCreate(&ev.ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS)
		have = true;
	if (!have)
		return false;
	if (fn.cuEventRecord(ev.ev, p->stream) != CUDA_SUCCESS) {
		if (r->n_spares < MAX_PENDING)
			r->spares[r->n_spares++] = ev;
		else if (fn.cuEventDestroy)
			(void)fn.cuEventDestroy(ev.ev);
		return false;
	}
	p->ev = ev.ev;
	return true;
}

/* With the lock held, in the poller: asks the library how r's nonblocking work stands. On
 * ncclSuccess a pending init gets its identity (and *ret_announce is set), waiting entries
 * their events; on an error neither will come. Returns whether r is still in progress. */
static bool settle_locked(struct rec *r, CUcontext *cur, bool *ret_announce)
{
	ncclResult_t st = ncclInProgress;

	*ret_announce = false;
	if (r->ending || (!r->init_pending && r->n_waiting == 0))
		return false;
	if (!fn.ncclCommGetAsyncError)
		st = ncclSuccess; /* a library without it: its calls never return ncclInProgress */
	else if (fn.ncclCommGetAsyncError(r->comm, &st) != ncclSuccess)
		st = ncclInvalidArgument;
	if (st == ncclInProgress)
		return true;
	if (r->init_pending) {
		r->init_pending = false;
		if (st == ncclSuccess) {
			identify(r->comm, &r->rank, &r->nranks, &r->dev);
			identity_defaults(r);
			r->announced = *ret_announce = true;
		} else {
			log_debug("A nonblocking communicator failed to initialise (%d), not "
				  "announcing it.",
				  (int)st);
		}
	}
	for (size_t i = 0; i < r->count && r->n_waiting > 0; i++) {
		struct pend *p = &r->ring[(r->head + i) % MAX_PENDING];

		if (p->kind != PEND_WAIT)
			continue;
		r->n_waiting--;
		p->kind = st == ncclSuccess && record_late_locked(r, p, cur) ? PEND_EVENT
									     : PEND_UNTRACKED;
	}
	return false;
}

/* One pass over every communicator's oldest events. Returns whether any is still pending;
 * the records that became announceable are added to ann (n_ann of them). */
static bool poll_once_locked(CUcontext *cur, uint64_t *ann, size_t *n_ann)
{
	bool pending = false;

	for (size_t i = 0; i < n_recs; i++) {
		struct rec *r = recs[i];
		bool a;

		if (settle_locked(r, cur, &a))
			pending = true;
		if (a)
			ann[(*n_ann)++] = r->id;
		while (r->count > 0) {
			struct pend *p = &r->ring[r->head];
			CUresult q = CUDA_SUCCESS;

			if (p->kind == PEND_WAIT) {
				pending = true;
				break;
			}
			if (p->kind == PEND_EVENT) {
				if (p->ctx != *cur && real_extra()->cuCtxSetCurrent &&
				    real_extra()->cuCtxSetCurrent(p->ctx) == CUDA_SUCCESS)
					*cur = p->ctx;
				q = fn.cuEventQuery ? fn.cuEventQuery(p->ev) : CUDA_SUCCESS;
				if (q == CUDA_ERROR_NOT_READY) {
					pending = true;
					break;
				}
			}
			/* Done, or an error (a failed context), or no event: either way it will
			 * not complete later, and a stuck counter would read as a hang. */
			if (q != CUDA_SUCCESS || p->kind == PEND_UNTRACKED)
				__atomic_add_fetch(&r->ctr->untracked, 1, __ATOMIC_RELAXED);
			complete_locked(r, p->seq, p->p2p);
			if (p->kind == PEND_EVENT && r->n_spares < MAX_PENDING)
				r->spares[r->n_spares++] = (struct spare){p->ev, p->ctx};
			else if (p->kind == PEND_EVENT && fn.cuEventDestroy)
				(void)fn.cuEventDestroy(p->ev);
			r->head = (r->head + 1) % MAX_PENDING;
			r->count--;
		}
	}
	return pending;
}

static void *poller(void *arg)
{
	CUcontext cur = NULL;
	uint64_t ann[MAX_COMMS];

	(void)arg;
	shim_busy++; /* everything this thread calls is the shim's own */
	capture_relax_thread();
	pthread_mutex_lock(&lock);
	for (;;) {
		size_t n_ann = 0;
		bool pending = poll_once_locked(&cur, ann, &n_ann);

		if (n_ann > 0) {
			/* The connection's lock comes before ours: never taken under it. */
			pthread_mutex_unlock(&lock);
			for (size_t i = 0; i < n_ann; i++)
				announce(CONN_NCCL_COMM, ann[i]);
			pthread_mutex_lock(&lock);
		}
		if (!pending) {
			bool any = false;
			for (size_t i = 0; i < n_recs && !any; i++)
				any = recs[i]->count > 0 ||
				      (recs[i]->init_pending && !recs[i]->ending);
			if (!any)
				pthread_cond_wait(&wake, &lock);
			continue;
		}
		pthread_mutex_unlock(&lock);
		{
			struct timespec ts = {.tv_sec = poll_us / 1000000,
					      .tv_nsec = (poll_us % 1000000) * 1000};
			(void)nanosleep(&ts, NULL);
		}
		pthread_mutex_lock(&lock);
	}
	return NULL;
}

bool nccl_build_comm(uint64_t id, struct proto_msg *ret)
{
	struct rec *r;
	bool ok = false;

	pthread_mutex_lock(&lock);
	r = find_id_locked(id);
	if (r && !r->gone && r->announced) {
		int fd = fcntl(r->memfd, F_DUPFD_CLOEXEC, 3);

		if (fd >= 0) {
			*ret = (struct proto_msg){.type = PROTO_NCCL_COMM};
			ret->nccl_comm.id = r->id;
			ret->nccl_comm.hash = r->hash;
			ret->nccl_comm.rank = r->rank;
			ret->nccl_comm.nranks = (uint32_t)r->nranks;
			ret->nccl_comm.cuda_dev = r->dev;
			ret->nccl_comm.parent_id = r->parent_id;
			ret->nccl_comm.origin = r->origin;
			ret->nccl_comm.fd = fd;
			ok = true;
		}
	}
	pthread_mutex_unlock(&lock);
	if (ok && ret->nccl_comm.cuda_dev >= 0) {
		const struct real_extra *x = real_extra();
		CUdevice d = ret->nccl_comm.cuda_dev;

		shim_busy++;
		if (x->cuDeviceGet)
			(void)x->cuDeviceGet(&d, ret->nccl_comm.cuda_dev);
		shim_busy--;
		shim_device_uuid(d, ret->nccl_comm.device_uuid);
	}
	return ok;
}

int nccl_announce_all(int (*send)(const struct proto_msg *m))
{
	uint64_t ids[MAX_COMMS];
	size_t n;

	pthread_mutex_lock(&lock);
	n = n_recs;
	for (size_t i = 0; i < n; i++)
		ids[i] = recs[i]->id;
	pthread_mutex_unlock(&lock);
	for (size_t i = 0; i < n; i++) {
		struct proto_msg m;
		int r;

		if (!nccl_build_comm(ids[i], &m))
			continue;
		r = send(&m);
		proto_msg_finish(&m);
		if (r < 0)
			return r;
	}
	return 0;
}

void nccl_reset_after_fork(void)
{
	/* NCCL communicators do not survive fork: the child starts with none. The parent's
	 * records are leaked in the child on purpose (their events belong to the parent). */
	pthread_mutex_init(&lock, NULL);
	pthread_cond_init(&wake, NULL);
	n_recs = 0;
	n_splits = 0;
	generation++;
	cached_comm = NULL;
	cached_rec = NULL; /* its reference is leaked with it */
	if (cache_key_ok)
		(void)pthread_setspecific(cache_key, NULL);
	poller_started = false;
	group_depth = 0;
	n_deferred = 0;
}
