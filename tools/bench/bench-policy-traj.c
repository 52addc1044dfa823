/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench policy: one rollout. Every trajectory is a thread with its own connection to
 * the supervisor: step-end (PROTO_TRAJ_STEP) -> a real streaming generation through the
 * supervisor's gateway (header X-Belayer-Trajectory) -> step-begin (PROTO_TRAJ_STEP; the
 * reply may be held while the policy's checkpoint runs) -> the action, a real command inside
 * the trajectory's environment. A trajectory with a failure planned has its environment's
 * cgroup killed at that time (a timer thread), and then recovers the way a framework would:
 * restore the environment's latest checkpoint (rebuild from the base when there is none) and
 * carry on from the restored turn.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bench-measure.h"
#include "bench-path.h"
#include "bench-policy.h"
#include "engine-client.h"
#include "envckpt-fixture.h"
#include "log.h"
#include "util.h"

/* A loaded machine makes answers late, not wrong: a wait says so every SLOW_MS it lasts (the
 * rollout counts them: pol_slow_waits()) and gives up only when its peer is gone or after
 * HANG_MS, which no load explains (a fixed 30 s bound failed the adaptive failure rollout with
 * "Connection timed out" while other work ran on the machine). */
#define SLOW_MS 30000
#define HANG_MS (20 * 60 * 1000)

uint64_t pol_now_us(const struct pol_rollout *ro)
{
	return (bench_now_ns() - ro->t0_ns) / 1000;
}

int pol_connect(const char *socket_path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd;

	if (strlen(socket_path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, socket_path, strlen(socket_path));
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int r = -errno;

		close(fd);
		return r;
	}
	return fd;
}

static atomic_uint slow_waits;

unsigned pol_slow_waits(void)
{
	return atomic_load(&slow_waits);
}

/* Whether a wait that began at t0_ns and is still on may go on (it reports itself as slow);
 * -ETIMEDOUT after HANG_MS. */
static int still_waiting(uint64_t t0_ns, const char *what)
{
	uint64_t s = (bench_now_ns() - t0_ns) / 1000000000u;

	atomic_fetch_add(&slow_waits, 1);
	if (s * 1000 >= HANG_MS)
		return log_error_errno(-ETIMEDOUT, "%s: nothing for %" PRIu64 " s: hung", what, s);
	log_warning("%s: still waiting after %" PRIu64 " s (a loaded machine?).", what, s);
	return 0;
}

/* Until fd is readable (or its peer gone: the read that follows says so). */
static int wait_readable(int fd, const char *what)
{
	uint64_t t0 = bench_now_ns();

	for (;;) {
		int r = poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, SLOW_MS);

		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r == 0) {
			r = still_waiting(t0, what);
			if (r < 0)
				return r;
		}
	}
}

static int recv_wait(int fd, struct proto_msg *m)
{
	int r = wait_readable(fd, "an answer of the supervisor");

	return r < 0 ? r : proto_recv(fd, m, 0);
}

/* fixture_ask() with the same patience (its requests are idempotent: get, set turn-N). */
static int ask(const struct pol_traj *t, const char *req, char *ans, size_t cap)
{
	uint64_t t0 = bench_now_ns();
	char port[16], what[96];
	int r;

	snprintf(port, sizeof(port), "%u", (unsigned)t->srv_port);
	snprintf(what, sizeof(what), "%s: the environment's server (%s)", t->id, req);
	while ((r = fixture_ask_in(t->cgroup, port, req, ans, cap, SLOW_MS)) == -ETIMEDOUT) {
		r = still_waiting(t0, what);
		if (r < 0)
			return r;
	}
	return r;
}

int pol_env_request(int fd, const struct proto_env_request *q, struct proto_env_info *ret)
{
	struct proto_msg m = {.type = PROTO_ENV_REQUEST};
	bool got = false;
	int r;

	m.env_request = *q;
	r = proto_send(fd, &m, 0);
	if (r < 0)
		return r;
	for (;;) {
		r = recv_wait(fd, &m);
		if (r < 0)
			return r;
		if (m.type == PROTO_ERROR) {
			r = -abs(m.error.code ? m.error.code : EIO);
			log_debug("env %s %s: %s", env_op_to_string(q->op), q->env,
				  m.error.message);
			proto_msg_finish(&m);
			return r;
		}
		if (m.type == PROTO_ENV_INFO && !got && ret) {
			*ret = m.env_info;
			got = true;
		}
		proto_msg_finish(&m);
		if (m.type == PROTO_END)
			return 0;
	}
}

/* An environment request retried while the environment is busy (a checkpoint job, however
 * long load makes it). */
static int env_request_retry(int fd, const struct proto_env_request *q, struct proto_env_info *ret)
{
	uint64_t t0 = bench_now_ns(), next = t0 + (uint64_t)SLOW_MS * 1000000u;
	int r;

	while ((r = pol_env_request(fd, q, ret)) == -EBUSY) {
		if (bench_now_ns() >= next) {
			next += (uint64_t)SLOW_MS * 1000000u;
			r = still_waiting(t0, "a busy environment");
			if (r < 0)
				return r;
		}
		(void)poll(NULL, 0, 5);
	}
	return r;
}

int pol_env_create(int fd, const char *base, struct pol_traj *t)
{
	struct proto_env_request q = {.op = ENV_OP_CREATE};
	char ans[128];
	int r;

	snprintf(q.env, sizeof(q.env), "%s", t->env);
	snprintf(q.root, sizeof(q.root), "%s", base);
	snprintf(q.cmd, sizeof(q.cmd), "cd /work; /work/server %u & exec sleep infinity",
		 (unsigned)t->srv_port);
	r = pol_env_request(fd, &q, NULL);
	if (r < 0)
		return log_error_errno(r, "Failed to create environment %s: %m", q.env);
	r = pol_env_refresh(fd, t);
	if (r < 0)
		return log_error_errno(r, "Environment %s has no process: %m", q.env);
	/* Ready once its server answers. */
	r = ask(t, "get", ans, sizeof(ans));
	if (r < 0)
		return log_error_errno(r, "The server of %s does not answer: %m", q.env);
	return 0;
}

int pol_env_refresh(int fd, struct pol_traj *t)
{
	struct proto_msg m = {.type = PROTO_ENV_REQUEST};
	bool found = false;
	int r;

	m.env_request.op = ENV_OP_LIST;
	r = proto_send(fd, &m, 0);
	if (r < 0)
		return r;
	for (;;) {
		r = recv_wait(fd, &m);
		if (r < 0)
			return r;
		if (m.type == PROTO_ERROR)
			return -abs(m.error.code ? m.error.code : EIO);
		if (m.type == PROTO_ENV_INFO && strcmp(m.env_info.env, t->env) == 0) {
			t->pid = m.env_info.pid;
			snprintf(t->root, sizeof(t->root), "%s", m.env_info.root);
			snprintf(t->cgroup, sizeof(t->cgroup), "%s", m.env_info.cgroup);
			found = true;
		}
		/* Its cgroup and root are what the failure timer and the actions build paths
		 * from: an environment without them is not there. */
		if (m.type == PROTO_END)
			return found && t->pid > 0 && t->cgroup[0] == '/' && t->root[0] == '/'
				       ? 0
				       : -ESRCH;
	}
}

static int step(int fd, struct pol_traj *t, enum traj_event ev, uint64_t turn, uint64_t plen,
		uint64_t mtps, uint64_t out, struct proto_traj_decision *ret)
{
	struct proto_msg m = {.type = PROTO_TRAJ_STEP};
	int r;

	m.traj_step.ev = ev;
	snprintf(m.traj_step.trajectory, sizeof(m.traj_step.trajectory), "%s", t->id);
	snprintf(m.traj_step.env, sizeof(m.traj_step.env), "%s", t->env);
	m.traj_step.turn = turn;
	m.traj_step.prompt_tokens = plen;
	m.traj_step.decode_mtps = mtps;
	m.traj_step.output_tokens = out;
	r = proto_send(fd, &m, 0);
	if (r < 0)
		return r;
	r = recv_wait(fd, &m);
	if (r < 0)
		return r;
	if (m.type == PROTO_ERROR)
		return log_error_errno(EPROTO, "%s: step %s refused: %s", t->id,
				       traj_event_to_string(ev), m.error.message);
	if (m.type != PROTO_TRAJ_DECISION)
		return log_error_errno(EPROTO, "%s: step answered with %s", t->id,
				       proto_type_to_string(m.type));
	*ret = m.traj_decision;
	return 0;
}

/* A streaming /generate of exactly `tokens` new tokens through the gateway, tagged with the
 * trajectory. Returns the tokens streamed, or -errno. */
static int64_t generate(const struct pol_rollout *ro, const struct pol_traj *t, unsigned plen,
			unsigned tokens, unsigned turn)
{
	char head[512], *body, buf[16384];
	size_t cap = (size_t)plen * 8 + 256, o;
	int64_t n = 0;
	bool done = false;
	int fd;

	body = malloc(cap);
	if (!body)
		return -ENOMEM;
	o = (size_t)snprintf(body, cap, "{\"input_ids\":[");
	for (unsigned k = 0; k < plen; k++)
		o += (size_t)snprintf(body + o, cap - o, "%s%u", k ? "," : "",
				      (t->idx * 7919u + turn * 31u + k * 104729u) % 500u + 1);
	snprintf(body + o, cap - o,
		 "],\"sampling_params\":{\"max_new_tokens\":%u,\"temperature\":0},"
		 "\"stream\":true}",
		 tokens);
	fd = client_connect(ro->gateway);
	if (fd < 0) {
		free(body);
		return fd;
	}
	snprintf(head, sizeof(head),
		 "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
		 "X-Belayer-Trajectory: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
		 t->id, strlen(body));
	if (send(fd, head, strlen(head), MSG_NOSIGNAL) < 0 ||
	    send(fd, body, strlen(body), MSG_NOSIGNAL) < 0) {
		free(body);
		close(fd);
		return -EIO;
	}
	free(body);
	for (;;) {
		int w = wait_readable(fd, "a generation's stream");
		ssize_t k;

		if (w < 0) {
			close(fd);
			return w;
		}
		k = recv(fd, buf, sizeof(buf) - 1, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		buf[k] = 0;
		/* Events are small and arrive whole in practice; count their starts. */
		for (char *p = buf; (p = strstr(p, "data: ")); p += 6) {
			if (strncmp(p + 6, "[DONE]", 6) == 0)
				done = true;
			else
				n++;
		}
	}
	close(fd);
	return done ? n : -EPROTO;
}

/* Runs `sh -c cmd` inside the environment: its cgroups (its limits' v1 ones too) and every
 * namespace (nsenter -a). */
static int env_run(const struct pol_traj *t, const char *cmd)
{
	char line[8192], procs[4200], join[2048];
	int r;

	/* An empty cgroup would have the shell write /cgroup.procs at the host's root. */
	r = bench_cgroup_file(procs, sizeof(procs), t->cgroup, "cgroup.procs");
	if (r >= 0)
		r = fixture_join_prefix((pid_t)t->pid, join, sizeof(join));
	if (r < 0 || !strstr(join, procs))
		return log_error_errno(r < 0 ? r : -ESRCH, "%s: no cgroup to run in (\"%s\"): %m",
				       t->id, t->cgroup);
	snprintf(line, sizeof(line),
		 "%sexec nsenter -t %u -a -r -w sh -ec \"%s\" </dev/null >/dev/null 2>&1", join,
		 t->pid, cmd);
	return system(line) == 0 ? 0 : -EIO;
}

/* Action k: files written as drawn, the turn recorded in /work/turn and in the server. */
static int act(const struct pol_traj *t, unsigned k)
{
	char cmd[1024], req[64], ans[128];
	int r;

	switch (t->act[k]) {
	case ACT_READ:
		snprintf(cmd, sizeof(cmd),
			 "cat /work/turn /work/notes.txt >/dev/null 2>&1 || true; ls -l /work "
			 ">/dev/null; wc -c /work/data/* >/dev/null 2>&1 || true");
		return env_run(t, cmd);
	case ACT_EDIT:
		snprintf(cmd, sizeof(cmd),
			 "mkdir -p /work/data; seq %u %u >>/work/notes.txt; sed -i "
			 "'s/^%u$/edited-%u/' /work/notes.txt; echo %u >/work/turn",
			 k * 1000, k * 1000 + t->act_bytes[k] / 8, k * 1000 + 1, k, k);
		break;
	case ACT_WRITE:
		snprintf(
			cmd, sizeof(cmd),
			"mkdir -p /work/data; head -c %u /dev/urandom >/work/data/t%u.bin; echo %u "
			">/work/turn",
			t->act_bytes[k], k, k);
		break;
	}
	r = env_run(t, cmd);
	if (r < 0)
		return r;
	snprintf(req, sizeof(req), "set turn-%u", k);
	return ask(t, req, ans, sizeof(ans));
}

unsigned pol_protected_turn(const struct pol_traj *t, unsigned turns, uint64_t at_us)
{
	unsigned best = 0;

	for (unsigned k = 0; k <= turns; k++)
		if (t->ck_done_us[k] && t->ck_done_us[k] <= at_us)
			best = k;
	return best;
}

int pol_env_checkpoints(int fd, const struct pol_rollout *ro, struct pol_traj *t)
{
	struct proto_msg m = {.type = PROTO_ENV_REQUEST};
	uint64_t t0 = bench_now_ns(), next = t0 + (uint64_t)SLOW_MS * 1000000u;
	char dir[4200];
	int r;

	memset(t->ck_done_us, 0, sizeof(t->ck_done_us));
	t->ck_listed = 0;
	/* <state>/envs/ID/root -> <state>/envs/ID/ckpt/CKPT: from a root that is one */
	snprintf(dir, sizeof(dir), "%s", t->root);
	if (dir[0] != '/' || strrchr(dir, '/') == dir)
		return log_error_errno(-ESRCH, "%s: no environment root (\"%s\")", t->id, t->root);
	*strrchr(dir, '/') = '\0';
again:
	m = (struct proto_msg){.type = PROTO_ENV_REQUEST};
	m.env_request.op = ENV_OP_LIST;
	snprintf(m.env_request.env, sizeof(m.env_request.env), "%s", t->env);
	r = proto_send(fd, &m, 0);
	if (r < 0)
		return r;
	for (;;) {
		r = recv_wait(fd, &m);
		if (r < 0)
			return r;
		if (m.type == PROTO_ERROR) {
			r = -abs(m.error.code ? m.error.code : EIO);
			if (r == -EBUSY && bench_now_ns() >= next) {
				next += (uint64_t)SLOW_MS * 1000000u;
				r = still_waiting(t0, "a busy environment's checkpoints");
				if (r < 0)
					return r;
				r = -EBUSY;
			}
			if (r == -EBUSY) {
				(void)poll(NULL, 0, 5);
				goto again;
			}
			return r;
		}
		if (m.type == PROTO_END)
			return 0;
		/* An entry without a checkpoint ("": its ckpt/ directory) commits no turn. */
		if (m.type == PROTO_ENV_INFO && m.env_info.turn < POL_MAX_TURNS + 1 &&
		    m.env_info.ckpt[0]) {
			char path[4400];
			struct stat st;

			snprintf(path, sizeof(path), "%s/ckpt/%s", dir, m.env_info.ckpt);
			if (stat(path, &st) == 0) {
				uint64_t ns = (uint64_t)st.st_ctim.tv_sec * 1000000000u +
					      (uint64_t)st.st_ctim.tv_nsec;

				t->ck_done_us[m.env_info.turn] =
					ns > ro->t0_real_ns ? (ns - ro->t0_real_ns) / 1000 : 1;
				t->ck_listed++;
			}
		}
	}
}

static void *killer(void *arg)
{
	struct {
		const struct pol_rollout *ro;
		struct pol_traj *t;
	} *k = arg;
	struct timespec ts = {.tv_sec = (time_t)(k->t->fail_delay_us / 1000000),
			      .tv_nsec = (long)(k->t->fail_delay_us % 1000000) * 1000};
	char path[4200];
	int fd, r;

	/* Relative to the trajectory's own progress, so that the failure lands inside it
	 * however fast this rollout runs. */
	while (atomic_load(&k->t->at_turn) < k->t->fail_turn && !atomic_load(&k->t->finished))
		(void)poll(NULL, 0, 1);
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	if (atomic_load(&k->t->finished))
		return NULL;
	/* The environment's own cgroup, checked: an environment never created (or gone) has
	 * none, and "" + "/cgroup.kill" is a path at the host's root. Nothing is killed then,
	 * and the trajectory fails on its own error. */
	r = bench_cgroup_file(path, sizeof(path), k->t->cgroup, "cgroup.kill");
	if (r < 0) {
		log_error_errno(r, "%s: no environment cgroup to kill (\"%s\"): %m", k->t->id,
				k->t->cgroup);
		return NULL;
	}
	k->t->fail.at_us = pol_now_us(k->ro);
	/* Flagged first: an action the kill breaks must know why it failed. */
	atomic_store(&k->t->killed, true);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "1", 1) != 1)
		log_error_errno(negative_errno(), "%s: failed to kill %s: %m", k->t->id, path);
	if (fd >= 0)
		close(fd);
	return NULL;
}

/* After the environment was killed: restore its latest checkpoint (or rebuild it), check
 * what came back, and say where the trajectory carries on. */
static int recover(struct pol_rollout *ro, int fd, struct pol_traj *t, unsigned *ret_next)
{
	struct proto_env_request q = {.op = ENV_OP_RESTORE};
	struct proto_env_info info = {0};
	struct pol_failure *f = &t->fail;
	char path[4300], buf[32] = "", ans[128], want[64];
	uint64_t s0 = pol_now_us(ro);
	FILE *fp;
	int r;

	/* The computed figure: from the checkpoints committed before the failure. */
	r = pol_env_checkpoints(fd, ro, t);
	if (r < 0)
		return log_error_errno(r, "%s: cannot list the checkpoints of %s: %m", t->id,
				       t->env);
	f->computed_turn = pol_protected_turn(t, ro->turns, f->at_us);
	f->computed_lost_us = f->at_us - t->act_end[f->computed_turn];
	snprintf(q.env, sizeof(q.env), "%s", t->env);
	r = env_request_retry(fd, &q, &info);
	if (r == -ENOENT || r == -ENOLINK) {
		/* No checkpoint: the baseline's recovery, a fresh environment from the base
		 * (destroy + create: ENV_OP_REBUILD through the daemon fails with EBUSY on
		 * this tree). */
		q.op = ENV_OP_DESTROY;
		info = (struct proto_env_info){0};
		r = env_request_retry(fd, &q, NULL);
		/* Under a new id: a destroyed environment's upper layer stays on disk, and a
		 * create of the same id would take it back. */
		if (strlen(t->env) + 2 < sizeof(t->env))
			strcat(t->env, "r");
		if (r >= 0)
			r = pol_env_create(fd, ro->base, t);
		f->rebuilt = true;
	}
	if (r < 0)
		return log_error_errno(r, "%s: recovery of %s failed: %m", t->id, t->env);
	f->recover_us = pol_now_us(ro) - s0;
	f->restored_turn = f->rebuilt ? 0 : (unsigned)info.turn;
	f->real_lost_us = f->at_us - t->act_end[f->restored_turn];
	r = pol_env_refresh(fd, t);
	if (r < 0)
		return log_error_errno(r, "%s: %s gone after recovery: %m", t->id, t->env);
	snprintf(path, sizeof(path), "%s/work/turn", t->root);
	fp = fopen(path, "re");
	if (fp) {
		if (!fgets(buf, sizeof(buf), fp))
			buf[0] = '\0';
		fclose(fp);
	}
	f->file_turn = (unsigned)strtoul(buf, NULL, 10);
	r = ask(t, "get", ans, sizeof(ans));
	/* The server answers "STATE COUNT"; its state is the last turn that set it. */
	snprintf(want, sizeof(want), "turn-%u ", f->file_turn);
	f->server_ok = r >= 0 && (f->file_turn ? strncmp(ans, want, strlen(want)) == 0
					       : strncmp(ans, "turn-", 5) != 0);
	f->done = true;
	*ret_next = f->restored_turn + 1;
	return 0;
}

/* The environment was killed and not yet recovered. */
static bool pending_failure(const struct pol_traj *t)
{
	return atomic_load(&t->killed) && !t->fail.done;
}

static void *traj_run(void *arg)
{
	struct {
		struct pol_rollout *ro;
		struct pol_traj *t;
	} *a = arg;
	struct pol_rollout *ro = a->ro;
	struct pol_traj *t = a->t;
	struct {
		const struct pol_rollout *ro;
		struct pol_traj *t;
	} kargs = {ro, t};
	pthread_t kt;
	bool have_killer = false;
	uint64_t mtps = 0;
	int fd, r = 0;

	fd = pol_connect(ro->socket);
	if (fd < 0) {
		t->err = fd;
		return NULL;
	}
	t->t_start = pol_now_us(ro);
	t->act_end[0] = t->t_start;
	if (t->fail_turn && pthread_create(&kt, NULL, killer, &kargs) == 0)
		have_killer = true;
	for (unsigned g = 1; g <= ro->turns + 1 && r >= 0;) {
		struct pol_turn *u = &t->turn[g];
		struct proto_traj_decision d;
		unsigned plen = ro->prompt + 4 * g;
		int64_t n;

		*u = (struct pol_turn){.t_end = pol_now_us(ro)};
		atomic_store(&t->at_turn, g);
		/* The observation of action g-1 went back: a bubble starts. The framework knows
		 * the prompt length and the decode rate it measured (0 on the first turn: the
		 * gateway's view then). */
		r = step(fd, t, TRAJ_STEP_END, g - 1, mtps ? plen : 0, mtps, 0, &d);
		if (r < 0)
			break;
		u->end_ok = true;
		u->end_act = d.act;
		snprintf(u->end_why, sizeof(u->end_why), "%s", d.why);
		u->bub_us = d.bubble_us;
		u->bub_err = d.bubble_err_pm;
		u->cost_us = d.cost_us;
		u->cost_err = d.cost_err_pm;
		u->t_gen0 = pol_now_us(ro);
		n = generate(ro, t, plen, t->out_tokens[g], g);
		if (n < 0) {
			r = log_error_errno((int)n, "%s: generation %u failed: %m", t->id, g);
			break;
		}
		u->t_gen1 = pol_now_us(ro);
		u->tokens = (uint64_t)n;
		if (u->t_gen1 > u->t_gen0)
			mtps = (uint64_t)n * 1000000000u / (u->t_gen1 - u->t_gen0);
		r = step(fd, t, TRAJ_STEP_BEGIN, g, 0, 0, (uint64_t)n, &d);
		if (r < 0)
			break;
		u->t_begin = pol_now_us(ro);
		u->held_us = d.held_us;
		u->ckpt_us = d.ckpt_us;
		u->aborted = d.aborted;
		snprintf(u->ckpt, sizeof(u->ckpt), "%s", d.ckpt);
		if (g <= ro->turns && !pending_failure(t)) {
			r = act(t, g);
			if (r < 0 && !pending_failure(t)) {
				log_error_errno(r, "%s: action %u failed", t->id, g);
				break;
			}
			if (r >= 0 && !pending_failure(t)) {
				u->t_act1 = pol_now_us(ro);
				t->act_end[g] = u->t_act1;
			}
			r = 0;
		}
		if (pending_failure(t)) {
			unsigned next;

			r = recover(ro, fd, t, &next);
			g = next;
			continue;
		}
		g++;
	}
	t->t_done = pol_now_us(ro);
	atomic_store(&t->finished, true);
	if (have_killer)
		(void)pthread_join(kt, NULL);
	close(fd);
	t->err = r;
	return NULL;
}

int pol_rollout_run(struct pol_rollout *ro)
{
	struct {
		struct pol_rollout *ro;
		struct pol_traj *t;
	} args[POL_MAX_TRAJS];
	pthread_t th[POL_MAX_TRAJS];
	unsigned started = 0;
	int r = 0;

	{
		struct timespec ts;

		ro->t0_ns = bench_now_ns();
		clock_gettime(CLOCK_REALTIME, &ts);
		ro->t0_real_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	}
	for (unsigned i = 0; i < ro->ntraj; i++) {
		struct pol_traj *t = &ro->traj[i];

		memset(t->turn, 0, sizeof(t->turn));
		memset(t->act_end, 0, sizeof(t->act_end));
		memset(t->ck_done_us, 0, sizeof(t->ck_done_us));
		t->ck_listed = 0;
		t->fail = (struct pol_failure){0};
		atomic_store(&t->killed, false);
		atomic_store(&t->at_turn, 0);
		atomic_store(&t->finished, false);
		t->t_start = t->t_done = 0;
		t->err = 0;
		args[i].ro = ro;
		args[i].t = t;
		if (pthread_create(&th[i], NULL, traj_run, &args[i]) != 0) {
			r = -EAGAIN;
			break;
		}
		started++;
	}
	for (unsigned i = 0; i < started; i++) {
		(void)pthread_join(th[i], NULL);
		if (ro->traj[i].err < 0 && r == 0)
			r = ro->traj[i].err;
	}
	return r;
}
