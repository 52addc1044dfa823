/* SPDX-License-Identifier: MIT */
/* Tracked memory the program shares with other processes (shim-share.c). */
#pragma once

#include <stdint.h>

/* Converted region id is being shared (legacy IPC): it leaves the layout as `other`, and in a
 * shadow gets real memory of its own first. Returns 0 or -errno (the region stays as it was). */
int share_converted(uint64_t id);
