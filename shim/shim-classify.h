/* SPDX-License-Identifier: MIT */
/* Which class a new region gets (shim-classify.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

/* The class a region created now, by code at caller, of size bytes, gets. */
enum region_class classify_region(const void *caller, uint64_t size);
void classify_note_mem_get_info(void);
void classify_note_tracked_free(void);
bool classify_load_done(void);
void classify_reset_after_fork(void);
/* torch_memory_saver: dlsym of its setters returns these, which record and forward. */
void *tms_hook_for(const char *name, void *real);
