/* SPDX-License-Identifier: MIT */
/*
 * Stream capture and graphs: captured work is recorded, not run; a graph replays it against
 * whatever is mapped at the captured addresses at launch; the capture modes decide which other
 * threads' calls are prohibited and invalidate the capture; legacy IPC refuses VMM memory;
 * an imported mapping keeps its backing when the exporter remaps its own VA.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test-emu-cuda-util.h"
#include "test-util.h"

#define CU_OK(call) assert_int_equal((call), CUDA_SUCCESS)
#define MIB	    (1ull << 20)

static const char ptx[] = ".version 8.5\n"
			  ".target sm_90\n"
			  ".address_size 64\n"
			  ".visible .entry vec_add(\n"
			  "\t.param .u64 vec_add_param_0,\n"
			  "\t.param .u64 vec_add_param_1,\n"
			  "\t.param .u64 vec_add_param_2,\n"
			  "\t.param .u32 vec_add_param_3\n"
			  ")\n"
			  "{\n\tret;\n}\n";

static int group_setup(void **state)
{
	return cu_setup(NULL);
}

static int group_teardown(void **state)
{
	return cu_teardown();
}

static int setup(void **state)
{
	return cu_use_device(0) == CUDA_SUCCESS ? 0 : -1;
}

static uint32_t read_u32(CUdeviceptr p)
{
	uint32_t v;

	CU_OK(cu.cuMemcpyDtoH(&v, p, sizeof(v)));
	return v;
}

static void test_capture_records_and_graph_replays(void **state)
{
	CUstreamCaptureStatus st;
	CUdeviceptr d;
	CUstream s;
	CUgraph g;
	CUgraphExec x;
	cuuint64_t id = 0;
	uint32_t v = 7;

	CU_OK(cu.cuMemAlloc(&d, 4096));
	CU_OK(cu.cuMemsetD32(d, 0, 1024));
	CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(cu.cuStreamIsCapturing(s, &st));
	assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
	CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	CU_OK(cu.cuStreamIsCapturing(s, &st));
	assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	CU_OK(cu.cuStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL));
	assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	assert_true(id != 0);
	/* Already capturing: refused. */
	assert_int_not_equal(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
			     CUDA_SUCCESS);
	CU_OK(cu.cuMemsetD32Async(d, 0x11111111, 1, s));
	CU_OK(cu.cuMemcpyHtoDAsync(d + 4, &v, sizeof(v), s));
	CU_OK(cu.cuStreamEndCapture(s, &g));
	assert_non_null(g);
	/* Nothing ran at capture. */
	assert_int_equal(read_u32(d), 0);
	assert_int_equal(read_u32(d + 4), 0);
	CU_OK(cu.cuGraphInstantiateWithFlags(&x, g, 0));
	v = 9; /* a host source is read at replay, as a GPU reads it */
	CU_OK(cu.cuGraphLaunch(x, s));
	CU_OK(cu.cuStreamSynchronize(s));
	assert_int_equal(read_u32(d), 0x11111111);
	assert_int_equal(read_u32(d + 4), 9);
	/* Replayed again, from scratch. */
	CU_OK(cu.cuMemsetD32(d, 0, 2));
	CU_OK(cu.cuGraphLaunch(x, s));
	assert_int_equal(read_u32(d), 0x11111111);
	CU_OK(cu.cuGraphExecDestroy(x));
	CU_OK(cu.cuGraphDestroy(g));
	assert_int_not_equal(cu.cuGraphLaunch(x, s), CUDA_SUCCESS);
	/* Ending a capture that was never begun, and capturing the legacy stream. */
	assert_int_equal(cu.cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
	assert_int_not_equal(
		cu.cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
		CUDA_SUCCESS);
	CU_OK(cu.cuStreamDestroy(s));
	CU_OK(cu.cuMemFree(d));
}

/* A kernel captured against a VMM range replays into whatever handle is mapped there at
 * launch time, with the arguments copied when it was captured. */
static void test_graph_replays_against_current_mapping(void **state)
{
	const size_t size = 2 * MIB;
	CUmemGenericAllocationHandle ha, hb;
	CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40}, c[4];
	CUdeviceptr da, db, va;
	unsigned n = 4;
	void *params[] = {&da, &db, &va, &n};
	CUmodule m;
	CUfunction f;
	CUstream s;
	CUgraph g;
	CUgraphExec x;

	CU_OK(cu.cuModuleLoadData(&m, ptx));
	CU_OK(cu.cuModuleGetFunction(&f, m, "vec_add"));
	CU_OK(cu.cuMemAlloc(&da, sizeof(a)));
	CU_OK(cu.cuMemAlloc(&db, sizeof(b)));
	CU_OK(cu.cuMemcpyHtoD(da, a, sizeof(a)));
	CU_OK(cu.cuMemcpyHtoD(db, b, sizeof(b)));
	CU_OK(cu_vmm_create(0, size, true, &ha));
	CU_OK(cu_vmm_create(0, size, true, &hb));
	CU_OK(cu_vmm_map(ha, size, 0, &va));
	CU_OK(cu.cuMemsetD8(va, 0, size));

	CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	CU_OK(cu.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
	CU_OK(cu.cuStreamEndCapture(s, &g));
	CU_OK(cu.cuGraphInstantiateWithFlags(&x, g, 0));
	n = 1; /* arguments were copied at capture */

	/* Swap the physical memory under the captured VA, as a promotion does. */
	CU_OK(cu.cuMemUnmap(va, size));
	CU_OK(cu.cuMemMap(va, size, 0, hb, 0));
	CU_OK(cu.cuMemSetAccess(va, size, &acc, 1));
	CU_OK(cu.cuMemsetD8(va, 0, size));
	CU_OK(cu.cuGraphLaunch(x, s));
	CU_OK(cu.cuMemcpyDtoH(c, va, sizeof(c)));
	for (int i = 0; i < 4; i++)
		assert_true(c[i] == a[i] + b[i]);
	/* The old backing saw nothing. */
	CU_OK(cu.cuMemUnmap(va, size));
	CU_OK(cu.cuMemMap(va, size, 0, ha, 0));
	CU_OK(cu.cuMemSetAccess(va, size, &acc, 1));
	CU_OK(cu.cuMemcpyDtoH(c, va, sizeof(c)));
	for (int i = 0; i < 4; i++)
		assert_true(c[i] == 0);

	CU_OK(cu.cuGraphExecDestroy(x));
	CU_OK(cu.cuGraphDestroy(g));
	CU_OK(cu.cuStreamDestroy(s));
	cu_vmm_unmap(va, size);
	CU_OK(cu.cuMemRelease(ha));
	CU_OK(cu.cuMemRelease(hb));
	CU_OK(cu.cuMemFree(da));
	CU_OK(cu.cuMemFree(db));
	CU_OK(cu.cuModuleUnload(m));
}

static void count_call(void *arg)
{
	(*(int *)arg)++;
}

/* A host function runs in stream order; captured, it is a node that runs at every replay. */
static void test_host_function_node(void **state)
{
	CUstream s;
	CUgraph g;
	CUgraphExec x;
	int calls = 0;

	CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(cu.cuLaunchHostFunc(s, count_call, &calls));
	assert_int_equal(calls, 1);
	CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	CU_OK(cu.cuLaunchHostFunc(s, count_call, &calls));
	CU_OK(cu.cuStreamEndCapture(s, &g));
	assert_int_equal(calls, 1);
	CU_OK(cu.cuGraphInstantiateWithFlags(&x, g, 0));
	CU_OK(cu.cuGraphLaunch(x, s));
	CU_OK(cu.cuGraphLaunch(x, s));
	assert_int_equal(calls, 3);
	CU_OK(cu.cuGraphExecDestroy(x));
	CU_OK(cu.cuGraphDestroy(g));
	CU_OK(cu.cuStreamDestroy(s));
}

struct other {
	CUcontext ctx;
	CUevent ev;
	CUstreamCaptureMode mode; /* the other thread's own mode */
	CUresult query, alloc;
};

static void *other_thread(void *arg)
{
	struct other *o = arg;
	CUstreamCaptureMode mode = o->mode;
	CUdeviceptr d = 0;

	(void)cu.cuCtxSetCurrent(o->ctx);
	(void)cu.cuThreadExchangeStreamCaptureMode(&mode);
	o->query = cu.cuEventQuery(o->ev);
	o->alloc = cu.cuMemAlloc(&d, 4096);
	if (o->alloc == CUDA_SUCCESS)
		(void)cu.cuMemFree(d);
	return NULL;
}

/* Captures on this thread in capture_mode while another thread in other_mode queries an
 * event and allocates; returns cuStreamEndCapture's result. */
static CUresult capture_with_other(CUstreamCaptureMode capture_mode, CUstreamCaptureMode other_mode,
				   struct other *o)
{
	CUstreamCaptureStatus st;
	pthread_t t;
	CUstream s;
	CUgraph g = NULL;
	CUdeviceptr d;
	CUresult r;

	*o = (struct other){.mode = other_mode};
	CU_OK(cu.cuCtxGetCurrent(&o->ctx));
	CU_OK(cu.cuEventCreate(&o->ev, CU_EVENT_DISABLE_TIMING));
	CU_OK(cu.cuEventRecord(o->ev, NULL)); /* recorded before the capture */
	CU_OK(cu.cuMemAlloc(&d, 4096));
	CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(cu.cuStreamBeginCapture(s, capture_mode));
	CU_OK(cu.cuMemsetD32Async(d, 1, 1, s));
	assert_int_equal(pthread_create(&t, NULL, other_thread, o), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	CU_OK(cu.cuStreamIsCapturing(s, &st));
	r = cu.cuStreamEndCapture(s, &g);
	if (r == CUDA_SUCCESS) {
		assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
		assert_non_null(g);
		CU_OK(cu.cuGraphDestroy(g));
	} else {
		assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
		assert_null(g);
	}
	CU_OK(cu.cuStreamDestroy(s));
	CU_OK(cu.cuMemFree(d));
	CU_OK(cu.cuEventDestroy(o->ev));
	return r;
}

static void test_global_capture_prohibits_other_threads(void **state)
{
	struct other o;

	/* Both in the default GLOBAL mode: the other thread's cuEventQuery (PyTorch's watchdog)
	 * and cuMemAlloc are refused and invalidate this thread's capture. */
	assert_int_equal(capture_with_other(CU_STREAM_CAPTURE_MODE_GLOBAL,
					    CU_STREAM_CAPTURE_MODE_GLOBAL, &o),
			 CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	assert_int_equal(o.query, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	assert_int_equal(o.alloc, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
}

static void test_thread_local_and_relaxed_modes(void **state)
{
	struct other o;

	/* The other thread exchanged its mode to THREAD_LOCAL or RELAXED: it ignores this
	 * thread's capture. */
	CU_OK(capture_with_other(CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
				 &o));
	CU_OK(o.query);
	CU_OK(o.alloc);
	CU_OK(capture_with_other(CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED,
				 &o));
	CU_OK(o.query);
	CU_OK(o.alloc);
	/* A THREAD_LOCAL or RELAXED capture does not constrain other threads. */
	CU_OK(capture_with_other(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
				 &o));
	CU_OK(o.query);
	CU_OK(capture_with_other(CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL,
				 &o));
	CU_OK(o.query);
}

static void test_exchange_returns_previous_mode(void **state)
{
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

	CU_OK(cu.cuThreadExchangeStreamCaptureMode(&m));
	assert_int_equal(m, CU_STREAM_CAPTURE_MODE_GLOBAL); /* the default */
	CU_OK(cu.cuThreadExchangeStreamCaptureMode(&m));
	assert_int_equal(m, CU_STREAM_CAPTURE_MODE_RELAXED);
	m = (CUstreamCaptureMode)42;
	assert_int_equal(cu.cuThreadExchangeStreamCaptureMode(&m), CUDA_ERROR_INVALID_VALUE);
	assert_int_equal(cu.cuThreadExchangeStreamCaptureMode(NULL), CUDA_ERROR_INVALID_VALUE);
}

static void test_own_thread_unsafe_calls(void **state)
{
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
	CUdeviceptr d, d2;
	CUstream s;
	CUgraph g;

	CU_OK(cu.cuMemAlloc(&d, 4096));
	CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	/* cudaMalloc during one's own global capture: refused, capture invalidated. */
	CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	assert_int_equal(cu.cuMemAlloc(&d2, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	assert_int_equal(cu.cuMemsetD32Async(d, 1, 1, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	assert_int_equal(cu.cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	assert_null(g);
	/* PyTorch's cudaMallocMaybeCapturing: RELAXED around the allocation keeps the capture. */
	CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	CU_OK(cu.cuThreadExchangeStreamCaptureMode(&m));
	CU_OK(cu.cuMemAlloc(&d2, 4096));
	CU_OK(cu.cuThreadExchangeStreamCaptureMode(&m));
	/* Synchronising the capturing stream is not allowed. */
	assert_int_equal(cu.cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	assert_int_equal(cu.cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	CU_OK(cu.cuMemFree(d2));
	CU_OK(cu.cuStreamDestroy(s));
	CU_OK(cu.cuMemFree(d));
}

static void *end_capture_thread(void *arg)
{
	CUgraph g;

	return (void *)(intptr_t)cu.cuStreamEndCapture((CUstream)arg, &g);
}

static void test_end_capture_wrong_thread(void **state)
{
	pthread_t t;
	void *ret;
	CUstream s;
	CUgraph g;

	CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	assert_int_equal(pthread_create(&t, NULL, end_capture_thread, s), 0);
	assert_int_equal(pthread_join(t, &ret), 0);
	assert_int_equal((CUresult)(intptr_t)ret, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
	CU_OK(cu.cuStreamEndCapture(s, &g));
	CU_OK(cu.cuGraphDestroy(g));
	/* RELAXED captures may be ended anywhere. */
	CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
	assert_int_equal(pthread_create(&t, NULL, end_capture_thread, s), 0);
	assert_int_equal(pthread_join(t, &ret), 0);
	assert_int_equal((CUresult)(intptr_t)ret, CUDA_SUCCESS);
	CU_OK(cu.cuStreamDestroy(s));
}

static void test_legacy_stream_during_blocking_capture(void **state)
{
	CUstreamCaptureStatus st;
	CUdeviceptr d;
	CUstream s;
	CUgraph g;
	uint32_t v = 5;

	CU_OK(cu.cuMemAlloc(&d, 4096));
	/* A blocking stream: the legacy stream depends on it. */
	CU_OK(cu.cuStreamCreate(&s, CU_STREAM_DEFAULT));
	CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
	/* Querying the legacy stream: IMPLICIT, capture kept. */
	assert_int_equal(cu.cuStreamIsCapturing(CU_STREAM_LEGACY, &st),
			 CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
	CU_OK(cu.cuStreamIsCapturing(s, &st));
	assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	/* A synchronous copy uses the legacy stream: IMPLICIT, capture invalidated. */
	assert_int_equal(cu.cuMemcpyHtoD(d, &v, sizeof(v)), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
	assert_int_equal(cu.cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	CU_OK(cu.cuStreamDestroy(s));
	/* A non-blocking stream's capture leaves the legacy stream usable. */
	CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
	CU_OK(cu.cuMemcpyHtoD(d, &v, sizeof(v)));
	CU_OK(cu.cuStreamEndCapture(s, &g));
	CU_OK(cu.cuGraphDestroy(g));
	CU_OK(cu.cuStreamDestroy(s));
	CU_OK(cu.cuMemFree(d));
}

static void test_legacy_ipc_refuses_vmm_memory(void **state)
{
	CUmemGenericAllocationHandle h;
	CUipcMemHandle ih;
	CUdeviceptr va;

	CU_OK(cu_vmm_create(0, 2 * MIB, true, &h));
	CU_OK(cu_vmm_map(h, 2 * MIB, 0, &va));
	/* cuIpcGetMemHandle: "dptr - Base pointer to previously allocated device memory"
	 * (cuMemAlloc); VMM memory is shared through cuMemExportToShareableHandle. */
	assert_int_not_equal(cu.cuIpcGetMemHandle(&ih, va), CUDA_SUCCESS);
	cu_vmm_unmap(va, 2 * MIB);
	CU_OK(cu.cuMemRelease(h));
}

/* A peer that imported the exporter's handle keeps that memory when the exporter maps other
 * memory at its own VA: mappings are of the handle's bytes, not of the exporter's VA. */
static void test_import_keeps_backing_after_exporter_remaps(void **state)
{
	const size_t size = 2 * MIB;
	CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle ha, hb, imported;
	CUdeviceptr va, peer;
	int fd;

	CU_OK(cu_vmm_create(0, size, true, &ha));
	CU_OK(cu_vmm_create(0, size, true, &hb));
	CU_OK(cu_vmm_map(ha, size, 0, &va));
	CU_OK(cu.cuMemsetD32(va, 0xaaaaaaaa, size / 4));
	CU_OK(cu.cuMemExportToShareableHandle(&fd, ha, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
					      0));
	CU_OK(cu.cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd,
						CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd);
	CU_OK(cu_vmm_map(imported, size, 0, &peer));
	/* The exporter swaps its backing. */
	CU_OK(cu.cuMemUnmap(va, size));
	CU_OK(cu.cuMemMap(va, size, 0, hb, 0));
	CU_OK(cu.cuMemSetAccess(va, size, &acc, 1));
	CU_OK(cu.cuMemsetD32(va, 0xbbbbbbbb, size / 4));
	assert_int_equal(read_u32(peer), 0xaaaaaaaa);
	assert_int_equal(read_u32(va), 0xbbbbbbbb);
	cu_vmm_unmap(peer, size);
	cu_vmm_unmap(va, size);
	CU_OK(cu.cuMemRelease(imported));
	CU_OK(cu.cuMemRelease(ha));
	CU_OK(cu.cuMemRelease(hb));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_capture_records_and_graph_replays, setup),
		cmocka_unit_test_setup(test_graph_replays_against_current_mapping, setup),
		cmocka_unit_test_setup(test_host_function_node, setup),
		cmocka_unit_test_setup(test_global_capture_prohibits_other_threads, setup),
		cmocka_unit_test_setup(test_thread_local_and_relaxed_modes, setup),
		cmocka_unit_test_setup(test_exchange_returns_previous_mode, setup),
		cmocka_unit_test_setup(test_own_thread_unsafe_calls, setup),
		cmocka_unit_test_setup(test_end_capture_wrong_thread, setup),
		cmocka_unit_test_setup(test_legacy_stream_during_blocking_capture, setup),
		cmocka_unit_test_setup(test_legacy_ipc_refuses_vmm_memory, setup),
		cmocka_unit_test_setup(test_import_keeps_backing_after_exporter_remaps, setup),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
