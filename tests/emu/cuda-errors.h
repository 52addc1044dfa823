/* SPDX-License-Identifier: MIT */
#pragma once

/* "CUDA_ERROR_OUT_OF_MEMORY" for 2; NULL for a value cuda.h does not define. */
const char *emu_cuda_error_name(int value);
/* Parses a CUresult name or number; 0 or -1. */
int emu_cuda_error_parse(const char *s, int *ret);
