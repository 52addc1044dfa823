/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench hang: a tensor-parallel engine (the stand-in, TP=2 and TP=4, on the emulated
 * GPU) loses a rank mid-run — SIGKILL, or SIGSTOP (alive, never joining the next collective) —
 * and the supervisor must detect it and bring a serving engine back (shadow promotion).
 * Reported: time to detection and time to a serving engine, against the 10 minutes a
 * PyTorch NCCL watchdog waits by default; and the cost of the NCCL progress counters on
 * decode throughput (the engine with tracking on vs BELAYER_NCCL_TRACK=0).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench-measure.h"
#include "bench-recovery.h"
#include "bench.h"
#include "log.h"
#include "util.h"

#define WATCHDOG_MS	  600000.0 /* TORCH_NCCL timeout default: 10 minutes */
#define WEIGHTS_BYTES	  (8u << 20)
#define OVERHEAD_ROUNDS	  6
#define OVERHEAD_REQUESTS 10

struct hang_case {
	unsigned tp;
	enum rec_fault fault;
	struct rec_case rc;
	int r;
};

/* Decode throughput (tokens/s over OVERHEAD_REQUESTS requests) of an engine already ready. */
static double throughput(uint16_t port)
{
	uint64_t t0 = rec_now_ns();

	for (int i = 0; i < OVERHEAD_REQUESTS; i++) {
		struct rec_answers a;

		if (rec_answers_get(port, &a) < 0)
			return -1;
	}
	return (double)OVERHEAD_REQUESTS * REC_NPROMPTS * REC_NEW_TOKENS /
	       (bench_ms_between(t0, rec_now_ns()) / 1000.0);
}

/* Two engines of one world, tracking on and off, measured alternately. */
static int overhead(const struct rec_paths *p, const char *wfile, unsigned tp, double *ret_on,
		    double *ret_off)
{
	struct rec_world w = {};
	struct rec_engine on = {.pid = -1, .pidfd = -1}, off = {.pid = -1, .pidfd = -1};
	double sum_on = 0, sum_off = 0;
	uint16_t p_on, p_off;
	int r;

	r = rec_free_port(&p_on);
	r = r ?: rec_free_port(&p_off);
	r = r ?: rec_world_open(&w, p, tp, WEIGHTS_BYTES, "");
	if (r < 0)
		return r;
	unsetenv("BELAYER_NCCL_TRACK");
	r = rec_engine_spawn(&w, p, wfile, p_on, &on);
	setenv("BELAYER_NCCL_TRACK", "0", 1);
	r = r ?: rec_engine_spawn(&w, p, wfile, p_off, &off);
	unsetenv("BELAYER_NCCL_TRACK");
	r = r ?: rec_engine_wait_ready(&on, REC_READY_MS, NULL);
	r = r ?: rec_engine_wait_ready(&off, REC_READY_MS, NULL);
	for (int i = 0; r == 0 && i < OVERHEAD_ROUNDS; i++) {
		double a = throughput(on.port), b = throughput(off.port);

		if (a < 0 || b < 0)
			r = -EIO;
		sum_on += a;
		sum_off += b;
	}
	*ret_on = sum_on / OVERHEAD_ROUNDS;
	*ret_off = sum_off / OVERHEAD_ROUNDS;
	rec_engine_kill(&on);
	rec_engine_kill(&off);
	rec_world_close(&w);
	return r;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: belayer-bench hang [--json] [--tp 2,4] [--hang-timeout MS]\n"
		"                          [--no-overhead | --overhead-only] [--build-dir DIR]\n"
		"  --hang-timeout  the supervisor's [nccl] hang_timeout (default: its default)\n");
}

int bench_hang(const struct bench_args *a, int argc, char **argv)
{
	static const struct option options[] = {
		{"json", no_argument, NULL, 'j'},
		{"tp", required_argument, NULL, 't'},
		{"hang-timeout", required_argument, NULL, 'H'},
		{"no-overhead", no_argument, NULL, 'n'},
		{"overhead-only", no_argument, NULL, 'o'},
		{"build-dir", required_argument, NULL, 'B'},
		{"help", no_argument, NULL, 'h'},
		{},
	};
	char dir[] = "/tmp/belayer-bench-hang.XXXXXX", wfile[64], ufile[64], extra[128] = "";
	const char *build = BENCH_BUILD_ROOT;
	unsigned tps[4] = {2, 4}, ntp = 2;
	struct hang_case cases[8];
	size_t n = 0;
	bool json = a->json, do_overhead = true, only_overhead = false;
	double on = 0, off = 0;
	struct rec_paths p = {};
	int c, r, ro = -1;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
		switch (c) {
		case 'j':
			json = true;
			break;
		case 't': {
			char *save = NULL, *copy = strdup(optarg);

			ntp = 0;
			for (char *t = strtok_r(copy, ",", &save); t && ntp < 4;
			     t = strtok_r(NULL, ",", &save))
				tps[ntp++] = (unsigned)strtoul(t, NULL, 10);
			free(copy);
			break;
		}
		case 'H':
			snprintf(extra, sizeof(extra), "\n[nccl]\nhang_timeout = %sms\n", optarg);
			break;
		case 'n':
			do_overhead = false;
			break;
		case 'o':
			only_overhead = true;
			break;
		case 'B':
			build = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return -EINVAL;
		}
	rec_paths_init(&p, a, build);
	if (access(p.engine, X_OK) < 0 || access(p.supervisor, X_OK) < 0)
		return log_error_errno(ENOENT, "%s or %s missing: build the tree with tests",
				       p.engine, p.supervisor);
	r = rec_guard_install();
	if (r < 0)
		return r;
	if (!mkdtemp(dir))
		return -errno;
	rec_guard_dir(dir);
	snprintf(wfile, sizeof(wfile), "%s/w.safetensors", dir);
	snprintf(ufile, sizeof(ufile), "%s/u.safetensors", dir);
	r = rec_gen_weights(&p, wfile, WEIGHTS_BYTES, 1);
	r = r ?: rec_gen_weights(&p, ufile, WEIGHTS_BYTES, 2);
	for (unsigned t = 0; r == 0 && !only_overhead && t < ntp; t++)
		for (int f = 0; f < 2; f++) {
			struct hang_case *hc = &cases[n++];

			*hc = (struct hang_case){.tp = tps[t], .fault = f};
			hc->rc = (struct rec_case){.bytes = WEIGHTS_BYTES, .tp = tps[t]};
			fprintf(stderr, "hang: TP=%u, one rank %s\n", tps[t],
				f == REC_FAULT_KILL ? "killed" : "stopped");
			hc->r = rec_run_shadow_fault(&p, wfile, ufile, "sampled", f, extra,
						     &hc->rc);
		}
	if (r == 0 && do_overhead) {
		fprintf(stderr, "hang: counters' overhead on decode throughput (TP=2)\n");
		ro = overhead(&p, wfile, 2, &on, &off);
	}
	unlink(wfile);
	unlink(ufile);
	rmdir(dir);
	rec_guard_dir(NULL);
	if (r < 0)
		return log_error_errno(r, "Failed to generate weights: %m");

	if (json) {
		printf("{\"watchdog_ms\": %.0f, \"cases\": [", WATCHDOG_MS);
		for (size_t i = 0; i < n; i++) {
			const struct hang_case *hc = &cases[i];

			printf("%s{\"tp\": %u, \"fault\": \"%s\", \"ok\": %s, \"detect_ms\": %.1f, "
			       "\"serving_ms\": %.1f, \"promoted\": %s, \"note\": \"%s\"}",
			       i ? ", " : "", hc->tp, hc->fault == REC_FAULT_KILL ? "kill" : "stop",
			       hc->r == 0 && hc->rc.ok ? "true" : "false", hc->rc.ph[PH_DETECT],
			       hc->rc.total_ms, hc->rc.note[0] ? "false" : "true", hc->rc.note);
		}
		printf("], \"overhead\": {\"measured\": %s, \"tokens_per_s_tracked\": %.1f, "
		       "\"tokens_per_s_untracked\": %.1f, \"overhead_pct\": %.2f}}\n",
		       ro == 0 ? "true" : "false", on, off, off > 0 ? (off - on) / off * 100 : 0);
	} else {
		printf("NCCL rank failure: detection and time to a serving engine (watchdog "
		       "default "
		       "%.0f s)\n",
		       WATCHDOG_MS / 1000);
		printf("  %-4s %-6s %12s %14s %10s  %s\n", "TP", "fault", "detect (ms)",
		       "serving (ms)", "vs 10 min", "note");
		for (size_t i = 0; i < n; i++) {
			const struct hang_case *hc = &cases[i];
			bool ok = hc->r == 0 && hc->rc.ok;

			printf("  %-4u %-6s %12.1f %14.1f %9.0fx  %s\n", hc->tp,
			       hc->fault == REC_FAULT_KILL ? "kill" : "stop",
			       ok ? hc->rc.ph[PH_DETECT] : -1, ok ? hc->rc.total_ms : -1,
			       ok && hc->rc.total_ms > 0 ? WATCHDOG_MS / hc->rc.total_ms : 0,
			       hc->rc.note[0] ? hc->rc.note : (ok ? "promoted" : "failed"));
		}
		if (ro == 0)
			printf("Counters' overhead, TP=2 decode: %.1f tokens/s tracked, %.1f "
			       "untracked: %.2f%% (target <= 1%%)\n",
			       on, off, off > 0 ? (off - on) / off * 100 : 0);
		else if (do_overhead)
			printf("Counters' overhead: not measured (%s)\n", strerror(-ro));
	}
	for (size_t i = 0; i < n; i++)
		if (cases[i].r < 0 || !cases[i].rc.ok)
			return -EIO;
	return 0;
}
