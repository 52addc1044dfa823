/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench bpf-overhead: what environment side-effect tracing costs the agent.
 *
 * One file- and process-heavy workload (unpack a generated C source tree, build it with
 * make -j2, run its tests, git init/add/commit/diff/commit, rebuild, delete it) runs in a real
 * cgroup v2 directory under four configurations, interleaved round by round so that drift
 * hits all alike:
 *   off        no BPF program loaded
 *   loaded     envtrace loaded and attached, the workload's cgroup not watched (the cost
 *              every other process on the node pays)
 *   watched    the cgroup watched; this process consumes the ring buffer into a dirty set
 *              and a side-effect log while the workload runs, as the supervisor would
 *              (woken when 256 KiB wait, else draining every 50 ms)
 *   wake_all   the same, the consumer woken for every record (the kernel's default)
 *   loaded_noact  as "loaded", without the process-activity programs ([env] activity = no:
 *              the two that run at every syscall of every process on the node), so that
 *              "loaded" against it is what those cost outside environments
 * Reported, as medians: wall time; the CPU time of the workload's processes (user + system:
 * the programs run in their context, so it shows the tracing's cost even when the machine's
 * other load makes wall time noisy); the time spent in the BPF programs (kernel run-time
 * statistics); and for "watched" records/s, drops and this process's CPU as the consumer.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "bench-measure.h"
#include "bench.h"
#include "log.h"
#include "supervisor-dirty.h"
#include "supervisor-envtrace.h"
#include "supervisor-sidelog.h"
#include "util.h"

#define ENV_ID	   1
#define NFILES	   160 /* C files in the generated tree */
#define NTESTS	   120 /* test runs in "make check" */
#define CONFIGS	   5
#define MAX_ROUNDS 15

enum {
	CFG_OFF,
	CFG_LOADED,
	CFG_WATCHED,
	CFG_WAKE_ALL,
	CFG_LOADED_NOACT,
};
static const char *const cfg_names[CONFIGS] = {"off", "loaded", "watched", "wake_all",
					       "loaded_noact"};

struct run {
	double wall_s;
	double workload_cpu_s; /* user + system time of the workload's processes */
	double bpf_s; /* time in the BPF programs (all processes), from the kernel's stats */
	uint64_t bpf_runs;
	uint64_t records;
	uint64_t drops;
	size_t dirty;
	double consumer_cpu_s;
	bool full_diff;
};

struct consumer {
	struct sv_dirty *dirty;
	struct sv_sidelog *log;
	uint64_t records;
};

static int on_record(const struct envtrace_record *rec, void *userdata)
{
	struct consumer *c = userdata;

	c->records++;
	(void)dirty_apply(c->dirty, rec);
	(void)sidelog_append(c->log, rec);
	return 0;
}

static int write_text(const char *dir, const char *name, const char *text)
{
	char path[PATH_MAX];
	_cleanup_fclose_ FILE *f = NULL;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "we");
	if (!f)
		return negative_errno();
	fputs(text, f);
	return ferror(f) ? -EIO : 0;
}

/* The source tree and the workload script; the tarball is what the workload unpacks. */
static int prepare(const char *base)
{
	char dir[PATH_MAX], name[64], body[1024], cmd[PATH_MAX * 2];
	_cleanup_fclose_ FILE *m = NULL;
	int r;

	snprintf(dir, sizeof(dir), "%s/gen/src", base);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/tests'", dir);
	if (system(cmd) != 0)
		return -EIO;
	for (int i = 0; i < NFILES; i++) {
		snprintf(name, sizeof(name), "f%03d.c", i);
		snprintf(body, sizeof(body),
			 "/* generated */\n#include <stdint.h>\n"
			 "uint64_t f%03d(uint64_t x);\n"
			 "uint64_t f%03d(uint64_t x)\n{\n\tuint64_t h = %d;\n"
			 "\tfor (int i = 0; i < 64; i++)\n\t\th = h * 31 + (x ^ (uint64_t)i);\n"
			 "\treturn h;\n}\n",
			 i, i, i);
		r = write_text(dir, name, body);
		if (r < 0)
			return r;
	}
	snprintf(cmd, sizeof(cmd), "%s/main.c", dir);
	m = fopen(cmd, "we");
	if (!m)
		return negative_errno();
	fputs("#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n", m);
	for (int i = 0; i < NFILES; i++)
		fprintf(m, "uint64_t f%03d(uint64_t x);\n", i);
	fputs("int main(int argc, char **argv)\n{\n\tuint64_t x = argc > 1 ? "
	      "strtoull(argv[1], NULL, 0) : 1, h = 0;\n",
	      m);
	for (int i = 0; i < NFILES; i++)
		fprintf(m, "\th ^= f%03d(x);\n", i);
	fputs("\tprintf(\"%llu\\n\", (unsigned long long)h);\n\treturn 0;\n}\n", m);
	m = (fclose(m), NULL);
	r = write_text(dir, "Makefile",
		       "SRCS := $(wildcard f*.c) main.c\nOBJS := $(SRCS:.c=.o)\n"
		       "CFLAGS := -O1\n"
		       "prog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n"
		       "%.o: %.c\n\t$(CC) $(CFLAGS) -c -o $@ $<\n"
		       "check: prog\n\t./tests/run.sh\n"
		       "clean:\n\trm -f prog $(OBJS)\n");
	if (r < 0)
		return r;
	snprintf(body, sizeof(body),
		 "#!/bin/sh\n# One process per test, each writing and comparing its output.\n"
		 "set -e\nmkdir -p tests/out\n"
		 "for i in $(seq 1 %d); do\n"
		 "\t./prog $i > tests/out/$i.txt\n\t./prog $i | cmp -s - tests/out/$i.txt\n"
		 "done\nrm -rf tests/out\n",
		 NTESTS);
	r = write_text(dir, "tests/run.sh", body);
	if (r < 0)
		return r;
	snprintf(cmd, sizeof(cmd),
		 "chmod +x '%s/tests/run.sh' && tar -C '%s/gen' -cf '%s/src.tar' src", dir, base,
		 base);
	if (system(cmd) != 0)
		return -EIO;
	return write_text(base, "workload.sh",
			  "#!/bin/sh\n"
			  "set -e\n"
			  "cd \"$1\"\n"
			  "tar xf ../src.tar\n"
			  "cd src\n"
			  "make -s -j2 prog\n"
			  "make -s check\n"
			  "export GIT_AUTHOR_NAME=b GIT_AUTHOR_EMAIL=b@b GIT_COMMITTER_NAME=b "
			  "GIT_COMMITTER_EMAIL=b@b\n"
			  "git init -q .\n"
			  "git add -A\n"
			  "git commit -q -m import\n"
			  "for f in f00*.c; do sed -i 's/h \\* 31/h * 37/' \"$f\"; done\n"
			  "git status --short > /dev/null\n"
			  "git diff --stat > /dev/null\n"
			  "git commit -q -am change\n"
			  "make -s -j2 prog\n"
			  "./prog 7 > /dev/null\n"
			  "cd ..\n"
			  "rm -rf src\n");
}

static int move_self(const char *cgroup)
{
	char path[PATH_MAX];
	_cleanup_close_ int fd = -1;

	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "0", 1) != 1)
		return negative_errno();
	return 0;
}

static double cpu_seconds(int who)
{
	struct rusage ru;

	getrusage(who, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
	       ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

static int silent_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	return level == LIBBPF_DEBUG ? 0 : vfprintf(stderr, fmt, ap);
}

static int run_once(const char *base, const char *cgroup, int cfg, struct run *ret)
{
	bool watched = cfg == CFG_WATCHED || cfg == CFG_WAKE_ALL;
	struct envtrace_options opts = {.pin_dir = ""};
	struct sv_envtrace *et = NULL;
	struct consumer c = {0};
	char work[PATH_MAX], script[PATH_MAX], logp[PATH_MAX];
	uint64_t t0, t1;
	double cpu0, child0;
	int status = 0, r = 0;
	pid_t pid;

	*ret = (struct run){0};
	snprintf(work, sizeof(work), "%s/work", base);
	snprintf(script, sizeof(script), "%s/workload.sh", base);
	snprintf(logp, sizeof(logp), "%s/sidelog", base);
	(void)mkdir(work, 0755);
	(void)unlink(logp);
	if (cfg == CFG_WAKE_ALL)
		opts.wakeup_bytes = -1;
	opts.no_activity = cfg == CFG_LOADED_NOACT;
	if (cfg != CFG_OFF) {
		r = envtrace_create(&opts, &et);
		if (r < 0)
			return log_error_errno(r, "Failed to load the envtrace programs: %m");
	}
	if (watched) {
		r = envtrace_watch_add(et, cgroup, NULL, ENV_ID);
		if (r >= 0)
			r = dirty_create(&c.dirty);
		if (r >= 0)
			r = sidelog_open(logp, &c.log);
		if (r < 0)
			goto out;
	}

	cpu0 = cpu_seconds(RUSAGE_SELF);
	child0 = cpu_seconds(RUSAGE_CHILDREN);
	t0 = bench_now_ns();
	pid = fork();
	if (pid < 0) {
		r = negative_errno();
		goto out;
	}
	if (pid == 0) {
		if (move_self(cgroup) < 0)
			_exit(126);
		execl("/bin/sh", "sh", script, work, (char *)NULL);
		_exit(127);
	}
	/* The same loop in every configuration (a 50 ms poll, then a reap attempt), so that this
	 * process wakes the CPUs alike; only "watched" has a ring buffer to read. */
	for (;;) {
		struct pollfd p = {.fd = et ? envtrace_fd(et) : -1, .events = POLLIN};

		(void)poll(&p, 1, 50);
		if (watched) {
			while (envtrace_consume(et, on_record, &c) > 0)
				;
		}
		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
	}
	t1 = bench_now_ns();
	if (watched) {
		struct envtrace_env_stats st;

		while (envtrace_consume(et, on_record, &c) > 0)
			;
		if (envtrace_env_stats(et, ENV_ID, &st) == 0) {
			ret->drops = st.drops;
			dirty_note_drops(c.dirty, st.drops);
		}
		ret->records = c.records;
		ret->dirty = dirty_count(c.dirty);
		ret->full_diff = dirty_needs_full_diff(c.dirty, NULL);
	}
	ret->consumer_cpu_s = cpu_seconds(RUSAGE_SELF) - cpu0;
	ret->workload_cpu_s = cpu_seconds(RUSAGE_CHILDREN) - child0;
	if (et) {
		uint64_t ns = 0;

		(void)envtrace_prog_runtime(et, &ns, &ret->bpf_runs);
		ret->bpf_s = (double)ns / 1e9;
	}
	ret->wall_s = (double)(t1 - t0) / 1e9;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		log_error("The workload failed (status %d) under '%s'", status, cfg_names[cfg]);
		r = -EIO;
	}
out:
	sidelog_close(c.log);
	dirty_destroy(c.dirty);
	envtrace_destroy(et);
	return r;
}

/* field: offset of a double in struct run. */
static double median(const struct run *runs, int n, size_t field)
{
	double v[MAX_ROUNDS];

	for (int i = 0; i < n; i++)
		v[i] = *(const double *)((const char *)&runs[i] + field);
	qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static const char *find_cgroup2(char *buf, size_t n)
{
	char line[1024];
	_cleanup_fclose_ FILE *f = fopen("/proc/self/mounts", "re");

	if (!f)
		return NULL;
	while (fgets(line, sizeof(line), f)) {
		char dev[128], mnt[256], type[64];

		if (sscanf(line, "%127s %255s %63s", dev, mnt, type) == 3 &&
		    strcmp(type, "cgroup2") == 0) {
			snprintf(buf, n, "%s", mnt);
			return buf;
		}
	}
	return NULL;
}

int bench_bpf_overhead(const struct bench_args *a, int argc, char **argv)
{
	static const struct option options[] = {
		{"json", no_argument, NULL, 'j'},
		{"rounds", required_argument, NULL, 'r'},
		{},
	};
	struct run runs[CONFIGS][MAX_ROUNDS];
	char base[] = "/var/tmp/belayer-bpf-overhead-XXXXXX", cg2[256], cgroup[PATH_MAX],
	     cmd[PATH_MAX + 32];
	double med[CONFIGS], cpu[CONFIGS], bpf[CONFIGS];
	uint64_t records = 0, drops = 0;
	double watched_wall = 0, consumer_cpu = 0;
	size_t dirty = 0;
	bool full_diff = false;
	_cleanup_close_ int stats_fd = -1;
	int rounds = 3, o, r = 0;

	optind = 1;
	while ((o = getopt_long(argc, argv, "", options, NULL)) >= 0) {
		switch (o) {
		case 'j':
			break;
		case 'r':
			rounds = atoi(optarg);
			break;
		default:
			return -EINVAL;
		}
	}
	if (rounds < 1 || rounds > MAX_ROUNDS)
		return log_error_errno(-EINVAL, "--rounds must be 1..%d", MAX_ROUNDS);
	if (geteuid() != 0)
		return log_error_errno(-EPERM, "bpf-overhead needs root (BPF, cgroups)");
	if (!find_cgroup2(cg2, sizeof(cg2)))
		return log_error_errno(-ENOENT, "No cgroup2 file system is mounted");
	libbpf_set_print(silent_print);
	if (!mkdtemp(base))
		return log_error_errno(negative_errno(), "Failed to create a directory: %m");
	snprintf(cgroup, sizeof(cgroup), "%s/belayer-bench-%d", cg2, getpid());
	if (mkdir(cgroup, 0755) < 0) {
		r = log_error_errno(negative_errno(), "Failed to create cgroup %s: %m", cgroup);
		goto out;
	}
	r = prepare(base);
	if (r < 0) {
		log_error_errno(r, "Failed to generate the source tree: %m");
		goto out;
	}
	/* The kernel counts the programs' run time while this fd is open. */
	stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
	if (stats_fd < 0)
		log_warning_errno(stats_fd,
				  "Failed to enable BPF run-time statistics: %m, ignoring.");
	/* A warm-up run (page cache, git's first start) that is not counted. */
	r = run_once(base, cgroup, CFG_OFF, &runs[0][0]);
	if (r < 0)
		goto out;
	for (int i = 0; i < rounds; i++) {
		for (int k = 0; k < CONFIGS; k++) {
			/* Rotate the order so no configuration always runs first. */
			int cfg = (k + i) % CONFIGS;

			r = run_once(base, cgroup, cfg, &runs[cfg][i]);
			if (r < 0)
				goto out;
			if (!a->json)
				fprintf(stderr, "round %d %-8s %.3f s\n", i + 1, cfg_names[cfg],
					runs[cfg][i].wall_s);
		}
	}
	for (int k = 0; k < CONFIGS; k++) {
		med[k] = median(runs[k], rounds, offsetof(struct run, wall_s));
		cpu[k] = median(runs[k], rounds, offsetof(struct run, workload_cpu_s));
		bpf[k] = median(runs[k], rounds, offsetof(struct run, bpf_s));
	}
	for (int i = 0; i < rounds; i++) {
		records += runs[CFG_WATCHED][i].records;
		drops += runs[CFG_WATCHED][i].drops;
		watched_wall += runs[CFG_WATCHED][i].wall_s;
		consumer_cpu += runs[CFG_WATCHED][i].consumer_cpu_s;
		dirty = runs[CFG_WATCHED][i].dirty;
		full_diff |= runs[CFG_WATCHED][i].full_diff;
	}
	if (a->json) {
		printf("{\"benchmark\":\"bpf-overhead\",\"rounds\":%d,\"files\":%d,\"tests\":%d,",
		       rounds, NFILES, NTESTS);
		for (int k = 0; k < CONFIGS; k++)
			printf("\"%s_wall_s\":%.4f,\"%s_workload_cpu_s\":%.4f,\"%s_bpf_s\":%.4f,",
			       cfg_names[k], med[k], cfg_names[k], cpu[k], cfg_names[k], bpf[k]);
		printf("\"activity_bpf_s\":%.4f,", bpf[CFG_LOADED] - bpf[CFG_LOADED_NOACT]);
		printf("\"loaded_slowdown_pct\":%.2f,\"watched_slowdown_pct\":%.2f,"
		       "\"watched_cpu_overhead_pct\":%.2f,"
		       "\"records_per_run\":%" PRIu64 ",\"records_per_s\":%.0f,\"drops\":%" PRIu64
		       ",\"dirty_paths\":%zu,\"full_diff\":%s,\"consumer_cpu_pct\":%.2f}\n",
		       (med[CFG_LOADED] / med[CFG_OFF] - 1) * 100,
		       (med[CFG_WATCHED] / med[CFG_OFF] - 1) * 100,
		       (cpu[CFG_WATCHED] / cpu[CFG_OFF] - 1) * 100, records / (uint64_t)rounds,
		       watched_wall > 0 ? (double)records / watched_wall : 0.0, drops, dirty,
		       full_diff ? "true" : "false",
		       watched_wall > 0 ? consumer_cpu / watched_wall * 100 : 0.0);
	} else {
		printf("bpf-overhead: unpack %d C files, make -j2, %d test processes, git, rm -rf; "
		       "median of %d rounds\n",
		       NFILES, NTESTS, rounds);
		printf("  %-12s %9s %9s %14s %9s %12s\n", "config", "wall s", "vs off",
		       "workload cpu s", "vs off", "in BPF s");
		for (int k = 0; k < CONFIGS; k++)
			printf("  %-12s %9.3f %8.2f%% %14.3f %8.2f%% %12.4f\n", cfg_names[k],
			       med[k], (med[k] / med[CFG_OFF] - 1) * 100, cpu[k],
			       (cpu[k] / cpu[CFG_OFF] - 1) * 100, bpf[k]);
		printf("  the activity programs (loaded - loaded_noact): %.4f s in BPF per run, "
		       "%.2f%% "
		       "of the workload's CPU, paid by every process on the node\n",
		       bpf[CFG_LOADED] - bpf[CFG_LOADED_NOACT],
		       cpu[CFG_OFF] > 0
			       ? (bpf[CFG_LOADED] - bpf[CFG_LOADED_NOACT]) / cpu[CFG_OFF] * 100
			       : 0.0);
		printf("  watched: %" PRIu64 " records/run, %.0f records/s, %" PRIu64
		       " drops, %zu dirty paths%s, consumer CPU %.2f%% of wall\n",
		       records / (uint64_t)rounds,
		       watched_wall > 0 ? (double)records / watched_wall : 0.0, drops, dirty,
		       full_diff ? " (full diff)" : "",
		       watched_wall > 0 ? consumer_cpu / watched_wall * 100 : 0.0);
	}
out:
	(void)rmdir(cgroup);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
	(void)!system(cmd);
	return r;
}
