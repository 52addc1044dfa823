/* SPDX-License-Identifier: MIT */
/*
 * Stand-in for torch_memory_saver's C ABI (its preload library), as far as the shim looks at
 * it: the thread-local tag and "interesting region" setters that its Python side calls through
 * ctypes. Records what it was given, so a test can check the shim forwarded the calls.
 */
#include <stdbool.h>
#include <stdio.h>

#define TMS_API __attribute__((visibility("default")))

TMS_API void tms_set_current_tag(const char *tag);
TMS_API void tms_set_interesting_region(bool on);
TMS_API const char *tms_standin_last_tag(void);
TMS_API bool tms_standin_region(void);

static __thread char current_tag[64] = "default";
static __thread bool interesting;

void tms_set_current_tag(const char *tag)
{
	snprintf(current_tag, sizeof(current_tag), "%s", tag ? tag : "");
}

void tms_set_interesting_region(bool on)
{
	interesting = on;
}

const char *tms_standin_last_tag(void)
{
	return current_tag;
}

bool tms_standin_region(void)
{
	return interesting;
}
