/* SPDX-License-Identifier: MIT */
/*
 * env_manifest_decode() (a checkpoint's manifest, supervisor-env-manifest.h) on arbitrary
 * bytes: it never crashes, never leaks, and whatever it accepts re-encodes and decodes again
 * to the same entries (the restore trusts nothing else about a manifest).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor-env-manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct env_manifest m, again;
	char *buf;
	size_t len;

	if (env_manifest_decode(data, size, &m) < 0)
		return 0;
	if (env_manifest_encode(&m, &buf, &len) < 0)
		abort();
	if (env_manifest_decode(buf, len, &again) < 0 || again.n_entries != m.n_entries ||
	    strcmp(again.id, m.id) != 0)
		abort();
	for (size_t i = 0; i < m.n_entries; i++)
		if (strcmp(again.entries[i].path, m.entries[i].path) != 0 ||
		    again.entries[i].kind != m.entries[i].kind)
			abort();
	free(buf);
	env_manifest_finish(&again);
	env_manifest_finish(&m);
	return 0;
}
