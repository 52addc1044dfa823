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

/*
 * Positive classification for the whole process from now on: only regions created under a
 * "weights" or "kv" tag are weights or KV, every other one is "other" (real memory in a
 * shadow, never swapped at promotion), whatever the shim's phase heuristic would say. The
 * first successful belayer_set_tag() does the same; call this first when untagged buffers
 * (index tables, step buffers) are allocated before the first tagged one. Cannot be undone.
 */
void belayer_tags_only(void);
