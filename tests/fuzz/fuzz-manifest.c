/* SPDX-License-Identifier: MIT */
/*
 * env_manifest_decode() (a checkpoint's manifest, supervisor-env-manifest.h) on arbitrary
 * bytes: it never crashes, never leaks, and whatever it accepts re-encodes and decodes again
 * to the same entries, xattrs byte for byte (the restore trusts nothing else about a manifest).
 * env_manifest_decode_header() (a chain's ancestors, their index skipped in the raw bytes) on
 * the same bytes: never crashes, and accepts whatever the full decoder accepts, with the same
 * header.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor-env-manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct env_manifest m, again, hdr;
	char *buf;
	size_t len;
	int h = env_manifest_decode_header(data, size, &hdr);

	if (h >= 0)
		env_manifest_finish(&hdr);
	if (env_manifest_decode(data, size, &m) < 0)
		return 0;
	if (h < 0 || strcmp(hdr.id, m.id) != 0 || strcmp(hdr.parent, m.parent) != 0 ||
	    memcmp(hdr.uuid, m.uuid, sizeof(m.uuid)) != 0 || hdr.n_entries != 0)
		abort();
	if (env_manifest_encode(&m, &buf, &len) < 0)
		abort();
	if (env_manifest_decode(buf, len, &again) < 0 || again.n_entries != m.n_entries ||
	    strcmp(again.id, m.id) != 0)
		abort();
	for (size_t i = 0; i < m.n_entries; i++) {
		const struct env_entry *a = &again.entries[i], *e = &m.entries[i];

		if (strcmp(a->path, e->path) != 0 || a->kind != e->kind ||
		    a->n_xattrs != e->n_xattrs)
			abort();
		for (uint32_t k = 0; k < e->n_xattrs; k++)
			if (strcmp(a->xattrs[k].name, e->xattrs[k].name) != 0 ||
			    a->xattrs[k].len != e->xattrs[k].len ||
			    memcmp(a->xattrs[k].value, e->xattrs[k].value, e->xattrs[k].len) != 0)
				abort();
	}
	free(buf);
	env_manifest_finish(&again);
	env_manifest_finish(&m);
	return 0;
}
