/* SPDX-License-Identifier: MIT */
/*
 * Shared by the envtrace tests: a real cgroup v2 directory, the loaded tracer watching it, a
 * dirty set and a side-effect log fed from its records, and children run inside the cgroup.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "supervisor-dirty.h"
#include "supervisor-envtrace.h"
#include "supervisor-sidelog.h"

struct fixture {
	struct sv_envtrace *et;
	bool own_et; /* else the executable's shared tracer */
	bool watching;
	uint32_t env_id;
	struct sv_dirty *dirty;
	struct sv_sidelog *log;
	char cgroup[256];
	char pin_dir[256];
	char log_path[256];
	char *tmp; /* a scratch directory for the test */
	/* Seen in the records since the last fixture_run. */
	size_t records, exits_seen;
	pid_t waiting_for;
	bool exited;
	size_t foreign_records; /* records of pids the test did not run in the cgroup */
	pid_t outsider;
};

/* The cgroup v2 mount point (the unified hierarchy: /sys/fs/cgroup or its "unified" dir in a
 * hybrid layout), or NULL. */
const char *fixture_cgroup2_root(void);

/* cmocka group setup/teardown: load (and finally destroy) the tracer the tests share. */
int fixture_group_setup(void **state);
int fixture_group_teardown(void **state);

/* ringbuf_bytes 0: the shared tracer (default size); else a tracer of the test's own. Returns 0, or a reason in *why for TEST_REQUIRE. */
int fixture_setup(struct fixture *fx, size_t ringbuf_bytes, const char **why);
void fixture_teardown(struct fixture *fx);

/* Runs fn(arg) in a child that first moves itself into cgroup (NULL: fx->cgroup; (char *)-1:
 * stays where the test runs, outside any watched cgroup); waits for
 * its exit and for the tracer's record of that exit (bounded), consuming records all along
 * when consume is set. Returns the child's exit status (0 expected). */
int fixture_run(struct fixture *fx, const char *cgroup, int (*fn)(void *), void *arg, bool consume);
/* Consumes everything waiting. */
void fixture_drain(struct fixture *fx);
