/* SPDX-License-Identifier: MIT */
/*
 * Shadow mode and promotion end to end on the emulated GPU. This test plays the supervisor's
 * side of the protocol itself: it listens on the socket the shims connect to, takes a
 * primary's announcements (fds included), starts a shadow of the same workload, checks its
 * layout against the primary's with common/layout, SIGKILLs the primary, sends the
 * PROMOTE_MAPs and the PROMOTE_COMMIT, and then asks the promoted process itself what its
 * memory holds: shadow-workload reads every region back at the address it always had, and
 * the engine stand-in answers /generate.
 *
 * Every wait is on a real condition (a message, a line, an exit) with a bounded timeout.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "belayer-emu.h"
#include "engine-client.h"
#include "gpu-uuid.h"
#include "layout.h"
#include "proto.h"
#include "test-util.h"
#include "util.h"

#define TIMEOUT_MS 30000
#define MIB	   (UINT64_C(1) << 20)
#define MAX_REGS   64
#define N_LAYOUT   5 /* shadow-workload: 3 weights + 2 kv regions */
#define SCRATCH	   (2 * MIB)

struct peer {
	pid_t pid;
	bool child;	  /* ours to reap (a TP rank's follower is its leader's child) */
	int in, out, err; /* the process's stdin, stdout, stderr */
	int conn;	  /* its shim's connection */
	int hellos;
	enum worker_role role;
	int32_t rank;
	struct proto_region regs[MAX_REGS]; /* announced, fd owned */
	size_t n_regs;
	struct proto_shadow_region sregs[MAX_REGS];
	size_t n_sregs;
	int parked;
	struct proto_shadow_parked park;
	int dones;
	struct proto_promote_done done;
	int errors;
	struct proto_error error;
	struct proto_mem_info mem[PROTO_MAX_MEM_INFO]; /* its cuMemGetInfo answers */
	size_t n_mem;
};

static char *emu_dir;

struct fixture {
	char *dir;
	char sock[256];
	int lfd;
	struct peer primary, shadow;
	struct peer primary1, shadow1; /* rank 1 of a TP=2 engine */
	/* engine_start: how the KV cache is sized (NULL: --kv-cache-bytes 16M), and one more
	 * "NAME=value" for a shadow */
	const char *kv_flag, *kv_value, *shadow_env;
	/* engine_start: where the index tables go (NULL: --index-tables), and --belayer-tags */
	const char *index_flag;
	bool engine_tags;
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void peer_init(struct peer *p)
{
	memset(p, 0, sizeof(*p));
	p->pid = -1;
	p->in = p->out = p->err = p->conn = -1;
}

static void peer_close(struct peer *p)
{
	if (p->pid > 0) {
		kill(p->pid, SIGKILL);
		if (p->child)
			waitpid(p->pid, NULL, 0);
	}
	for (size_t i = 0; i < p->n_regs; i++)
		safe_close(p->regs[i].fd);
	safe_close(p->in);
	safe_close(p->out);
	safe_close(p->err);
	safe_close(p->conn);
	peer_init(p);
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	if (!f)
		return -1;
	f->dir = test_mkdtemp("belayer-shadow");
	if (!f->dir)
		return -1;
	snprintf(f->sock, sizeof(f->sock), "%s/supervisor.sock", f->dir);
	if (strlen(f->sock) >= sizeof(sa.sun_path))
		return -1;
	memcpy(sa.sun_path, f->sock, strlen(f->sock) + 1);
	f->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(f->lfd, 16) < 0)
		return -1;
	peer_init(&f->primary);
	peer_init(&f->shadow);
	peer_init(&f->primary1);
	peer_init(&f->shadow1);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	peer_close(&f->primary);
	peer_close(&f->shadow);
	peer_close(&f->primary1);
	peer_close(&f->shadow1);
	safe_close(f->lfd);
	test_rmtree(f->dir);
	free(f->dir);
	free(f);
	return 0;
}

/* Starts argv under the shim with the given role and extra environment ("NAME=value"). */
static void spawn(struct fixture *f, struct peer *p, const char *const argv[], const char *role,
		  const char *const env[])
{
	int in[2], out[2], err[2];

	assert_int_equal(pipe2(in, O_CLOEXEC), 0);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	assert_int_equal(pipe2(err, O_CLOEXEC), 0);
	p->pid = fork();
	assert_true(p->pid >= 0);
	p->child = true;
	if (p->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		dup2(err[1], 2);
		setenv("LD_LIBRARY_PATH", EMU_LIB_DIR, 1);
		setenv("LD_PRELOAD", SHIM_PATH, 1);
		setenv("BELAYER_SOCKET", f->sock, 1);
		setenv("BELAYER_ROLE", role, 1);
		setenv("BELAYER_ENGINE_ID", "test-engine", 1);
		setenv("BELAYER_PARK_QUIET_MS", "200", 1);
		for (size_t i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	close(err[1]);
	p->in = in[1];
	p->out = out[0];
	p->err = err[0];
}

/* Accepts the shim connection of the process just started (its CUDA init connects). */
static void accept_peer(struct fixture *f, struct peer *p)
{
	struct pollfd pfd = {.fd = f->lfd, .events = POLLIN};
	struct ucred cred;
	socklen_t len = sizeof(cred);

	assert_int_equal(poll(&pfd, 1, TIMEOUT_MS), 1);
	p->conn = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	assert_true(p->conn >= 0);
	assert_int_equal(getsockopt(p->conn, SOL_SOCKET, SO_PEERCRED, &cred, &len), 0);
	assert_int_equal(cred.pid, p->pid);
}

static void absorb(struct peer *p, struct proto_msg *m)
{
	switch (m->type) {
	case PROTO_HELLO:
		p->hellos++;
		p->role = m->hello.role;
		p->rank = m->hello.rank;
		assert_int_equal(m->hello.pid, p->pid);
		break;
	case PROTO_REGION_ANNOUNCE:
		for (size_t i = 0; i < p->n_regs; i++)
			if (p->regs[i].id == m->region.id) {
				/* an update of a region already known */
				safe_close(p->regs[i].fd);
				p->regs[i] = m->region;
				m->region.fd = -1;
				return;
			}
		assert_true(p->n_regs < MAX_REGS);
		p->regs[p->n_regs++] = m->region;
		m->region.fd = -1;
		break;
	case PROTO_REGION_RELEASE:
		for (size_t i = 0; i < p->n_regs; i++)
			if (p->regs[i].id == m->release.id) {
				safe_close(p->regs[i].fd);
				p->regs[i] = p->regs[--p->n_regs];
				break;
			}
		/* A shadow region that left the layout (the supervisor's shadow_release); the
		 * others keep their creation order. */
		for (size_t i = 0; i < p->n_sregs; i++)
			if (p->sregs[i].id == m->release.id) {
				memmove(&p->sregs[i], &p->sregs[i + 1],
					(p->n_sregs - i - 1) * sizeof(p->sregs[0]));
				p->n_sregs--;
				break;
			}
		break;
	case PROTO_SHADOW_REGION:
		assert_true(p->n_sregs < MAX_REGS);
		p->sregs[p->n_sregs++] = m->shadow_region;
		break;
	case PROTO_SHADOW_PARKED:
		p->parked++;
		p->park = m->shadow_parked;
		break;
	case PROTO_PROMOTE_DONE:
		p->dones++;
		p->done = m->promote_done;
		break;
	case PROTO_ERROR:
		p->errors++;
		p->error = m->error;
		break;
	case PROTO_MEM_INFO:
		if (p->n_mem < PROTO_MAX_MEM_INFO)
			p->mem[p->n_mem++] = m->mem_info;
		break;
	case PROTO_NCCL_COMM:
	case PROTO_NCCL_COMM_END:
		break; /* the engine's TP communicator (issue 12): not this test's concern */
	default:
		fail_msg("unexpected message type %d from the shim", (int)m->type);
	}
}

/* Takes messages from p's shim until cond holds. */
#define PUMP_UNTIL(p, cond)                                                       \
	do {                                                                      \
		uint64_t deadline_ = now_ms() + TIMEOUT_MS;                       \
		while (!(cond)) {                                                 \
			struct pollfd pfd_ = {.fd = (p)->conn, .events = POLLIN}; \
			struct proto_msg m_;                                      \
			int left_ = (int)(deadline_ - now_ms());                  \
                                                                                  \
			if (left_ <= 0)                                           \
				fail_msg("timed out waiting for %s", #cond);      \
			if (poll(&pfd_, 1, left_) <= 0)                           \
				continue;                                         \
			assert_int_equal(proto_recv((p)->conn, &m_, 0), 0);       \
			absorb((p), &m_);                                         \
			proto_msg_finish(&m_);                                    \
		}                                                                 \
	} while (0)

static bool read_line(int fd, char *buf, size_t cap)
{
	uint64_t deadline = now_ms() + TIMEOUT_MS;
	size_t n = 0;

	while (n + 1 < cap) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int left = (int)(deadline - now_ms());

		if (left <= 0 || poll(&pfd, 1, left) <= 0 || read(fd, &buf[n], 1) != 1)
			return false;
		if (buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = '\0';
	return true;
}

static void expect_line(struct peer *p, const char *prefix, char *buf, size_t cap)
{
	while (read_line(p->out, buf, cap))
		if (strncmp(buf, prefix, strlen(prefix)) == 0)
			return;
	/* what the process said on its way out */
	for (;;) {
		struct pollfd pfd = {.fd = p->err, .events = POLLIN};
		ssize_t n;

		if (poll(&pfd, 1, 0) != 1)
			break;
		n = read(p->err, buf, cap - 1);
		if (n <= 0)
			break;
		buf[n] = '\0';
		print_message("%s", buf);
	}
	fail_msg("no line \"%s\" from process %d", prefix, p->pid);
}

/* The workload's checksums of its weights/kv regions, read at their addresses. */
static void sums(struct peer *p, uint64_t out[N_LAYOUT])
{
	char line[128];
	size_t n = 0;

	assert_int_equal(write(p->in, "sum\n", 4), 4);
	for (;;) {
		unsigned idx;
		uint64_t v;

		assert_true(read_line(p->out, line, sizeof(line)));
		if (strcmp(line, "sum-end") == 0)
			break;
		assert_int_equal(sscanf(line, "sum %u %" SCNx64, &idx, &v), 2);
		assert_true(idx < N_LAYOUT);
		out[idx] = v;
		n++;
	}
	assert_int_equal(n, N_LAYOUT);
}

static void start_workload(struct fixture *f, struct peer *p, const char *role, unsigned seed,
			   uint64_t weights, uint64_t kv)
{
	char s[16], w[32], k[32], line[64];
	const char *argv[] = {SHADOW_WORKLOAD_PATH, s, w, k, NULL};

	snprintf(s, sizeof(s), "%u", seed);
	snprintf(w, sizeof(w), "%" PRIu64, weights);
	snprintf(k, sizeof(k), "%" PRIu64, kv);
	spawn(f, p, argv, role, NULL);
	accept_peer(f, p);
	expect_line(p, "ready", line, sizeof(line));
}

/* The primary's layout as the supervisor computes it: its weights+kv announcements. */
static uint64_t primary_layout(const struct peer *p, uint32_t *ret_n,
			       const struct proto_region *ret[])
{
	struct layout_entry e[MAX_REGS];
	uint64_t h;

	for (size_t i = 0; i < p->n_regs; i++)
		e[i] = (struct layout_entry){
			.order = p->regs[i].order, .cls = p->regs[i].cls, .size = p->regs[i].size};
	h = layout_hash(e, p->n_regs, ret_n);
	if (ret) {
		size_t k = 0;

		/* the same entries, in the order layout_hash sorted them */
		for (size_t i = 0; i < p->n_regs; i++)
			for (size_t j = 0; j < p->n_regs; j++)
				if (p->regs[j].order == e[i].order && layout_class_counts(e[i].cls))
					ret[k++] = &p->regs[j];
	}
	return h;
}

static size_t count_class(const struct peer *p, bool layout)
{
	size_t n = 0;

	for (size_t i = 0; i < p->n_regs; i++)
		n += layout_class_counts(p->regs[i].cls) == layout;
	return n;
}

static uint64_t live_bytes(void)
{
	uint64_t bytes = 0;

	assert_true(belayer_emu_live_allocations(0, &bytes) >= 0);
	return bytes;
}

/* Pumps primary and shadow until the shadow's last park is the primary's layout (n: its
 * entries). Either side may still have messages on the way: an engine's shadow that paused
 * longer than BELAYER_PARK_QUIET_MS between two allocations parked part of its layout first,
 * and parks the whole once it is there. */
static void pump_until_park_matches(struct peer *prim, struct peer *shad, uint32_t *n)
{
	uint64_t deadline = now_ms() + TIMEOUT_MS;

	while (!(shad->parked >= 1 && primary_layout(prim, n, NULL) == shad->park.hash)) {
		struct pollfd pfd[2] = {{.fd = prim->conn, .events = POLLIN},
					{.fd = shad->conn, .events = POLLIN}};
		struct peer *peers[2] = {prim, shad};
		int left = (int)(deadline - now_ms());

		if (left <= 0)
			fail_msg("timed out waiting for the shadow's park of the primary's layout "
				 "(%d parks, %u entries in the last)",
				 shad->parked, shad->park.n_entries);
		if (poll(pfd, 2, left) <= 0)
			continue;
		for (int i = 0; i < 2; i++) {
			struct proto_msg m;

			if (!pfd[i].revents)
				continue;
			assert_int_equal(proto_recv(peers[i]->conn, &m, 0), 0);
			absorb(peers[i], &m);
			proto_msg_finish(&m);
		}
	}
}

/* The shadow-workload's shadow parked with its whole layout. The shim parks once the KV cache
 * exists and nothing was allocated for BELAYER_PARK_QUIET_MS (200 ms here), and parks again
 * when the layout changes: on a loaded machine a pause between two of the workload's
 * allocations (a 1 GiB region maps hundreds of scratch pieces) sends a first park of part of
 * it. The last park is the one that counts. */
static void wait_parked_whole(struct fixture *f)
{
	PUMP_UNTIL(&f->shadow, f->shadow.parked >= 1 && f->shadow.park.n_entries == N_LAYOUT &&
				       f->shadow.n_sregs == N_LAYOUT);
}

/* Primary up and announced, shadow up and parked, layouts equal. */
static void start_pair(struct fixture *f, uint64_t weights, uint64_t kv, uint64_t prim_sums[])
{
	uint64_t hash;
	uint32_t n;

	start_workload(f, &f->primary, "primary", 1, weights, kv);
	PUMP_UNTIL(&f->primary, f->primary.hellos == 1 && f->primary.n_regs == N_LAYOUT + 1);
	assert_int_equal(f->primary.role, ROLE_PRIMARY);
	sums(&f->primary, prim_sums);

	start_workload(f, &f->shadow, "shadow", 2, weights, kv);
	wait_parked_whole(f);
	assert_int_equal(f->shadow.role, ROLE_SHADOW);
	hash = primary_layout(&f->primary, &n, NULL);
	assert_int_equal(n, N_LAYOUT);
	assert_int_equal(f->shadow.park.n_entries, N_LAYOUT);
	assert_true(f->shadow.park.hash == hash);
	assert_int_equal(f->shadow.n_sregs, N_LAYOUT);
	/* its scratch-backed regions are not announced; its `other` region is */
	assert_int_equal(count_class(&f->shadow, true), 0);
	assert_int_equal(count_class(&f->shadow, false), 1);
}

/* MAP of every shadow region onto the primary region at the same layout position. */
static void send_maps_to(const struct peer *primary, const struct peer *shadow)
{
	const struct proto_region *prim[MAX_REGS];
	uint32_t n;

	(void)primary_layout(primary, &n, prim);
	assert_int_equal(n, shadow->n_sregs);
	for (uint32_t i = 0; i < n; i++) {
		struct proto_msg m = {.type = PROTO_PROMOTE_MAP};

		/* SHADOW_REGIONs come in creation order */
		assert_int_equal(shadow->sregs[i].cls, prim[i]->cls);
		assert_true(shadow->sregs[i].size == prim[i]->size);
		m.promote_map = (struct proto_promote_map){
			.shadow_id = shadow->sregs[i].id,
			.primary_pid = (uint32_t)primary->pid,
			.primary_id = prim[i]->id,
			.size = prim[i]->size,
			.weights_version = prim[i]->weights_version,
			.fd = prim[i]->fd,
		};
		assert_int_equal(proto_send(shadow->conn, &m, 0), 0);
	}
}

static void send_maps(struct fixture *f)
{
	send_maps_to(&f->primary, &f->shadow);
}

static void kill_primary(struct fixture *f)
{
	int status;

	assert_int_equal(kill(f->primary.pid, SIGKILL), 0);
	assert_int_equal(waitpid(f->primary.pid, &status, 0), f->primary.pid);
	f->primary.pid = -1;
}

static void send_commit(struct peer *shadow, uint64_t hash, uint32_t n, uint64_t wver)
{
	struct proto_msg m = {.type = PROTO_PROMOTE_COMMIT};

	m.promote_commit = (struct proto_promote_commit){
		.n_regions = n, .hash = hash, .weights_version = wver};
	assert_int_equal(proto_send(shadow->conn, &m, 0), 0);
}

static void commit(struct fixture *f, uint64_t hash, uint32_t n, uint64_t wver)
{
	int before = f->shadow.dones;

	send_commit(&f->shadow, hash, n, wver);
	PUMP_UNTIL(&f->shadow, f->shadow.dones == before + 1);
}

/* After a successful commit: hello as a primary, every promoted region announced with an
 * fd and the committed version, and the primary's bytes at the shadow's own addresses. */
static void expect_promoted(struct fixture *f, const uint64_t prim_sums[], uint64_t wver)
{
	uint64_t got[N_LAYOUT];

	assert_int_equal(f->shadow.done.code, 0);
	assert_int_equal(f->shadow.done.n_regions, N_LAYOUT);
	PUMP_UNTIL(&f->shadow, f->shadow.hellos == 2 && count_class(&f->shadow, true) == N_LAYOUT);
	assert_int_equal(f->shadow.role, ROLE_PRIMARY);
	for (size_t i = 0; i < f->shadow.n_regs; i++) {
		const struct proto_region *r = &f->shadow.regs[i];

		if (!layout_class_counts(r->cls))
			continue;
		assert_true(r->fd >= 0);
		assert_true(r->weights_version == wver);
		/* the same addresses it reported as a shadow */
		bool found = false;
		for (size_t j = 0; j < f->shadow.n_sregs; j++)
			found = found ||
				(f->shadow.sregs[j].id == r->id && f->shadow.sregs[j].va == r->va);
		assert_true(found);
	}
	sums(&f->shadow, got);
	for (size_t i = 0; i < N_LAYOUT; i++)
		if (got[i] != prim_sums[i])
			fail_msg("region %zu: %016" PRIx64
				 " after promotion, the primary had %016" PRIx64,
				 i, got[i], prim_sums[i]);
}

/* The primary's layout (from its announcements) is the parked shadow's; then the primary dies
 * and the shadow is promoted onto its memory at weights version wver. */
static void promote_on_equal_layout(struct fixture *f, const uint64_t prim_sums[], uint64_t wver)
{
	uint32_t n;
	uint64_t hash = primary_layout(&f->primary, &n, NULL);

	assert_int_equal(n, N_LAYOUT);
	assert_true(f->shadow.park.hash == hash);
	send_maps(f);
	kill_primary(f);
	commit(f, f->shadow.park.hash, N_LAYOUT, wver);
	expect_promoted(f, prim_sums, wver);
}

/* Still a shadow on scratch: it reads its regions fine, and none holds the primary's bytes. */
static void expect_still_scratch(struct fixture *f, const uint64_t prim_sums[])
{
	uint64_t got[N_LAYOUT];

	assert_int_not_equal(f->shadow.done.code, 0);
	assert_int_equal(f->shadow.done.n_regions, 0);
	sums(&f->shadow, got);
	for (size_t i = 0; i < N_LAYOUT; i++)
		assert_true(got[i] != prim_sums[i]);
	assert_int_equal(f->shadow.hellos, 1);
}

static int emu_ctl(const char *a, const char *b, const char *c, const char *d)
{
	const char *argv[] = {EMU_CTL_PATH, a, b, c, d, NULL};
	int status;
	pid_t pid = fork();

	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY | O_CLOEXEC);

		dup2(null, 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_shadow_parks_with_primary_layout_and_costs_scratch(void **state)
{
	struct fixture *f = *state;
	uint64_t prim_sums[N_LAYOUT], before, with_shadow;

	start_workload(f, &f->primary, "primary", 1, 32 * MIB, 32 * MIB);
	PUMP_UNTIL(&f->primary, f->primary.n_regs == N_LAYOUT + 1);
	sums(&f->primary, prim_sums);
	before = live_bytes();

	start_workload(f, &f->shadow, "shadow", 2, 32 * MIB, 32 * MIB);
	wait_parked_whole(f);
	with_shadow = live_bytes();
	/* one scratch granule plus its 2 MiB `other` allocation, for 64 MiB of weights + kv */
	assert_true(with_shadow - before == SCRATCH + 2 * MIB);

	uint32_t n;
	assert_true(f->shadow.park.hash == primary_layout(&f->primary, &n, NULL));
	assert_int_equal(f->shadow.park.n_entries, n);
	assert_int_equal(count_class(&f->shadow, true), 0);
	/* the shadow's classes and sizes, in creation order, are the primary's */
	for (size_t i = 0; i < f->shadow.n_sregs; i++)
		assert_true(i == 0 || f->shadow.sregs[i].order > f->shadow.sregs[i - 1].order);
}

/* Runs a shim-workload peer (argv, no supervisor) that reads a shadow-workload's shared buffer
 * and returns the "bytes" line it printed for the first 16 bytes, or "" when it could not. */
static void peer_read(struct fixture *f, const char *const argv[], char *line, size_t cap)
{
	const char *env[] = {"BELAYER_SOCKET=/nonexistent/belayer.sock", "BELAYER_LOG_LEVEL=error",
			     NULL};
	struct peer o;
	int status;

	peer_init(&o);
	spawn(f, &o, argv, "primary", env);
	close(o.in);
	o.in = -1;
	line[0] = '\0';
	while (read_line(o.out, line, cap) && strncmp(line, "bytes ", 6) != 0)
		line[0] = '\0';
	assert_int_equal(waitpid(o.pid, &status, 0), o.pid);
	o.pid = -1;
	peer_close(&o);
}

/* Opens a shadow-workload's IPC handle (legacy IPC, as vLLM's custom all-reduce). */
static void ipc_peer_read(struct fixture *f, const char *hex, char *line, size_t cap)
{
	const char *argv[] = {WORKLOAD_PATH, "ipc-open", hex, "0", NULL};

	peer_read(f, argv, line, cap);
}

/* Imports a shadow-workload's exported fd ("PID FD", taken with pidfd_getfd), as PyTorch's
 * symmetric memory peers do. */
static void symm_peer_read(struct fixture *f, const char *pid_fd, char *line, size_t cap)
{
	char pid[16], fd[16];
	const char *argv[] = {WORKLOAD_PATH, "vmm-import", pid, fd, NULL};

	assert_int_equal(sscanf(pid_fd, "%15s %15s", pid, fd), 2);
	peer_read(f, argv, line, cap);
}

/* Starts shadow-workload with a shared buffer (mode "ipc" or "symm") and returns what it printed
 * about it (the line "MODE ..." without its first word). */
static void start_shared_workload(struct fixture *f, struct peer *p, const char *role,
				  unsigned seed, const char *mode, char *out, size_t cap)
{
	char s[16], w[32], k[32], line[256], prefix[16];
	const char *argv[] = {SHADOW_WORKLOAD_PATH, s, w, k, mode, NULL};

	snprintf(s, sizeof(s), "%u", seed);
	snprintf(w, sizeof(w), "%" PRIu64, 32 * MIB);
	snprintf(k, sizeof(k), "%" PRIu64, 32 * MIB);
	snprintf(prefix, sizeof(prefix), "%s ", mode);
	spawn(f, p, argv, role, NULL);
	accept_peer(f, p);
	expect_line(p, prefix, line, sizeof(line));
	snprintf(out, cap, "%s", line + strlen(prefix));
	expect_line(p, "ready", line, sizeof(line));
}

/* A buffer shadow-workload shares with peers (mode "ipc" or "symm", read by peer_read_fn)
 * before its KV probe, so `weights` by phase: peers read what the program wrote from the
 * primary and from the shadow (after the shadow's weights went through scratch); it is real
 * memory in the shadow, out of the layout in both roles (the primary's layout is its 5
 * weights/kv regions), and keeps its backing across the promotion (the peer still reads the
 * shadow's own buffer afterwards). */
static void shared_buffer_is_real_and_never_swapped(
	struct fixture *f, const char *mode, const char *pattern,
	void (*peer_read_fn)(struct fixture *, const char *, char *, size_t))
{
	uint64_t prim_sums[N_LAYOUT];
	char prim_ref[256], ref[256], line[256];

	start_shared_workload(f, &f->primary, "primary", 1, mode, prim_ref, sizeof(prim_ref));
	peer_read_fn(f, prim_ref, line, sizeof(line));
	assert_string_equal(line, pattern);

	start_shared_workload(f, &f->shadow, "shadow", 2, mode, ref, sizeof(ref));
	peer_read_fn(f, ref, line, sizeof(line));
	assert_string_equal(line, pattern);

	/* 5 layout regions, the shared buffer and the `other` one; the shared one is not weights */
	PUMP_UNTIL(&f->primary,
		   f->primary.n_regs == N_LAYOUT + 2 && count_class(&f->primary, true) == N_LAYOUT);
	PUMP_UNTIL(&f->shadow, f->shadow.parked >= 1 && f->shadow.n_sregs == N_LAYOUT &&
				       f->shadow.park.n_entries == N_LAYOUT);
	sums(&f->primary, prim_sums);
	promote_on_equal_layout(f, prim_sums, 3);
	peer_read_fn(f, ref, line, sizeof(line));
	assert_string_equal(line, pattern);
}

/* Review findings 1 and 4: a custom-all-reduce-style buffer (cuMemAlloc + cuIpcGetMemHandle). */
static void test_ipc_shared_buffer_is_real_and_never_swapped(void **state)
{
	shared_buffer_is_real_and_never_swapped(
		*state, "ipc", "bytes a5a4a7a6a1a0a3a2adacafaea9a8abaa", ipc_peer_read);
}

/* Review finding 1, the program's own cuMemCreate memory: a PyTorch symmetric-memory buffer
 * (cuMemCreate with a POSIX fd handle type, then cuMemRetainAllocationHandle,
 * cuMemGetAllocationPropertiesFromHandle and cuMemExportToShareableHandle, which must be
 * answered as the driver documents in a shadow too: no fake handle reaching the driver). */
static void test_symm_buffer_is_real_and_never_swapped(void **state)
{
	shared_buffer_is_real_and_never_swapped(
		*state, "symm", "bytes 5a5b58595e5f5c5d5253505156575455", symm_peer_read);
}

static void workload_cmd(struct peer *p, const char *cmd, const char *reply)
{
	char line[64];

	assert_int_equal(write(p->in, cmd, strlen(cmd)), (ssize_t)strlen(cmd));
	expect_line(p, reply, line, sizeof(line));
}

/* Review finding 8 (B2): vLLM's sleep mode (CuMemAllocator.sleep(level=1), then wake_up())
 * releases the program's own weights and kv mappings and re-creates them at the same
 * addresses after the KV probe. They must keep their class and their place in the layout, so
 * the primary's layout still is the shadow's and a promotion after the cycle maps the woken
 * primary's memory. */
static void test_sleep_wake_keeps_class_and_layout(void **state)
{
	struct fixture *f = *state;
	uint64_t prim_sums[N_LAYOUT], woke_sums[N_LAYOUT];

	start_pair(f, 32 * MIB, 32 * MIB, prim_sums);
	workload_cmd(&f->primary, "sleep\n", "slept");
	PUMP_UNTIL(&f->primary, f->primary.n_regs == N_LAYOUT - 1);
	workload_cmd(&f->primary, "wake\n", "woke");
	PUMP_UNTIL(&f->primary, f->primary.n_regs == N_LAYOUT + 1);
	sums(&f->primary, woke_sums);
	for (size_t i = 0; i < N_LAYOUT; i++)
		assert_true(woke_sums[i] == prim_sums[i]);
	for (size_t i = 0; i < f->primary.n_regs; i++)
		print_message("primary region %" PRIu64 ": class %d, order %" PRIu64 "\n",
			      f->primary.regs[i].id, (int)f->primary.regs[i].cls,
			      f->primary.regs[i].order);
	if (count_class(&f->primary, true) != N_LAYOUT)
		fail_msg("after sleep/wake the primary has %zu weights/kv regions, not %d",
			 count_class(&f->primary, true), N_LAYOUT);
	promote_on_equal_layout(f, prim_sums, 5);
}

static void test_promotion_remaps_every_region(void **state)
{
	struct fixture *f = *state;
	uint64_t prim_sums[N_LAYOUT];

	start_pair(f, 32 * MIB, 32 * MIB, prim_sums);
	send_maps(f); /* early, as the supervisor does once both layouts are known */
	kill_primary(f);
	commit(f, f->shadow.park.hash, N_LAYOUT, 7);
	expect_promoted(f, prim_sums, 7);
	assert_true(f->shadow.done.ns > 0);
}

static void test_layout_mismatch_is_refused_and_rolled_back(void **state)
{
	struct fixture *f = *state;
	uint64_t prim_sums[N_LAYOUT];

	start_pair(f, 16 * MIB, 16 * MIB, prim_sums);
	send_maps(f);
	kill_primary(f);
	commit(f, f->shadow.park.hash ^ 1, N_LAYOUT, 3);
	assert_int_equal(f->shadow.done.code, EXDEV);
	expect_still_scratch(f, prim_sums);
	commit(f, f->shadow.park.hash, N_LAYOUT - 1, 3);
	assert_int_equal(f->shadow.done.code, EXDEV);
	/* nothing was lost: the right commit still works */
	commit(f, f->shadow.park.hash, N_LAYOUT, 3);
	expect_promoted(f, prim_sums, 3);
}

static void test_failed_import_is_refused(void **state)
{
	struct fixture *f = *state;
	uint64_t prim_sums[N_LAYOUT];

	start_pair(f, 16 * MIB, 16 * MIB, prim_sums);
	assert_int_equal(
		emu_ctl("fail", "cuMemImportFromShareableHandle", "1", "CUDA_ERROR_INVALID_VALUE"),
		0);
	send_maps(f);
	PUMP_UNTIL(&f->shadow, f->shadow.errors == 1);
	assert_int_equal(f->shadow.error.in_reply_to, PROTO_PROMOTE_MAP);
	kill_primary(f);
	commit(f, f->shadow.park.hash, N_LAYOUT, 4);
	assert_int_equal(f->shadow.done.code, EIO);
	expect_still_scratch(f, prim_sums);
	/* a MAP sent again replaces the failed one */
	send_maps(f);
	commit(f, f->shadow.park.hash, N_LAYOUT, 4);
	expect_promoted(f, prim_sums, 4);
}

/* A commit with the next call of func failing (emu-ctl fail func 1 result) is refused with EIO
 * and leaves every region on scratch; the next commit promotes. */
static void commit_fails_then_promotes(struct fixture *f, const char *func, const char *result)
{
	uint64_t prim_sums[N_LAYOUT];

	start_pair(f, 16 * MIB, 16 * MIB, prim_sums);
	send_maps(f);
	kill_primary(f);
	assert_int_equal(emu_ctl("fail", func, "1", result), 0);
	commit(f, f->shadow.park.hash, N_LAYOUT, 5);
	assert_int_equal(f->shadow.done.code, EIO);
	expect_still_scratch(f, prim_sums);
	commit(f, f->shadow.park.hash, N_LAYOUT, 5);
	expect_promoted(f, prim_sums, 5);
}

static void test_failed_remap_rolls_back(void **state)
{
	/* the first region is swapped, then granting access fails: it must go back to scratch */
	commit_fails_then_promotes(*state, "cuMemSetAccess", "CUDA_ERROR_OUT_OF_MEMORY");
}

/* Review finding 10: the commit synchronises the shadow's devices before it unmaps anything
 * (in-flight work would fault on a real GPU); a device that cannot (a sticky error) is not
 * promoted onto, and nothing was swapped. */
static void test_commit_synchronises_first(void **state)
{
	commit_fails_then_promotes(*state, "cuCtxSynchronize", "CUDA_ERROR_ILLEGAL_ADDRESS");
}

/* The figure the README quotes: a parked shadow of 1 GiB weights + 1 GiB KV. */
static void test_parked_cost_at_1g(void **state)
{
	struct fixture *f = *state;
	uint64_t before = live_bytes(), parked;
	char line[128];
	size_t free_b, total_b;

	start_workload(f, &f->shadow, "shadow", 2, 1024 * MIB, 1024 * MIB);
	wait_parked_whole(f);
	parked = live_bytes();
	assert_true(parked - before == SCRATCH + 2 * MIB);
	assert_int_equal(write(f->shadow.in, "info\n", 5), 5);
	expect_line(&f->shadow, "info ", line, sizeof(line));
	assert_int_equal(sscanf(line, "info %zu %zu", &free_b, &total_b), 2);
	assert_true(total_b - free_b >= SCRATCH + 2 * MIB);
	print_message("parked shadow of 1 GiB weights + 1 GiB kv: %" PRIu64
		      " bytes of device memory (device used: %zu)\n",
		      parked - before, total_b - free_b);
}

/* Mappings of p's scratch allocation of unit bytes (each cuMemMap of the emulator is one of
 * the process's memory maps of the allocation's memfd, named ...:BYTES). */
static size_t scratch_mappings(pid_t pid, uint64_t unit)
{
	char path[64], line[512], tail[32];
	size_t n = 0;
	FILE *in;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	snprintf(tail, sizeof(tail), ":%" PRIu64 " (deleted)", unit);
	in = fopen(path, "re");
	assert_non_null(in);
	while (fgets(line, sizeof(line), in))
		n += strstr(line, "belayer-emu:") && strstr(line, tail);
	fclose(in);
	return n;
}

/* Review finding 10: BELAYER_SHADOW_SCRATCH_UNIT maps scratch that much at a time: for 2 GiB
 * of weights + kv, 32 mappings of one 64 MiB allocation instead of 1024 of one 2 MiB granule
 * (as many cuMemMap calls at parking and cuMemUnmap calls at promotion). */
static void test_scratch_unit_maps_fewer_pieces(void **state)
{
	struct fixture *f = *state;
	uint64_t before = live_bytes();

	assert_int_equal(setenv("BELAYER_SHADOW_SCRATCH_UNIT", "64M", 1), 0);
	start_workload(f, &f->shadow, "shadow", 2, 1024 * MIB, 1024 * MIB);
	assert_int_equal(unsetenv("BELAYER_SHADOW_SCRATCH_UNIT"), 0);
	wait_parked_whole(f);
	assert_true(live_bytes() - before == 64 * MIB + 2 * MIB);
	assert_int_equal(scratch_mappings(f->shadow.pid, 64 * MIB), 2048 / 64);
}

/* A unit that does not divide the regions (6 MiB over 8 and 4 MiB regions): their tails map
 * part of it, and the promotion unmaps the same pieces. */
static void test_scratch_unit_tails_promote(void **state)
{
	struct fixture *f = *state;
	uint64_t prim_sums[N_LAYOUT];

	assert_int_equal(setenv("BELAYER_SHADOW_SCRATCH_UNIT", "6M", 1), 0);
	start_pair(f, 16 * MIB, 16 * MIB, prim_sums);
	assert_int_equal(unsetenv("BELAYER_SHADOW_SCRATCH_UNIT"), 0);
	send_maps(f);
	kill_primary(f);
	commit(f, f->shadow.park.hash, N_LAYOUT, 2);
	expect_promoted(f, prim_sums, 2);
}

/* ---- the engine stand-in ---- */

struct engine {
	struct peer *p;
	uint16_t port;
	uint64_t kv_bytes; /* its KV cache, from its ready line */
};

/* A TP=2 engine's two shim connections, in whichever order the ranks got there (the
 * leader starts its follower before its own CUDA init): the leader's by pid, the other is
 * rank 1, its leader's child. */
static void accept_group(struct fixture *f, struct peer *leader, struct peer *p)
{
	for (int k = 0; k < 2; k++) {
		struct pollfd pfd = {.fd = f->lfd, .events = POLLIN};
		struct ucred cred;
		socklen_t len = sizeof(cred);
		int c;

		assert_int_equal(poll(&pfd, 1, TIMEOUT_MS), 1);
		c = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
		assert_true(c >= 0);
		assert_int_equal(getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len), 0);
		if (cred.pid == leader->pid) {
			assert_int_equal(leader->conn, -1);
			leader->conn = c;
			continue;
		}
		assert_int_equal(p->conn, -1);
		p->conn = c;
		p->pid = cred.pid;
		p->child = false;
	}
	PUMP_UNTIL(p, p->hellos == 1);
	assert_int_equal(p->rank, 1);
}

/* The stand-in with dummy weights of seed; p1 set: TP=2, rank 1 in p1. */
static void engine_start(struct fixture *f, struct peer *p, struct peer *p1, const char *role,
			 const char *seed, struct engine *e)
{
	char line[4096], *port;
	const char *argv[20] = {ENGINE_PATH,
				"--model",
				NULL,
				"--port",
				"0",
				"--load-format",
				"dummy",
				"--seed",
				seed,
				f->kv_flag ? f->kv_flag : "--kv-cache-bytes",
				f->kv_value ? f->kv_value : "16M",
				"--cuda-graph",
				f->index_flag ? f->index_flag : "--index-tables"};
	size_t argc = 13;
	/* The shim's default threshold: the stand-in's caching allocator puts every tensor, the
	 * smallest (norms) too, in segments of at least 2 MiB, so a promoted shadow holds all of
	 * the primary's weights. RANK=0 for the leader's hello; the engine gives its followers
	 * their own. */
	const char *env[] = {"BELAYER_EMU_KERNELS=" ENGINE_KERNELS_PATH, "RANK=0",
			     strcmp(role, "shadow") == 0 ? f->shadow_env : NULL, NULL};
	static char model[512];

	snprintf(model, sizeof(model), "%s/model.safetensors", f->dir);
	argv[2] = model;
	if (f->engine_tags)
		argv[argc++] = "--belayer-tags";
	if (p1) {
		argv[argc++] = "--tensor-parallel-size";
		argv[argc++] = "2";
		argv[argc++] = "--custom-all-reduce";
	}
	argv[argc] = NULL;
	spawn(f, p, argv, role, env);
	if (p1)
		accept_group(f, p, p1);
	else
		accept_peer(f, p);
	expect_line(p, "{\"event\":\"ready\"", line, sizeof(line));
	port = strstr(line, "\"port\":");
	assert_non_null(port);
	e->p = p;
	e->port = (uint16_t)strtoul(port + 7, NULL, 10);
	assert_true(e->port > 0);
	port = strstr(line, "\"kv_cache_bytes\":");
	assert_non_null(port);
	e->kv_bytes = strtoull(port + 17, NULL, 10);
}

/* Greedy tokens for a fixed prompt, as the engine's /generate returns them. */
static char *generate(const struct engine *e)
{
	static const char body[] = "{\"input_ids\":[100,7,42,42,9,300,11,250,3,17,64,8],"
				   "\"sampling_params\":{\"max_new_tokens\":24,\"temperature\":0},"
				   "\"stream\":false}";
	struct http_response resp = {};
	char *tokens, *end;

	assert_int_equal(client_request(e->port, "POST", "/generate", body, TIMEOUT_MS, &resp), 0);
	if (resp.status != 200)
		fail_msg("/generate: %d %s", resp.status, resp.body ? resp.body : "");
	tokens = strstr(resp.body, "\"output_ids\"");
	assert_non_null(tokens);
	end = strchr(tokens, ']');
	assert_non_null(end);
	tokens = strndup(tokens, (size_t)(end - tokens + 1));
	http_response_free(&resp);
	return tokens;
}

static void gen_model(struct fixture *f)
{
	char model[512];
	const char *gen[] = {GEN_WEIGHTS_PATH, "--out", model,	     "--size", "8M",
			     "--seed",	       "1",	"--max-pos", "256",    NULL};
	int status;
	pid_t pid;

	TEST_REQUIRE(access(ENGINE_PATH, X_OK) == 0, "the engine stand-in is not built");
	snprintf(model, sizeof(model), "%s/model.safetensors", f->dir);
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY | O_CLOEXEC);

		dup2(null, 1);
		execv(gen[0], (char *const *)gen);
		_exit(127);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A TP=1 primary and its shadow with different dummy weights (only a promotion can make them
 * agree) from the fixture's engine flags; the shadow parks, answers (a step of its own), is
 * promoted onto the primary's memory and then answers like the primary did. */
static void promote_tp1(struct fixture *f)
{
	struct engine prim, shad;
	char *want, *before, *got;
	const struct proto_region *pr[MAX_REGS];
	uint32_t n;

	gen_model(f);
	engine_start(f, &f->primary, NULL, "primary", "11", &prim);
	want = generate(&prim);
	engine_start(f, &f->shadow, NULL, "shadow", "22", &shad);
	PUMP_UNTIL(&f->shadow, f->shadow.parked >= 1);
	before = generate(&shad);
	assert_string_not_equal(before, want);

	/* every tracked weights/kv region of the primary, as announced by now */
	pump_until_park_matches(&f->primary, &f->shadow, &n);
	assert_int_equal(n, f->shadow.park.n_entries);
	(void)primary_layout(&f->primary, &n, pr);
	send_maps(f);
	kill_primary(f);
	commit(f, f->shadow.park.hash, n, pr[0]->weights_version);
	assert_int_equal(f->shadow.done.code, 0);
	assert_int_equal(f->shadow.done.n_regions, n);
	got = generate(&shad);
	assert_string_equal(got, want);
	print_message("TP=1: promoted %u regions in %" PRIu64 " us; answers equal the primary's\n",
		      n, f->shadow.done.ns / 1000);
	free(want);
	free(before);
	free(got);
}

/* TP=1 with decode steps from CUDA graphs (both engine tests): the shadow captured its graphs
 * on scratch at warm-up and replays them after the promotion against the primary's memory,
 * mapped at the same addresses. */
static void test_engine_promoted_shadow_answers_like_the_primary(void **state)
{
	promote_tp1(*state);
}

/* Review finding 2, with what python/belayer_tag.py does to vLLM: the engine allocates its
 * index tables before the weights (vLLM's block tables at runner init) and tags its weights
 * and KV cache (--belayer-tags). The tables are `other`, real memory in the shadow, so the
 * shadow's steps read back their own tables; by the phase heuristic they would be weights,
 * scratch aliased with the KV cache, and the shadow's first step would fail ("The block table
 * at ... no longer holds what the step wrote there"). The promoted shadow answers like the
 * primary. */
static void test_engine_tagged_index_tables_before_weights(void **state)
{
	struct fixture *f = *state;

	f->index_flag = "--index-tables-first";
	f->engine_tags = true;
	promote_tp1(f);
}

/* Review finding 6: primary and shadow size their KV cache from cuMemGetInfo, as vLLM's
 * determine_available_memory does (--gpu-memory-utilization: total x F minus what is used).
 * The shadow starts next to the primary, which holds most of what F allows; on its own
 * figures it finds no room for a KV cache. Given the primary's recorded answers
 * (BELAYER_SHADOW_MEM_INFO, from the primary's PROTO_MEM_INFO reports), it computes the
 * primary's KV size, parks with the primary's layout and is promoted onto it. */
static void test_engine_shadow_sizes_itself_like_the_primary(void **state)
{
	struct fixture *f = *state;
	struct engine prim, shad;
	char *want, *got, env[4096];
	const struct proto_region *pr[MAX_REGS];
	size_t off;
	uint32_t n;

	gen_model(f);
	f->kv_flag = "--gpu-memory-utilization";
	f->kv_value = "0.05"; /* of the emulated 8 GiB: about 400 MiB */
	engine_start(f, &f->primary, NULL, "primary", "11", &prim);
	want = generate(&prim);
	/* the KV probe's answer, at least, was reported as the primary got it */
	PUMP_UNTIL(&f->primary, f->primary.n_mem >= 1);
	off = (size_t)snprintf(env, sizeof(env), "BELAYER_SHADOW_MEM_INFO=");
	for (size_t i = 0; i < f->primary.n_mem; i++) {
		const struct proto_mem_info *mi = &f->primary.mem[i];
		char uuid[GPU_UUID_STR_LEN + 1];

		/* rank 0 (a single-rank engine), on the device the report names */
		assert_true(mi->free <= mi->total);
		gpu_uuid_format(mi->device_uuid, uuid);
		off += (size_t)snprintf(env + off, sizeof(env) - off, "%s0:%s:%" PRIu64 ":%" PRIu64,
					i ? "," : "", uuid, mi->free, mi->total);
		assert_true(off < sizeof(env));
	}
	f->shadow_env = env;
	engine_start(f, &f->shadow, NULL, "shadow", "22", &shad);
	assert_true(shad.kv_bytes == prim.kv_bytes);
	PUMP_UNTIL(&f->shadow, f->shadow.parked >= 1);
	/* the shadow's engine was told what the primary's was */
	PUMP_UNTIL(&f->shadow, f->shadow.n_mem >= f->primary.n_mem);
	for (size_t i = 0; i < f->primary.n_mem; i++)
		assert_memory_equal(&f->shadow.mem[i], &f->primary.mem[i],
				    sizeof(f->shadow.mem[i]));

	pump_until_park_matches(&f->primary, &f->shadow, &n);
	assert_int_equal(n, f->shadow.park.n_entries);
	(void)primary_layout(&f->primary, &n, pr);
	send_maps(f);
	kill_primary(f);
	commit(f, f->shadow.park.hash, n, pr[0]->weights_version);
	assert_int_equal(f->shadow.done.code, 0);
	got = generate(&shad);
	assert_string_equal(got, want);
	print_message("KV sized from cuMemGetInfo: primary %" PRIu64 " bytes, shadow %" PRIu64
		      " bytes (%zu answers replayed); promoted, answers equal the primary's\n",
		      prim.kv_bytes, shad.kv_bytes, f->primary.n_mem);
	free(want);
	free(got);
}

static void wait_gone(pid_t pid)
{
	uint64_t deadline = now_ms() + TIMEOUT_MS;

	while (kill(pid, 0) == 0 || errno != ESRCH) {
		char path[64], st = 0;
		FILE *in;

		/* a zombie waiting for its reaper holds nothing any more */
		snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
		in = fopen(path, "re");
		if (in) {
			int ok = fscanf(in, "%*d %*s %c", &st);

			fclose(in);
			if (ok == 1 && st == 'Z')
				return;
		}
		assert_true(now_ms() < deadline);
		poll(NULL, 0, 10);
	}
}

/* Both ranks of a TP=2 group: the primary group dies whole, both shadow ranks are promoted
 * (each onto the memory of the primary rank of the same number, on the same device). The
 * ranks share custom-all-reduce buffers over legacy IPC before the KV probe, as vLLM's do by
 * default: the shadow ranks must be able to open each other's (review finding 1), and those
 * stay out of the layout. Their decode graphs, captured on scratch, hold the all-reduces. */
static void test_engine_tp2_promoted_group_answers_like_the_primary(void **state)
{
	struct fixture *f = *state;
	struct engine prim, shad;
	struct peer *prims[2] = {&f->primary, &f->primary1}, *shads[2] = {&f->shadow, &f->shadow1};
	char *want, *got;
	uint32_t n[2];
	uint64_t wver[2];

	gen_model(f);
	engine_start(f, &f->primary, &f->primary1, "primary", "11", &prim);
	want = generate(&prim);
	engine_start(f, &f->shadow, &f->shadow1, "shadow", "22", &shad);
	for (int r = 0; r < 2; r++) {
		const struct proto_region *pr[MAX_REGS];

		PUMP_UNTIL(shads[r], shads[r]->parked >= 1);
		pump_until_park_matches(prims[r], shads[r], &n[r]);
		(void)primary_layout(prims[r], &n[r], pr);
		wver[r] = pr[0]->weights_version;
		send_maps_to(prims[r], shads[r]);
	}
	/* the follower first: the leader's death would stop it anyway */
	assert_int_equal(kill(f->primary1.pid, SIGKILL), 0);
	wait_gone(f->primary1.pid);
	f->primary1.pid = -1;
	kill_primary(f);
	for (int r = 0; r < 2; r++)
		send_commit(shads[r], shads[r]->park.hash, n[r], wver[r]);
	for (int r = 0; r < 2; r++) {
		PUMP_UNTIL(shads[r], shads[r]->dones == 1);
		assert_int_equal(shads[r]->done.code, 0);
		assert_int_equal(shads[r]->done.n_regions, n[r]);
	}
	got = generate(&shad);
	assert_string_equal(got, want);
	print_message("TP=2: promoted %u + %u regions; answers equal the primary group's\n", n[0],
		      n[1]);
	free(want);
	free(got);
}

static int group_setup(void **state)
{
	emu_dir = test_mkdtemp("belayer-shadow-emu");
	if (!emu_dir)
		return -1;
	/* one emulated machine for the whole run: this process reads it too */
	setenv("BELAYER_EMU_DIR", emu_dir, 1);
	return 0;
}

static int group_teardown(void **state)
{
	test_rmtree(emu_dir);
	free(emu_dir);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			test_shadow_parks_with_primary_layout_and_costs_scratch, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ipc_shared_buffer_is_real_and_never_swapped,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_symm_buffer_is_real_and_never_swapped, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_sleep_wake_keeps_class_and_layout, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_promotion_remaps_every_region, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_layout_mismatch_is_refused_and_rolled_back,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_import_is_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failed_remap_rolls_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_commit_synchronises_first, setup, teardown),
		cmocka_unit_test_setup_teardown(test_parked_cost_at_1g, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scratch_unit_maps_fewer_pieces, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_scratch_unit_tails_promote, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_engine_promoted_shadow_answers_like_the_primary, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_engine_tp2_promoted_group_answers_like_the_primary, setup, teardown),
		cmocka_unit_test_setup_teardown(test_engine_shadow_sizes_itself_like_the_primary,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_engine_tagged_index_tables_before_weights,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
