/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-client.h"
#include "supervisor-gateway-traj.h"
#include "supervisor-traj-ctl.h"
#include "supervisor-traj.h"

/* Trajectories (and environments) whose history is kept; the least recently seen goes. */
#define TRAJ_CTL_MAX   4096
#define TRAJ_CTL_ALPHA 0.2

/* The environments' side (traj_ctl_set_env_ops); NULL: no environments (tests, fuzzing). */
static const struct traj_env_ops *env_ops;

void traj_ctl_set_env_ops(const struct traj_env_ops *ops)
{
	env_ops = ops;
}

/* A checkpoint the policy started at a step end, until a step-begin of its trajectory took its
 * outcome and its job is over. */
struct pckpt {
	struct envs_policy_ckpt h; /* the job's handle (sv-policy.h) */
	struct pckpt *next;
	struct sv_traj_ctl *tc;
	char env[64];
	char trajectory[PROTO_MAX_STR + 1];
	bool sync;	     /* every-turn: a step-begin waits for the thaw however long */
	bool running;	     /* the job is not over */
	bool collected;	     /* a step-begin took its outcome (or a newer checkpoint replaced it) */
	bool bound_hit;	     /* cancel set at a step-begin's delay bound */
	bool bound_in_dump;  /* ... while CRIU was dumping: the release waits for the dump */
	uint64_t decided_us; /* the step end that asked for it: what it protects */
	int r;		     /* once over: 0, -ECANCELED, or the failure */
	char id[64];	     /* once committed */
	uint64_t ran_us;
};

/* A step-begin reply waiting for the environment to run again. */
struct held {
	struct held *next;
	uint64_t client; /* serial: the client may be gone by the release */
	struct pckpt *pc;
	uint64_t since_us;
	uint64_t bound_us;    /* UINT64_MAX: none (every-turn) */
	uint64_t deadline_us; /* UINT64_MAX: none, or the bound already reached */
	struct proto_traj_decision d;
};

struct sv_traj_ctl {
	int wake_fd;  /* eventfd: a policy checkpoint thawed (written by the offload thread) */
	int timer_fd; /* timerfd: the earliest held reply's bound */
	bool watched; /* the loop watches both: replies can be held */
	struct pckpt *ckpts;
	struct held *held;
};

static uint64_t mono_now_us(void)
{
	struct timespec ts;

	(void)clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void policy_of_config(const struct sv_config *cf, struct policy_config *ret)
{
	*ret = (struct policy_config){
		.mode = cf->policy_mode,
		.confidence = cf->policy_confidence_pct / 100.0,
		.max_delay_us = cf->policy_max_delay_ms * 1000,
		.max_turns = cf->policy_max_turns,
		.max_unprotected_us = cf->policy_max_unprotected_ms * 1000,
	};
}

static struct traj_tracker *tracker(struct supervisor *s)
{
	if (!s->trajs)
		s->trajs = traj_tracker_new(TRAJ_CTL_MAX, TRAJ_CTL_ALPHA);
	return s->trajs;
}

/* gateway-traj: what the framework did not send, from the gateway's view of the trajectory's
 * requests (X-Belayer-Trajectory): a step-end without plen/gen/mtps gets the pending request's,
 * a step-begin without out the last completed request's output tokens. */
static const struct proto_traj_step *gateway_fill(struct supervisor *s,
						  const struct proto_traj_step *q,
						  struct proto_traj_step *buf)
{
	struct gateway_traj_pending p;
	uint64_t out;

	if (q->ev == TRAJ_STEP_END && !q->prompt_tokens && !q->generated_tokens &&
	    !q->decode_mtps && gateway_traj_pending(s, q->trajectory, &p) == 0) {
		*buf = *q;
		buf->prompt_tokens = p.prompt_tokens;
		buf->generated_tokens = p.generated_tokens;
		buf->decode_mtps = p.decode_mtps;
		return buf;
	}
	if (q->ev == TRAJ_STEP_BEGIN && !q->output_tokens &&
	    gateway_traj_last_output(s, q->trajectory, &out) == 0) {
		*buf = *q;
		buf->output_tokens = out;
		return buf;
	}
	return q;
}

/* --- held replies and the policy's checkpoints (loop thread) ----------------------------- */

static bool referenced(const struct sv_traj_ctl *tc, const struct pckpt *pc)
{
	for (const struct held *h = tc->held; h; h = h->next)
		if (h->pc == pc)
			return true;
	return false;
}

/* Frees pc once nothing needs it: its job is over, its outcome taken, no reply waits on it. */
static void pckpt_maybe_free(struct sv_traj_ctl *tc, struct pckpt *pc)
{
	if (pc->running || !pc->collected || referenced(tc, pc))
		return;
	for (struct pckpt **pp = &tc->ckpts; *pp; pp = &(*pp)->next)
		if (*pp == pc) {
			*pp = pc->next;
			break;
		}
	free(pc);
}

static struct pckpt *pckpt_of_env(const struct sv_traj_ctl *tc, const char *env)
{
	for (struct pckpt *pc = tc ? tc->ckpts : NULL; pc; pc = pc->next)
		if (!pc->collected && strcmp(pc->env, env) == 0)
			return pc;
	return NULL;
}

/* The outcome a step-begin reports: the checkpoint's id once committed, how long it ran (to
 * its end, or to the thaw while it still commits), whether it was aborted at the bound. */
static void fill_outcome(struct pckpt *pc, struct proto_traj_decision *d)
{
	if (!pc->running) {
		if (pc->r == 0)
			snprintf(d->ckpt, sizeof(d->ckpt), "%s", pc->id);
		d->ckpt_us = pc->ran_us;
		d->aborted = pc->r == -ECANCELED && pc->bound_hit;
	} else {
		d->ckpt_us = atomic_load(&pc->h.thawed) ? pc->h.thaw_us : 0;
		d->aborted = pc->bound_hit;
	}
	pc->collected = true;
}

static void arm_timer(struct sv_traj_ctl *tc)
{
	uint64_t next = UINT64_MAX;
	struct itimerspec its = {0};

	for (const struct held *h = tc->held; h; h = h->next)
		if (h->deadline_us < next)
			next = h->deadline_us;
	if (next != UINT64_MAX) {
		its.it_value.tv_sec = (time_t)(next / 1000000);
		its.it_value.tv_nsec = (long)(next % 1000000) * 1000;
		if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
			its.it_value.tv_nsec = 1; /* zero would disarm it */
	}
	if (timerfd_settime(tc->timer_fd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
		log_warning_errno(-errno, "Failed to arm the policy's hold timer: %m, ignoring.");
}

static void release(struct supervisor *s, struct held *h, uint64_t now_us)
{
	struct sv_traj_ctl *tc = s->traj_ctl;
	struct proto_msg m = {.type = PROTO_TRAJ_DECISION};
	struct sv_client *c = client_by_serial(s, h->client);
	struct pckpt *pc = h->pc;

	for (struct held **pp = &tc->held; *pp; pp = &(*pp)->next)
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	m.traj_decision = h->d;
	m.traj_decision.held_us = now_us - h->since_us;
	fill_outcome(pc, &m.traj_decision);
	s->metrics.policy_holds++;
	s->metrics.policy_held_us += m.traj_decision.held_us;
	/* Past the bound: the cancel came while CRIU dumped and the reply waited for the dump
	 * (the contract's one exception), not a cancel that load made a few ms late. */
	if (h->bound_us != UINT64_MAX && pc->bound_in_dump &&
	    m.traj_decision.held_us > h->bound_us) {
		s->metrics.policy_holds_past_bound++;
		log_info("Trajectory %s: step-begin held %" PRIu64 " ms, past its %" PRIu64
			 " ms bound (a running CRIU dump is not interrupted).",
			 pc->trajectory, m.traj_decision.held_us / 1000, h->bound_us / 1000);
	}
	log_debug("Trajectory %s (env %s): step-begin released after %" PRIu64 " us%s.",
		  pc->trajectory, pc->env, m.traj_decision.held_us,
		  m.traj_decision.aborted ? ", checkpoint aborted" : "");
	free(h);
	if (c) /* gone meanwhile: nobody to tell */
		(void)client_send(s, c, &m);
	pckpt_maybe_free(tc, pc);
}

/* Releases every reply waiting on pc (thawed, or over). */
static void release_of(struct supervisor *s, struct pckpt *pc, uint64_t now_us)
{
	struct sv_traj_ctl *tc = s->traj_ctl;

	for (struct held *h = tc->held, *next; h; h = next) {
		next = h->next;
		if (h->pc == pc)
			release(s, h, now_us);
	}
	arm_timer(tc);
}

/* The bound: ask the checkpoint to stop; the reply goes when the environment runs again. */
static void bound_reached(struct supervisor *s, struct held *h, uint64_t now_us)
{
	struct pckpt *pc = h->pc;

	h->deadline_us = UINT64_MAX;
	pc->bound_hit = true;
	pc->bound_in_dump = atomic_load(&pc->h.dumping);
	atomic_store(&pc->h.cancel, true);
	/* Paired with job_run's fence (supervisor-env-ctl.c): a job that had not started when
	 * this looks will see cancel before it freezes anything, so nothing is to wait for. */
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load(&pc->h.started) || atomic_load(&pc->h.thawed) || !pc->running)
		release(s, h, now_us);
}

static void on_wake(struct supervisor *s)
{
	struct sv_traj_ctl *tc = s->traj_ctl;
	uint64_t n, now = mono_now_us();

	(void)!read(tc->wake_fd, &n, sizeof(n));
	for (struct held *h = tc->held, *next; h; h = next) {
		next = h->next;
		if (atomic_load(&h->pc->h.thawed))
			release(s, h, now);
	}
	arm_timer(tc);
}

static void on_timer(struct supervisor *s)
{
	struct sv_traj_ctl *tc = s->traj_ctl;
	uint64_t n, now = mono_now_us();

	(void)!read(tc->timer_fd, &n, sizeof(n));
	for (struct held *h = tc->held, *next; h; h = next) {
		next = h->next;
		if (h->deadline_us <= now)
			bound_reached(s, h, now);
	}
	arm_timer(tc);
}

/* Offload thread: the environment of a policy checkpoint runs again. */
static void pckpt_thawed(struct envs_policy_ckpt *h)
{
	struct pckpt *pc = (struct pckpt *)h;
	uint64_t one = 1;

	(void)!write(pc->tc->wake_fd, &one, sizeof(one));
}

static void cost_sample_of(const struct envs_ckpt_result *res, struct cost_sample *ret)
{
	/* What a step-begin may wait for: the job's start to the thaw (the commit runs with
	 * the environment running). */
	uint64_t total_us = res->thaw_us ? res->thaw_us : res->run_us;

	*ret = (struct cost_sample){
		.fs_bytes = res->fs_bytes,
		.criu_bytes = res->criu_bytes,
		.fs_s = (double)res->fs_us / 1e6,
		.dump_s = (double)res->dump_us / 1e6,
		.total_s = (double)total_us / 1e6,
	};
}

static void pckpt_done(struct supervisor *s, struct envs_policy_ckpt *h,
		       const struct envs_ckpt_result *res)
{
	struct pckpt *pc = (struct pckpt *)h;
	struct traj_tracker *t = tracker(s);
	uint64_t now = mono_now_us();

	pc->running = false;
	pc->r = res->r;
	pc->ran_us = res->run_us;
	if (res->r >= 0 && res->committed) {
		struct cost_sample cs;

		pc->r = 0;
		snprintf(pc->id, sizeof(pc->id), "%s", res->id);
		s->metrics.policy_ckpts[POLICY_CKPT_COMPLETED]++;
		cost_sample_of(res, &cs);
		if (t)
			(void)traj_checkpoint_done_at(t, pc->trajectory, pc->env, &cs,
						      pc->decided_us, now);
	} else {
		s->metrics.policy_ckpts[res->r == -ECANCELED ? POLICY_CKPT_ABORTED
							     : POLICY_CKPT_FAILED]++;
		if (t)
			(void)traj_checkpoint_aborted(t, pc->trajectory);
	}
	/* A reply still held on it (a checkpoint cancelled before its freeze, in its pre-copy,
	 * never thawed: issue 23 item 2) is released now, and its release frees pc (over, its
	 * outcome taken): pc is not to be looked at after that. */
	if (referenced(s->traj_ctl, pc)) {
		release_of(s, pc, now);
		return;
	}
	release_of(s, pc, now);
	pckpt_maybe_free(s->traj_ctl, pc);
}

static struct sv_traj_ctl *ctl_get(struct supervisor *s)
{
	struct sv_traj_ctl *tc = s->traj_ctl;

	if (tc)
		return tc;
	tc = calloc(1, sizeof(*tc));
	if (!tc)
		return NULL;
	tc->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	tc->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	/* Without the loop's watch (tests, fuzzing) replies are never held. */
	tc->watched = tc->wake_fd >= 0 && tc->timer_fd >= 0 && s->hooks && s->hooks->watch_fd &&
		      s->hooks->watch_fd(s, tc->wake_fd, on_wake) >= 0 &&
		      s->hooks->watch_fd(s, tc->timer_fd, on_timer) >= 0;
	s->traj_ctl = tc;
	return tc;
}

/* Step end: run the checkpoint the decision asks for. */
static void start_checkpoint(struct supervisor *s, struct sv_traj_ctl *tc,
			     const struct proto_traj_step *q, uint64_t now_us,
			     struct proto_traj_decision *d)
{
	struct pckpt *pc, *old = pckpt_of_env(tc, q->env);
	size_t n = 0;
	int r;

	if (old && old->running) {
		r = -EBUSY;
		goto refused;
	}
	if (old) { /* over, its outcome never asked for: the new one replaces it */
		old->collected = true;
		pckpt_maybe_free(tc, old);
	}
	for (pc = tc->ckpts; pc; pc = pc->next)
		n++;
	if (n >= TRAJ_CTL_MAX) {
		r = -ENOSPC;
		goto refused;
	}
	pc = calloc(1, sizeof(*pc));
	if (!pc) {
		r = -ENOMEM;
		goto refused;
	}
	pc->tc = tc;
	pc->h.on_thawed = pckpt_thawed;
	pc->h.on_done = pckpt_done;
	snprintf(pc->env, sizeof(pc->env), "%s", q->env);
	snprintf(pc->trajectory, sizeof(pc->trajectory), "%s", q->trajectory);
	pc->sync = d->act == TRAJ_ACT_CHECKPOINT_SYNC;
	pc->decided_us = now_us;
	pc->running = true;
	pc->next = tc->ckpts;
	tc->ckpts = pc;
	r = env_ops->checkpoint(s, q->env, q->trajectory, q->turn, q->prefix_tokens, q->prefix_hash,
				&pc->h);
	if (r < 0) {
		tc->ckpts = pc->next;
		free(pc);
		goto refused;
	}
	s->metrics.policy_ckpts_started++;
	/* Without an offload thread the job ran inline and pckpt_done may have freed pc. */
	return;
refused:
	/* The turn stays unprotected: a later step end decides again (and is forced in time). */
	log_info_errno(r, "Trajectory %s: no checkpoint of %s now (%s): %m.", q->trajectory, q->env,
		       d->why);
	(void)traj_checkpoint_aborted(s->trajs, q->trajectory);
	d->act = TRAJ_ACT_NONE;
	snprintf(d->why, sizeof(d->why), "%s", r == -EBUSY ? "busy" : "failed");
}

/* Step begin: the outcome of the checkpoint of the bubble that ended; held while it runs. */
static int answer_begin(struct supervisor *s, struct sv_client *c, struct sv_traj_ctl *tc,
			const struct policy_config *cf, struct proto_msg *m)
{
	struct proto_traj_decision *d = &m->traj_decision;
	struct pckpt *pc = pckpt_of_env(tc, d->env);
	uint64_t now = mono_now_us();
	struct held *h;

	if (!pc || strcmp(pc->trajectory, d->trajectory) != 0)
		return client_send(s, c, m);
	if (!pc->running || atomic_load(&pc->h.thawed) || !tc->watched ||
	    !(h = calloc(1, sizeof(*h)))) {
		fill_outcome(pc, d);
		pckpt_maybe_free(tc, pc);
		return client_send(s, c, m);
	}
	h->client = c->serial;
	h->pc = pc;
	h->since_us = now;
	h->bound_us = pc->sync ? UINT64_MAX : policy_action_hold_us(cf);
	h->deadline_us = h->bound_us == UINT64_MAX ? UINT64_MAX : now + h->bound_us;
	h->d = *d;
	h->next = tc->held;
	tc->held = h;
	if (h->deadline_us <= now)
		bound_reached(s, h, now);
	arm_timer(tc);
	return 0;
}

int traj_ctl_on_step(struct supervisor *s, struct sv_client *c, const struct proto_traj_step *q)
{
	struct proto_traj_step filled; /* gateway-traj */
	struct traj_env_view v = {.dirty = true};
	struct sv_traj_ctl *tc = ctl_get(s);
	struct policy_config pc;
	struct proto_msg m = {.type = PROTO_TRAJ_DECISION};
	uint64_t now = mono_now_us();
	bool managed = false;
	int r;

	if (!tracker(s) || !tc)
		return client_send_error(s, c, ENOMEM, PROTO_TRAJ_STEP, "out of memory");
	policy_of_config(&s->config, &pc);
	q = gateway_fill(s, q, &filled); /* gateway-traj */
	/* An environment the supervisor manages is seen as it is; any other (or none) is taken
	 * as dirty with the cost model's priors, and the decision is advice only. */
	if (q->ev == TRAJ_STEP_END && q->env[0] && env_ops && env_ops->view && env_ops->checkpoint)
		managed = env_ops->view(s, q->env, &v) >= 0;
	r = traj_on_step(s->trajs, &pc, q, &v, now, &m.traj_decision);
	if (r < 0)
		return client_send_error(s, c, -r, PROTO_TRAJ_STEP,
					 "a step needs a trajectory and an environment id");
	log_debug("Trajectory %s (env %s): %s -> %s (%s)", q->trajectory, q->env,
		  traj_event_to_string(q->ev), traj_action_to_string(m.traj_decision.act),
		  m.traj_decision.why);
	if (q->ev == TRAJ_STEP_BEGIN)
		return answer_begin(s, c, tc, &pc, &m);
	if (managed && m.traj_decision.act != TRAJ_ACT_NONE)
		start_checkpoint(s, tc, q, now, &m.traj_decision);
	return client_send(s, c, &m);
}

void traj_ctl_env_checkpointed(struct supervisor *s, const char *env, const char *trajectory,
			       const struct envs_ckpt_result *res)
{
	struct traj_tracker *t = tracker(s);
	struct cost_sample cs;

	if (!t || !res->committed)
		return;
	cost_sample_of(res, &cs);
	(void)traj_checkpoint_done(t, trajectory, env, &cs, mono_now_us());
}

void traj_ctl_free(struct supervisor *s)
{
	struct sv_traj_ctl *tc = s->traj_ctl;

	traj_tracker_free(s->trajs);
	s->trajs = NULL;
	if (!tc)
		return;
	/* After the offload thread stopped: no job holds a pckpt any more. */
	while (tc->held) {
		struct held *h = tc->held;

		tc->held = h->next;
		free(h);
	}
	while (tc->ckpts) {
		struct pckpt *pc = tc->ckpts;

		tc->ckpts = pc->next;
		free(pc);
	}
	(void)safe_close(tc->wake_fd);
	(void)safe_close(tc->timer_fd);
	free(tc);
	s->traj_ctl = NULL;
}
