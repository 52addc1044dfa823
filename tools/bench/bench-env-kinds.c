/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench env-scaling's checkpoint kinds (issue 23 item 3): in one environment of the
 * smallest size, with the tracer watching it (its activity counter decides the kind), what a
 * turn costs when a process ran ("full": FS delta and CRIU dump), when only a file was
 * written from outside, as `env write` does ("fs-only": FS delta, the last dump's images
 * hard-linked), and when nothing changed ("skipped": the decision alone, unfrozen: the
 * activity counter and the tasks; the daemon adds a look at its dirty set, a hash table's
 * size). Medians of reps.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench-env-kinds.h"
#include "bench-measure.h"
#include "log.h"
#include "supervisor-envtrace.h"
#include "util.h"

#define KINDS_WATCH BENCH_KINDS_WATCH

int bench_kinds_activity(void *userdata, uint32_t *ret_watch, uint64_t *ret_count)
{
	struct sv_envtrace *const *et = userdata;
	struct envtrace_env_stats st;
	int r = envtrace_env_stats(*et, KINDS_WATCH, &st);

	*ret_watch = KINDS_WATCH;
	if (r < 0)
		return r;
	*ret_count = st.activity;
	return 0;
}

int bench_kinds_checkpoint(struct sv_env *e, const char *trajectory, unsigned turn,
			   struct sv_envtrace **t, struct kinds_row *row, char *ret_id, size_t cap)
{
	struct env_ckpt_params cp = {.trajectory = trajectory,
				     .turn = turn,
				     .activity = t && *t ? bench_kinds_activity : NULL,
				     .userdata = t};
	struct env_manifest m;
	uint64_t t0 = bench_now_ns() / 1000;
	int r = env_checkpoint(e, &cp, &m);

	if (r < 0)
		return log_error_errno(r, "Checkpoint of %s failed: %m (%s)", e->id, e->error);
	*row = (struct kinds_row){
		.freeze_us = m.freeze_us,
		.fs_us = m.fs_us,
		.dump_us = m.dump_us,
		.commit_us = m.commit_us,
		.total_us = bench_now_ns() / 1000 - t0,
		.criu_bytes = m.criu_bytes,
		.fs_bytes = m.fs_bytes,
	};
	snprintf(row->kind, sizeof(row->kind), "%s", m.kind);
	if (ret_id)
		snprintf(ret_id, cap, "%s", m.id);
	env_manifest_finish(&m);
	return 0;
}

int bench_kinds_write(const struct sv_env *e, const char *name, unsigned salt)
{
	char path[PATH_MAX], text[32];
	_cleanup_close_ int fd = -1;
	int n = snprintf(text, sizeof(text), "%015u\n", salt);

	snprintf(path, sizeof(path), "%s/work/%s", e->root, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, text, (size_t)n) != n)
		return -errno;
	return 0;
}

static void kinds_median(struct kinds_row *rows, unsigned reps, struct kinds_row *ret)
{
	uint64_t v[5][BENCH_KINDS_REPS_MAX];

	for (unsigned i = 0; i < reps; i++) {
		v[0][i] = rows[i].freeze_us;
		v[1][i] = rows[i].fs_us;
		v[2][i] = rows[i].dump_us;
		v[3][i] = rows[i].commit_us;
		v[4][i] = rows[i].total_us;
	}
	*ret = rows[0];
	/* every rep's kind must be the same: the first different one is the row's */
	for (unsigned i = 1; i < reps; i++)
		if (strcmp(rows[i].kind, rows[0].kind) != 0)
			snprintf(ret->kind, sizeof(ret->kind), "%s", rows[i].kind);
	ret->freeze_us = bench_median_u64(v[0], reps);
	ret->fs_us = bench_median_u64(v[1], reps);
	ret->dump_us = bench_median_u64(v[2], reps);
	ret->commit_us = bench_median_u64(v[3], reps);
	ret->total_us = bench_median_u64(v[4], reps);
}

int bench_env_kinds(const struct env_params *base_p, unsigned files, unsigned reps,
		    int (*run)(const struct sv_env *e, const char *action),
		    int (*fill)(const struct sv_env *e, const char *dir, unsigned n),
		    struct bench_kinds *ret)
{
	struct kinds_row full[BENCH_KINDS_REPS_MAX], fs[BENCH_KINDS_REPS_MAX],
		skip[BENCH_KINDS_REPS_MAX];
	struct envtrace_options o = {0};
	struct sv_envtrace *t = NULL;
	struct env_params p = *base_p;
	struct sv_env *e = NULL;
	unsigned turn = 1;
	int r;

	if (reps > BENCH_KINDS_REPS_MAX)
		reps = BENCH_KINDS_REPS_MAX;
	*ret = (struct bench_kinds){.files = files};
	r = envtrace_create(&o, &t);
	if (r < 0)
		return log_error_errno(r, "No tracer for the checkpoint kinds: %m");
	p.id = "kinds";
	r = env_create(&p, &e);
	if (r < 0) {
		log_error_errno(r, "Failed to create the environment: %m");
		goto out;
	}
	r = envtrace_watch_add(t, e->cgroup, e->root, KINDS_WATCH);
	if (r >= 0)
		r = fill(e, "tree", files);
	for (unsigned i = 0; r >= 0 && i < reps; i++) {
		struct kinds_row row = {0};
		uint64_t t0;
		bool same;

		/* a process ran (and wrote a file): full */
		r = run(e, "echo ran >/work/ran.txt");
		if (r >= 0)
			r = bench_kinds_checkpoint(e, "kinds", turn++, &t, &full[i], NULL, 0);
		/* a file written from outside, nothing ran: fs-only */
		if (r >= 0)
			r = bench_kinds_write(e, "kinds.txt", i);
		if (r >= 0)
			r = bench_kinds_checkpoint(e, "kinds", turn++, &t, &fs[i], NULL, 0);
		if (r < 0)
			break;
		/* nothing: the decision alone */
		t0 = bench_now_ns() / 1000;
		same = env_activity_idle_since_dump(e, bench_kinds_activity, &t);
		row.total_us = bench_now_ns() / 1000 - t0;
		snprintf(row.kind, sizeof(row.kind), "%s", same ? ENV_KIND_SKIPPED : "changed");
		skip[i] = row;
	}
	if (r >= 0) {
		kinds_median(full, reps, &ret->full);
		kinds_median(fs, reps, &ret->fs_only);
		kinds_median(skip, reps, &ret->unchanged);
	}
out:
	if (e)
		env_destroy(e);
	envtrace_destroy(t);
	return r;
}
