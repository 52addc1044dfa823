/* SPDX-License-Identifier: MIT */
/*
 * Stream capture and CUDA graphs. Work enqueued on a capturing stream is not executed but
 * recorded into the capture's graph (cuStreamBeginCapture: "all operations pushed into the
 * stream will not be executed, but will instead be captured into a graph"); cuGraphLaunch
 * replays the recorded operations against whatever memory is mapped at the recorded device
 * addresses at replay time, with the kernel arguments copied at capture, as a GPU does.
 *
 * The capture interaction modes follow cuThreadExchangeStreamCaptureMode: a thread in GLOBAL
 * mode is prohibited from potentially unsafe API calls while it has a non-relaxed capture of
 * its own or any other thread has a GLOBAL capture; THREAD_LOCAL only looks at the thread's
 * own captures; RELAXED is never prohibited. A prohibited call returns
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures that prohibited it, as
 * the documentation says conflicting calls do (cuCtxRecordEvent: "the call will invalidate all
 * the conflicting captures"). Which calls are "potentially unsafe" is only given by example:
 * cudaMalloc (cuThreadExchangeStreamCaptureMode) and, observed by PyTorch's NCCL watchdog
 * (pytorch PR #104487), cudaEventQuery; synchronising the device or a capturing stream
 * necessarily conflicts. The emulator prohibits exactly those: cuMemAlloc*, cuMemFree*,
 * cuEventQuery, cuEventSynchronize, cuCtxSynchronize, and cuStreamSynchronize/Query of a
 * capturing stream. VMM calls (cuMemCreate/Map/Export/Import) are allowed: nothing documents
 * them as unsafe, and PyTorch maps expandable segments during capture.
 */
#include <stdio.h>
#include <string.h>

#include "cuda-internal.h"

struct capture {
	struct capture *next;
	CUstream stream;
	CUstreamCaptureMode mode;
	pthread_t owner;
	cuuint64_t id;
	bool invalidated;
	struct CUgraph_st *graph;
};

struct CUgraph_st {
	struct CUgraph_st *next;
	struct emu_op *ops;
	size_t n, cap;
};

struct CUgraphExec_st {
	struct CUgraphExec_st *next;
	struct emu_op *ops;
	size_t n;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct capture *captures;
static struct CUgraph_st *graphs;
static struct CUgraphExec_st *execs;
static cuuint64_t next_capture_id = 1;
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static bool is_legacy(CUstream s)
{
	/* The NULL stream is the legacy stream unless a caller built for per-thread default
	 * streams uses the _ptsz entries, which the emulator does not tell apart. */
	return !s || s == CU_STREAM_LEGACY;
}

static struct capture *capture_of_locked(CUstream s)
{
	for (struct capture *c = captures; c; c = c->next)
		if (c->stream == s)
			return c;
	return NULL;
}

static void op_finish(struct emu_op *op)
{
	if (op->kind == EMU_OP_KERNEL) {
		free(op->args);
		free(op->sizes);
	}
}

static void ops_free(struct emu_op *ops, size_t n)
{
	for (size_t i = 0; i < n; i++)
		op_finish(&ops[i]);
	free(ops);
}

/* A deep copy of op (kernel arguments by value, as cuLaunchKernel copies them). */
static int op_copy(struct emu_op *dst, const struct emu_op *src)
{
	*dst = *src;
	dst->params = NULL;
	if (src->kind != EMU_OP_KERNEL)
		return 0;
	dst->args = NULL;
	dst->sizes = NULL;
	if (src->nparams) {
		size_t total = 0;

		dst->sizes = malloc(src->nparams * sizeof(size_t));
		if (!dst->sizes)
			return -ENOMEM;
		memcpy(dst->sizes, src->sizes, src->nparams * sizeof(size_t));
		for (size_t i = 0; i < src->nparams; i++)
			total += src->sizes[i];
		dst->args = malloc(total ? total : 1);
		if (!dst->args) {
			free(dst->sizes);
			return -ENOMEM;
		}
		total = 0;
		for (size_t i = 0; i < src->nparams; i++) {
			/* At submit time the arguments are the caller's (params); a graph's copy
			 * holds them in args. */
			const void *from =
				src->params ? src->params[i] : (const uint8_t *)src->args + total;
			memcpy((uint8_t *)dst->args + total, from, src->sizes[i]);
			total += src->sizes[i];
		}
	}
	return 0;
}

static int graph_append(struct CUgraph_st *g, const struct emu_op *op)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 16;
		struct emu_op *v = realloc(g->ops, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		g->ops = v;
		g->cap = cap;
	}
	if (op_copy(&g->ops[g->n], op) < 0)
		return -ENOMEM;
	g->n++;
	return 0;
}

__thread bool emu_in_kernel, emu_kernel_faulted;

/* Runs a host kernel; an address it could not translate is the GPU's illegal address, which
 * the launch (synchronous here) reports and which stays sticky (emu_set_sticky). */
static CUresult kernel_run(const struct emu_op *op, void **params)
{
	emu_in_kernel = true;
	emu_kernel_faulted = false;
	op->fn(&op->launch, params);
	emu_in_kernel = false;
	if (!emu_kernel_faulted)
		return CUDA_SUCCESS;
	emu_kernel_faulted = false;
	emu_set_sticky(CUDA_ERROR_ILLEGAL_ADDRESS);
	fprintf(stderr,
		"libcuda (belayer emulator): kernel %s touched an address not mapped with access: "
		"CUDA_ERROR_ILLEGAL_ADDRESS from now on in this process\n",
		op->launch.name ? op->launch.name : "?");
	return CUDA_ERROR_ILLEGAL_ADDRESS;
}

static CUresult op_run(const struct emu_op *op)
{
	CUresult r;

	if (op->kind == EMU_OP_HOST) {
		op->host_fn(op->user_data);
		return CUDA_SUCCESS;
	}
	if (op->kind != EMU_OP_KERNEL)
		return emu_mem_op_run(op);
	if (op->params)
		return kernel_run(op, op->params);
	{
		void *stack[32];
		void **params = op->nparams <= 32 ? stack : calloc(op->nparams, sizeof(void *));
		size_t off = 0;

		if (!params)
			return CUDA_ERROR_OUT_OF_MEMORY;
		for (size_t i = 0; i < op->nparams; i++) {
			params[i] = (uint8_t *)op->args + off;
			off += op->sizes[i];
		}
		r = kernel_run(op, params);
		if (params != stack)
			free(params);
	}
	return r;
}

/* Any blocking (not CU_STREAM_NON_BLOCKING) stream capturing, for the legacy stream's
 * implicit dependency on it. */
static struct capture *blocking_capture_locked(void)
{
	for (struct capture *c = captures; c; c = c->next)
		if (!(emu_stream_flags(c->stream) & CU_STREAM_NON_BLOCKING))
			return c;
	return NULL;
}

CUresult emu_stream_submit(CUstream s, const struct emu_op *op)
{
	struct capture *c;
	CUresult r = emu_stream_check(s);

	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&lock);
	if (is_legacy(s)) {
		/* cuStreamIsCapturing: "When a blocking stream is capturing, the legacy stream is
		 * in an unusable state until the blocking stream capture is terminated"; its use
		 * would merge into the capture, which invalidates it. */
		c = blocking_capture_locked();
		if (c) {
			c->invalidated = true;
			pthread_mutex_unlock(&lock);
			return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
		}
		pthread_mutex_unlock(&lock);
		return op_run(op);
	}
	c = capture_of_locked(s);
	if (!c) {
		pthread_mutex_unlock(&lock);
		return op_run(op);
	}
	if (c->invalidated)
		r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	else if (graph_append(c->graph, op) < 0)
		r = CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_unlock(&lock);
	return r;
}

CUresult emu_legacy_use(void)
{
	struct capture *c;

	pthread_mutex_lock(&lock);
	c = blocking_capture_locked();
	if (c)
		c->invalidated = true;
	pthread_mutex_unlock(&lock);
	return c ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

CUresult emu_capture_unsafe(void)
{
	pthread_t self = pthread_self();
	bool prohibited = false;

	if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&lock);
	for (struct capture *c = captures; c; c = c->next) {
		bool own = pthread_equal(c->owner, self);
		bool conflicts = own ? c->mode != CU_STREAM_CAPTURE_MODE_RELAXED
				     : thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
						 c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
		if (conflicts) {
			c->invalidated = true;
			prohibited = true;
		}
	}
	pthread_mutex_unlock(&lock);
	return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult emu_capture_sync_stream(CUstream s)
{
	struct capture *c;
	CUresult r = CUDA_SUCCESS;

	pthread_mutex_lock(&lock);
	c = is_legacy(s) ? blocking_capture_locked() : capture_of_locked(s);
	if (c) {
		/* Programming guide, stream capture: "It is invalid to synchronize or query the
		 * execution status of a stream which is being captured". */
		c->invalidated = true;
		r = is_legacy(s) ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
				 : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

void emu_capture_stream_destroyed(CUstream s)
{
	pthread_mutex_lock(&lock);
	for (struct capture **p = &captures; *p; p = &(*p)->next)
		if ((*p)->stream == s) {
			struct capture *c = *p;

			*p = c->next;
			ops_free(c->graph->ops, c->graph->n);
			free(c->graph);
			free(c);
			break;
		}
	pthread_mutex_unlock(&lock);
}

/* ---- capture ---- */

static CUresult begin_capture(CUstream hStream, CUstreamCaptureMode mode)
{
	struct capture *c;
	CUresult r;

	if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
	    mode != CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	/* "Capture may not be initiated if stream is CU_STREAM_LEGACY." */
	if (is_legacy(hStream))
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	r = emu_stream_check(hStream);
	if (r != CUDA_SUCCESS)
		return r;
	c = calloc(1, sizeof(*c));
	if (c)
		c->graph = calloc(1, sizeof(*c->graph));
	if (!c || !c->graph) {
		free(c);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	c->stream = hStream;
	c->mode = mode;
	c->owner = pthread_self();
	pthread_mutex_lock(&lock);
	/* "it may only be initiated if the stream is not already in capture mode" */
	if (capture_of_locked(hStream)) {
		pthread_mutex_unlock(&lock);
		free(c->graph);
		free(c);
		return CUDA_ERROR_ILLEGAL_STATE;
	}
	c->id = next_capture_id++;
	c->next = captures;
	captures = c;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
	EMU_ENTER();
	return begin_capture(hStream, mode);
}
EMU_VARIANT(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2,
	    (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode));

CUAPI CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	struct capture *c = NULL;
	CUresult r = CUDA_SUCCESS;

	EMU_ENTER();
	if (!phGraph)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	for (struct capture **p = &captures; *p; p = &(*p)->next)
		if ((*p)->stream == hStream) {
			c = *p;
			/* "If the mode argument to cuStreamBeginCapture was not
			 * CU_STREAM_CAPTURE_MODE_RELAXED, this call must be from the same thread" */
			if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
			    !pthread_equal(c->owner, pthread_self())) {
				pthread_mutex_unlock(&lock);
				return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
			}
			*p = c->next;
			break;
		}
	if (!c) {
		pthread_mutex_unlock(&lock);
		/* "This error indicates that the capture was not initiated in this stream." */
		return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
	}
	if (c->invalidated) {
		/* "If capture was invalidated, due to a violation of the rules of stream capture,
		 * then a NULL graph will be returned." */
		ops_free(c->graph->ops, c->graph->n);
		free(c->graph);
		*phGraph = NULL;
		r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	} else {
		c->graph->next = graphs;
		graphs = c->graph;
		*phGraph = c->graph;
	}
	pthread_mutex_unlock(&lock);
	free(c);
	return r;
}
EMU_VARIANT(cuStreamEndCapture_ptsz, cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph),
	    (hStream, phGraph));

static CUresult capture_info(CUstream hStream, CUstreamCaptureStatus *status, cuuint64_t *id,
			     CUgraph *graph)
{
	struct capture *c;
	CUresult r;

	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	r = emu_stream_check(hStream);
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&lock);
	if (is_legacy(hStream)) {
		/* "if this is called on CU_STREAM_LEGACY while a blocking stream in the same
		 * context is capturing, it will return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ... The
		 * blocking stream capture is not invalidated." */
		r = blocking_capture_locked() ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
		*status = CU_STREAM_CAPTURE_STATUS_NONE;
		pthread_mutex_unlock(&lock);
		return r;
	}
	c = capture_of_locked(hStream);
	*status = !c		   ? CU_STREAM_CAPTURE_STATUS_NONE
		  : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
				   : CU_STREAM_CAPTURE_STATUS_ACTIVE;
	if (c && !c->invalidated) {
		if (id)
			*id = c->id;
		if (graph)
			*graph = c->graph;
	}
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	EMU_ENTER();
	return capture_info(hStream, captureStatus, NULL, NULL);
}
EMU_VARIANT(cuStreamIsCapturing_ptsz, cuStreamIsCapturing,
	    (CUstream hStream, CUstreamCaptureStatus *captureStatus), (hStream, captureStatus));

CUAPI CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
					 cuuint64_t *id_out, CUgraph *graph_out,
					 const CUgraphNode **dependencies_out,
					 const CUgraphEdgeData **edgeData_out,
					 size_t *numDependencies_out)
{
	CUresult r;

	EMU_ENTER();
	/* "If edgeData_out is non-NULL then dependencies_out must be as well." */
	if (edgeData_out && !dependencies_out)
		return CUDA_ERROR_INVALID_VALUE;
	r = capture_info(hStream, captureStatus_out, id_out, graph_out);
	/* Graph nodes are not exposed: a capture's graph is a sequence, with no handles. */
	if (r == CUDA_SUCCESS) {
		if (dependencies_out)
			*dependencies_out = NULL;
		if (edgeData_out)
			*edgeData_out = NULL;
		if (numDependencies_out)
			*numDependencies_out = 0;
	}
	return r;
}
EMU_VARIANT(cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCaptureInfo_v3,
	    (CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out,
	     CUgraph *graph_out, const CUgraphNode **dependencies_out,
	     const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out),
	    (hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
	     numDependencies_out));

CUAPI CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	CUstreamCaptureMode old = thread_mode;

	EMU_ENTER();
	if (!mode || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL &&
		      *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
		      *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
		return CUDA_ERROR_INVALID_VALUE;
	thread_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

/* ---- graphs ---- */

static bool graph_live_locked(CUgraph g)
{
	for (struct CUgraph_st *p = graphs; p; p = p->next)
		if (p == g)
			return true;
	return false;
}

CUAPI CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
					   unsigned long long flags)
{
	struct CUgraphExec_st *x;
	CUresult r = CUDA_SUCCESS;

	EMU_ENTER();
	if (!phGraphExec ||
	    (flags & ~(unsigned long long)(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
					   CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
					   CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
					   CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)))
		return CUDA_ERROR_INVALID_VALUE;
	x = calloc(1, sizeof(*x));
	if (!x)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&lock);
	if (!graph_live_locked(hGraph)) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* The executable graph is a snapshot: later changes to the graph do not reach it. */
	x->ops = calloc(hGraph->n ? hGraph->n : 1, sizeof(*x->ops));
	if (!x->ops) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	for (; x->n < hGraph->n; x->n++)
		if (op_copy(&x->ops[x->n], &hGraph->ops[x->n]) < 0) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
	x->next = execs;
	execs = x;
	*phGraphExec = x;
	x = NULL;
out:
	pthread_mutex_unlock(&lock);
	if (x) {
		ops_free(x->ops, x->n);
		free(x);
	}
	return r;
}

static struct CUgraphExec_st *exec_find_locked(CUgraphExec x)
{
	for (struct CUgraphExec_st *p = execs; p; p = p->next)
		if (p == x)
			return p;
	return NULL;
}

CUAPI CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	struct CUgraphExec_st *x;
	CUresult r;

	EMU_ENTER();
	pthread_mutex_lock(&lock);
	x = exec_find_locked(hGraphExec);
	pthread_mutex_unlock(&lock);
	if (!x)
		return CUDA_ERROR_INVALID_VALUE;
	/* Each operation goes to the stream as the graph's node would: replayed against the
	 * memory mapped now at the captured addresses (or captured again, into another graph). */
	for (size_t i = 0; i < x->n; i++) {
		r = emu_stream_submit(hStream, &x->ops[i]);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return CUDA_SUCCESS;
}
EMU_VARIANT(cuGraphLaunch_ptsz, cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream),
	    (hGraphExec, hStream));

CUAPI CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	pthread_mutex_lock(&lock);
	for (struct CUgraphExec_st **p = &execs; *p; p = &(*p)->next)
		if (*p == hGraphExec) {
			*p = hGraphExec->next;
			ops_free(hGraphExec->ops, hGraphExec->n);
			free(hGraphExec);
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lock);
	return r;
}

CUAPI CUresult cuGraphDestroy(CUgraph hGraph)
{
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	EMU_ENTER();
	pthread_mutex_lock(&lock);
	for (struct CUgraph_st **p = &graphs; *p; p = &(*p)->next)
		if (*p == hGraph) {
			*p = hGraph->next;
			ops_free(hGraph->ops, hGraph->n);
			free(hGraph);
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lock);
	return r;
}

/* "Enqueues a host function call in a stream. The function will be called after currently
 * enqueued work and will block work added after it." Captured, it is a host node: called at
 * every replay. */
CUAPI CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
	EMU_ENTER();
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	return emu_stream_submit(
		hStream,
		&(struct emu_op){.kind = EMU_OP_HOST, .host_fn = fn, .user_data = userData});
}
EMU_VARIANT(cuLaunchHostFunc_ptsz, cuLaunchHostFunc,
	    (CUstream hStream, CUhostFn fn, void *userData), (hStream, fn, userData));
