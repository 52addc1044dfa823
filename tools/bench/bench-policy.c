/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench policy: the checkpoint policies side by side (issue 11 item 4).
 *
 * For each of never, every-turn and adaptive (`[policy] mode`, a supervisor of its own per
 * policy) the same rollout runs: N concurrent trajectories, each with its own environment
 * created through the supervisor's socket, doing T turns of step-end -> generation (a real
 * stream from the engine stand-in through the supervisor's gateway, tagged with
 * X-Belayer-Trajectory) -> step-begin -> action (a real command inside the environment:
 * edits, data files of drawn sizes, or read-only). The daemon runs the policy's checkpoints;
 * the step-begin decisions say how long each ran ("ckus"), whether it was aborted ("abrt"),
 * which checkpoint completed ("ckpt") and how long the action's reply was held ("held").
 *
 * Generation lengths (tokens per turn) are drawn, seeded and the same for every policy, from
 * a lognormal: long-tailed per-step generation as characterised for agentic RL rollouts by
 * Heddle (Zhang et al., "Heddle: A Distributed Orchestration System for Agentic RL Rollout",
 * arXiv:2603.28101, 2026: tool-calling trajectories whose per-step generation is long-tailed)
 * and for RL rollouts in general by DARTS (Wang et al., arXiv:2605.30859, 2026). Neither
 * publishes a parametric fit; the shape used is a lognormal with p99/median = 10 (sigma =
 * ln 10 / 2.326 = 0.99), the ratio of the commonly quoted reasoning-RL figures (median ~500,
 * p99 ~5000 tokens), scaled down so that the engine stand-in on the emulated GPU turns a
 * bubble into seconds, not minutes: median `--tokens` (default 96) new tokens, capped by the
 * model's 512-token context.
 *
 * Per policy: rollout wall time and its slowdown against never (failure-free); the fraction
 * of checkpoint time hidden in bubbles, 1 - sum(held)/sum(ckus); checkpoints done/aborted;
 * expected work lost per failure: failures at uniformly drawn (seeded) times over each
 * trajectory's measured timeline, the work lost being the time since the trajectory's last
 * protected point (the end of the last action whose checkpoint completed; for never the
 * start). Then a second rollout with real failures in a few trajectories (the environment's
 * cgroup killed at a drawn time, the environment restored from its head, or rebuilt when it
 * has none): the turn that came back and the work really lost against what the decisions
 * predicted, and the restored files and server state checked.
 *
 * The engine stand-in (the "GPU") is pinned to CPU 0 and everything else (supervisor,
 * environments, CRIU, this program) to CPU 1 when the machine has two or more CPUs: on the
 * emulator decoding is host work, and a checkpoint taking CPU from it would slow generation
 * in a way a real GPU is not slowed (--no-pin to measure without).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "bench-measure.h"
#include "bench-policy.h"
#include "bench-recovery.h"
#include "bench.h"
#include "engine-client.h"
#include "envckpt-fixture.h"
#include "log.h"
#include "supervisor-criu.h"
#include "util.h"

#define CGROUP_V2     "/sys/fs/cgroup/unified"
#define WEIGHTS_BYTES (8u << 20)
#define MC_SAMPLES    2000 /* drawn failure times per trajectory */
#define MAX_ROUNDS    8
#define MAX_WHY	      16

static const char *const mode_names[POL_COUNT] = {"never", "every-turn", "adaptive"};

struct popts {
	unsigned trajs, turns, failures, prompt, tokens, rounds;
	uint64_t seed;
	bool quick, json, pin;
	int only; /* -1: every policy */
	const char *plot;
};

/* One policy's figures, summed over the rounds (summarize) and then averaged (finish). */
struct pol_result {
	bool ran;
	unsigned rounds;
	double wall[MAX_ROUNDS], slowdown[MAX_ROUNDS];
	double wall_s, slowdown_pct, slowdown_min, slowdown_max;
	uint64_t held_us, ckpt_us;
	double hidden; /* 1 - held/ckus; NAN: no checkpoint ran */
	/* done: committed (the environments' lists); reported: "ckpt" in a step-begin */
	unsigned ckpt_done, ckpt_reported, ckpt_aborted, ckpt_decided, tokens;
	double lost_mean_s, lost_p95_s; /* per failure, drawn */
	/* The same draws with nothing protected (lost back to the start): the policy's own
	 * timeline without its checkpoints, which a slower rollout lengthens for every policy. */
	double lost_unprotected_mean_s;
	/* Mean per turn, ms: step-end answered, generation, step-begin answered, action. */
	double end_ms, gen_ms, begin_ms, act_ms;
	/* The step-end predictions (means over those with a bubble predicted), ms and per mille:
	 * bubble, its error, |predicted - measured generation|, checkpoint cost, its error. */
	double bub_ms, bub_err, bub_miss_ms, cost_ms, cost_err;
	unsigned npred, ncost, nckus;
	/* The step-end decisions' reasons. */
	struct {
		char why[32];
		unsigned n;
	} why[MAX_WHY];
	unsigned nwhy;
	unsigned nfail, fail_match;
	struct pol_failure fail[POL_MAX_TRAJS];
	char fail_traj[POL_MAX_TRAJS][32];
};

/* splitmix64: seeded, the same draws for every policy. */
static uint64_t rnd(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rnd_unit(uint64_t *s)
{
	return ((double)(rnd(s) >> 11) + 0.5) / 9007199254740992.0;
}

static double rnd_lognormal(uint64_t *s, double median, double sigma)
{
	double z = sqrt(-2 * log(rnd_unit(s))) * cos(2 * M_PI * rnd_unit(s));

	return median * exp(sigma * z);
}

static void draw(const struct popts *o, struct pol_traj *tr)
{
	uint64_t s = o->seed;
	/* p99 / median = 10 on a lognormal: sigma = ln(10) / z(0.99). */
	const double sigma = log(10.0) / 2.326;
	const unsigned cap = 512 - o->prompt - 4 * (o->turns + 1) - 1;

	for (unsigned i = 0; i < o->trajs; i++) {
		struct pol_traj *t = &tr[i];

		t->idx = (int)i;
		snprintf(t->id, sizeof(t->id), "bench-traj-%u", i);
		snprintf(t->env, sizeof(t->env), "bench-env-%u", i);
		for (unsigned g = 1; g <= o->turns + 1; g++) {
			double v = rnd_lognormal(&s, o->tokens, sigma);

			t->out_tokens[g] = (unsigned)MIN(MAX(v, 2.0), (double)cap);
		}
		for (unsigned k = 1; k <= o->turns; k++) {
			double u = rnd_unit(&s);

			/* A third of the actions only read (the policy should see them clean). */
			t->act[k] = u < 0.33 ? ACT_READ : u < 0.66 ? ACT_EDIT : ACT_WRITE;
			/* Data sizes: lognormal around 256 KiB, 4 KiB .. 16 MiB. */
			t->act_bytes[k] = (uint32_t)MIN(
				MAX(rnd_lognormal(&s, 256 << 10, 1.5), 4096.0), 16.0 * (1 << 20));
		}
	}
}

static int create_envs(int fd, const char *base, struct pol_traj *tr, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		int r = fixture_free_port(&tr[i].srv_port);

		r = r ?: pol_env_create(fd, base, &tr[i]);
		if (r < 0)
			return r;
	}
	return 0;
}

static void destroy_envs(int fd, struct pol_traj *tr, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		struct proto_env_request q = {.op = ENV_OP_DESTROY};
		uint64_t end = bench_now_ns() + 30000000000ull;

		snprintf(q.env, sizeof(q.env), "%s", tr[i].env);
		while (pol_env_request(fd, &q, NULL) == -EBUSY && bench_now_ns() < end)
			(void)poll(NULL, 0, 10);
	}
}

/* Work lost by failures at drawn times over each trajectory's timeline. */
static void work_lost(const struct popts *o, const struct pol_traj *tr, struct pol_result *res)
{
	size_t n = (size_t)o->trajs * MC_SAMPLES, k = 0;
	double *v = calloc(n, sizeof(*v)), sum = 0, sum_unprotected = 0;
	uint64_t s = o->seed ^ 0x5eedf00dull;

	if (!v)
		return;
	for (unsigned i = 0; i < o->trajs; i++) {
		const struct pol_traj *t = &tr[i];

		for (unsigned j = 0; j < MC_SAMPLES; j++) {
			uint64_t f = t->t_start +
				     (uint64_t)(rnd_unit(&s) * (double)(t->t_done - t->t_start));
			uint64_t from = t->act_end[pol_protected_turn(t, o->turns, f)];

			v[k] = (double)(f - from) / 1e6;
			sum += v[k++];
			sum_unprotected += (double)(f - t->act_end[0]) / 1e6;
		}
	}
	res->lost_mean_s = sum / (double)k;
	res->lost_unprotected_mean_s = sum_unprotected / (double)k;
	qsort(v, k, sizeof(*v), bench_cmp_double);
	res->lost_p95_s = v[k * 95 / 100];
	free(v);
}

static void count_why(struct pol_result *res, const char *why)
{
	unsigned i;

	for (i = 0; i < res->nwhy; i++)
		if (strcmp(res->why[i].why, why) == 0)
			break;
	if (i == res->nwhy) {
		if (res->nwhy == MAX_WHY)
			return;
		snprintf(res->why[res->nwhy++].why, sizeof(res->why[0].why), "%s", why);
	}
	res->why[i].n++;
}

/* Adds the figures of one policy's failure-free rollout. */
static void summarize(const struct popts *o, const struct pol_traj *tr, struct pol_result *res)
{
	uint64_t end = 0;

	for (unsigned i = 0; i < o->trajs; i++) {
		const struct pol_traj *t = &tr[i];

		end = MAX(end, t->t_done);
		res->ckpt_done += t->ck_listed;
		for (unsigned g = 1; g <= o->turns + 1; g++) {
			const struct pol_turn *u = &t->turn[g];

			res->tokens += (unsigned)u->tokens;
			res->held_us += u->held_us;
			res->ckpt_us += u->ckpt_us;
			res->nckus += u->ckpt_us > 0;
			res->ckpt_reported += u->ckpt[0] && !u->aborted;
			res->ckpt_aborted += u->aborted;
			res->ckpt_decided += u->end_ok && u->end_act != TRAJ_ACT_NONE;
			if (u->end_ok)
				count_why(res, u->end_why[0] ? u->end_why : "-");
			if (u->end_ok && u->bub_us) {
				double gen = (double)(u->t_gen1 - u->t_gen0) / 1e3;

				res->bub_ms += (double)u->bub_us / 1e3;
				res->bub_err += u->bub_err;
				res->bub_miss_ms += fabs((double)u->bub_us / 1e3 - gen);
				res->npred++;
			}
			if (u->end_ok && u->cost_us) {
				res->cost_ms += (double)u->cost_us / 1e3;
				res->cost_err += u->cost_err;
				res->ncost++;
			}
			res->end_ms += (double)(u->t_gen0 - u->t_end) / 1e3;
			res->gen_ms += (double)(u->t_gen1 - u->t_gen0) / 1e3;
			res->begin_ms += (double)(u->t_begin - u->t_gen1) / 1e3;
			if (g <= o->turns)
				res->act_ms += (double)(u->t_act1 - u->t_begin) / 1e3;
		}
	}
	if (res->rounds < MAX_ROUNDS)
		res->wall[res->rounds] = (double)end / 1e6;
	{
		struct pol_result one = {0};

		work_lost(o, tr, &one);
		res->lost_mean_s += one.lost_mean_s;
		res->lost_p95_s += one.lost_p95_s;
		res->lost_unprotected_mean_s += one.lost_unprotected_mean_s;
	}
	res->rounds++;
	res->ran = true;
}

/* Averages over the rounds; slowdowns against never's rollout of the same round. */
static void finish(const struct popts *o, struct pol_result *res)
{
	const struct pol_result *never = &res[POL_NEVER];

	for (int m = 0; m < POL_COUNT; m++) {
		struct pol_result *r = &res[m];
		double nt = (double)r->rounds * o->trajs;

		if (!r->ran)
			continue;
		r->wall_s = 0;
		r->slowdown_pct = 0;
		r->slowdown_min = INFINITY;
		r->slowdown_max = -INFINITY;
		for (unsigned k = 0; k < r->rounds; k++) {
			r->slowdown[k] = 100.0 * (r->wall[k] / never->wall[k] - 1);
			r->wall_s += r->wall[k] / r->rounds;
			r->slowdown_pct += r->slowdown[k] / r->rounds;
			r->slowdown_min = MIN(r->slowdown_min, r->slowdown[k]);
			r->slowdown_max = MAX(r->slowdown_max, r->slowdown[k]);
		}
		r->end_ms /= nt * (o->turns + 1);
		r->gen_ms /= nt * (o->turns + 1);
		r->begin_ms /= nt * (o->turns + 1);
		r->act_ms /= nt * o->turns;
		if (r->npred) {
			r->bub_ms /= r->npred;
			r->bub_err /= r->npred;
			r->bub_miss_ms /= r->npred;
		}
		if (r->ncost) {
			r->cost_ms /= r->ncost;
			r->cost_err /= r->ncost;
		}
		r->lost_mean_s /= r->rounds;
		r->lost_p95_s /= r->rounds;
		r->lost_unprotected_mean_s /= r->rounds;
		r->hidden = r->ckpt_us ? 1.0 - (double)r->held_us / (double)r->ckpt_us : NAN;
	}
}

/* What /work/turn holds after action k: the last action up to k that wrote. */
static unsigned last_writing_turn(const struct pol_traj *t, unsigned k)
{
	while (k > 0 && t->act[k] == ACT_READ)
		k--;
	return k;
}

struct world_paths {
	struct rec_paths p;
	char wfile[4200], base[4200], cgroup[4200];
};

/* What a failed run left: environments' overlays still mounted (the world's directory is
 * removed next) and their cgroups. Normally empty: every environment was destroyed. */
static void sweep(const struct rec_world *w, const char *cgroup)
{
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d;

	snprintf(path, sizeof(path), "%s/state/envs", w->dir);
	d = w->dir[0] ? opendir(path) : NULL;
	while (d && (de = readdir(d)))
		if (de->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/state/envs/%s/root", w->dir, de->d_name);
			(void)umount2(path, MNT_DETACH);
		}
	if (d)
		closedir(d);
	d = opendir(cgroup);
	while (d && (de = readdir(d)))
		if (de->d_type == DT_DIR && de->d_name[0] != '.') {
			int fd;

			snprintf(path, sizeof(path), "%s/%s/cgroup.kill", cgroup, de->d_name);
			fd = open(path, O_WRONLY | O_CLOEXEC);
			if (fd >= 0) {
				(void)!write(fd, "1", 1);
				close(fd);
			}
			snprintf(path, sizeof(path), "%s/%s", cgroup, de->d_name);
			for (int i = 0; i < 50 && rmdir(path) < 0 && errno == EBUSY; i++)
				(void)poll(NULL, 0, 10);
		}
	if (d)
		closedir(d);
}

/* A real failure for the failure rollout: a drawn turn 1..turns, at a drawn point of that
 * turn's failure-free span (step-end to the next step-end): generation, step-begin or
 * action. */
static void fail_draw(uint64_t *s, unsigned turns, struct pol_traj *t)
{
	unsigned g = 1 + (unsigned)(rnd(s) % turns);

	t->fail_turn = g;
	t->fail_delay_us =
		(uint64_t)(rnd_unit(s) * (double)(t->turn[g + 1].t_end - t->turn[g].t_end));
}

static int run_policy(const struct popts *o, const struct world_paths *wp, enum pol_mode mode,
		      bool failures, struct pol_traj *tr, struct pol_traj *ftr,
		      struct pol_result *res)
{
	struct rec_world w = {.sup_pid = -1, .sup_pidfd = -1};
	struct pol_rollout ro = {.turns = o->turns, .prompt = o->prompt};
	struct http_response resp = {0};
	char config[16384];
	uint16_t port, gport;
	uint64_t s = o->seed ^ 0xfa11ull;
	bool envs = false, fenvs = false;
	int fd = -1, r;

	r = rec_free_port(&port);
	r = r ?: rec_free_port(&gport);
	if (r < 0)
		return r;
	snprintf(config, sizeof(config),
		 "[engine.bench]\n"
		 "primary = %s%s --model %s --port {port} --kv-cache-bytes 64M\n"
		 "env = LD_PRELOAD=%s\n"
		 "port = %u\nprobe_interval = 200ms\n"
		 "gateway_listen = 127.0.0.1:%u\n"
		 "[journal]\nenabled = no\n"
		 "[env]\ncgroup = %s\nkeep = 64\n"
		 "[policy]\nmode = %s\n",
		 o->pin ? "taskset -c 0 " : "", wp->p.engine, wp->wfile, wp->p.shim, port, gport,
		 wp->cgroup, mode_names[mode]);
	r = rec_world_open(&w, &wp->p, 1, WEIGHTS_BYTES, config);
	if (r < 0)
		goto out;
	r = rec_wait_port(gport, 120000);
	if (r < 0) {
		log_error_errno(r, "The gateway on port %u did not come up (see %s): %m", gport,
				w.dir);
		goto out;
	}
	/* Warm-up: the engine answers through the gateway before anything is timed. */
	r = client_request(gport, "POST", "/generate",
			   "{\"input_ids\":[1,2,3,4],\"sampling_params\":{\"max_new_tokens\":4,"
			   "\"temperature\":0}}",
			   120000, &resp);
	http_response_free(&resp);
	if (r < 0) {
		log_error_errno(r, "The engine does not answer through the gateway: %m");
		goto out;
	}
	fd = pol_connect(w.socket);
	if (fd < 0) {
		r = log_error_errno(fd, "Cannot reach the supervisor at %s: %m", w.socket);
		goto out;
	}
	ro.socket = w.socket;
	ro.base = wp->base;
	ro.gateway = gport;

	/* Failure-free. */
	envs = true;
	r = create_envs(fd, wp->base, tr, o->trajs);
	if (r < 0)
		goto out;
	for (unsigned i = 0; i < o->trajs; i++)
		tr[i].fail_turn = 0;
	ro.traj = tr;
	ro.ntraj = o->trajs;
	r = pol_rollout_run(&ro);
	if (r < 0) {
		log_error_errno(r, "The %s rollout failed (see %s): %m", mode_names[mode], w.dir);
		goto out;
	}
	for (unsigned i = 0; i < o->trajs && r >= 0; i++) {
		r = pol_env_checkpoints(fd, &ro, &tr[i]);
		if (r < 0)
			log_error_errno(r, "Cannot list the checkpoints of %s: %m", tr[i].env);
	}
	if (r < 0)
		goto out;
	summarize(o, tr, res);
	destroy_envs(fd, tr, o->trajs);
	envs = false;

	/* Real failures: the same rollout again (same load), the first few trajectories each
	 * killed once at a drawn time. */
	if (failures && o->failures) {
		for (unsigned i = 0; i < o->trajs; i++) {
			ftr[i] = tr[i];
			snprintf(ftr[i].id, sizeof(ftr[i].id), "bench-fail-%u", i);
			snprintf(ftr[i].env, sizeof(ftr[i].env), "bench-fenv-%u", i);
			ftr[i].fail_turn = 0;
			if (i < o->failures)
				fail_draw(&s, o->turns, &ftr[i]);
		}
		fenvs = true;
		r = create_envs(fd, wp->base, ftr, o->trajs);
		if (r < 0)
			goto out;
		ro.traj = ftr;
		ro.ntraj = o->trajs;
		r = pol_rollout_run(&ro);
		if (r < 0) {
			log_error_errno(r, "The %s failure rollout failed (see %s): %m",
					mode_names[mode], w.dir);
			goto out;
		}
		for (unsigned i = 0; i < o->failures; i++) {
			const struct pol_failure *f = &ftr[i].fail;

			if (!f->done)
				continue;
			res->fail[res->nfail] = *f;
			snprintf(res->fail_traj[res->nfail], sizeof(res->fail_traj[0]), "%s",
				 ftr[i].id);
			res->nfail++;
			res->fail_match +=
				f->computed_turn == f->restored_turn &&
				f->file_turn == last_writing_turn(&ftr[i], f->restored_turn) &&
				f->server_ok;
		}
	}
out:
	if (fd >= 0) {
		if (envs)
			destroy_envs(fd, tr, o->trajs);
		if (fenvs)
			destroy_envs(fd, ftr, o->trajs);
		close(fd);
	}
	sweep(&w, wp->cgroup);
	rec_world_close(&w);
	return r;
}

static int plot(const struct pol_result *res, const char *png)
{
	struct rec_plot pl;
	int r = rec_plot_open(&pl);

	if (r < 0)
		return r;
	for (int m = 0; m < POL_COUNT; m++)
		if (res[m].ran)
			fprintf(pl.data, "%.3f %.3f %s\n", res[m].slowdown_pct, res[m].lost_mean_s,
				mode_names[m]);
	fprintf(pl.script,
		"set terminal pngcairo size 800,560 noenhanced\n"
		"set output '%s'\n"
		"set title 'Belayer checkpoint policies: failure-free slowdown vs work lost per "
		"failure'\n"
		"set xlabel 'rollout slowdown vs never (%%)'\n"
		"set ylabel 'expected work lost per failure (s)'\n"
		"set grid\nset key off\nset offsets 0.5, 0.5, 0.5, 0.5\nset rmargin 14\n"
		"plot '%s' using 1:2 with points pt 7 ps 2, '' using 1:2:3 with labels offset "
		"1.5,1 left\n",
		png, pl.dat);
	return rec_plot_run(&pl);
}

static json_object *jd(double v)
{
	return isnan(v) ? NULL : json_object_new_double(v);
}

static void print_json(const struct popts *o, const struct pol_result *res, const char *png)
{
	json_object *j = json_object_new_object(), *pols = json_object_new_object();

	json_object_object_add(j, "trajectories", json_object_new_int((int)o->trajs));
	json_object_object_add(j, "turns", json_object_new_int((int)o->turns));
	json_object_object_add(j, "rounds", json_object_new_int((int)o->rounds));
	json_object_object_add(j, "median_tokens", json_object_new_int((int)o->tokens));
	json_object_object_add(j, "seed", json_object_new_int64((int64_t)o->seed));
	json_object_object_add(j, "pinned", json_object_new_boolean(o->pin));
	for (int m = 0; m < POL_COUNT; m++) {
		const struct pol_result *r = &res[m];
		json_object *p = json_object_new_object(), *fl = json_object_new_array();

		if (!r->ran)
			continue;
		json_object *walls = json_object_new_array(), *slows = json_object_new_array(),
			    *why = json_object_new_object();

		for (unsigned k = 0; k < r->rounds; k++) {
			json_object_array_add(walls, json_object_new_double(r->wall[k]));
			json_object_array_add(slows, json_object_new_double(r->slowdown[k]));
		}
		for (unsigned k = 0; k < r->nwhy; k++)
			json_object_object_add(why, r->why[k].why,
					       json_object_new_int((int)r->why[k].n));
		json_object_object_add(p, "wall_s", json_object_new_double(r->wall_s));
		json_object_object_add(p, "wall_s_rounds", walls);
		json_object_object_add(p, "slowdown_pct", json_object_new_double(r->slowdown_pct));
		json_object_object_add(p, "slowdown_pct_rounds", slows);
		json_object_object_add(p, "step_end_reasons", why);
		json_object_object_add(p, "tokens", json_object_new_int((int)r->tokens));
		json_object_object_add(p, "checkpoints_decided",
				       json_object_new_int((int)r->ckpt_decided));
		json_object_object_add(p, "checkpoints_done",
				       json_object_new_int((int)r->ckpt_done));
		json_object_object_add(p, "checkpoints_reported",
				       json_object_new_int((int)r->ckpt_reported));
		json_object_object_add(p, "checkpoints_aborted",
				       json_object_new_int((int)r->ckpt_aborted));
		json_object_object_add(p, "checkpoint_us",
				       json_object_new_int64((int64_t)r->ckpt_us));
		json_object_object_add(p, "held_us", json_object_new_int64((int64_t)r->held_us));
		json_object_object_add(p, "hidden_fraction", jd(r->hidden));
		json_object_object_add(p, "turn_step_end_ms", json_object_new_double(r->end_ms));
		json_object_object_add(p, "turn_generation_ms", json_object_new_double(r->gen_ms));
		json_object_object_add(p, "turn_step_begin_ms",
				       json_object_new_double(r->begin_ms));
		json_object_object_add(p, "turn_action_ms", json_object_new_double(r->act_ms));
		json_object_object_add(p, "predicted_bubbles", json_object_new_int((int)r->npred));
		json_object_object_add(p, "predicted_bubble_ms", json_object_new_double(r->bub_ms));
		json_object_object_add(p, "predicted_bubble_err_pm",
				       json_object_new_double(r->bub_err));
		json_object_object_add(p, "bubble_abs_error_ms",
				       json_object_new_double(r->bub_miss_ms));
		json_object_object_add(p, "predicted_cost_ms", json_object_new_double(r->cost_ms));
		json_object_object_add(
			p, "checkpoint_ran_ms_mean",
			json_object_new_double(r->nckus ? (double)r->ckpt_us / 1e3 / r->nckus : 0));
		json_object_object_add(p, "predicted_cost_err_pm",
				       json_object_new_double(r->cost_err));
		json_object_object_add(p, "work_lost_mean_s",
				       json_object_new_double(r->lost_mean_s));
		json_object_object_add(p, "work_lost_p95_s", json_object_new_double(r->lost_p95_s));
		json_object_object_add(p, "work_lost_unprotected_mean_s",
				       json_object_new_double(r->lost_unprotected_mean_s));
		for (unsigned i = 0; i < r->nfail; i++) {
			const struct pol_failure *f = &r->fail[i];
			json_object *x = json_object_new_object();

			json_object_object_add(x, "trajectory",
					       json_object_new_string(r->fail_traj[i]));
			json_object_object_add(x, "at_s", json_object_new_double(f->at_us / 1e6));
			json_object_object_add(x, "computed_turn",
					       json_object_new_int((int)f->computed_turn));
			json_object_object_add(x, "computed_lost_s",
					       json_object_new_double(f->computed_lost_us / 1e6));
			json_object_object_add(x, "restored_turn",
					       json_object_new_int((int)f->restored_turn));
			json_object_object_add(x, "real_lost_s",
					       json_object_new_double(f->real_lost_us / 1e6));
			json_object_object_add(x, "rebuilt", json_object_new_boolean(f->rebuilt));
			json_object_object_add(x, "recover_ms",
					       json_object_new_double(f->recover_us / 1e3));
			json_object_object_add(x, "files_turn",
					       json_object_new_int((int)f->file_turn));
			json_object_object_add(x, "server_state_ok",
					       json_object_new_boolean(f->server_ok));
			json_object_array_add(fl, x);
		}
		json_object_object_add(p, "real_failures", fl);
		json_object_object_add(p, "real_failures_matching",
				       json_object_new_int((int)r->fail_match));
		json_object_object_add(pols, mode_names[m], p);
	}
	json_object_object_add(j, "policies", pols);
	/* waits of SLOW_MS and more (a loaded machine): reported, never a failure */
	json_object_object_add(j, "slow_waits", json_object_new_int((int)pol_slow_waits()));
	json_object_object_add(j, "plot", png ? json_object_new_string(png) : NULL);
	printf("%s\n", json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY));
	json_object_put(j);
}

static void print_table(const struct popts *o, const struct pol_result *res, const char *png)
{
	printf("policy: %u concurrent trajectories x %u turns (real environments, engine "
	       "stand-in through the gateway), generation lengths lognormal (median %u tokens, "
	       "p99/median 10), seed %" PRIu64 ", %u round%s%s\n\n",
	       o->trajs, o->turns, o->tokens, o->seed, o->rounds, o->rounds > 1 ? "s" : "",
	       o->pin ? ", engine pinned to CPU 0" : "");
	printf("%-11s %8s %9s %17s %10s %8s %8s %11s %10s\n", "policy", "wall s", "slowdown",
	       "(rounds min..max)", "ckpt done", "aborted", "hidden", "lost/fail s", "lost p95 s");
	for (int m = 0; m < POL_COUNT; m++) {
		const struct pol_result *r = &res[m];
		char hidden[16], range[40];

		if (!r->ran)
			continue;
		if (isnan(r->hidden))
			snprintf(hidden, sizeof(hidden), "-");
		else
			snprintf(hidden, sizeof(hidden), "%.1f%%", 100 * r->hidden);
		snprintf(range, sizeof(range), "%+.1f..%+.1f%%", r->slowdown_min, r->slowdown_max);
		printf("%-11s %8.2f %8.2f%% %17s %10.1f %8.1f %8s %11.2f %10.2f\n", mode_names[m],
		       r->wall_s, r->slowdown_pct, range, (double)r->ckpt_done / r->rounds,
		       (double)r->ckpt_aborted / r->rounds, hidden, r->lost_mean_s, r->lost_p95_s);
	}
	printf("(wall and slowdown: means over the rounds, slowdown against never's rollout of "
	       "the same round; checkpoints per rollout: done = committed, listed by the "
	       "environments; aborted = \"abrt\" in the step-begin decisions)\n");
	printf("\nstep-end decisions (reason: count over the rounds):\n");
	for (int m = 0; m < POL_COUNT; m++) {
		if (!res[m].ran)
			continue;
		printf("%-11s", mode_names[m]);
		for (unsigned k = 0; k < res[m].nwhy; k++)
			printf(" %s: %u", res[m].why[k].why, res[m].why[k].n);
		printf("\n");
	}
	printf("\nper turn (mean ms): step-end answered / generation / step-begin answered / "
	       "action\n");
	for (int m = 0; m < POL_COUNT; m++)
		if (res[m].ran)
			printf("%-11s %8.1f / %8.1f / %8.1f / %8.1f\n", mode_names[m],
			       res[m].end_ms, res[m].gen_ms, res[m].begin_ms, res[m].act_ms);
	printf("\nstep-end predictions (means): bubble ms (err per mille; |predicted - "
	       "generation| ms; of n) / checkpoint cost ms (err per mille) / checkpoints ran "
	       "(ckus) ms\n");
	for (int m = 0; m < POL_COUNT; m++)
		if (res[m].ran)
			printf("%-11s %8.1f (%4.0f; %7.1f; %u) / %7.1f (%4.0f) / %7.1f\n",
			       mode_names[m], res[m].bub_ms, res[m].bub_err, res[m].bub_miss_ms,
			       res[m].npred, res[m].cost_ms, res[m].cost_err,
			       res[m].nckus ? (double)res[m].ckpt_us / 1e3 / res[m].nckus : 0);
	printf("\ntargets: adaptive slowdown <= 1%%, hidden >= 90%% (hidden = 1 - sum(held) / "
	       "sum(ckus) over the step-begin decisions)\n");
	printf("lost/fail: failures at %u drawn times per trajectory over the measured "
	       "timelines; work lost = time since the end of the last action whose checkpoint "
	       "completed (never: since the start)\n",
	       MC_SAMPLES);
	printf("\nreal failures (environment's cgroup killed, restored from its head, or rebuilt "
	       "when it has none):\n");
	printf("%-11s %-14s %7s %15s %15s %9s %10s %7s\n", "policy", "trajectory", "at s",
	       "computed turn", "restored turn", "lost s", "recover ms", "state");
	for (int m = 0; m < POL_COUNT; m++)
		for (unsigned i = 0; i < res[m].nfail; i++) {
			const struct pol_failure *f = &res[m].fail[i];
			char lost[48];

			snprintf(lost, sizeof(lost), "%.2f/%.2f", f->computed_lost_us / 1e6,
				 f->real_lost_us / 1e6);
			printf("%-11s %-14s %7.2f %15u %12u%-3s %9s %10.1f %7s\n", mode_names[m],
			       res[m].fail_traj[i], f->at_us / 1e6, f->computed_turn,
			       f->restored_turn, f->rebuilt ? " rb" : "", lost, f->recover_us / 1e3,
			       f->server_ok ? "ok" : "BAD");
		}
	printf("(lost s: computed from the decisions / real, from the turn that came back; rb: "
	       "rebuilt from the base; state: files and server hold that turn's state)\n");
	if (pol_slow_waits())
		printf("\nslow: %u waits of 30 s or more for the supervisor, a stream or an "
		       "environment (a loaded machine: the timings above are inflated)\n",
		       pol_slow_waits());
	if (png)
		printf("\nplot: %s\n", png);
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: belayer-bench policy [--json] [--quick] [--trajectories N] [--turns T]\n"
		   "                            [--tokens MEDIAN] [--failures N] [--rounds R] "
		   "[--seed S]\n"
		   "                            [--plot FILE.png] [--no-pin] [--only POLICY]\n");
}

int bench_policy(const struct bench_args *a, int argc, char **argv)
{
	static const struct option options[] = {{"json", no_argument, NULL, 'j'},
						{"quick", no_argument, NULL, 'q'},
						{"trajectories", required_argument, NULL, 'n'},
						{"turns", required_argument, NULL, 't'},
						{"tokens", required_argument, NULL, 'k'},
						{"failures", required_argument, NULL, 'f'},
						{"seed", required_argument, NULL, 's'},
						{"rounds", required_argument, NULL, 'r'},
						{"plot", required_argument, NULL, 'p'},
						{"no-pin", no_argument, NULL, 'P'},
						{"only", required_argument, NULL, 'o'},
						{"help", no_argument, NULL, 'h'},
						{}};
	struct popts o = {.trajs = 8,
			  .turns = 6,
			  .failures = 3,
			  .rounds = 3,
			  .prompt = 16,
			  .tokens = 96,
			  .seed = 11,
			  .json = a->json,
			  .pin = true,
			  .only = -1,
			  .plot = "belayer-bench-policy.png"};
	struct pol_result res[POL_COUNT] = {0};
	struct world_paths wp = {0};
	struct pol_traj *tr = NULL, *ftr = NULL;
	char dir[] = "/tmp/belayer-bench-policy.XXXXXX", png[PATH_MAX] = "";
	const char *criu = sv_criu_binary(NULL);
	int c, r = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jqn:t:k:f:s:r:p:Po:h", options, NULL)) >= 0)
		switch (c) {
		case 'j':
			o.json = true;
			break;
		case 'q':
			o.quick = true;
			o.trajs = 3;
			o.turns = 3;
			o.failures = 1;
			o.tokens = 24;
			o.rounds = 1;
			break;
		case 'n':
			o.trajs = (unsigned)atoi(optarg);
			break;
		case 't':
			o.turns = (unsigned)atoi(optarg);
			break;
		case 'k':
			o.tokens = (unsigned)atoi(optarg);
			break;
		case 'f':
			o.failures = (unsigned)atoi(optarg);
			break;
		case 's':
			o.seed = strtoull(optarg, NULL, 0);
			break;
		case 'r':
			o.rounds = (unsigned)atoi(optarg);
			break;
		case 'p':
			o.plot = optarg;
			break;
		case 'P':
			o.pin = false;
			break;
		case 'o':
			for (o.only = POL_COUNT - 1; o.only >= 0; o.only--)
				if (strcmp(optarg, mode_names[o.only]) == 0)
					break;
			if (o.only < 0) {
				usage(stderr);
				return -EINVAL;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return -EINVAL;
		}
	if (o.trajs < 1 || o.trajs > POL_MAX_TRAJS || o.turns < 1 || o.turns > POL_MAX_TURNS ||
	    o.failures > o.trajs || o.tokens < 2 || o.tokens > 400)
		return log_error_errno(EINVAL,
				       "1..%d trajectories, 1..%d turns, failures <= "
				       "trajectories, 2..400 tokens",
				       POL_MAX_TRAJS, POL_MAX_TURNS);
	if (geteuid() != 0 || !criu || sv_criu_version(criu) < 40200) {
		fprintf(stderr, "policy needs root and CRIU >= 4.2 (BELAYER_CRIU).\n");
		return 77;
	}
	if (o.pin && sysconf(_SC_NPROCESSORS_ONLN) >= 2) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(1, &set);
		if (sched_setaffinity(0, sizeof(set), &set) < 0)
			o.pin = false;
	} else {
		o.pin = false;
	}
	rec_paths_init(&wp.p, a, BENCH_BUILD_ROOT);
	(void)rec_guard_install();
	if (!mkdtemp(dir))
		return log_error_errno(errno, "mkdtemp: %m");
	rec_guard_dir(dir);
	snprintf(wp.wfile, sizeof(wp.wfile), "%s/w.safetensors", dir);
	snprintf(wp.base, sizeof(wp.base), "%s/base", dir);
	snprintf(wp.cgroup, sizeof(wp.cgroup), CGROUP_V2 "/belayer-bench-policy-%d", (int)getpid());
	tr = calloc(POL_MAX_TRAJS, sizeof(*tr));
	ftr = calloc(POL_MAX_TRAJS, sizeof(*ftr));
	if (!tr || !ftr) {
		r = -ENOMEM;
		goto out;
	}
	r = rec_gen_weights(&wp.p, wp.wfile, WEIGHTS_BYTES, 1);
	if (r < 0)
		goto out;
	r = fixture_make_base(wp.base, BENCH_ENV_SERVER);
	if (r < 0) {
		log_error_errno(r, "Failed to make the environments' base: %m");
		goto out;
	}
	draw(&o, tr);
	/* Round k runs the policies in an order rotated by k (drift spreads over all three);
	 * the real failures are injected in the first round only. */
	for (unsigned k = 0; k < o.rounds; k++)
		for (int i = 0; i < POL_COUNT; i++) {
			enum pol_mode m = (enum pol_mode)((k + (unsigned)i) % POL_COUNT);

			if (o.only >= 0 && (int)m != o.only && m != POL_NEVER)
				continue;
			r = run_policy(&o, &wp, m, k == 0, tr, ftr, &res[m]);
			if (r < 0)
				goto out;
		}
	finish(&o, res);
	if (o.plot && o.plot[0]) {
		char cwd[PATH_MAX];

		if (o.plot[0] == '/' || !getcwd(cwd, sizeof(cwd)))
			snprintf(png, sizeof(png), "%s", o.plot);
		else
			snprintf(png, sizeof(png), "%s/%s", cwd, o.plot);
		if (plot(res, png) < 0) {
			log_warning(
				"gnuplot failed (tools/dev setup installs gnuplot-nox): no plot");
			png[0] = '\0';
		}
	}
	if (o.json)
		print_json(&o, res, png[0] ? png : NULL);
	else
		print_table(&o, res, png[0] ? png : NULL);
out:
	(void)rmdir(wp.cgroup);
	free(tr);
	free(ftr);
	{
		char cmd[PATH_MAX + 16];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		(void)system(cmd);
	}
	return r < 0 ? r : 0;
}
