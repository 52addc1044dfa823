/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench resume: in-flight requests across a worker failure (issue 8).
 *
 * N concurrent streaming /generate requests of long prompts run against the engine stand-in on
 * the emulated GPU; halfway through, the primary is SIGKILLed.
 *   belayer: through the supervisor's gateway, with a parked shadow: promotion, then every
 *            stream resumed by re-prefilling prompt + generated-so-far.
 *   cold:    straight to the engine, no shadow: the supervisor cold-restarts it, each client
 *            retries its request from scratch once the port answers again.
 * Per path: time from the kill to the first token after it (per client: the end of the longest
 * gap in its stream after the kill; median and max over clients) and the time until every
 * request completed, against the same path's failure-free run. Then the gateway's cost on a
 * failure-free engine: per-request latency (sequential small requests) and streaming
 * throughput, through the gateway and straight to the engine.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-measure.h"
#include "bench-recovery.h"
#include "bench.h"
#include "engine-client.h"
#include "log.h"
#include "util.h"

#define MAX_CLIENTS 256
#define MAX_EVENTS  1024

struct client {
	pthread_t t;
	uint16_t port;
	const char *body;
	bool retry; /* from scratch after a failure (the cold path's client) */
	uint64_t t_ev[MAX_EVENTS];
	int n_ev;
	uint64_t t_done;
	int tries;
	bool ok;
};

struct opts {
	int clients, prompt, tokens, small;
	bool quick, json;
};

/* One attempt: the events' arrival times appended to c; 1 when the stream ended with [DONE]. */
static int stream_once(struct client *c)
{
	char head[256], buf[65536], tail[8] = "";
	size_t n = strlen(c->body);
	int fd = client_connect(c->port), done = 0;

	if (fd < 0)
		return fd;
	snprintf(head, sizeof(head),
		 "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
		 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
		 n);
	if (send(fd, head, strlen(head), MSG_NOSIGNAL) < 0 ||
	    send(fd, c->body, n, MSG_NOSIGNAL) < 0) {
		close(fd);
		return -EIO;
	}
	for (;;) {
		ssize_t k = recv(fd, buf, sizeof(buf) - 1, 0);
		uint64_t t = rec_now_ns();

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		buf[k] = 0;
		/* events are small: count their starts in this read (and one split across reads,
		 * through the last bytes of the previous one) */
		for (char *p = buf; (p = strstr(p, "data: ")); p += 6) {
			if (strncmp(p + 6, "[DONE]", 6) == 0)
				done = 1;
			else if (strstr(p, "\"error\"") && strstr(p, "\"error\"") < strstr(p, "\n"))
				done = -1;
			else if (c->n_ev < MAX_EVENTS)
				c->t_ev[c->n_ev++] = t;
		}
		(void)tail;
	}
	close(fd);
	return done;
}

static void *client_run(void *arg)
{
	struct client *c = arg;

	for (c->tries = 1;; c->tries++) {
		int r = stream_once(c);

		if (r == 1) {
			c->ok = true;
			break;
		}
		if (!c->retry || c->tries > 2000)
			break;
		/* the client-side retry: from scratch, once something answers again */
		c->n_ev = 0;
		(void)poll(NULL, 0, 10);
	}
	c->t_done = rec_now_ns();
	return NULL;
}

static char *prompt_body(int i, int prompt, int tokens)
{
	size_t cap = (size_t)prompt * 8 + 256, o;
	char *b = malloc(cap);

	if (!b)
		return NULL;
	o = (size_t)snprintf(b, cap, "{\"input_ids\":[");
	for (int k = 0; k < prompt; k++)
		o += (size_t)snprintf(b + o, cap - o, "%s%d", k ? "," : "",
				      (i * 7919 + k * 104729) % 500 + 1);
	snprintf(b + o, cap - o,
		 "],\"sampling_params\":{\"max_new_tokens\":%d,\"temperature\":0},\"stream\":true}",
		 tokens);
	return b;
}

struct run {
	double total_ms, first_after_med_ms, first_after_max_ms, tok_per_s;
	int ok, retries;
};

/* Runs n clients against port; kill_after_ms >= 0: SIGKILLs victim that long after the start. */
static int run_clients(struct client *cl, char **bodies, int n, uint16_t port, bool retry,
		       int kill_after_ms, pid_t victim, struct run *ret)
{
	uint64_t t0 = rec_now_ns(), t_kill = 0, t_end = 0;
	double gaps[MAX_CLIENTS];
	int ng = 0, tokens = 0;

	for (int i = 0; i < n; i++) {
		cl[i] = (struct client){.port = port, .body = bodies[i], .retry = retry};
		if (pthread_create(&cl[i].t, NULL, client_run, &cl[i]) != 0)
			return -EAGAIN;
	}
	if (kill_after_ms >= 0) {
		(void)poll(NULL, 0, kill_after_ms);
		t_kill = rec_now_ns();
		(void)kill(victim, SIGKILL);
	}
	*ret = (struct run){0};
	for (int i = 0; i < n; i++) {
		(void)pthread_join(cl[i].t, NULL);
		ret->ok += cl[i].ok;
		ret->retries += cl[i].tries - 1;
		tokens += cl[i].n_ev;
		if (cl[i].t_done > t_end)
			t_end = cl[i].t_done;
		if (t_kill) {
			/* the first token after the kill: the end of the longest gap after it */
			uint64_t best = 0, at = 0;

			for (int k = 0; k < cl[i].n_ev; k++) {
				uint64_t prev = k ? cl[i].t_ev[k - 1] : t0;

				if (cl[i].t_ev[k] > t_kill &&
				    cl[i].t_ev[k] - MAX(prev, t_kill) > best) {
					best = cl[i].t_ev[k] - MAX(prev, t_kill);
					at = cl[i].t_ev[k];
				}
			}
			if (at)
				gaps[ng++] = bench_ms_between(t_kill, at);
		}
	}
	ret->total_ms = bench_ms_between(t0, t_end);
	ret->tok_per_s = ret->total_ms > 0 ? tokens / (ret->total_ms / 1000.0) : 0;
	if (ng) {
		qsort(gaps, (size_t)ng, sizeof(gaps[0]), bench_cmp_double);
		ret->first_after_med_ms = gaps[ng / 2];
		ret->first_after_max_ms = gaps[ng - 1];
	}
	return 0;
}

/* Sequential small requests: mean latency in µs. */
static double seq_latency_us(uint16_t port, int n)
{
	static const char body[] = "{\"input_ids\":[1,2,3,4,5,6,7,8],\"sampling_params\":"
				   "{\"max_new_tokens\":1,\"temperature\":0},\"stream\":true}";
	struct client c = {.port = port, .body = body};
	uint64_t t0 = rec_now_ns();

	for (int i = 0; i < n; i++) {
		c.n_ev = 0;
		if (stream_once(&c) != 1)
			return -1;
	}
	return bench_ms_between(t0, rec_now_ns()) * 1000.0 / n;
}

/* The engine process serving on port: argv holds "--port" then the port (the supervisor's
 * /bin/sh wrapper, if any, holds the command as one string and does not match). */
static pid_t primary_pid(uint16_t port)
{
	char want[32], path[64], line[8192];
	struct dirent *d;
	pid_t found = 0;
	size_t wl;
	DIR *dir = opendir("/proc");

	if (!dir)
		return 0;
	wl = (size_t)snprintf(want, sizeof(want), "--port%c%u%c", 0, port, 0);
	while (!found && (d = readdir(dir))) {
		pid_t pid = atoi(d->d_name);
		FILE *f;
		size_t k;

		if (pid <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
		f = fopen(path, "re");
		if (!f)
			continue;
		k = fread(line, 1, sizeof(line) - 1, f);
		fclose(f);
		if (k && memmem(line, k, want, wl) && strstr(line, "belayer-test-engine"))
			found = pid;
	}
	closedir(dir);
	return found;
}

struct path_result {
	struct run free, failed;
	int kill_ms;
};

static int one_path(const struct rec_paths *p, const char *wfile, const struct opts *o,
		    bool belayer, char **bodies, struct client *cl, struct path_result *res,
		    struct run *direct, struct run *via, double *lat_direct, double *lat_gw)
{
	struct rec_world w = {};
	uint16_t port, sport, gport;
	char config[12000];
	pid_t victim;
	int r;

	r = rec_free_port(&port);
	r = r ?: rec_free_port(&sport);
	r = r ?: rec_free_port(&gport);
	if (r < 0)
		return r;
	snprintf(config, sizeof(config),
		 "[engine.bench]\n"
		 "primary = %s --model %s --port {port} --kv-cache-bytes 64M\n"
		 "%s%s%s%s%s"
		 "env = LD_PRELOAD=%s\n"
		 "port = %u\nshadow_port = %u\nprobe_interval = 20ms\nchecksum_settle = 200ms\n"
		 "gateway_listen = 127.0.0.1:%u\n",
		 p->engine, wfile, belayer ? "shadow = " : "", belayer ? p->engine : "",
		 belayer ? " --port {port} --kv-cache-bytes 64M --load-format dummy --seed 1 "
			   "--model "
			 : "",
		 belayer ? wfile : "", belayer ? "\n" : "", p->shim, port, sport, gport);
	r = rec_world_open(&w, p, 1, 8u << 20, config);
	if (r < 0)
		goto out;
	r = rec_wait_port(port, 60000);
	r = r ?: rec_wait_port(gport, 60000);
	if (r < 0)
		goto out;
	/* warm-up, then the failure-free reference of this path */
	r = run_clients(cl, bodies, o->clients, belayer ? gport : port, false, -1, 0, direct);
	r = r
		    ?: run_clients(cl, bodies, o->clients, belayer ? gport : port, false, -1, 0,
				   &res->free);
	if (r < 0)
		goto out;
	if (belayer) {
		/* the gateway's overhead, failure-free: alternating, best of 3 each */
		struct run d, g;

		*direct = (struct run){0};
		*via = (struct run){0};
		*lat_direct = *lat_gw = 1e18;
		for (int k = 0; k < 3; k++) {
			double ld = seq_latency_us(port, o->small),
			       lg = seq_latency_us(gport, o->small);

			*lat_direct = MIN(*lat_direct, ld);
			*lat_gw = MIN(*lat_gw, lg);
			r = run_clients(cl, bodies, o->clients, port, false, -1, 0, &d);
			r = r ?: run_clients(cl, bodies, o->clients, gport, false, -1, 0, &g);
			if (r < 0)
				goto out;
			if (d.tok_per_s > direct->tok_per_s)
				*direct = d;
			if (g.tok_per_s > via->tok_per_s)
				*via = g;
		}
		/* armed: the shadow parked and the checksums recorded */
		(void)poll(NULL, 0, 1500);
	}
	victim = primary_pid(port);
	if (victim <= 0) {
		r = log_error_errno(ESRCH, "The primary on port %u was not found", port);
		goto out;
	}
	res->kill_ms = (int)(res->free.total_ms / 2);
	r = run_clients(cl, bodies, o->clients, belayer ? gport : port, !belayer, res->kill_ms,
			victim, &res->failed);
out:
	rec_world_close(&w);
	return r;
}

int bench_resume(const struct bench_args *a, int argc, char **argv)
{
	static const struct option options[] = {{"json", no_argument, NULL, 'j'},
						{"quick", no_argument, NULL, 'q'},
						{"clients", required_argument, NULL, 'c'},
						{"prompt", required_argument, NULL, 'p'},
						{"tokens", required_argument, NULL, 't'},
						{"help", no_argument, NULL, 'h'},
						{}};
	struct opts o = {.clients = 64, .prompt = 384, .tokens = 96, .small = 300, .json = a->json};
	struct rec_paths p = {};
	struct path_result bel = {}, cold = {};
	struct run direct = {}, via = {}, scratch;
	double lat_d = 0, lat_g = 0;
	char wfile[4200], dir[] = "/tmp/belayer-bench-resume.XXXXXX", **bodies;
	struct client *cl;
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jqc:p:t:h", options, NULL)) >= 0)
		switch (c) {
		case 'j':
			o.json = true;
			break;
		case 'q':
			o.quick = true;
			o.clients = 16;
			o.prompt = 128;
			o.tokens = 48;
			o.small = 100;
			break;
		case 'c':
			o.clients = atoi(optarg);
			break;
		case 'p':
			o.prompt = atoi(optarg);
			break;
		case 't':
			o.tokens = atoi(optarg);
			break;
		case 'h':
			printf("Usage: belayer-bench resume [--json] [--quick] [--clients N] "
			       "[--prompt TOKENS] [--tokens N]\n");
			return 0;
		default:
			return -EINVAL;
		}
	if (o.clients < 1 || o.clients > MAX_CLIENTS || o.prompt < 1 || o.tokens < 2 ||
	    o.prompt + o.tokens > 512)
		return log_error_errno(EINVAL,
				       "1..%d clients, prompt + tokens <= 512 (the model's "
				       "context)",
				       MAX_CLIENTS);
	rec_paths_init(&p, a, BENCH_BUILD_ROOT);
	(void)rec_guard_install();
	if (!mkdtemp(dir))
		return log_error_errno(errno, "mkdtemp: %m");
	rec_guard_dir(dir);
	snprintf(wfile, sizeof(wfile), "%s/w.safetensors", dir);
	r = rec_gen_weights(&p, wfile, 8u << 20, 1);
	bodies = calloc((size_t)o.clients, sizeof(*bodies));
	cl = calloc(MAX_CLIENTS, sizeof(*cl));
	if (r < 0 || !bodies || !cl)
		goto out;
	for (int i = 0; i < o.clients; i++)
		if (!(bodies[i] = prompt_body(i, o.prompt, o.tokens))) {
			r = -ENOMEM;
			goto out;
		}
	r = one_path(&p, wfile, &o, true, bodies, cl, &bel, &direct, &via, &lat_d, &lat_g);
	r = r ?: one_path(&p, wfile, &o, false, bodies, cl, &cold, &scratch, NULL, NULL, NULL);
	if (r < 0)
		goto out;
	if (o.json) {
		printf("{\"clients\":%d,\"prompt_tokens\":%d,\"new_tokens\":%d,"
		       "\"belayer\":{\"ok\":%d,\"kill_ms\":%d,\"first_token_after_kill_ms\":{"
		       "\"median\":"
		       "%.1f,\"max\":%.1f},\"total_ms\":%.1f,\"failure_free_ms\":%.1f},"
		       "\"cold_retry\":{\"ok\":%d,\"kill_ms\":%d,\"first_token_after_kill_ms\":{"
		       "\"median\":%.1f,\"max\":%.1f},\"total_ms\":%.1f,\"failure_free_ms\":%.1f,"
		       "\"retries\":%d},"
		       "\"overhead\":{\"latency_us\":{\"direct\":%.0f,\"gateway\":%.0f},"
		       "\"tokens_per_s\":{\"direct\":%.0f,\"gateway\":%.0f}}}\n",
		       o.clients, o.prompt, o.tokens, bel.failed.ok, bel.kill_ms,
		       bel.failed.first_after_med_ms, bel.failed.first_after_max_ms,
		       bel.failed.total_ms, bel.free.total_ms, cold.failed.ok, cold.kill_ms,
		       cold.failed.first_after_med_ms, cold.failed.first_after_max_ms,
		       cold.failed.total_ms, cold.free.total_ms, cold.failed.retries, lat_d, lat_g,
		       direct.tok_per_s, via.tok_per_s);
	} else {
		printf("resume: %d concurrent streams, %d-token prompts, %d new tokens each; "
		       "primary "
		       "SIGKILLed halfway\n\n",
		       o.clients, o.prompt, o.tokens);
		printf("%-34s %10s %10s %12s %12s %8s\n", "path", "1st tok", "1st tok", "all done",
		       "no failure", "done");
		printf("%-34s %10s %10s %12s %12s %8s\n", "", "median ms", "max ms", "ms", "ms",
		       "");
		printf("%-34s %10.1f %10.1f %12.1f %12.1f %5d/%d\n",
		       "belayer (promotion + re-prefill)", bel.failed.first_after_med_ms,
		       bel.failed.first_after_max_ms, bel.failed.total_ms, bel.free.total_ms,
		       bel.failed.ok, o.clients);
		printf("%-34s %10.1f %10.1f %12.1f %12.1f %5d/%d\n", "cold restart + client retry",
		       cold.failed.first_after_med_ms, cold.failed.first_after_max_ms,
		       cold.failed.total_ms, cold.free.total_ms, cold.failed.ok, o.clients);
		printf("\ngateway overhead, failure-free (best of 3):\n");
		printf("  latency per request (1 token, sequential): direct %.0f us, gateway %.0f "
		       "us "
		       "(+%.0f us)\n",
		       lat_d, lat_g, lat_g - lat_d);
		printf("  throughput (%d streams): direct %.0f tok/s, gateway %.0f tok/s "
		       "(%+.1f%%)\n",
		       o.clients, direct.tok_per_s, via.tok_per_s,
		       direct.tok_per_s > 0 ? 100.0 * (via.tok_per_s / direct.tok_per_s - 1) : 0);
	}
	if (bel.failed.ok != o.clients || cold.failed.ok != o.clients)
		r = log_error_errno(EPROTO,
				    "Not every request completed (belayer %d, cold %d of %d)",
				    bel.failed.ok, cold.failed.ok, o.clients);
out:
	if (bodies)
		for (int i = 0; i < o.clients; i++)
			free(bodies[i]);
	free(bodies);
	free(cl);
	{
		char wf2[4300];

		snprintf(wf2, sizeof(wf2), "%s/w.safetensors", dir);
		(void)unlink(wf2);
		(void)rmdir(dir);
	}
	return r < 0 ? r : 0;
}
