/* SPDX-License-Identifier: MIT */
/*
 * Streams and events. Work runs synchronously at the call that enqueues it, so every stream
 * is always idle and an event completes when it is recorded: what the documentation allows
 * an implementation to do, and what the callers of these functions must already cope with.
 */
#include <stdlib.h>
#include <time.h>

#include "cuda-internal.h"

struct CUstream_st {
	struct CUstream_st *next;
	unsigned flags;
	int priority;
	CUdevice dev;
	unsigned long long id;
};

struct CUevent_st {
	struct CUevent_st *next;
	unsigned flags;
	bool recorded;
	struct timespec when;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *streams;
static struct CUevent_st *events;
static unsigned long long next_stream_id = 3; /* 0-2 stand for the built-in streams */

unsigned emu_stream_flags(CUstream s)
{
	unsigned flags = 0;

	pthread_mutex_lock(&lock);
	for (struct CUstream_st *p = streams; p; p = p->next)
		if (p == s)
			flags = p->flags;
	pthread_mutex_unlock(&lock);
	return flags;
}

CUresult emu_stream_check(CUstream s)
{
	CUresult r = CUDA_ERROR_INVALID_HANDLE;

	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&lock);
	for (struct CUstream_st *p = streams; p; p = p->next)
		if (p == s)
			r = CUDA_SUCCESS;
	pthread_mutex_unlock(&lock);
	return r;
}

static CUresult stream_create(CUstream *phStream, unsigned int flags, int priority)
{
	struct CUstream_st *s;
	CUdevice dev;
	CUresult r;

	if (!phStream || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	r = emu_current_device(&dev);
	if (r != CUDA_SUCCESS)
		return r;
	s = calloc(1, sizeof(*s));
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->flags = flags;
	s->priority = priority;
	s->dev = dev;
	pthread_mutex_lock(&lock);
	s->id = next_stream_id++;
	s->next = streams;
	streams = s;
	pthread_mutex_unlock(&lock);
	*phStream = s;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	EMU_ENTER();
	return stream_create(phStream, Flags, 0);
}

CUAPI CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
	EMU_ENTER();
	/* Priorities are clamped to the range cuCtxGetStreamPriorityRange reports: [-5, 0]. */
	return stream_create(phStream, flags, priority > 0 ? 0 : priority < -5 ? -5 : priority);
}

CUAPI CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
	EMU_ENTER();
	if (leastPriority)
		*leastPriority = 0;
	if (greatestPriority)
		*greatestPriority = -5;
	return CUDA_SUCCESS;
}

static CUresult stream_destroy(CUstream hStream)
{
	CUresult r = CUDA_ERROR_INVALID_HANDLE;

	if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&lock);
	for (struct CUstream_st **p = &streams; *p; p = &(*p)->next)
		if (*p == hStream) {
			*p = hStream->next;
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lock);
	if (r == CUDA_SUCCESS) {
		/* A capture still open on it ends with it (its graph is dropped). */
		emu_capture_stream_destroyed(hStream);
		free(hStream);
	}
	return r;
}

CUAPI CUresult cuStreamDestroy_v2(CUstream hStream)
{
	EMU_ENTER();
	return stream_destroy(hStream);
}
EMU_VARIANT(cuStreamDestroy, cuStreamDestroy_v2, (CUstream hStream), (hStream));

CUAPI CUresult cuStreamSynchronize(CUstream hStream)
{
	CUresult r;

	EMU_ENTER();
	r = emu_stream_check(hStream);
	return r != CUDA_SUCCESS ? r : emu_capture_sync_stream(hStream);
}
EMU_VARIANT(cuStreamSynchronize_ptsz, cuStreamSynchronize, (CUstream hStream), (hStream));

CUAPI CUresult cuStreamQuery(CUstream hStream)
{
	CUresult r;

	EMU_ENTER();
	r = emu_stream_check(hStream);
	return r != CUDA_SUCCESS ? r : emu_capture_sync_stream(hStream);
}
EMU_VARIANT(cuStreamQuery_ptsz, cuStreamQuery, (CUstream hStream), (hStream));

CUAPI CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	EMU_ENTER();
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	return emu_stream_check(hStream);
}
EMU_VARIANT(cuStreamWaitEvent_ptsz, cuStreamWaitEvent,
	    (CUstream hStream, CUevent hEvent, unsigned int Flags), (hStream, hEvent, Flags));

CUAPI CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
	CUresult r;

	EMU_ENTER();
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	r = emu_stream_check(hStream);
	if (r == CUDA_SUCCESS)
		*flags = hStream && hStream != CU_STREAM_LEGACY && hStream != CU_STREAM_PER_THREAD
				 ? hStream->flags
				 : 0;
	return r;
}
EMU_VARIANT(cuStreamGetFlags_ptsz, cuStreamGetFlags, (CUstream hStream, unsigned int *flags),
	    (hStream, flags));

CUAPI CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId)
{
	CUresult r;

	EMU_ENTER();
	if (!streamId)
		return CUDA_ERROR_INVALID_VALUE;
	r = emu_stream_check(hStream);
	if (r == CUDA_SUCCESS)
		*streamId = hStream == NULL		      ? 0
			    : hStream == CU_STREAM_LEGACY     ? 1
			    : hStream == CU_STREAM_PER_THREAD ? 2
							      : hStream->id;
	return r;
}
EMU_VARIANT(cuStreamGetId_ptsz, cuStreamGetId, (CUstream hStream, unsigned long long *streamId),
	    (hStream, streamId));

/* ---- events ---- */

static struct CUevent_st *event_find(CUevent e)
{
	struct CUevent_st *found = NULL;

	pthread_mutex_lock(&lock);
	for (struct CUevent_st *p = events; p; p = p->next)
		if (p == e)
			found = p;
	pthread_mutex_unlock(&lock);
	return found;
}

CUAPI CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	struct CUevent_st *e;
	CUdevice dev;
	CUresult r;

	EMU_ENTER();
	if (!phEvent || (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
					     CU_EVENT_INTERPROCESS)))
		return CUDA_ERROR_INVALID_VALUE;
	r = emu_current_device(&dev);
	if (r != CUDA_SUCCESS)
		return r;
	e = calloc(1, sizeof(*e));
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->flags = Flags;
	pthread_mutex_lock(&lock);
	e->next = events;
	events = e;
	pthread_mutex_unlock(&lock);
	*phEvent = e;
	return CUDA_SUCCESS;
}

static CUresult event_record(CUevent hEvent, CUstream hStream)
{
	struct CUevent_st *e = event_find(hEvent);
	CUresult r;

	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	r = emu_stream_check(hStream);
	if (r != CUDA_SUCCESS)
		return r;
	clock_gettime(CLOCK_MONOTONIC, &e->when);
	e->recorded = true;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	EMU_ENTER();
	return event_record(hEvent, hStream);
}
EMU_VARIANT(cuEventRecord_ptsz, cuEventRecord, (CUevent hEvent, CUstream hStream),
	    (hEvent, hStream));

CUAPI CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	EMU_ENTER();
	return event_record(hEvent, hStream);
}
EMU_VARIANT(cuEventRecordWithFlags_ptsz, cuEventRecordWithFlags,
	    (CUevent hEvent, CUstream hStream, unsigned int flags), (hEvent, hStream, flags));

/* BELAYER_EMU_EVENT_DELAY_MS: an event reports CUDA_ERROR_NOT_READY for that long after it
 * was recorded, as a GPU still running the work before it would (the work itself is done:
 * nothing can read its results before the event completes without racing). 0 by default. */
static long event_delay_ns(void)
{
	static long delay = -1;
	long d = __atomic_load_n(&delay, __ATOMIC_RELAXED);

	if (d < 0) {
		const char *e = secure_getenv("BELAYER_EMU_EVENT_DELAY_MS");
		char *end;
		long ms = e ? strtol(e, &end, 10) : 0;

		d = e && *e && !*end && ms > 0 && ms < 60000 ? ms * 1000000L : 0;
		__atomic_store_n(&delay, d, __ATOMIC_RELAXED);
	}
	return d;
}

static bool event_pending(const struct CUevent_st *e)
{
	struct timespec now;
	long d = event_delay_ns();

	if (!d || !e->recorded)
		return false;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - e->when.tv_sec) * 1000000000L + (now.tv_nsec - e->when.tv_nsec) < d;
}

/* The live event h, for a call that waits for or queries its work: PyTorch's NCCL watchdog
 * found cuEventQuery unsafe during another thread's global capture. */
static CUresult event_wait_begin(CUevent h, struct CUevent_st **ret)
{
	*ret = event_find(h);
	if (!*ret)
		return CUDA_ERROR_INVALID_HANDLE;
	return emu_capture_unsafe();
}

CUAPI CUresult cuEventQuery(CUevent hEvent)
{
	struct CUevent_st *e;
	CUresult r;

	EMU_ENTER();
	r = event_wait_begin(hEvent, &e);
	if (r != CUDA_SUCCESS)
		return r;
	/* Recorded work has completed; an event never recorded also reports CUDA_SUCCESS, as
	 * documented. */
	return event_pending(e) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUAPI CUresult cuEventSynchronize(CUevent hEvent)
{
	struct timespec ts = {.tv_nsec = 1000000};
	struct CUevent_st *e;
	CUresult r;

	EMU_ENTER();
	r = event_wait_begin(hEvent, &e);
	if (r != CUDA_SUCCESS)
		return r;
	while (event_pending(e))
		(void)nanosleep(&ts, NULL);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuEventDestroy_v2(CUevent hEvent)
{
	CUresult r = CUDA_ERROR_INVALID_HANDLE;

	EMU_ENTER();
	pthread_mutex_lock(&lock);
	for (struct CUevent_st **p = &events; *p; p = &(*p)->next)
		if (*p == hEvent) {
			*p = hEvent->next;
			free(hEvent);
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lock);
	return r;
}
EMU_VARIANT(cuEventDestroy, cuEventDestroy_v2, (CUevent hEvent), (hEvent));

CUAPI CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	struct CUevent_st *s, *e;

	EMU_ENTER();
	if (!pMilliseconds)
		return CUDA_ERROR_INVALID_VALUE;
	s = event_find(hStart);
	e = event_find(hEnd);
	if (!s || !e)
		return CUDA_ERROR_INVALID_HANDLE;
	/* "If either event was last recorded in a non-NULL stream and either event has not
	 * been recorded, or if either event was created with the CU_EVENT_DISABLE_TIMING flag,
	 * then this function will return CUDA_ERROR_INVALID_HANDLE." */
	if (!s->recorded || !e->recorded || (s->flags & CU_EVENT_DISABLE_TIMING) ||
	    (e->flags & CU_EVENT_DISABLE_TIMING))
		return CUDA_ERROR_INVALID_HANDLE;
	*pMilliseconds = (float)((double)(e->when.tv_sec - s->when.tv_sec) * 1e3 +
				 (double)(e->when.tv_nsec - s->when.tv_nsec) / 1e6);
	return CUDA_SUCCESS;
}
EMU_VARIANT(cuEventElapsedTime, cuEventElapsedTime_v2,
	    (float *pMilliseconds, CUevent hStart, CUevent hEnd), (pMilliseconds, hStart, hEnd));
