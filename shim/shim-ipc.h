/* SPDX-License-Identifier: MIT */
/* Legacy CUDA IPC of converted memory (shim-ipc.c). */
#pragma once

#include <cuda.h>

CUresult shim_ipc_get_mem_handle(CUipcMemHandle *handle, CUdeviceptr dptr);
CUresult shim_ipc_open_mem_handle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
CUresult shim_ipc_close_mem_handle(CUdeviceptr dptr);
void ipc_reset_after_fork(void);
