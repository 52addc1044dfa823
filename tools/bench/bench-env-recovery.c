/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench env-recovery: recovering an agent environment after a failure, Belayer's full
 * restore vs rebuilding the environment and replaying the trajectory (issue 10 item 5).
 *
 * The environment (supervisor-env.h: own namespaces, cgroup v2, overlay root) holds a
 * generated git repository of NFILES C files (a few thousand) and runs a long-lived server
 * (its state in memory) on a TCP port on loopback (CRIU >= 4.2: 4.1.1 cannot dump inet
 * sockets on kernels >= 6.16). A trajectory of NTURNS actions runs in it: edits, builds
 * (make -j2), tests, git commits, installing a dependency from a local tarball into a local
 * prefix, links, chmod.
 * After every action the server's state is updated and a full checkpoint is taken (its cost
 * is reported: frozen time, CRIU dump, FS delta copy, bytes).
 *
 * Then, for failures at several turns F: Belayer restores the checkpoint of turn F; the
 * baseline kills the environment, rebuilds it from its base (empty upper layer, fresh launch,
 * server started again) and replays actions 1..F. Both are timed until the environment is
 * ready (the server answers). Belayer's result is checked against the failure-free run: tree
 * hash (contents and metadata) and the server answering with its pre-failure state; the
 * replay's tree is compared by contents only (its timestamps differ by nature), and its
 * server's request counter cannot match (it restarted).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "bench-measure.h"
#include "bench-path.h"
#include "bench.h"
#include "envckpt-fixture.h"
#include "log.h"
#include "supervisor-criu.h"
#include "supervisor-env-fs.h"
#include "supervisor-env.h"
#include "util.h"

#define NFILES	  3000
#define NBUILD	  60 /* modules the build compiles */
#define NTURNS	  20
#define CGROUP_V2 "/sys/fs/cgroup/unified"
#define WAIT_MS	  30000
#define GIT_ENV                                                                       \
	"export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=a@b GIT_COMMITTER_NAME=agent " \
	"GIT_COMMITTER_EMAIL=a@b GIT_AUTHOR_DATE='2026-01-01T00:00:00' "              \
	"GIT_COMMITTER_DATE='2026-01-01T00:00:00'; cd /work/repo; "

static const char *const actions[NTURNS] = {
	"git checkout -q -b agent",
	"sed -i 's/return x + 1;/return x + 100;/' src/mod0001.c",
	"make -s -j2",
	"./build/runtests >test.log",
	"tar xzf /work/deps/libdep-1.0.tar.gz -C /tmp && make -s -C /tmp/libdep-1.0 install "
	"PREFIX=/work/.local && rm -rf /tmp/libdep-1.0",
	"echo '/* uses libdep */' >>src/mod0002.c && make -s -j2",
	"./build/runtests >>test.log && cat test.log",
	"git add -A && git commit -q -m 'turn 8: fix mod0001'",
	"mkdir -p notes && seq 1 5000 >notes/numbers.txt",
	"git rm -q src/mod2999.c src/mod2998.c",
	"sed -i 's/return x + 10;/return x - 10;/' src/mod0010.c && make -s -j2",
	"./build/runtests >>test.log",
	"ln -s build/runtests run && ln src/mod0005.c hard.c",
	"chmod 600 src/mod0006.c && touch -d 2020-01-01 src/mod0007.c",
	"git add -A && git commit -q -m 'turn 15'",
	"rm -rf notes && echo done >status",
	"make -s clean && make -s -j2",
	"./run >>test.log",
	"git log --oneline >history.txt && git status --short >>history.txt",
	"tar czf /work/artifact.tgz build",
};

static const unsigned fail_turns[] = {5, 10, 15, 20};

struct turn_cost {
	uint64_t freeze_us, dump_us, fs_us, commit_us, bytes, criu_bytes, total_us;
};

static int write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "we");

	if (!f)
		return -errno;
	fputs(text, f);
	return fclose(f) == 0 ? 0 : -errno;
}

/* The base: a C project of NFILES modules in a git repository, a local dependency tarball. */
static int make_base(const char *base, const char *server)
{
	char path[PATH_MAX], cmd[4 * PATH_MAX], text[512];
	FILE *f;
	int r;

	r = fixture_make_base(base, server);
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "%s/work/repo/src", base);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s %s/work/repo/tests %s/work/deps/libdep-1.0", path,
		 base, base);
	if (system(cmd) != 0)
		return -EIO;
	for (int i = 0; i < NFILES; i++) {
		snprintf(path, sizeof(path), "%s/work/repo/src/mod%04d.c", base, i);
		snprintf(
			text, sizeof(text),
			"/* module %d */\nint mod%04d(int x);\nint mod%04d(int x)\n{\n\treturn x + "
			"%d;\n}\n",
			i, i, i, i % 50);
		r = write_text(path, text);
		if (r < 0)
			return r;
	}
	snprintf(path, sizeof(path), "%s/work/repo/tests/main.c", base);
	f = fopen(path, "we");
	if (!f)
		return -errno;
	for (int i = 0; i < NBUILD; i++)
		fprintf(f, "int mod%04d(int x);\n", i);
	fprintf(f, "#include <stdio.h>\nint main(void)\n{\n\tlong s = 0;\n");
	for (int i = 0; i < NBUILD; i++)
		fprintf(f, "\ts += mod%04d(%d);\n", i, i);
	fprintf(f, "\tprintf(\"tests ok %%ld\\n\", s);\n\treturn 0;\n}\n");
	fclose(f);
	snprintf(path, sizeof(path), "%s/work/repo/Makefile", base);
	f = fopen(path, "we");
	if (!f)
		return -errno;
	fprintf(f, "OBJS :=");
	for (int i = 0; i < NBUILD; i++)
		fprintf(f, " build/mod%04d.o", i);
	fprintf(f, "\nbuild/runtests: $(OBJS) build/main.o\n\tcc -o $@ $^\n"
		   "build/mod%%.o: src/mod%%.c | build\n\tcc -O1 -c -o $@ $<\n"
		   "build/main.o: tests/main.c | build\n\tcc -O1 -c -o $@ $<\n"
		   "build:\n\tmkdir -p build\n"
		   "clean:\n\trm -rf build\n");
	fclose(f);
	snprintf(path, sizeof(path), "%s/work/deps/libdep-1.0/dep.c", base);
	r = write_text(path, "int dep_answer(void) { return 42; }\n");
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "%s/work/deps/libdep-1.0/dep.h", base);
	r = write_text(path, "int dep_answer(void);\n");
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "%s/work/deps/libdep-1.0/Makefile", base);
	r = write_text(path, "install:\n\tcc -O1 -c dep.c -o dep.o\n\tar rcs libdep.a dep.o\n"
			     "\tmkdir -p $(PREFIX)/lib $(PREFIX)/include\n"
			     "\tcp libdep.a $(PREFIX)/lib/ && cp dep.h $(PREFIX)/include/\n");
	if (r < 0)
		return r;
	snprintf(cmd, sizeof(cmd),
		 "cd %s/work/deps && tar czf libdep-1.0.tar.gz libdep-1.0 && rm -rf libdep-1.0 && "
		 "cd %s/work/repo && git init -q && git add -A && git -c user.name=base -c "
		 "user.email=b@b commit -q -m base",
		 base, base);
	return system(cmd) == 0 ? 0 : -EIO;
}

/* Runs the action inside the environment: its cgroup and every namespace it has (nsenter -a:
 * after a restore that includes CRIU's time namespace, without which the next checkpoint
 * could not be restored). */
static int env_run(struct sv_env *e, const char *action)
{
	char cmd[8192], procs[PATH_MAX + 16], join[2048];
	int r;

	r = bench_cgroup_file(procs, sizeof(procs), e->cgroup, "cgroup.procs");
	if (r >= 0)
		r = fixture_join_prefix(e->pid, join, sizeof(join));
	if (r < 0 || !strstr(join, procs))
		return log_error_errno(r < 0 ? r : -ESRCH, "%s: no cgroup to run in (\"%s\"): %m",
				       e->id, e->cgroup);
	snprintf(cmd, sizeof(cmd),
		 "%sexec nsenter -t %d -a -r -w sh -ec \"%s%s\" </dev/null >/dev/null 2>&1", join,
		 (int)e->pid, GIT_ENV, action);
	return system(cmd) == 0 ? 0 : -EIO;
}

static int set_state(const struct sv_env *e, const char *addr, unsigned turn)
{
	char req[64], ans[256];

	snprintf(req, sizeof(req), "set turn-%u", turn);
	return fixture_ask_in(e->cgroup, addr, req, ans, sizeof(ans), WAIT_MS);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return n ? v[n / 2] : 0;
}

static json_object *ju(uint64_t v)
{
	return json_object_new_int64(v > INT64_MAX ? INT64_MAX : (int64_t)v);
}

static const char *const tree_skip[] = {"dev", "proc", "usr", "etc", NULL};

/* What a replay cannot reproduce byte for byte: git's index and objects (stat data, pack
 * order) and tar archives (mtimes) are left out of the contents comparison. */
static const char *const content_skip[] = {"dev", "proc", "usr", "etc", NULL};

static int content_hash(const char *root, uint64_t *ret)
{
	char repo[PATH_MAX];
	uint64_t a, b;
	int r;

	snprintf(repo, sizeof(repo), "%s/work/repo", root);
	r = fixture_content_hash(repo, (const char *const[]){".git", NULL}, &a);
	if (r >= 0) {
		char local[PATH_MAX];

		snprintf(local, sizeof(local), "%s/work/.local", root);
		if (fixture_content_hash(local, NULL, &b) < 0)
			b = 0;
		*ret = a ^ (b * 31);
	}
	(void)content_skip;
	return r;
}

static void dump_cgroup(const struct sv_env *e)
{
	char cmd[PATH_MAX + 128];

	snprintf(cmd, sizeof(cmd),
		 "cat %s/cgroup.events %s/cgroup.procs >&2; cat %s/work/init.log >&2", e->cgroup,
		 e->cgroup, e->root);
	(void)!system(cmd);
}

int bench_env_recovery(const struct bench_args *a, int argc, char **argv)
{
	struct turn_cost cost[NTURNS] = {0};
	uint64_t tree[NTURNS + 1] = {0}, content[NTURNS + 1] = {0};
	uint64_t t_restore[ARRAY_SIZE(fail_turns)], t_replay[ARRAY_SIZE(fail_turns)];
	bool ok_tree[ARRAY_SIZE(fail_turns)], ok_state[ARRAY_SIZE(fail_turns)],
		ok_replay_content[ARRAY_SIZE(fail_turns)];
	char ckpt_id[NTURNS + 1][ENV_ID_MAX + 1];
	char dir[] = "/tmp/belayer-bench-env.XXXXXX", base[PATH_MAX], state[PATH_MAX], cg[PATH_MAX],
	     srv_cmd[128], addr[16] /* the server's TCP port on 127.0.0.1 */, ans[256];
	struct env_params p = {0};
	struct sv_env *e = NULL;
	const char *criu = sv_criu_binary(NULL);
	uint64_t t0, setup_us;
	uint16_t port;
	int r = 0;

	(void)argc;
	(void)argv;
	if (geteuid() != 0 || !criu || sv_criu_version(criu) < 40200) {
		fprintf(stderr, "env-recovery needs root and CRIU >= 4.2 (BELAYER_CRIU).\n");
		return 77;
	}
	if (!mkdtemp(dir))
		return -errno;
	snprintf(base, sizeof(base), "%s/base", dir);
	snprintf(state, sizeof(state), "%s/state", dir);
	snprintf(cg, sizeof(cg), CGROUP_V2 "/belayer-bench-%d", (int)getpid());
	r = sv_criu_config_init(state);
	if (r < 0)
		goto out;
	t0 = bench_now_ns() / 1000;
	r = make_base(base, BENCH_ENV_SERVER);
	if (r < 0) {
		log_error_errno(r, "Failed to make the base: %m");
		goto out;
	}
	setup_us = bench_now_ns() / 1000 - t0;
	p.id = "bench";
	p.base = base;
	r = fixture_free_port(&port);
	if (r < 0)
		goto out;
	snprintf(addr, sizeof(addr), "%u", (unsigned)port);
	snprintf(srv_cmd, sizeof(srv_cmd), "cd /work; /work/server %s & exec sleep infinity", addr);
	p.cmd = srv_cmd;
	p.state_dir = state;
	p.cgroup_parent = cg;
	p.criu = criu;
	p.keep = NTURNS + 1;
	r = env_create(&p, &e);
	if (r < 0) {
		log_error_errno(r, "Failed to create the environment: %m");
		goto out;
	}
	r = fixture_ask_in(e->cgroup, addr, "get", ans, sizeof(ans), WAIT_MS);
	if (r < 0)
		goto out;

	/* The failure-free trajectory, a checkpoint after every turn. */
	for (unsigned t = 1; t <= NTURNS; t++) {
		struct env_ckpt_params cp = {.trajectory = "bench",
					     .turn = t,
					     .prefix_tokens = 512 * t,
					     .prefix_hash = t};
		struct env_manifest m;
		uint64_t c0;

		r = env_run(e, actions[t - 1]);
		if (r < 0) {
			log_error("Action %u failed: %s", t, actions[t - 1]);
			goto out;
		}
		r = set_state(e, addr, t);
		if (r < 0)
			goto out;
		c0 = bench_now_ns() / 1000;
		r = env_checkpoint(e, &cp, &m);
		if (r < 0) {
			log_error_errno(r, "Checkpoint at turn %u failed: %m", t);
			goto out;
		}
		cost[t - 1] = (struct turn_cost){
			.freeze_us = m.freeze_us,
			.dump_us = m.dump_us,
			.fs_us = m.fs_us,
			.commit_us = m.commit_us,
			.bytes = m.fs_bytes,
			.criu_bytes = m.criu_bytes,
			.total_us = bench_now_ns() / 1000 - c0,
		};
		snprintf(ckpt_id[t], sizeof(ckpt_id[t]), "%s", m.id);
		env_manifest_finish(&m);
		r = fixture_tree_hash(e->root, tree_skip, &tree[t]);
		if (r >= 0)
			r = content_hash(e->root, &content[t]);
		if (r < 0)
			goto out;
	}

	for (size_t i = 0; i < ARRAY_SIZE(fail_turns); i++) {
		unsigned F = fail_turns[i];
		struct env_manifest m;
		char want[64];
		uint64_t h, s0;

		/* Belayer: full restore of turn F's checkpoint, until the server answers. */
		s0 = bench_now_ns() / 1000;
		r = env_restore(e, ckpt_id[F], &m);
		if (r < 0) {
			log_error_errno(r, "Restore of turn %u failed: %m", F);
			goto out;
		}
		r = fixture_ask_in(e->cgroup, addr, "get", ans, sizeof(ans), WAIT_MS);
		t_restore[i] = bench_now_ns() / 1000 - s0;
		env_manifest_finish(&m);
		if (r < 0)
			goto out;
		/* One "get" at start, one "set" per turn, this "get": F + 2 requests. */
		snprintf(want, sizeof(want), "turn-%u %u", F, F + 2);
		ok_state[i] = strcmp(ans, want) == 0;
		ok_tree[i] = fixture_tree_hash(e->root, tree_skip, &h) >= 0 && h == tree[F];

		/* Baseline: kill, rebuild from the base, relaunch, replay actions 1..F. */
		s0 = bench_now_ns() / 1000;
		r = env_rebuild(e);
		if (r >= 0)
			r = fixture_ask_in(e->cgroup, addr, "get", ans, sizeof(ans), WAIT_MS);
		for (unsigned t = 1; r >= 0 && t <= F; t++) {
			r = env_run(e, actions[t - 1]);
			if (r >= 0)
				r = set_state(e, addr, t);
		}
		t_replay[i] = bench_now_ns() / 1000 - s0;
		if (r < 0) {
			log_error_errno(r, "Replay to turn %u failed: %m", F);
			dump_cgroup(e);
			goto out;
		}
		ok_replay_content[i] = content_hash(e->root, &h) >= 0 && h == content[F];
	}

	{
		uint64_t v[NTURNS], med_freeze, med_dump, med_fs, med_total, med_bytes, med_criu;
		size_t mid = ARRAY_SIZE(fail_turns) / 2;
		uint64_t sorted_restore[ARRAY_SIZE(fail_turns)],
			sorted_replay[ARRAY_SIZE(fail_turns)];
		double speedup_median;

#define MED(field, out)                          \
	do {                                     \
		for (int k = 0; k < NTURNS; k++) \
			v[k] = cost[k].field;    \
		out = median(v, NTURNS);         \
	} while (0)
		MED(freeze_us, med_freeze);
		MED(dump_us, med_dump);
		MED(fs_us, med_fs);
		MED(total_us, med_total);
		MED(bytes, med_bytes);
		MED(criu_bytes, med_criu);
#undef MED
		/* The median failure point: the middle of the failure turns (10 of 5/10/15/20
		 * lies below the middle, so both middles are shown; the ratio uses turn 15's
		 * neighbour average: the median of the per-turn speedups). */
		{
			double sp[ARRAY_SIZE(fail_turns)];

			for (size_t i = 0; i < ARRAY_SIZE(fail_turns); i++)
				sp[i] = (double)t_replay[i] / (double)t_restore[i];
			for (size_t i = 0; i < ARRAY_SIZE(fail_turns); i++)
				for (size_t j = i + 1; j < ARRAY_SIZE(fail_turns); j++)
					if (sp[j] < sp[i]) {
						double x = sp[i];

						sp[i] = sp[j];
						sp[j] = x;
					}
			speedup_median = (sp[mid - 1] + sp[mid]) / 2;
		}
		memcpy(sorted_restore, t_restore, sizeof(t_restore));
		memcpy(sorted_replay, t_replay, sizeof(t_replay));
		if (a->json) {
			json_object *j = json_object_new_object(), *ft = json_object_new_array();

			json_object_object_add(j, "files", json_object_new_int(NFILES));
			json_object_object_add(j, "turns", json_object_new_int(NTURNS));
			json_object_object_add(j, "base_setup_us", ju(setup_us));
			json_object_object_add(j, "ckpt_freeze_us_median", ju(med_freeze));
			json_object_object_add(j, "ckpt_dump_us_median", ju(med_dump));
			json_object_object_add(j, "ckpt_fs_us_median", ju(med_fs));
			json_object_object_add(j, "ckpt_total_us_median", ju(med_total));
			json_object_object_add(j, "ckpt_fs_bytes_median", ju(med_bytes));
			json_object_object_add(j, "ckpt_criu_bytes_median", ju(med_criu));
			for (size_t i = 0; i < ARRAY_SIZE(fail_turns); i++) {
				json_object *o = json_object_new_object();

				json_object_object_add(o, "turn",
						       json_object_new_int((int)fail_turns[i]));
				json_object_object_add(o, "restore_us", ju(t_restore[i]));
				json_object_object_add(o, "replay_us", ju(t_replay[i]));
				json_object_object_add(o, "tree_identical",
						       json_object_new_boolean(ok_tree[i]));
				json_object_object_add(o, "server_state_identical",
						       json_object_new_boolean(ok_state[i]));
				json_object_object_add(
					o, "replay_contents_identical",
					json_object_new_boolean(ok_replay_content[i]));
				json_object_array_add(ft, o);
			}
			json_object_object_add(j, "failures", ft);
			json_object_object_add(j, "speedup_median",
					       json_object_new_double(speedup_median));
			printf("%s\n", json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY));
			json_object_put(j);
		} else {
			printf("env-recovery: %d-file git repository, %d turns, base made in %.1f "
			       "s\n",
			       NFILES, NTURNS, (double)setup_us / 1e6);
			printf("checkpoint per turn (median): frozen %.1f ms (FS delta %.1f ms + "
			       "CRIU "
			       "dump %.1f ms), commit %.1f ms, total %.1f ms; FS delta %" PRIu64
			       " KiB, CRIU images %" PRIu64 " KiB\n",
			       (double)med_freeze / 1e3, (double)med_fs / 1e3,
			       (double)med_dump / 1e3, (double)cost[NTURNS / 2].commit_us / 1e3,
			       (double)med_total / 1e3, med_bytes >> 10, med_criu >> 10);
			printf("%-6s %12s %14s %8s %10s %12s %16s\n", "fail@", "restore ms",
			       "replay ms", "speedup", "tree ==", "server ==", "replay content ==");
			for (size_t i = 0; i < ARRAY_SIZE(fail_turns); i++)
				printf("%-6u %12.1f %14.1f %7.1fx %10s %12s %16s\n", fail_turns[i],
				       (double)t_restore[i] / 1e3, (double)t_replay[i] / 1e3,
				       (double)t_replay[i] / (double)t_restore[i],
				       ok_tree[i] ? "yes" : "NO", ok_state[i] ? "yes" : "NO",
				       ok_replay_content[i] ? "yes" : "NO");
			printf("median speedup (full restore vs rebuild + replay): %.1fx (target "
			       ">= "
			       "3.5x)\n",
			       speedup_median);
		}
		for (size_t i = 0; i < ARRAY_SIZE(fail_turns); i++)
			if (!ok_tree[i] || !ok_state[i])
				r = -EPROTO;
	}
out:
	if (e)
		env_destroy(e);
	(void)rmdir(cg);
	{
		char cmd[PATH_MAX + 16];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		(void)system(cmd);
	}
	return r < 0 ? 1 : 0;
}
