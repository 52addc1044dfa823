/* SPDX-License-Identifier: MIT */
/* The shim's driver calls beside an engine's CUDA-graph capture (shim-capture.c). */
#pragma once

#include <cuda.h>

/* Puts the calling shim thread (poller, connection, IPC server) in RELAXED capture mode, once
 * per thread. */
void capture_relax_thread(void);
/* Around the shim's own calls on an engine thread: RELAXED, then back to what it was. */
CUstreamCaptureMode capture_relax_begin(void);
void capture_relax_end(CUstreamCaptureMode previous);
