/* SPDX-License-Identifier: MIT */
/*
 * The public API of libbelayer.so, for programs that want to classify their own GPU
 * allocations instead of leaving it to the shim's heuristics. Resolve these with
 * dlsym(RTLD_DEFAULT, ...) so the program still runs without the shim.
 */
#pragma once

/*
 * Until belayer_clear_tag(), regions this thread creates are classed by tag: "weights", "kv"
 * (also "kv_cache"), "nccl" or "other". Returns 0, or -EINVAL for NULL or an unknown tag
 * (the previous tag stays in force).
 */
int belayer_set_tag(const char *tag);
void belayer_clear_tag(void);
