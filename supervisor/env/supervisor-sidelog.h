/* SPDX-License-Identifier: MIT */
/*
 * An environment's append-only side-effect log (DESIGN §2): what its processes ran (argv),
 * which files they changed, by which pid. One msgpack map per record, each written with one
 * write() to an O_APPEND file, so a reader never sees half a record from a live writer
 * except at the end, which it stops at.
 *
 * Record keys: "t" (kind: "exec", "file", "full_diff", "fork", "exit"), "ts" (ns, monotonic),
 * "pid", "env"; exec: "exe", "argv" (array of strings); file: "op", "path", and "path2" for
 * rename/link; full_diff: "reason"; fork: "child"; exit: "code".
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "supervisor-envtrace.h"

#define SIDELOG_ARGV_MAX 256 /* arguments kept per exec record when reading */

struct sv_sidelog;

int sidelog_open(const char *path, struct sv_sidelog **ret);
void sidelog_close(struct sv_sidelog *l);
int sidelog_append(struct sv_sidelog *l, const struct envtrace_record *rec);

struct sidelog_entry {
	char kind[16];
	uint64_t ts_ns;
	int64_t pid;
	uint32_t env_id;
	const char *op;		  /* file */
	const char *path, *path2; /* file */
	const char *reason;	  /* full_diff */
	const char *exe;	  /* exec */
	const char *argv[SIDELOG_ARGV_MAX];
	size_t argc;
	int64_t child, code;
};

typedef int (*sidelog_entry_cb)(const struct sidelog_entry *e, void *userdata);

/* Reads every complete record from the file at path, in order. Malformed records end the
 * read with -EBADMSG; a record cut at the end of a live file is not reported. */
int sidelog_read(const char *path, sidelog_entry_cb cb, void *userdata);
