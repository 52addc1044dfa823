/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench sandbox (issue 20 item 6): Belayer's environments against podman (runc, its
 * CRIU checkpoints) side by side in one run, on the same image and workload: a busybox root
 * whose command serves HTTP (busybox httpd) beside a sleeping init.
 *
 *   create   an environment / container from the cached image, until its command runs
 *   exec     `true` inside it: p50 and p99 (belayerctl env exec vs podman exec)
 *   ckpt     a checkpoint that leaves it running (env checkpoint vs podman container
 *            checkpoint --leave-running)
 *   restore  back to that checkpoint (env restore vs podman container restore of a
 *            checkpointed, stopped container)
 *   fork 8   eight running copies of one checkpoint (env fork --count 8 vs podman container
 *            checkpoint --export + 8 x podman container restore --import --name)
 *
 * Both sides are driven through their command-line tools (belayerctl, podman), so each figure
 * includes one CLI start: what a user or a framework shelling out sees. Rounds alternate
 * between the two. Podman absent (or unusable): its column says so and the Belayer figures
 * still print.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "bench-measure.h"
#include "bench.h"
#include "log.h"
#include "util.h"

#define MAX_ROUNDS 1000
#define FORKS	   8
#define ARGS_MAX   24

extern char **environ;

struct side {
	double create[MAX_ROUNDS], exec[MAX_ROUNDS], ckpt[MAX_ROUNDS], restore[MAX_ROUNDS],
		fork8[MAX_ROUNDS];
	unsigned n_create, n_exec, n_ckpt, n_restore, n_fork;
	bool ok;
	char why[256];
};

struct run {
	char dir[64];
	char sv[PATH_MAX], ctl[PATH_MAX], sock[PATH_MAX], cgroup[PATH_MAX], image[PATH_MAX];
	char tag[96];
	pid_t sv_pid;
	unsigned rounds, execs;
	bool quick;
};

/* Runs argv (NULL-ended), stdout and stderr to /dev/null unless keep: its wall time in ms
 * (-1: it failed to start or exited non-zero). */
static double timed(char *const argv[], bool quiet)
{
	posix_spawn_file_actions_t fa;
	uint64_t t0;
	pid_t pid;
	int st, r;

	posix_spawn_file_actions_init(&fa);
	if (quiet) {
		posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
		posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	}
	t0 = bench_now_ns();
	r = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (r != 0)
		return -1;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return -1;
	return bench_ms_between(t0, bench_now_ns());
}

/* timed() of a printf-built argument list split on spaces (no argument holds one). */
static double timedf(bool quiet, const char *fmt, ...)
{
	char line[4096], *argv[ARGS_MAX + 1], *save = NULL;
	size_t n = 0;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	for (char *t = strtok_r(line, " ", &save); t && n < ARGS_MAX;
	     t = strtok_r(NULL, " ", &save))
		argv[n++] = t;
	argv[n] = NULL;
	return n ? timed(argv, quiet) : -1;
}

/* sh -c of a printf-built line, quiet: 0 or -1. */
static int shell(const char *fmt, ...)
{
	char line[4096];
	char *argv[] = {"sh", "-c", line, NULL};
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	return timed(argv, true) < 0 ? -1 : 0;
}

static int record(double *v, unsigned *n, double ms, struct side *s, const char *what)
{
	if (ms < 0) {
		if (s->ok)
			snprintf(s->why, sizeof(s->why), "%s failed", what);
		s->ok = false;
		return -1;
	}
	if (*n < MAX_ROUNDS)
		v[(*n)++] = ms;
	return 0;
}

static double pct(double *v, unsigned n, double p)
{
	if (!n)
		return -1;
	qsort(v, n, sizeof(*v), bench_cmp_double);
	return v[(unsigned)((n - 1) * p + 0.5)];
}

/* The image: a busybox root (bin/busybox and its applets), a page to serve; imported into
 * podman with its command, saved as an OCI layout for Belayer. */
static int make_image(struct run *w)
{
	static const char *const applets[] = {"sh", "sleep", "true", "cat", "httpd", "echo", "ls"};
	char path[PATH_MAX], tar[PATH_MAX];

	snprintf(path, sizeof(path), "%s/rootfs", w->dir);
	if (timedf(true, "mkdir -p %s/bin %s/www %s/tmp", path, path, path) < 0 ||
	    timedf(true, "cp /bin/busybox %s/bin/busybox", path) < 0)
		return log_error_errno(-ENOENT, "No busybox (Debian's busybox-static) to build the "
						"image from.");
	for (size_t i = 0; i < ARRAY_SIZE(applets); i++)
		if (timedf(true, "ln -sf busybox %s/bin/%s", path, applets[i]) < 0)
			return -EIO;
	snprintf(tar, sizeof(tar), "%s/www/index.html", path);
	{
		FILE *f = fopen(tar, "we");

		if (!f)
			return -errno;
		fputs("belayer-bench\n", f);
		fclose(f);
	}
	snprintf(tar, sizeof(tar), "%s/rootfs.tar", w->dir);
	if (timedf(true, "tar -C %s -cf %s .", path, tar) < 0)
		return -EIO;
	return 0;
}

static int podman_image(struct run *w)
{
	char *const imp[] = {
		"podman",
		"import",
		"--change",
		"CMD [\"/bin/sh\",\"-c\",\"httpd -p 8080 -h /www; exec sleep infinity\"]",
		NULL,
		w->tag,
		NULL};
	char tar[PATH_MAX], *argv[7];

	snprintf(tar, sizeof(tar), "%s/rootfs.tar", w->dir);
	memcpy(argv, imp, sizeof(imp));
	argv[4] = tar;
	if (timed(argv, true) < 0)
		return -EIO;
	snprintf(w->image, sizeof(w->image), "%s/oci", w->dir);
	return timedf(true, "podman save --format oci-dir -o %s %s", w->image, w->tag) < 0 ? -EIO
											   : 0;
}

static const char *const podman_run = "podman --runtime runc run -d --ulimit nofile=1024:1024 "
				      "--ulimit nproc=4096:4096 --name";

static void measure_podman(struct run *w, struct side *s)
{
	char name[64];

	s->ok = true;
	for (unsigned i = 0; s->ok && i < w->rounds; i++) {
		snprintf(name, sizeof(name), "bb-%d-c%u", (int)getpid(), i);
		record(s->create, &s->n_create, timedf(true, "%s %s %s", podman_run, name, w->tag),
		       s, "podman run");
	}
	snprintf(name, sizeof(name), "bb-%d-c0", (int)getpid());
	for (unsigned i = 0; s->ok && i < w->execs; i++)
		record(s->exec, &s->n_exec, timedf(true, "podman exec %s true", name), s,
		       "podman exec");
	for (unsigned i = 0; s->ok && i < w->rounds; i++) {
		record(s->ckpt, &s->n_ckpt,
		       timedf(true, "podman container checkpoint --leave-running %s", name), s,
		       "podman checkpoint --leave-running");
		/* restore needs it checkpointed and stopped: that checkpoint is not timed */
		if (timedf(true, "podman container checkpoint %s", name) < 0) {
			record(s->restore, &s->n_restore, -1, s, "podman checkpoint");
			break;
		}
		record(s->restore, &s->n_restore, timedf(true, "podman container restore %s", name),
		       s, "podman restore");
	}
	for (unsigned i = 0; s->ok && i < (w->quick ? 1 : 3); i++) {
		char exp[PATH_MAX];
		uint64_t t0 = bench_now_ns();
		int bad = 0;

		snprintf(exp, sizeof(exp), "%s/podman-ckpt-%u.tar.gz", w->dir, i);
		bad |= timedf(true, "podman container checkpoint --leave-running --export %s %s",
			      exp, name) < 0;
		for (unsigned k = 0; !bad && k < FORKS; k++)
			bad |= timedf(true,
				      "podman container restore --import %s --name bb-%d-f%u-%u",
				      exp, (int)getpid(), i, k) < 0;
		record(s->fork8, &s->n_fork, bad ? -1 : bench_ms_between(t0, bench_now_ns()), s,
		       "podman checkpoint --export / restore --import");
	}
}

static void podman_cleanup(void)
{
	/* every container of this run, whatever state */
	(void)shell("podman ps -aq --filter name=bb-%d- | xargs -r podman rm -f", (int)getpid());
}

static int start_supervisor(struct run *w)
{
	char conf[PATH_MAX];
	FILE *f;
	char *argv[] = {w->sv, "-c", conf, NULL};
	posix_spawn_file_actions_t fa;
	char log[PATH_MAX];

	snprintf(conf, sizeof(conf), "%s/sv.ini", w->dir);
	snprintf(w->sock, sizeof(w->sock), "%s/sv.sock", w->dir);
	snprintf(w->cgroup, sizeof(w->cgroup), "/sys/fs/cgroup/unified/belayer-bench-sandbox-%d",
		 (int)getpid());
	f = fopen(conf, "we");
	if (!f)
		return -errno;
	fprintf(f,
		"[supervisor]\nsocket = %s\nstate_dir = %s/state\n[journal]\nenabled = no\n"
		"[health]\ninterval = 0\n[env]\ncgroup = %s\ntrace = no\n",
		w->sock, w->dir, w->cgroup);
	fclose(f);
	snprintf(log, sizeof(log), "%s/sv.log", w->dir);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	if (posix_spawn(&w->sv_pid, w->sv, &fa, NULL, argv, environ) != 0)
		w->sv_pid = 0;
	posix_spawn_file_actions_destroy(&fa);
	for (int i = 0; w->sv_pid > 0 && i < 200; i++) {
		if (access(w->sock, F_OK) == 0)
			return 0;
		usleep(50000);
	}
	return log_error_errno(-ETIMEDOUT, "The supervisor did not start (its log: %s).", log);
}

static void measure_belayer(struct run *w, struct side *s)
{
	char name[64];

	s->ok = true;
	if (timedf(true, "%s -s %s image import oci:%s", w->ctl, w->sock, w->image) < 0) {
		snprintf(s->why, sizeof(s->why), "image import failed");
		s->ok = false;
		return;
	}
	for (unsigned i = 0; s->ok && i < w->rounds; i++) {
		snprintf(name, sizeof(name), "c%u", i);
		record(s->create, &s->n_create,
		       timedf(true, "%s -s %s env create %s --image oci:%s", w->ctl, w->sock, name,
			      w->image),
		       s, "env create");
	}
	for (unsigned i = 0; s->ok && i < w->execs; i++)
		record(s->exec, &s->n_exec,
		       timedf(true, "%s -s %s env exec c0 -- true", w->ctl, w->sock), s,
		       "env exec");
	for (unsigned i = 0; s->ok && i < w->rounds; i++) {
		record(s->ckpt, &s->n_ckpt,
		       timedf(true, "%s -s %s env checkpoint c0 --turn %u", w->ctl, w->sock, i + 1),
		       s, "env checkpoint");
		record(s->restore, &s->n_restore,
		       timedf(true, "%s -s %s env restore c0", w->ctl, w->sock), s, "env restore");
	}
	for (unsigned i = 0; s->ok && i < (w->quick ? 1 : 3); i++)
		record(s->fork8, &s->n_fork,
		       timedf(true, "%s -s %s env fork c0 --as f%u --count %d", w->ctl, w->sock, i,
			      FORKS),
		       s, "env fork");
}

static void stop_supervisor(struct run *w)
{
	if (w->sv_pid > 0) {
		(void)kill(w->sv_pid, SIGTERM);
		(void)waitpid(w->sv_pid, NULL, 0);
	}
	/* The environments die with their cgroups: kill and remove what is left. */
	(void)shell("for c in %s/*/; do echo 1 >$c/cgroup.kill; done 2>/dev/null; sleep 0.5; "
		    "umount -l %s/state/envs/*/root; rmdir %s/* %s",
		    w->cgroup, w->dir, w->cgroup, w->cgroup);
}

static void row(const char *what, double b, double p, const char *goal)
{
	char bs[32], ps[32], rs[32];

	snprintf(bs, sizeof(bs), b < 0 ? "-" : "%.1f ms", b);
	snprintf(ps, sizeof(ps), p < 0 ? "-" : "%.1f ms", p);
	snprintf(rs, sizeof(rs), b > 0 && p > 0 ? "%.1fx" : "-", p / b);
	printf("%-34s %12s %14s %10s   %s\n", what, bs, ps, rs, goal);
}

static void add(json_object *o, const char *k, double v)
{
	json_object_object_add(o, k, v < 0 ? NULL : json_object_new_double(v));
}

static json_object *side_json(struct side *s, bool have)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "ok", json_object_new_boolean(have && s->ok));
	if (s->why[0])
		json_object_object_add(o, "why", json_object_new_string(s->why));
	add(o, "create_ms_p50", pct(s->create, s->n_create, 0.5));
	add(o, "exec_ms_p50", pct(s->exec, s->n_exec, 0.5));
	add(o, "exec_ms_p99", pct(s->exec, s->n_exec, 0.99));
	add(o, "checkpoint_ms_p50", pct(s->ckpt, s->n_ckpt, 0.5));
	add(o, "restore_ms_p50", pct(s->restore, s->n_restore, 0.5));
	add(o, "fork8_ms_p50", pct(s->fork8, s->n_fork, 0.5));
	return o;
}

int bench_sandbox(const struct bench_args *a, int argc, char **argv)
{
	static const struct option options[] = {
		{"json", no_argument, NULL, 'j'},	 {"rounds", required_argument, NULL, 'r'},
		{"execs", required_argument, NULL, 'e'}, {"quick", no_argument, NULL, 'q'},
		{"help", no_argument, NULL, 'h'},	 {},
	};
	struct run w = {.rounds = 5, .execs = 100};
	struct side *bel = calloc(1, sizeof(*bel)), *pod = calloc(1, sizeof(*pod));
	bool json = a->json, have_podman;
	int c, r;

	if (!bel || !pod)
		return -ENOMEM;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
		switch (c) {
		case 'j':
			json = true;
			break;
		case 'r':
			w.rounds = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'e':
			w.execs = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'q':
			w.quick = true;
			w.rounds = 2;
			w.execs = 10;
			break;
		default:
			printf("Usage: belayer-bench sandbox [--json] [--rounds N (5)] [--execs N "
			       "(100)] [--quick]\n");
			return c == 'h' ? 0 : 2;
		}
	if (!w.rounds || w.rounds > MAX_ROUNDS || !w.execs || w.execs > MAX_ROUNDS)
		return log_error_errno(-EINVAL, "--rounds and --execs: 1..%d", MAX_ROUNDS);
	if (geteuid() != 0)
		return log_error_errno(-EPERM, "belayer-bench sandbox needs root.");
	snprintf(w.sv, sizeof(w.sv), "%s/supervisor/belayer-supervisor", BENCH_BUILD_ROOT);
	snprintf(w.ctl, sizeof(w.ctl), "%s/tools/belayerctl/belayerctl", BENCH_BUILD_ROOT);
	snprintf(w.dir, sizeof(w.dir), "/tmp/belayer-bench-sandbox.XXXXXX");
	snprintf(w.tag, sizeof(w.tag), "localhost/belayer-bench-sandbox:%d", (int)getpid());
	if (!mkdtemp(w.dir))
		return -errno;
	have_podman = timedf(true, "podman --version") >= 0;
	r = make_image(&w);
	if (r >= 0 && have_podman)
		r = podman_image(&w);
	if (r < 0)
		goto out;
	if (have_podman) {
		log_info("podman: create, exec, checkpoint, restore, fork of %d ...", FORKS);
		measure_podman(&w, pod);
		podman_cleanup();
	} else {
		snprintf(pod->why, sizeof(pod->why), "podman is not installed");
	}
	r = start_supervisor(&w);
	if (r >= 0) {
		log_info("Belayer: create, exec, checkpoint, restore, fork of %d ...", FORKS);
		measure_belayer(&w, bel);
	}
	stop_supervisor(&w);
	if (json) {
		json_object *o = json_object_new_object();

		json_object_object_add(o, "rounds", json_object_new_int((int)w.rounds));
		json_object_object_add(o, "execs", json_object_new_int((int)w.execs));
		json_object_object_add(o, "belayer", side_json(bel, true));
		json_object_object_add(o, "podman", side_json(pod, have_podman));
		printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY));
		json_object_put(o);
	} else {
		printf("belayer-bench sandbox: one busybox image (httpd + sleep), %u rounds, %u "
		       "execs; "
		       "both through their CLIs, same run\n\n",
		       w.rounds, w.execs);
		printf("%-34s %12s %14s %10s   %s\n", "", "Belayer", "podman (runc)", "podman/B",
		       "goal (Belayer)");
		row("create from the cached image p50", pct(bel->create, bel->n_create, 0.5),
		    pct(pod->create, pod->n_create, 0.5), "<= 50 ms");
		row("exec `true` p50", pct(bel->exec, bel->n_exec, 0.5),
		    pct(pod->exec, pod->n_exec, 0.5), "<= 5 ms");
		row("exec `true` p99", pct(bel->exec, bel->n_exec, 0.99),
		    pct(pod->exec, pod->n_exec, 0.99), "");
		row("checkpoint, left running p50", pct(bel->ckpt, bel->n_ckpt, 0.5),
		    pct(pod->ckpt, pod->n_ckpt, 0.5), "");
		row("restore p50", pct(bel->restore, bel->n_restore, 0.5),
		    pct(pod->restore, pod->n_restore, 0.5), "");
		row("fork of 8, all running p50", pct(bel->fork8, bel->n_fork, 0.5),
		    pct(pod->fork8, pod->n_fork, 0.5), "<= 1000 ms");
		if (!bel->ok)
			printf("\nBelayer: %s\n", bel->why[0] ? bel->why : "did not run");
		if (!have_podman || !pod->ok)
			printf("podman: %s\n", pod->why[0] ? pod->why : "did not run");
		printf("\npodman's fork: checkpoint --leave-running --export, then 8 x container "
		       "restore --import --name.\n");
	}
	r = bel->ok ? 0 : -EIO;
out:
	if (have_podman)
		(void)timedf(true, "podman rmi -f %s", w.tag);
	if (!getenv("BELAYER_BENCH_KEEP"))
		(void)timedf(true, "rm -rf %s", w.dir);
	free(bel);
	free(pod);
	return r;
}
