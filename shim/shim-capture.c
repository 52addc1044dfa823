/* SPDX-License-Identifier: MIT */
/*
 * vLLM and SGLang capture CUDA graphs in the default GLOBAL mode (torch.cuda.graph's
 * capture_error_mode): while any thread captures so, every other thread in GLOBAL mode "is
 * prohibited from potentially unsafe API calls" (cuThreadExchangeStreamCaptureMode), and such
 * a call invalidates the capture: the engine fails at startup. PyTorch's NCCL watchdog had
 * exactly this bug with cudaEventQuery (pytorch PR #104487) and fixed it with thread-local
 * mode (#104555). The shim's threads never capture, and query only events recorded outside
 * any capture, so RELAXED is safe for them: it is never prohibited from those calls.
 */
#include <stdbool.h>

#include "shim-capture.h"
#include "shim-real.h"

static __thread bool thread_relaxed;

void capture_relax_thread(void)
{
	const struct real_extra *x;
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

	if (thread_relaxed)
		return;
	x = real_extra();
	if (x->cuThreadExchangeStreamCaptureMode &&
	    x->cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS)
		thread_relaxed = true;
}

CUstreamCaptureMode capture_relax_begin(void)
{
	const struct real_extra *x = real_extra();
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

	if (!x->cuThreadExchangeStreamCaptureMode ||
	    x->cuThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS)
		return CU_STREAM_CAPTURE_MODE_RELAXED; /* nothing to restore */
	return m;
}

void capture_relax_end(CUstreamCaptureMode previous)
{
	const struct real_extra *x = real_extra();

	if (previous != CU_STREAM_CAPTURE_MODE_RELAXED && x->cuThreadExchangeStreamCaptureMode)
		(void)x->cuThreadExchangeStreamCaptureMode(&previous);
}
