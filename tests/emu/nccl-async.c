/* SPDX-License-Identifier: MIT */
/*
 * Nonblocking communicators (ncclConfig_t.blocking = 0) of the emulated NCCL: the work of a
 * call that returns ncclInProgress runs on a thread of its own, as NCCL's ncclGroupEnd runs
 * the group job of a nonblocking communicator on a thread and returns ncclInProgress (it
 * marks every communicator of the job ncclInProgress first: ncclCommSetAsyncError in
 * group.cc). ncclCommGetAsyncError reports ncclInProgress for each communicator of the job
 * until the job is done, then ncclSuccess or the job's error.
 *
 * Streams are synchronous here, so "enqueued" means "done": the job runs the operations to
 * their end. BELAYER_EMU_NCCL_ASYNC_MS=N (default 0, at most 60000) holds every job back N ms
 * first, in 1 ms slices that an abort ends: the window in which a real NCCL has returned
 * ncclInProgress but not yet put the kernels on the stream.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "nccl-internal.h"

struct job {
	int (*run)(void *arg);
	void (*finish)(void *arg, int r);
	void *arg;
	size_t n;
	struct ncclComm *comms[];
};

static long delay_ms(void)
{
	const char *e = secure_getenv("BELAYER_EMU_NCCL_ASYNC_MS");
	char *end;
	long ms;

	if (!e || !*e)
		return 0;
	ms = strtol(e, &end, 10);
	return !*end && ms > 0 && ms <= 60000 ? ms : 0;
}

static bool any_aborted(const struct job *j)
{
	for (size_t i = 0; i < j->n; i++)
		if (atomic_load(&j->comms[i]->aborted))
			return true;
	return false;
}

static void *job_main(void *p)
{
	struct job *j = p;
	long ms = delay_ms();
	ncclResult_t res;
	int r;

	for (long i = 0; i < ms && !any_aborted(j); i++) {
		struct timespec ts = {.tv_nsec = 1000000};

		(void)nanosleep(&ts, NULL);
	}
	if (any_aborted(j)) {
		nccl_set_last_error("communicator aborted before its nonblocking operation ran");
		r = -ECANCELED;
	} else {
		r = j->run(j->arg);
	}
	if (j->finish)
		j->finish(j->arg, r);
	res = nccl_result_from_errno(r);
	/* Before inflight drops: an abort waiting for it frees nothing this still writes (the
	 * struct itself stays, a tombstone). Last first: a split lists its parent first, and its
	 * child is ready before the parent says so (NCCL's child init ends inside the job). */
	for (size_t i = j->n; i-- > 0;)
		atomic_store(&j->comms[i]->async_error, res);
	for (size_t i = 0; i < j->n; i++)
		atomic_fetch_sub(&j->comms[i]->inflight, 1);
	free(j);
	return NULL;
}

int nccl_async_launch(struct ncclComm *const *comms, size_t n, int (*run)(void *arg),
		      void (*finish)(void *arg, int r), void *arg)
{
	struct job *j = malloc(sizeof(*j) + n * sizeof(j->comms[0]));
	sigset_t all, old;
	pthread_attr_t attr;
	pthread_t t;
	int r;

	if (!j)
		return -ENOMEM;
	*j = (struct job){.run = run, .finish = finish, .arg = arg, .n = n};
	for (size_t i = 0; i < n; i++) {
		j->comms[i] = comms[i];
		/* Held until the job ends: ncclCommAbort waits for it, so nothing the job uses
		 * is freed under it. */
		atomic_fetch_add(&comms[i]->inflight, 1);
		atomic_store(&comms[i]->async_error, ncclInProgress);
	}
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	r = -pthread_create(&t, &attr, job_main, j);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0) {
		for (size_t i = 0; i < n; i++) {
			atomic_store(&comms[i]->async_error, ncclSuccess);
			atomic_fetch_sub(&comms[i]->inflight, 1);
		}
		free(j);
		nccl_set_last_error("cannot start the thread of a nonblocking operation");
	}
	return r;
}

int nccl_comm_ensure_ready(const struct ncclComm *comm)
{
	if (atomic_load(&((struct ncclComm *)comm)->async_error) != ncclInProgress)
		return 0;
	nccl_set_last_error("rank %d: Attempt to use communicator before the previous operation "
			    "returned ncclSuccess",
			    comm->rank);
	return -EINVAL;
}
