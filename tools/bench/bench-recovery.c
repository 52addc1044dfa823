/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench recovery: time to ready after a worker is killed, cold restart vs shadow
 * promotion, on the engine stand-in over the emulated GPU, for several weights sizes and TP
 * degrees, side by side in one run.
 *
 * Every case runs in a fresh world (temporary directory, emulated GPU state, supervisor):
 * the engine group starts under libbelayer.so from weights file W (seed 1), answers the fixed
 * prompts (version 0), takes an RL-style weight update from file U (seed 2) and answers again
 * (version 1: the "pre-failure" answers), then its last rank is SIGKILLed.
 *
 * "Ready" is the same on every path: GET /health on the group's serving port answers 200 and
 * then a first /generate returned, timed from the SIGKILL. Phases (ms):
 *   detect   SIGKILL -> the death seen through a pidfd
 *   owner    the group's surviving ranks killed and gone (NCCL groups cannot be half-recovered)
 *   health, content, layout, remap   promotion only: GPU health, weights checksums (verify =
 *            sampled or full), layout hash, the shadow mapping the retained memory
 *   canary   promotion only: the promoted group's answer to the canary prompt compared with
 *            the primary's at the same weights version (supervisor-canary.h)
 *   load     cold only: the new engine's start to its /health answering 200 (CUDA, NCCL,
 *            weight load from the file, KV, warm-up)
 *   ready    the rest: -> /health 200 -> the first /generate returned
 * Then the answers are asked again and compared with the pre-failure ones: a promoted group
 * holds the latest weights (version 1); a cold restart from the file answers as version 0.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-measure.h"
#include "bench-recovery.h"
#include "bench.h"
#include "log.h"
#include "util.h"

static const char *const path_names[PATH_COUNT] = {"cold restart", "shadow, sampled",
						   "shadow, full"};
static const char *const path_keys[PATH_COUNT] = {"cold", "shadow_sampled", "shadow_full"};

struct rec_opts {
	uint64_t sizes[REC_MAX_SIZES];
	size_t nsizes;
	unsigned tps[REC_MAX_TP];
	size_t ntps;
	const char *plot;
	bool quick;
	bool paths[PATH_COUNT];
};

static int parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'K':
	case 'k':
		v <<= 10;
		end++;
		break;
	case 'M':
	case 'm':
		v <<= 20;
		end++;
		break;
	case 'G':
	case 'g':
		v <<= 30;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' && end[1] == 'B')
		end += 2;
	if (*end || v < (4u << 20) || v > (64ull << 30))
		return -EINVAL;
	*ret = v;
	return 0;
}

static void fmt_size(uint64_t b, char *buf, size_t n)
{
	if (b >= (1ull << 30) && b % (1ull << 30) == 0)
		snprintf(buf, n, "%" PRIu64 " GiB", b >> 30);
	else
		snprintf(buf, n, "%" PRIu64 " MiB", b >> 20);
}

/* Starts the primary, records pre- and post-update answers. */
int rec_start_primary(const struct rec_world *w, const struct rec_paths *p, const char *wfile,
		      const char *ufile, struct rec_engine *e, struct rec_answers *v0,
		      struct rec_answers *v1)
{
	uint16_t port;
	int r;

	r = rec_free_port(&port);
	r = r ?: rec_engine_spawn(w, p, wfile, port, e);
	if (r < 0)
		return r;
	r = rec_engine_wait_ready(e, REC_READY_MS, NULL);
	if (r < 0)
		return log_error_errno(r, "The primary did not become ready (%s/engine.log): %m",
				       w->dir);
	r = rec_answers_get(port, v0);
	r = r ?: rec_update_weights(port, ufile);
	r = r ?: rec_answers_get(port, v1);
	if (r < 0)
		return log_error_errno(r, "Serving or updating the primary failed: %m");
	if (rec_answers_equal(v0, v1))
		return log_error_errno(EPROTO, "The weight update did not change the answers");
	return 0;
}

/* SIGKILLs rank `victim`, then the rest of the group; times detect and owner. */
static int kill_group(struct rec_engine *e, unsigned tp, unsigned victim, uint64_t *t_kill,
		      uint64_t *t_detect, uint64_t *t_owner)
{
	int fds[REC_MAX_TP];
	pid_t pids[REC_MAX_TP];
	int r = 0;

	for (unsigned i = 0; i < tp; i++) {
		pids[i] = rec_engine_rank_pid(e, i);
		fds[i] = pids[i] > 0 ? rec_pidfd_open(pids[i]) : -1;
		if (fds[i] < 0)
			r = log_error_errno(ESRCH, "Rank %u of the engine is not running", i);
	}
	if (r == 0) {
		*t_kill = rec_now_ns();
		(void)kill(pids[victim], SIGKILL);
		r = rec_pidfd_wait(fds[victim], 10000);
		*t_detect = rec_now_ns();
		/* As the supervisor's owner check: every other rank is stopped and gone. */
		for (unsigned i = 0; r == 0 && i < tp; i++)
			(void)kill(pids[i], SIGKILL);
		for (unsigned i = 0; r == 0 && i < tp; i++)
			r = rec_pidfd_wait(fds[i], 10000);
		*t_owner = rec_now_ns();
	}
	for (unsigned i = 0; i < tp; i++)
		safe_close(fds[i]);
	rec_engine_kill(e);
	return r;
}

static int run_cold(const struct rec_paths *p, const char *wfile, const char *ufile,
		    struct rec_case *c)
{
	struct rec_world w = {};
	struct rec_engine e = {.pid = -1, .pidfd = -1}, cold = {.pid = -1, .pidfd = -1};
	struct rec_answers v0 = {}, v1 = {}, after = {};
	uint64_t t_kill = 0, t_detect = 0, t_owner = 0, t_spawn, t_health = 0, t_ready;
	int r;

	r = rec_world_open(&w, p, c->tp, c->bytes, NULL);
	r = r ?: rec_start_primary(&w, p, wfile, ufile, &e, &v0, &v1);
	r = r ?: kill_group(&e, c->tp, c->tp - 1, &t_kill, &t_detect, &t_owner);
	if (r < 0)
		goto out;
	/* The engine's cold-start command, as a supervisor without a shadow would run it. */
	t_spawn = rec_now_ns();
	r = rec_engine_spawn(&w, p, wfile, e.port, &cold);
	r = r ?: rec_engine_wait_ready(&cold, REC_READY_MS, &t_health);
	t_ready = rec_now_ns();
	if (r < 0) {
		log_error_errno(r, "The cold restart did not become ready (%s/engine.log): %m",
				w.dir);
		goto out;
	}
	for (int i = 0; i < PH_COUNT; i++)
		c->ph[i] = -1;
	c->ph[PH_DETECT] = bench_ms_between(t_kill, t_detect);
	c->ph[PH_OWNER] = bench_ms_between(t_detect, t_owner);
	c->ph[PH_LOAD] = bench_ms_between(t_owner, t_health);
	c->ph[PH_READY] = bench_ms_between(t_health, t_ready);
	c->total_ms = bench_ms_between(t_kill, t_ready);
	(void)t_spawn;
	r = rec_answers_get(cold.port, &after);
	if (r < 0)
		goto out;
	c->equal_prefailure = rec_answers_equal(&after, &v1);
	c->equal_v0 = rec_answers_equal(&after, &v0);
	c->version_after = after.weights_version;
	c->ok = true;
out:
	if (r < 0)
		snprintf(c->note, sizeof(c->note), "failed: %s", strerror(-r));
	rec_engine_kill(&cold);
	rec_engine_kill(&e);
	rec_world_close(&w);
	return r;
}

static void print_table(const struct rec_case *cases, size_t n)
{
	printf("%-8s %-3s %-16s", "weights", "tp", "path");
	for (int i = 0; i < PH_COUNT; i++)
		printf(" %8s", rec_phase_names[i]);
	printf(" %10s %8s %14s  %s\n", "ready_ms", "speedup", "shadow_dev/host",
	       "answers after recovery");
	for (size_t i = 0; i < n; i++) {
		const struct rec_case *c = &cases[i], *cold = c - c->path;
		char sz[32];

		if (!c->ran)
			continue;
		fmt_size(c->bytes, sz, sizeof(sz));
		printf("%-8s %-3u %-16s", sz, c->tp, path_names[c->path]);
		if (!c->ok) {
			printf("  %s\n", c->note);
			continue;
		}
		for (int k = 0; k < PH_COUNT; k++)
			if (c->ph[k] < 0)
				printf(" %8s", "-");
			else
				printf(" %8.1f", c->ph[k]);
		printf(" %10.1f", c->total_ms);
		if (cold->ok && c->total_ms > 0)
			printf(" %7.1fx", cold->total_ms / c->total_ms);
		else
			printf(" %8s", "-");
		/* One parked shadow rank: device MiB / host MiB (Pss without the emulator's device
		 * memory, which is shared memory here). */
		if (c->path != PATH_COLD && c->shadow_device >= 0 && c->shadow_pss >= 0)
			printf(" %6.1f/%-7.1f", (double)c->shadow_device / (1 << 20),
			       (double)(c->shadow_pss - MAX(c->shadow_shmem, 0)) / (1 << 20));
		else
			printf(" %14s", "-");
		printf("  %s%s%s\n",
		       c->equal_prefailure ? "= pre-failure (latest weights, v1)"
		       : c->equal_v0	   ? "= v0 file weights, NOT pre-failure (v1)"
					   : "differ from v0 and v1",
		       c->note[0] ? "; " : "", c->note);
	}
}

static const struct rec_case *find(const struct rec_case *cases, size_t n, uint64_t bytes,
				   unsigned tp, enum rec_path path)
{
	for (size_t i = 0; i < n; i++)
		if (cases[i].bytes == bytes && cases[i].tp == tp && cases[i].path == path &&
		    cases[i].ran && cases[i].ok)
			return &cases[i];
	return NULL;
}

/* gnuplot: time to ready vs weights size, one line per path and TP. */
static int plot(const struct rec_opts *o, const struct rec_case *cases, size_t n, const char *png)
{
	struct rec_plot pl;
	FILE *f;
	int r = rec_plot_open(&pl);

	if (r < 0)
		return r;
	f = pl.data;
	for (size_t s = 0; s < o->nsizes; s++) {
		fprintf(f, "%.1f", (double)o->sizes[s] / (1 << 20));
		for (size_t t = 0; t < o->ntps; t++)
			for (int pth = 0; pth < PATH_COUNT; pth++) {
				const struct rec_case *c =
					find(cases, n, o->sizes[s], o->tps[t], pth);
				if (c)
					fprintf(f, " %.3f", c->total_ms);
				else
					fprintf(f, " NaN");
			}
		fputc('\n', f);
	}
	f = pl.script;
	fprintf(f,
		"set terminal pngcairo size 900,560 noenhanced\n"
		"set output '%s'\n"
		"set title 'Belayer: time to ready after a worker is killed (engine stand-in, "
		"emulated GPU)'\n"
		"set xlabel 'weights size (MiB)'\nset ylabel 'time to ready (ms)'\n"
		"set logscale xy\nset grid\nset key outside right\nset datafile missing 'NaN'\n"
		"plot ",
		png);
	for (size_t t = 0, col = 2; t < o->ntps; t++)
		for (int pth = 0; pth < PATH_COUNT; pth++, col++)
			fprintf(f, "%s'%s' using 1:%zu with linespoints lw 2 title '%s, TP=%u'",
				col == 2 ? "" : ", ", pl.dat, col, path_names[pth], o->tps[t]);
	fputc('\n', f);
	return rec_plot_run(&pl);
}

static int print_json(const struct rec_opts *o, const struct rec_case *cases, size_t n,
		      const char *summary_size, double speedup, const char *png)
{
	struct json_object *root = json_object_new_object(), *arr = json_object_new_array();

	(void)o;
	json_object_object_add(root, "ready_definition",
			       json_object_new_string("GET /health 200 then the first /generate "
						      "returned, timed from the SIGKILL"));
	for (size_t i = 0; i < n; i++) {
		const struct rec_case *c = &cases[i];
		struct json_object *e, *ph;

		if (!c->ran)
			continue;
		e = json_object_new_object();
		ph = json_object_new_object();
		json_object_object_add(e, "weights_bytes", json_object_new_uint64(c->bytes));
		json_object_object_add(e, "tp", json_object_new_int((int)c->tp));
		json_object_object_add(e, "path", json_object_new_string(path_keys[c->path]));
		json_object_object_add(e, "ok", json_object_new_boolean(c->ok));
		if (!c->ok) {
			json_object_object_add(e, "error", json_object_new_string(c->note));
		} else {
			for (int k = 0; k < PH_COUNT; k++)
				if (c->ph[k] >= 0)
					json_object_object_add(ph, rec_phase_names[k],
							       json_object_new_double(c->ph[k]));
			json_object_object_add(e, "ready_ms", json_object_new_double(c->total_ms));
			json_object_object_add(e, "answers_equal_prefailure",
					       json_object_new_boolean(c->equal_prefailure));
			json_object_object_add(e, "answers_equal_v0",
					       json_object_new_boolean(c->equal_v0));
			json_object_object_add(e, "weights_version_after",
					       json_object_new_int64(c->version_after));
			if (c->path != PATH_COLD && c->shadow_device >= 0) {
				struct json_object *sh = json_object_new_object();

				json_object_object_add(sh, "device_bytes",
						       json_object_new_int64(c->shadow_device));
				json_object_object_add(sh, "rss_bytes",
						       json_object_new_int64(c->shadow_rss));
				json_object_object_add(sh, "pss_bytes",
						       json_object_new_int64(c->shadow_pss));
				json_object_object_add(sh, "pss_shmem_bytes",
						       json_object_new_int64(c->shadow_shmem));
				json_object_object_add(e, "parked_shadow_rank", sh);
			}
		}
		json_object_object_add(e, "phases_ms", ph);
		json_object_array_add(arr, e);
	}
	json_object_object_add(root, "cases", arr);
	json_object_object_add(root, "summary_weights", json_object_new_string(summary_size));
	json_object_object_add(root, "speedup",
			       speedup > 0 ? json_object_new_double(speedup) : NULL);
	json_object_object_add(root, "plot", png ? json_object_new_string(png) : NULL);
	puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY));
	json_object_put(root);
	return 0;
}

static int parse_list(const char *arg, bool sizes, struct rec_opts *o)
{
	_cleanup_free_ char *copy = strdup(arg);
	char *save = NULL;

	if (!copy)
		return -ENOMEM;
	if (sizes)
		o->nsizes = 0;
	else
		o->ntps = 0;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (sizes) {
			if (o->nsizes == REC_MAX_SIZES || parse_size(t, &o->sizes[o->nsizes]) < 0)
				return -EINVAL;
			o->nsizes++;
		} else {
			char *end;
			unsigned long v = strtoul(t, &end, 10);

			if (*end || v < 1 || v > 2 || o->ntps == REC_MAX_TP)
				return -EINVAL;
			o->tps[o->ntps++] = (unsigned)v;
		}
	}
	return (sizes ? o->nsizes : o->ntps) ? 0 : -EINVAL;
}

static int parse_paths(const char *arg, bool *ret)
{
	_cleanup_free_ char *copy = strdup(arg);
	static const char *const keys[PATH_COUNT] = {"cold", "sampled", "full"};
	char *save = NULL;
	bool any = false;

	if (!copy)
		return -ENOMEM;
	memset(ret, 0, PATH_COUNT * sizeof(*ret));
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int k = 0;

		while (k < PATH_COUNT && strcmp(keys[k], t) != 0)
			k++;
		if (k == PATH_COUNT)
			return -EINVAL;
		ret[k] = any = true;
	}
	return any ? 0 : -EINVAL;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: belayer-bench recovery [--json] [--sizes 256M,1G,4G] [--tp 1,2]\n"
		"                              [--quick] [--plot FILE.png] [--build-dir DIR]\n"
		"                              [--paths cold,sampled,full] [--timeout SEC]\n"
		"  --quick      CI size: 8M,32M at TP 1,2 (and --timeout 200 unless given)\n"
		"  --timeout    bound on the whole run: a step still waiting then fails with its\n"
		"               reason (default: none beyond each step's own bound)\n"
		"  --plot       where the PNG goes (default ./belayer-bench-recovery.png)\n"
		"  --build-dir  build tree holding the engine stand-in and the supervisor\n");
}

int bench_recovery(const struct bench_args *a, int argc, char **argv)
{
	static const struct option options[] = {
		{"json", no_argument, NULL, 'j'},
		{"sizes", required_argument, NULL, 's'},
		{"tp", required_argument, NULL, 't'},
		{"quick", no_argument, NULL, 'q'},
		{"plot", required_argument, NULL, 'p'},
		{"build-dir", required_argument, NULL, 'B'},
		{"paths", required_argument, NULL, 'P'},
		{"timeout", required_argument, NULL, 'T'},
		{"help", no_argument, NULL, 'h'},
		{},
	};
	struct rec_opts o = {.sizes = {256ull << 20, 1ull << 30, 4ull << 30},
			     .nsizes = 3,
			     .tps = {1, 2},
			     .ntps = 2,
			     .plot = "belayer-bench-recovery.png",
			     .paths = {true, true, true}};
	const char *build = BENCH_BUILD_ROOT;
	bool sizes_set = false, tps_set = false;
	long timeout_s = -1;
	struct rec_paths p = {};
	struct rec_case *cases;
	size_t n = 0;
	int c, r = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
		switch (c) {
		case 'j':
			break;
		case 's':
			sizes_set = true;
			if (parse_list(optarg, true, &o) < 0) {
				fprintf(stderr, "recovery: bad --sizes '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		case 't':
			tps_set = true;
			if (parse_list(optarg, false, &o) < 0) {
				fprintf(stderr, "recovery: bad --tp '%s' (1 or 2)\n", optarg);
				return -EINVAL;
			}
			break;
		case 'q':
			o.quick = true;
			break;
		case 'p':
			o.plot = optarg;
			break;
		case 'B':
			build = optarg;
			break;
		case 'P':
			if (parse_paths(optarg, o.paths) < 0) {
				fprintf(stderr, "recovery: bad --paths '%s' (cold,sampled,full)\n",
					optarg);
				return -EINVAL;
			}
			break;
		case 'T': {
			char *end;

			errno = 0;
			timeout_s = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || timeout_s < 0 || timeout_s > 86400) {
				fprintf(stderr, "recovery: bad --timeout '%s' (seconds)\n", optarg);
				return -EINVAL;
			}
			break;
		}
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return -EINVAL;
		}
	}
	/* CI's quick run fails with a reason well within its callers' limits (meson: 300 s,
	 * tests/gpu/run.sh: 240 s) instead of being killed by them mid-wait. */
	if (timeout_s < 0)
		timeout_s = o.quick ? REC_QUICK_TIMEOUT_S : 0;
	rec_deadline_set((unsigned)timeout_s);
	if (o.quick && !sizes_set) {
		o.sizes[0] = 8u << 20;
		o.sizes[1] = 32u << 20;
		o.nsizes = 2;
	}
	(void)tps_set;
	rec_paths_init(&p, a, build);
	if (access(p.engine, X_OK) < 0 || access(p.supervisor, X_OK) < 0)
		return log_error_errno(
			ENOENT, "%s or %s missing: build the tree with tests (or --build-dir)",
			p.engine, p.supervisor);

	r = rec_guard_install();
	if (r < 0)
		return log_error_errno(r, "Failed to install the signal handlers: %m");
	cases = calloc(o.nsizes * o.ntps * PATH_COUNT, sizeof(*cases));
	if (!cases)
		return -ENOMEM;
	bool shadow = rec_shadow_supported(&p);
	if (!shadow)
		log_warning("This supervisor cannot promote shadows yet: cold restarts only.");

	for (size_t s = 0; s < o.nsizes; s++) {
		const char *tmp = getenv("TMPDIR");
		char dir[4096], wfile[4200], ufile[4200], sz[32];

		/* Where the worlds are too ($TMPDIR): a run's files stay together. */
		fmt_size(o.sizes[s], sz, sizeof(sz));
		snprintf(dir, sizeof(dir), "%s/belayer-bench-weights.XXXXXX", tmp ? tmp : "/tmp");
		if (!mkdtemp(dir)) {
			r = -errno;
			break;
		}
		rec_guard_dir(dir);
		snprintf(wfile, sizeof(wfile), "%s/w.safetensors", dir);
		snprintf(ufile, sizeof(ufile), "%s/u.safetensors", dir);
		fprintf(stderr,
			"recovery: %s: generating weights (seed 1, and seed 2 for the update)\n",
			sz);
		r = rec_gen_weights(&p, wfile, o.sizes[s], 1);
		r = r ?: rec_gen_weights(&p, ufile, o.sizes[s], 2);
		for (size_t t = 0; r == 0 && t < o.ntps; t++)
			for (int pth = 0; pth < PATH_COUNT; pth++) {
				struct rec_case *cs = &cases[n++];

				*cs = (struct rec_case){.bytes = o.sizes[s],
							.tp = o.tps[t],
							.path = pth,
							.shadow_device = -1,
							.shadow_rss = -1,
							.shadow_pss = -1,
							.shadow_shmem = -1};
				if (!o.paths[pth])
					continue;
				if (pth != PATH_COLD && !shadow) {
					cs->ran = true;
					snprintf(cs->note, sizeof(cs->note),
						 "n/a: supervisor without shadow promotion");
					continue;
				}
				fprintf(stderr, "recovery: %s TP=%u %s\n", sz, o.tps[t],
					path_names[pth]);
				cs->ran = true;
				if (pth == PATH_COLD)
					(void)run_cold(&p, wfile, ufile, cs);
				else
					(void)rec_run_shadow(&p, wfile, ufile,
							     pth == PATH_FULL ? "full" : "sampled",
							     cs);
			}
		unlink(wfile);
		unlink(ufile);
		rmdir(dir);
		rec_guard_dir(NULL);
		if (r < 0) {
			log_error_errno(r, "Failed to generate %s of weights: %m", sz);
			break;
		}
	}

	/* The summary: the largest size at the largest TP, verify = sampled. */
	uint64_t big = o.sizes[0];
	unsigned tpmax = o.tps[0];
	for (size_t s = 1; s < o.nsizes; s++)
		big = MAX(big, o.sizes[s]);
	for (size_t t = 1; t < o.ntps; t++)
		tpmax = MAX(tpmax, o.tps[t]);
	const struct rec_case *cc = find(cases, n, big, tpmax, PATH_COLD),
			      *cp = find(cases, n, big, tpmax, PATH_SAMPLED);
	double speedup = cc && cp && cp->total_ms > 0 ? cc->total_ms / cp->total_ms : 0;
	char bigs[32], png[PATH_MAX] = "";
	fmt_size(big, bigs, sizeof(bigs));

	if (r == 0) {
		char *abs = realpath(".", NULL);

		if (o.plot[0] == '/' || !abs)
			snprintf(png, sizeof(png), "%s", o.plot);
		else
			snprintf(png, sizeof(png), "%s/%s", abs, o.plot);
		free(abs);
		if (plot(&o, cases, n, png) < 0) {
			log_warning(
				"gnuplot failed (tools/dev setup installs gnuplot-nox): no plot");
			png[0] = '\0';
		}
	}
	if (a->json) {
		print_json(&o, cases, n, bigs, speedup, png[0] ? png : NULL);
	} else {
		printf("recovery: the engine stand-in on the emulated GPU under libbelayer.so; the "
		       "last rank is SIGKILLed after a weight update (v0 -> v1).\n"
		       "ready = GET /health 200, then the first /generate returned, timed from the "
		       "SIGKILL; phases in ms\n\n");
		print_table(cases, n);
		printf("\nshadow_dev/host: what one parked shadow rank held before the kill "
		       "(belayerctl workers), MiB: device memory (NVML per process; the emulator: "
		       "the allocations it maps) / host Pss without that device memory. The "
		       "Belayer "
		       "paper reports 1.84 GB per shadow on a real GPU: a vLLM worker's CUDA "
		       "context "
		       "(~500 MB), NCCL buffers, cuBLAS workspace and CUDA-graph pools, none of "
		       "which "
		       "the stand-in on the emulator has.\n\n");
		if (png[0])
			printf("plot: %s\n", png);
		if (speedup > 0)
			printf("recovery speedup at %s, TP=%u: %.1fx\n", bigs, tpmax, speedup);
		else
			printf("recovery speedup at %s, TP=%u: n/a (%s)\n", bigs, tpmax,
			       !shadow ? "no shadow promotion in this build"
			       : !cc   ? "no cold restart measured there"
				       : "no promotion measured there");
	}
	/*
	 * The exit status (CI runs --quick): every cold case measured; with a supervisor that
	 * promotes, every shadow case promoted and answering exactly the pre-failure answers.
	 */
	for (size_t i = 0; i < n; i++) {
		const struct rec_case *k = &cases[i];

		if (!k->ran || (k->path != PATH_COLD && !shadow))
			continue;
		if (!k->ok || (k->path != PATH_COLD && (k->note[0] || !k->equal_prefailure)))
			r = r ?: -EIO;
	}
	if (rec_deadline_passed()) {
		log_error("The run's --timeout of %ld s ran out: the steps still waiting then "
			  "failed (above)",
			  timeout_s);
		r = r ?: -ETIMEDOUT;
	}
	free(cases);
	return r;
}
