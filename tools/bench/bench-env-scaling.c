/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench env-scaling: what an environment checkpoint and restore cost as its upper
 * layer grows (issue 23 item 5). For 1,000, 10,000 and 100,000 files in the upper layer, one
 * 16-byte file is changed between two checkpoints (medians of 3): the frozen time, its FS
 * phase, the CRIU dump, the commit; then the file is changed again and the environment
 * restored to that checkpoint: the restore's time and its rollback phase. Last, a turn that
 * adds 100,000 files to the smallest environment.
 *
 * Each row names the path that computed the delta: "walk" (the whole upper layer) and
 * "dirty-set" (issue 23 item 1), side by side in one run, on the same environment. The
 * environments are driven through the library (supervisor-env.h) as env-recovery drives them;
 * the dirty-set rows are given the paths the tracer records for the bench's own changes (a
 * rewrite: the file, its directory for itself; the added tree: its root with its subtree),
 * through the checkpoint's frozen callback (the daemon's comes from the tracer, tested by
 * env-daemon). The files are written inside the environment by one python3 process (the
 * host's /usr).
 *
 * Then the memory rows (bench-env-mem.c): 10 MiB, 100 MiB and 1 GiB held by the environment's
 * process; a turn where it dirtied its memory (full), one where it did not run (fs-only), and
 * the same idle turn the old way (every checkpoint full), each restored.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "bench-env-kinds.h"
#include "bench-env-mem.h"
#include "bench-measure.h"
#include "bench-path.h"
#include "bench.h"
#include "envckpt-fixture.h"
#include "log.h"
#include "supervisor-criu.h"
#include "supervisor-env-fs.h"
#include "supervisor-env.h"
#include "util.h"

#define CGROUP_V2 "/sys/fs/cgroup/unified"
#define REPS_MAX  3

struct scaling_row {
	unsigned files;			   /* in the upper layer */
	char path[ENV_DELTA_PATH_MAX + 1]; /* how the delta was computed: the manifest's */
	uint64_t freeze_us, fs_us, dump_us, commit_us, restore_us, rollback_us;
	uint64_t fs_files, fs_bytes;
	/* the pre-copy's row (issue 23 item 2): the time before the freeze (the copy, the
	 * environment running), from its first round to the freeze */
	uint64_t precopy_us;
	/* the manifest's (issue 23 item 2): rounds, bytes copied before the freeze and frozen */
	uint64_t precopy_rounds, precopy_bytes, precopy_frozen_bytes;
};

/* Runs sh -c action inside the environment (its cgroup and every namespace). */
static int scaling_run(const struct sv_env *e, const char *action)
{
	char cmd[4096], procs[PATH_MAX + 16], join[2048];
	int r;

	r = bench_cgroup_file(procs, sizeof(procs), e->cgroup, "cgroup.procs");
	if (r >= 0)
		r = fixture_join_prefix(e->pid, join, sizeof(join));
	if (r < 0 || !strstr(join, procs))
		return log_error_errno(r < 0 ? r : -ESRCH, "%s: no cgroup to run in: %m", e->id);
	snprintf(cmd, sizeof(cmd), "%sexec nsenter -t %d -a -r -w sh -ec \"%s\" </dev/null >&2",
		 join, (int)e->pid, action);
	return system(cmd) == 0 ? 0 : -EIO;
}

/* n files of 16 bytes under /work/<dir>, 1,000 a directory. */
static int scaling_fill(const struct sv_env *e, const char *dir, unsigned n)
{
	char action[1024];

	snprintf(action, sizeof(action),
		 "python3 -c '\n"
		 "import os\n"
		 "for i in range(%u):\n"
		 "    d = \\\"/work/%s/d%%03d\\\" %% (i // 1000)\n"
		 "    if i %% 1000 == 0: os.makedirs(d, exist_ok=True)\n"
		 "    with open(\\\"%%s/f%%06d\\\" %% (d, i), \\\"w\\\") as f: "
		 "f.write(\\\"%%015d\\\\n\\\" "
		 "%% i)\n"
		 "'",
		 n, dir);
	return scaling_run(e, action);
}

/* A 16-byte rewrite of one file of the layer. */
static int scaling_touch(const struct sv_env *e, unsigned salt)
{
	char action[256];

	snprintf(action, sizeof(action), "printf '%%015u\\\\n' %u >/work/tree/d000/f000000", salt);
	return scaling_run(e, action);
}

/* The tracer's view of the bench's change (NULL: no tracer, the walk). */
struct scaling_dirty {
	struct env_fs_dirty items[2];
	size_t n;
};

/* The pre-copy's span: from its round 0 to the freeze (the frozen callback). */
static uint64_t precopy_start_us, frozen_at_us;

static int scaling_frozen(void *userdata, const struct env_fs_dirty **ret, size_t *ret_n,
			  const char **ret_why)
{
	struct scaling_dirty *d = userdata;

	frozen_at_us = bench_now_ns() / 1000;
	(void)ret_why;
	*ret = d->items;
	*ret_n = d->n;
	return 0;
}

static const struct scaling_dirty touched = {
	.items = {{.path = "/work/tree/d000/f000000", .subtree = true},
		  {.path = "/work/tree/d000", .subtree = false}},
	.n = 2,
};

/* The pre-copy's tracer: round 0 the turn's set; nothing dirtied since (the environment's
 * process sleeps), so no further round and nothing copied again frozen but /tmp. */
static int scaling_precopy(void *userdata, unsigned round, const struct env_fs_dirty **ret,
			   size_t *ret_n, const char **ret_why)
{
	const struct scaling_dirty *d = userdata;

	(void)ret_why;
	if (round == 0)
		precopy_start_us = bench_now_ns() / 1000;
	*ret = d->items;
	*ret_n = round == 0 ? d->n : 0;
	return 0;
}

static void scaling_late(void *userdata, const struct env_fs_dirty **ret, size_t *ret_n)
{
	const struct scaling_dirty *d = userdata;

	*ret = d->items;
	*ret_n = 0;
}

static int scaling_checkpoint_as(struct sv_env *e, unsigned turn, const struct scaling_dirty *d,
				 bool precopy, struct scaling_row *row, char *ret_id, size_t cap)
{
	struct env_ckpt_params cp = {.trajectory = "scaling",
				     .turn = turn,
				     .frozen = d ? scaling_frozen : NULL,
				     .precopy = d && precopy ? scaling_precopy : NULL,
				     .late = d && precopy ? scaling_late : NULL,
				     .userdata = (void *)d};
	struct env_manifest m;
	int r;

	precopy_start_us = frozen_at_us = 0;
	r = env_checkpoint(e, &cp, &m);
	if (r < 0)
		return log_error_errno(r, "Checkpoint of %s failed: %m (%s)", e->id, e->error);
	*row = (struct scaling_row){
		.files = row->files,
		.freeze_us = m.freeze_us,
		.fs_us = m.fs_us,
		.dump_us = m.dump_us,
		.commit_us = m.commit_us,
		.fs_files = m.fs_files,
		.fs_bytes = m.fs_bytes,
		.precopy_us = precopy && precopy_start_us && frozen_at_us > precopy_start_us
				      ? frozen_at_us - precopy_start_us
				      : 0,
		.precopy_rounds = m.precopy_rounds,
		.precopy_bytes = m.precopy_bytes,
		.precopy_frozen_bytes = m.precopy_frozen_bytes,
	};
	/* the manifest says whether the delta was pre-copied */
	snprintf(row->path, sizeof(row->path), "%s", m.precopy_rounds ? "pre-copy" : m.delta_path);
	if (ret_id)
		snprintf(ret_id, cap, "%s", m.id);
	env_manifest_finish(&m);
	return 0;
}

static int scaling_checkpoint(struct sv_env *e, unsigned turn, const struct scaling_dirty *d,
			      struct scaling_row *row, char *ret_id, size_t cap)
{
	return scaling_checkpoint_as(e, turn, d, false, row, ret_id, cap);
}

/* reps of (touch, checkpoint, touch, restore) by the walk (d NULL) or the dirty set, medians
 * in ret. */
static int scaling_reps(struct sv_env *e, unsigned n, unsigned reps, unsigned *turn,
			const struct scaling_dirty *d, struct scaling_row *ret)
{
	uint64_t v[7][REPS_MAX];
	struct scaling_row rows[REPS_MAX] = {0};
	char id[ENV_ID_MAX + 1];
	int r = 0;

	for (unsigned i = 0; r >= 0 && i < reps; i++) {
		struct env_manifest m;
		uint64_t t0;

		rows[i].files = n;
		r = scaling_touch(e, 2 * i + 1);
		if (r >= 0)
			r = scaling_checkpoint(e, (*turn)++, d, &rows[i], id, sizeof(id));
		if (r >= 0)
			r = scaling_touch(e, 2 * i + 2);
		if (r < 0)
			break;
		/* Each restore starts with the disks' writeback drained, outside the timed part: an
		 * overlay's unmount syncs its upper file system, and would otherwise pay for
		 * what the previous rows wrote (100,000 files rolled back by the walk). */
		sync();
		t0 = bench_now_ns() / 1000;
		/* the dirty set's rows: rolled back by the path changed since (the same) */
		r = env_restore_traced(e, id,
				       d ? &(struct env_restore_params){.killed = scaling_frozen,
									.userdata = (void *)d}
					 : NULL,
				       &m);
		if (r < 0) {
			log_error_errno(r, "Restore of %s failed: %m (%s)", e->id, e->error);
			break;
		}
		rows[i].restore_us = bench_now_ns() / 1000 - t0;
		rows[i].rollback_us = e->rollback_us;
		env_manifest_finish(&m);
	}
	if (r >= 0) {
		*ret = rows[0];
		for (unsigned i = 0; i < reps; i++) {
			v[0][i] = rows[i].freeze_us;
			v[1][i] = rows[i].fs_us;
			v[2][i] = rows[i].dump_us;
			v[3][i] = rows[i].commit_us;
			v[4][i] = rows[i].restore_us;
			v[5][i] = rows[i].rollback_us;
			v[6][i] = rows[i].fs_files;
		}
		ret->freeze_us = bench_median_u64(v[0], reps);
		ret->fs_us = bench_median_u64(v[1], reps);
		ret->dump_us = bench_median_u64(v[2], reps);
		ret->commit_us = bench_median_u64(v[3], reps);
		ret->restore_us = bench_median_u64(v[4], reps);
		ret->rollback_us = bench_median_u64(v[5], reps);
		ret->fs_files = bench_median_u64(v[6], reps);
	}
	return r;
}

/* One environment of n files: the walk's rows in ret[0], the dirty set's in ret[1]; add > 0:
 * then a turn that adds that many files, for each path (ret_add[0] the walk, ret_add[1] the
 * dirty set copied frozen, ret_add[2] the dirty set pre-copied). */
static int scaling_size(const struct env_params *base_p, unsigned n, unsigned reps, unsigned add,
			struct scaling_row ret[2], struct scaling_row ret_add[3])
{
	static const struct scaling_dirty added = {
		.items = {{.path = "/work/added1", .subtree = true},
			  {.path = "/work", .subtree = false}},
		.n = 2,
	};
	static const struct scaling_dirty added2 = {
		.items = {{.path = "/work/added2", .subtree = true},
			  {.path = "/work", .subtree = false}},
		.n = 2,
	};
	struct env_params p = *base_p;
	struct scaling_row first;
	struct sv_env *e = NULL;
	char name[32];
	unsigned turn = 1;
	int r;

	snprintf(name, sizeof(name), "scale%u", n);
	p.id = name;
	r = env_create(&p, &e);
	if (r < 0)
		return log_error_errno(r, "Failed to create the environment: %m");
	r = scaling_fill(e, "tree", n);
	if (r >= 0)
		r = scaling_checkpoint(e, turn++, NULL, &first, NULL, 0);
	if (r >= 0)
		r = scaling_reps(e, n, reps, &turn, NULL, &ret[0]);
	if (r >= 0)
		r = scaling_reps(e, n, reps, &turn, &touched, &ret[1]);
	if (r >= 0 && add) {
		r = scaling_fill(e, "added0", add);
		if (r >= 0)
			r = scaling_checkpoint(e, turn++, NULL, &ret_add[0], NULL, 0);
		if (r >= 0)
			r = scaling_fill(e, "added1", add);
		if (r >= 0)
			r = scaling_checkpoint(e, turn++, &added, &ret_add[1], NULL, 0);
		if (r >= 0)
			r = scaling_fill(e, "added2", add);
		if (r >= 0)
			r = scaling_checkpoint_as(e, turn++, &added2, true, &ret_add[2], NULL, 0);
		ret_add[0].files = ret_add[1].files = ret_add[2].files = add;
	}
	env_destroy(e);
	return r;
}

static void scaling_json_row(json_object *arr, const struct scaling_row *w)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "files", json_object_new_int64(w->files));
	json_object_object_add(o, "path", json_object_new_string(w->path));
	json_object_object_add(o, "frozen_us", json_object_new_int64((int64_t)w->freeze_us));
	json_object_object_add(o, "fs_us", json_object_new_int64((int64_t)w->fs_us));
	json_object_object_add(o, "dump_us", json_object_new_int64((int64_t)w->dump_us));
	json_object_object_add(o, "commit_us", json_object_new_int64((int64_t)w->commit_us));
	json_object_object_add(o, "fs_files", json_object_new_int64((int64_t)w->fs_files));
	json_object_object_add(o, "fs_bytes", json_object_new_int64((int64_t)w->fs_bytes));
	if (w->precopy_us)
		json_object_object_add(o, "precopy_us",
				       json_object_new_int64((int64_t)w->precopy_us));
	if (w->precopy_rounds) {
		json_object_object_add(o, "precopy_rounds",
				       json_object_new_int64((int64_t)w->precopy_rounds));
		json_object_object_add(o, "precopy_bytes",
				       json_object_new_int64((int64_t)w->precopy_bytes));
		json_object_object_add(o, "precopy_frozen_bytes",
				       json_object_new_int64((int64_t)w->precopy_frozen_bytes));
	}
	if (w->restore_us) {
		json_object_object_add(o, "restore_us",
				       json_object_new_int64((int64_t)w->restore_us));
		json_object_object_add(o, "rollback_us",
				       json_object_new_int64((int64_t)w->rollback_us));
	}
	json_object_array_add(arr, o);
}

static void scaling_print_row(const char *what, const struct scaling_row *w)
{
	printf("%-14s %-9s %9.1f %9.1f %9.1f %9.1f %8" PRIu64 " %10.1f %10.1f\n", what, w->path,
	       w->freeze_us / 1e3, w->fs_us / 1e3, w->dump_us / 1e3, w->commit_us / 1e3,
	       w->fs_files, w->restore_us / 1e3, w->rollback_us / 1e3);
}

static void kinds_json(json_object *o, const char *name, const struct kinds_row *k)
{
	json_object *r = json_object_new_object();

	json_object_object_add(r, "kind", json_object_new_string(k->kind));
	json_object_object_add(r, "frozen_us", json_object_new_int64((int64_t)k->freeze_us));
	json_object_object_add(r, "fs_us", json_object_new_int64((int64_t)k->fs_us));
	json_object_object_add(r, "dump_us", json_object_new_int64((int64_t)k->dump_us));
	json_object_object_add(r, "commit_us", json_object_new_int64((int64_t)k->commit_us));
	json_object_object_add(r, "total_us", json_object_new_int64((int64_t)k->total_us));
	json_object_object_add(r, "criu_bytes", json_object_new_int64((int64_t)k->criu_bytes));
	json_object_object_add(o, name, r);
}

static void mem_json(json_object *arr, unsigned mb, const char *turn, const char *how,
		     const struct mem_row *w)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "mb", json_object_new_int64(mb));
	json_object_object_add(o, "turn", json_object_new_string(turn));
	json_object_object_add(o, "path", json_object_new_string(how));
	json_object_object_add(o, "kind", json_object_new_string(w->ck.kind));
	json_object_object_add(o, "frozen_us", json_object_new_int64((int64_t)w->ck.freeze_us));
	json_object_object_add(o, "fs_us", json_object_new_int64((int64_t)w->ck.fs_us));
	json_object_object_add(o, "dump_us", json_object_new_int64((int64_t)w->ck.dump_us));
	json_object_object_add(o, "commit_us", json_object_new_int64((int64_t)w->ck.commit_us));
	json_object_object_add(o, "criu_bytes", json_object_new_int64((int64_t)w->ck.criu_bytes));
	json_object_object_add(o, "fs_bytes", json_object_new_int64((int64_t)w->ck.fs_bytes));
	json_object_object_add(o, "restore_us", json_object_new_int64((int64_t)w->restore_us));
	json_object_array_add(arr, o);
}

static void mem_print(unsigned mb, const char *turn, const struct mem_row *w)
{
	printf("%5u MiB  %-10s %-8s %9.1f %7.1f %9.1f %8.1f %10.1f %9.1f\n", mb, turn, w->ck.kind,
	       w->ck.freeze_us / 1e3, w->ck.fs_us / 1e3, w->ck.dump_us / 1e3, w->ck.commit_us / 1e3,
	       (double)(w->ck.criu_bytes + w->ck.fs_bytes) / (1 << 20), w->restore_us / 1e3);
}

static void kinds_print(const char *what, const struct kinds_row *k)
{
	printf("%-26s %-8s %9.1f %9.1f %9.1f %9.1f %9.1f\n", what, k->kind, k->freeze_us / 1e3,
	       k->fs_us / 1e3, k->dump_us / 1e3, k->commit_us / 1e3, k->total_us / 1e3);
}

/* The files rows (one changed file, the added files) as text. */
static void files_print(const struct scaling_row (*rows)[2], size_t n_sizes,
			const struct scaling_row added[3], unsigned reps)
{
	printf("env-scaling: one 16-byte file changed between two checkpoints (median of "
	       "%u); ms\n",
	       reps);
	printf("%-14s %-9s %9s %9s %9s %9s %8s %10s %10s\n", "upper files", "path", "frozen", "fs",
	       "dump", "commit", "copied", "restore", "rollback");
	for (size_t i = 0; i < n_sizes; i++)
		for (size_t k = 0; k < 2; k++) {
			char what[32];

			snprintf(what, sizeof(what), "%u", rows[i][k].files);
			scaling_print_row(what, &rows[i][k]);
		}
	for (size_t k = 0; k < 3; k++) {
		char what[32];

		snprintf(what, sizeof(what), "+%u new", added[k].files);
		scaling_print_row(what, &added[k]);
	}
	printf("(pre-copy: %.1f ms copying before the freeze, the environment running; "
	       "the manifest: %" PRIu64 " round%s, %" PRIu64 " bytes before the freeze, "
	       "%" PRIu64 " frozen)\n",
	       added[2].precopy_us / 1e3, added[2].precopy_rounds,
	       added[2].precopy_rounds == 1 ? "" : "s", added[2].precopy_bytes,
	       added[2].precopy_frozen_bytes);
}

int bench_env_scaling(const struct bench_args *a, int argc, char **argv)
{
	static const struct option options[] = {
		{"quick", no_argument, NULL, 'q'},
		{"mem", required_argument, NULL, 'm'},
		{"help", no_argument, NULL, 'h'},
		{},
	};
	static const unsigned sizes_full[] = {1000, 10000, 100000}, sizes_quick[] = {100, 1000};
	static const unsigned mem_full[] = {10, 100, 1024}, mem_quick[] = {10};
	const unsigned *sizes = sizes_full, *mem_sizes = mem_full;
	unsigned mem_one = 0;
	size_t n_sizes = ARRAY_SIZE(sizes_full), n_mem = ARRAY_SIZE(mem_full);
	struct bench_mem mem[ARRAY_SIZE(mem_full)] = {0};
	unsigned reps = REPS_MAX, add = 100000;
	struct scaling_row rows[ARRAY_SIZE(sizes_full)][2] = {0}, added[3] = {0};
	struct bench_kinds kinds = {0};
	int rk;
	char dir[] = "/tmp/belayer-bench-scale.XXXXXX", base[PATH_MAX], state[PATH_MAX],
	     cg[PATH_MAX], cmd[PATH_MAX + 16];
	struct env_params p = {0};
	const char *criu = sv_criu_binary(NULL);
	int c, r = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
		switch (c) {
		case 'q':
			sizes = sizes_quick;
			n_sizes = ARRAY_SIZE(sizes_quick);
			mem_sizes = mem_quick;
			n_mem = ARRAY_SIZE(mem_quick);
			reps = 1;
			add = 1000;
			break;
		case 'm': {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);

			if (*end || v < 1 || v > 65536) {
				fprintf(stderr, "--mem: 1..65536 (MiB)\n");
				return 2;
			}
			mem_one = (unsigned)v;
			break;
		}
		case 'h':
			printf("belayer-bench env-scaling [--quick] [--mem MIB]\n"
			       "  files in the upper layer 1k/10k/100k, one changed file between "
			       "two checkpoints (medians of 3), and a turn adding 100k files;\n"
			       "  memory 10 MiB/100 MiB/1 GiB held by the environment's process: "
			       "dirtied, idle, idle the old way (once each)\n"
			       "  --quick  CI size: 100 and 1,000 files, once; a turn adding "
			       "1,000; 10 MiB\n"
			       "  --mem MIB  the memory rows alone, at MIB only\n");
			return 0;
		default:
			return 2;
		}
	}
	if (geteuid() != 0 || !criu || sv_criu_version(criu) < 40000) {
		fprintf(stderr, "env-scaling needs root and CRIU >= 4 (BELAYER_CRIU).\n");
		return 77;
	}
	if (!mkdtemp(dir))
		return 1;
	snprintf(base, sizeof(base), "%s/base", dir);
	snprintf(state, sizeof(state), "%s/state", dir);
	snprintf(cg, sizeof(cg), CGROUP_V2 "/belayer-bench-%d", (int)getpid());
	r = sv_criu_config_init(state);
	if (r >= 0)
		r = fixture_make_base(base, BENCH_ENV_SERVER);
	if (r >= 0)
		r = bench_env_mem_prepare(base);
	if (r < 0) {
		log_error_errno(r, "Failed to make the base: %m");
		goto out;
	}
	p.base = base;
	p.cmd = "exec sleep infinity";
	p.state_dir = state;
	p.cgroup_parent = cg;
	p.criu = criu;
	p.keep = 4;
	if (mem_one) {
		mem_sizes = &mem_one;
		n_mem = 1;
		n_sizes = 0;
	}
	for (size_t i = 0; i < n_sizes && r >= 0; i++)
		r = scaling_size(&p, sizes[i], reps, i == 0 ? add : 0, rows[i], added);
	for (size_t i = 0; i < n_mem && r >= 0; i++)
		r = bench_env_mem(&p, mem_sizes[i], &mem[i]);
	if (r < 0)
		goto out;
	/* Checkpoint kinds (issue 23 item 3): they need the tracer; without it, not shown. */
	rk = n_sizes ? bench_env_kinds(&p, sizes[0], reps, scaling_run, scaling_fill, &kinds)
		     : -ENODATA;
	if (a->json) {
		json_object *j = json_object_new_object(), *arr = json_object_new_array(),
			    *adds = json_object_new_array();

		for (size_t i = 0; i < n_sizes; i++)
			for (size_t k = 0; k < 2; k++)
				scaling_json_row(arr, &rows[i][k]);
		for (size_t k = 0; n_sizes && k < 3; k++)
			scaling_json_row(adds, &added[k]);
		json_object_object_add(j, "reps", json_object_new_int((int)reps));
		json_object_object_add(j, "one_changed_file", arr);
		json_object_object_add(j, "added_files", adds);
		{
			json_object *ma = json_object_new_array();

			for (size_t i = 0; i < n_mem; i++) {
				mem_json(ma, mem[i].mb, "dirtied", "new", &mem[i].dirtied);
				mem_json(ma, mem[i].mb, "idle", "new", &mem[i].idle);
				mem_json(ma, mem[i].mb, "idle", "old", &mem[i].idle_old);
			}
			json_object_object_add(j, "memory", ma);
		}
		if (rk >= 0) {
			json_object *k = json_object_new_object();

			json_object_object_add(k, "files", json_object_new_int64(kinds.files));
			kinds_json(k, "process_ran", &kinds.full);
			kinds_json(k, "file_written", &kinds.fs_only);
			kinds_json(k, "unchanged", &kinds.unchanged);
			json_object_object_add(j, "kinds", k);
		}
		printf("%s\n", json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY));
		json_object_put(j);
	} else {
		if (n_sizes)
			files_print(rows, n_sizes, added, reps);
		printf("%senv-scaling: memory held by the environment's process (once each); ms, "
		       "MiB written\n",
		       n_sizes ? "\n" : "");
		printf("%9s  %-10s %-8s %9s %7s %9s %8s %10s %9s\n", "memory", "turn", "kind",
		       "frozen", "fs", "dump", "commit", "written", "restore");
		for (size_t i = 0; i < n_mem; i++) {
			mem_print(mem[i].mb, "dirtied", &mem[i].dirtied);
			mem_print(mem[i].mb, "idle", &mem[i].idle);
			mem_print(mem[i].mb, "idle, old", &mem[i].idle_old);
		}
		if (rk >= 0) {
			printf("\nenv-scaling: checkpoint kinds at %u files (median of %u); ms\n",
			       kinds.files, reps);
			printf("%-26s %-8s %9s %9s %9s %9s %9s\n", "turn", "kind", "frozen", "fs",
			       "dump", "commit", "total");
			kinds_print("a process ran", &kinds.full);
			kinds_print("a file written (env write)", &kinds.fs_only);
			kinds_print("unchanged", &kinds.unchanged);
		} else if (n_sizes) {
			printf("\nenv-scaling: checkpoint kinds not measured (no tracer)\n");
		}
	}
out:
	(void)rmdir(cg);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	(void)!system(cmd);
	return r < 0 ? 1 : 0;
}
