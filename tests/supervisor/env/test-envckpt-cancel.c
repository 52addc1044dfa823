/* SPDX-License-Identifier: MIT */
/*
 * Cancellable checkpoints (issue 11, env_ckpt_params.cancel and .thawed) on real
 * environments: real namespaces, overlay, cgroup v2 freezer and CRIU >= 4.2. Root only; skips
 * through TEST_REQUIRE otherwise (a failure under BELAYER_TEST_NO_SKIP=1).
 *
 * The cancel is set by a thread that follows the checkpoint on the file system with inotify:
 * the partial checkpoint's data/ or criu/ directory is watched before it is scanned, so the
 * flag goes up on a real event (a large file's copy under way, CRIU's first file) and nothing
 * waits on a timer.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "envckpt-fixture.h"
#include "envckpt-test.h"
#include "supervisor-criu.h"
#include "supervisor-env-fs.h"
#include "supervisor-env.h"
#include "test-util.h"
#include "util.h"

#define WAIT_MS 10000
/* Runs a shell command inside the environment; fails the test unless it exits 0. */
#define env_exec(f, ...) \
	assert_int_equal(fixture_env_exec((f)->env->cgroup, (f)->env->pid, __VA_ARGS__), 0)
/* From the flag to the thawed callback, generously: one ENV_FS_COPY_CHUNK copy and the thaw
 * take a few ms; this machine has 2 noisy cores. */
#define CANCEL_BOUND_US 250000
/* The large dirty set: one file big enough that its copy is under way when the flag goes up,
 * and many small ones. */
#define BIG_MIB	    320
#define SMALL_FILES 2000

static const char *const tree_skip[] = {"dev", "proc", "usr", "etc", NULL};

/* What the thawed callback saw. */
struct thawed_log {
	struct sv_env *env;
	atomic_uint calls;
	uint64_t at_us;
	bool running; /* cgroup.events said "frozen 0" inside the callback */
	char head[ENV_ID_MAX + 1];
};

/* hog_mib > 0: a process holding that much touched memory (dd's buffer, filled, then blocked
 * writing to a pipe nobody empties), so that CRIU's dump takes a while. /work/hog appears once
 * the buffer is full (dd writes only after its read). */
static void start_env(struct envckpt_fx *f, const char *id, unsigned hog_mib)
{
	char cmd[1024], hog[128] = "", ready[PATH_MAX], ans[256];

	envckpt_fx_prepare(f, "belayer-envcancel");
	if (hog_mib)
		snprintf(hog, sizeof(hog),
			 "dd if=/dev/zero bs=%uM count=1 2>/dev/null | "
			 "{ head -c 1 >/dev/null; touch /work/hog; exec sleep infinity; } & ",
			 hog_mib);
	snprintf(cmd, sizeof(cmd),
		 "cd /work; /work/server /work/server.sock & %s"
		 "touch /work/ready; exec sleep infinity",
		 hog);
	envckpt_fx_create(f, id, cmd, 0);
	if (hog_mib) {
		snprintf(ready, sizeof(ready), "%s/work/hog", f->env->root);
		assert_int_equal(fixture_wait_file(ready, WAIT_MS), 0);
	}
	assert_int_equal(fixture_ask(f->sock, "get", ans, sizeof(ans), WAIT_MS), 0);
}

static uint64_t tree(struct envckpt_fx *f)
{
	uint64_t h;

	assert_int_equal(fixture_tree_hash(f->env->root, tree_skip, &h), 0);
	return h;
}

static bool cgroup_running(const struct sv_env *e)
{
	char path[PATH_MAX], buf[256];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/cgroup.events", e->cgroup);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return false;
	buf[n] = '\0';
	return strstr(buf, "frozen 0") != NULL;
}

static void on_thawed(void *userdata)
{
	struct thawed_log *t = userdata;

	t->at_us = fixture_now_us();
	t->running = cgroup_running(t->env);
	snprintf(t->head, sizeof(t->head), "%s", t->env->head);
	atomic_fetch_add(&t->calls, 1);
}

/* The server inside answers, and counts: the environment's processes run. */
static void assert_progress(struct envckpt_fx *f)
{
	char a[256], b[256], tok[128];
	unsigned long n0, n1;

	assert_true(cgroup_running(f->env));
	assert_int_equal(fixture_ask(f->sock, "set progress", a, sizeof(a), WAIT_MS), 0);
	assert_int_equal(fixture_ask(f->sock, "get", a, sizeof(a), WAIT_MS), 0);
	assert_int_equal(fixture_ask(f->sock, "get", b, sizeof(b), WAIT_MS), 0);
	assert_int_equal(sscanf(a, "%127s %lu", tok, &n0), 2);
	assert_int_equal(sscanf(b, "%127s %lu", tok, &n1), 2);
	assert_int_equal(n1, n0 + 1);
}

static size_t count_partial(const struct sv_env *e)
{
	char path[PATH_MAX];
	struct dirent *de;
	size_t n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "%s/ckpt", e->dir);
	d = opendir(path);
	assert_non_null(d);
	while ((de = readdir(d)))
		n += strncmp(de->d_name, ".tmp-", 5) == 0;
	closedir(d);
	return n;
}

static size_t count_checkpoints(const struct sv_env *e)
{
	char **ids;
	size_t n;

	assert_int_equal(env_checkpoints(e, &ids, &n), 0);
	for (size_t i = 0; i < n; i++)
		free(ids[i]);
	free(ids);
	return n;
}

/* The head as stored on disk. */
static void head_on_disk(const struct sv_env *e, char *buf, size_t cap)
{
	char path[PATH_MAX];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/head", e->dir);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, buf, cap - 1) : 0;
	if (fd >= 0)
		close(fd);
	buf[n > 0 ? n : 0] = '\0';
}

/*
 * The canceller: follows ckpt/.tmp-<id>/<sub>/ and sets the flag when a file there reaches
 * min_bytes (0: as soon as one is created). The ckpt directory is watched before the
 * checkpoint starts; every directory further down is watched before it is scanned, so no
 * creation is missed between the two.
 */
struct canceller {
	const struct sv_env *env;
	const char *sub;
	uint64_t min_bytes;
	int ino;
	atomic_bool cancel;
	uint64_t at_us;	     /* when the flag went up */
	uint64_t file_bytes; /* the size of the file that triggered it, then */
	char file[NAME_MAX + 1];
	int r;
	pthread_t thread;
};

/* A file in dirfd (name) that meets the condition: cancel. */
static bool canceller_try(struct canceller *c, int dirfd, const char *name)
{
	struct stat st;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size < c->min_bytes)
		return false;
	c->at_us = fixture_now_us();
	atomic_store(&c->cancel, true);
	c->file_bytes = (uint64_t)st.st_size;
	snprintf(c->file, sizeof(c->file), "%s", name);
	return true;
}

static bool canceller_scan(struct canceller *c, int dirfd)
{
	int fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;
	bool done = false;

	if (!d)
		return false;
	while (!done && (de = readdir(d)))
		done = de->d_name[0] != '.' && canceller_try(c, dirfd, de->d_name);
	closedir(d);
	return done;
}

static void *canceller_run(void *arg)
{
	struct canceller *c = arg;
	char ckpt[PATH_MAX], tmp[PATH_MAX] = "", sub[PATH_MAX];
	_cleanup_close_ int subfd = -1;
	int wd_sub = -1;
	uint64_t deadline = fixture_now_us() + 60 * 1000000ull;
	union {
		struct inotify_event ev;
		char buf[8192];
	} u;

	snprintf(ckpt, sizeof(ckpt), "%s/ckpt", c->env->dir);
	c->r = -ETIMEDOUT;
	while (fixture_now_us() < deadline) {
		ssize_t n;

		if (!tmp[0]) {
			DIR *d = opendir(ckpt);
			struct dirent *de;

			while (d && (de = readdir(d)))
				if (strncmp(de->d_name, ".tmp-", 5) == 0) {
					snprintf(tmp, sizeof(tmp), "%s/%s", ckpt, de->d_name);
					(void)inotify_add_watch(c->ino, tmp, IN_CREATE);
				}
			if (d)
				closedir(d);
		}
		if (tmp[0] && wd_sub < 0) {
			snprintf(sub, sizeof(sub), "%s/%s", tmp, c->sub);
			wd_sub = inotify_add_watch(c->ino, sub, IN_CREATE | IN_MODIFY);
			if (wd_sub >= 0) {
				subfd = open(sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
				if (subfd >= 0 && canceller_scan(c, subfd)) {
					c->r = 0;
					return NULL;
				}
			}
		}
		if (poll(&(struct pollfd){.fd = c->ino, .events = POLLIN}, 1, 1000) <= 0)
			continue;
		n = read(c->ino, u.buf, sizeof(u.buf));
		for (char *p = u.buf; n > 0 && p < u.buf + n;) {
			struct inotify_event *ev = (struct inotify_event *)p;

			if (ev->wd == wd_sub && subfd >= 0 && ev->len &&
			    canceller_try(c, subfd, ev->name)) {
				c->r = 0;
				return NULL;
			}
			p += sizeof(*ev) + ev->len;
		}
	}
	return NULL;
}

static void canceller_start(struct canceller *c, const struct sv_env *e, const char *sub,
			    uint64_t min_bytes)
{
	char ckpt[PATH_MAX];

	*c = (struct canceller){.env = e, .sub = sub, .min_bytes = min_bytes};
	atomic_init(&c->cancel, false);
	c->ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	assert_true(c->ino >= 0);
	snprintf(ckpt, sizeof(ckpt), "%s/ckpt", e->dir);
	assert_true(inotify_add_watch(c->ino, ckpt, IN_CREATE) >= 0);
	assert_int_equal(pthread_create(&c->thread, NULL, canceller_run, c), 0);
}

static void canceller_join(struct canceller *c)
{
	assert_int_equal(pthread_join(c->thread, NULL), 0);
	close(c->ino);
	assert_int_equal(c->r, 0);
}

/* (1) Cancelled before the call: nothing frozen, nothing written, the head as it was. */
static void test_cancel_before(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m = {0}, m2 = {0};
	struct thawed_log t = {0};
	atomic_bool cancel;
	char head[ENV_ID_MAX + 1], disk[64];
	struct env_ckpt_params p = {
		.turn = 2, .cancel = &cancel, .thawed = on_thawed, .userdata = &t};

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	start_env(f, "before", 0);
	t.env = f->env;
	assert_int_equal(env_checkpoint(f->env, &(struct env_ckpt_params){.turn = 1}, &m), 0);
	snprintf(head, sizeof(head), "%s", f->env->head);
	env_exec(f, "echo x >/work/x");

	atomic_init(&cancel, true);
	assert_int_equal(env_checkpoint(f->env, &p, &m2), -ECANCELED);
	assert_int_equal(atomic_load(&t.calls), 0); /* never froze */
	assert_true(cgroup_running(f->env));
	assert_int_equal(count_checkpoints(f->env), 1);
	assert_int_equal(count_partial(f->env), 0);
	assert_string_equal(f->env->head, head);
	head_on_disk(f->env, disk, sizeof(disk));
	assert_string_equal(disk, head);
	assert_progress(f);

	/* The same parameters, flag down: a checkpoint like any other. */
	atomic_store(&cancel, false);
	assert_int_equal(env_checkpoint(f->env, &p, &m2), 0);
	assert_int_equal(atomic_load(&t.calls), 1);
	assert_string_equal(m2.parent, head);
	env_manifest_finish(&m);
	env_manifest_finish(&m2);
}

/* (2) Cancelled while the FS delta copies a large dirty set: back promptly, running, no
 * partial checkpoint, the head unchanged; the next checkpoint and its restore work. */
static void test_cancel_mid_copy(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m3 = {0}, back = {0};
	struct thawed_log t = {0};
	struct canceller c;
	char head[ENV_ID_MAX + 1], disk[64], ans[256];
	uint64_t h, t0, t1;
	struct env_ckpt_params p = {.turn = 2, .thawed = on_thawed, .userdata = &t};
	int r;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	start_env(f, "midcopy", 0);
	t.env = f->env;
	assert_int_equal(env_checkpoint(f->env, &(struct env_ckpt_params){.turn = 1}, &m1), 0);
	snprintf(head, sizeof(head), "%s", f->env->head);
	env_exec(f,
		 "mkdir /work/many && cd /work/many && i=0; while [ $i -lt %u ]; do "
		 "echo $i >f$i; i=$((i+1)); done; head -c %uM /dev/zero >/work/big",
		 SMALL_FILES, BIG_MIB);
	assert_int_equal(fixture_ask(f->sock, "set at-cancel", ans, sizeof(ans), WAIT_MS), 0);

	/* The flag goes up once the big file's copy holds two chunks: mid-file. */
	canceller_start(&c, f->env, "data", 2ull * ENV_FS_COPY_CHUNK);
	p.cancel = &c.cancel;
	t0 = fixture_now_us();
	r = env_checkpoint(f->env, &p, &m3);
	t1 = fixture_now_us();
	canceller_join(&c);
	print_message(
		"cancel mid-copy: flag at %" PRIu64 " ms into the call (data/%s at %" PRIu64
		" MiB), thawed %" PRIu64 " µs after the flag, returned %" PRIu64 " µs after it\n",
		(c.at_us - t0) / 1000, c.file, c.file_bytes >> 20, t.at_us - c.at_us, t1 - c.at_us);
	assert_int_equal(r, -ECANCELED);
	assert_int_equal(atomic_load(&t.calls), 1);
	assert_true(t.running);
	assert_true(t.at_us >= c.at_us);
	assert_true(t.at_us - c.at_us < CANCEL_BOUND_US);
	/* Cancelled inside the big file: it was not copied whole. */
	assert_true(c.file_bytes < (uint64_t)BIG_MIB << 20);
	assert_progress(f);
	assert_int_equal(count_partial(f->env), 0);
	assert_int_equal(count_checkpoints(f->env), 1);
	assert_string_equal(f->env->head, head);
	head_on_disk(f->env, disk, sizeof(disk));
	assert_string_equal(disk, head);

	/* Uncancelled: the same dirty set checkpoints, and restores. */
	h = tree(f);
	atomic_store(&c.cancel, false);
	t = (struct thawed_log){.env = f->env};
	assert_int_equal(env_checkpoint(f->env, &p, &m3), 0);
	assert_int_equal(atomic_load(&t.calls), 1);
	assert_string_equal(m3.parent, head);
	assert_true(m3.fs_bytes >= (uint64_t)BIG_MIB << 20);
	assert_true(m3.fs_files >= SMALL_FILES);
	print_message("uncancelled: FS delta %" PRIu64 " MiB in %" PRIu64 " files, %" PRIu64
		      " ms; CRIU %" PRIu64 " ms; frozen %" PRIu64 " ms\n",
		      m3.fs_bytes >> 20, m3.fs_files, m3.fs_us / 1000, m3.dump_us / 1000,
		      m3.freeze_us / 1000);
	env_exec(f, "rm -rf /work/big /work/many; echo after >/work/after");
	assert_int_equal(fixture_ask(f->sock, "set after", ans, sizeof(ans), WAIT_MS), 0);
	assert_int_equal(env_restore(f->env, NULL, &back), 0);
	assert_string_equal(back.id, m3.id);
	assert_true(tree(f) == h);
	assert_int_equal(fixture_ask(f->sock, "get", ans, sizeof(ans), WAIT_MS), 0);
	assert_true(strncmp(ans, "progress ", 9) == 0);
	env_manifest_finish(&m1);
	env_manifest_finish(&m3);
	env_manifest_finish(&back);
}

/* (3) An uncancelled checkpoint reports the thaw once, before it commits and returns, with
 * the environment running. */
static void test_thawed_once(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m2 = {0};
	struct thawed_log t = {0};
	atomic_bool cancel;
	uint64_t ret_us;
	char head[ENV_ID_MAX + 1];
	struct env_ckpt_params p = {
		.turn = 2, .cancel = &cancel, .thawed = on_thawed, .userdata = &t};

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	start_env(f, "thawed", 0);
	t.env = f->env;
	atomic_init(&cancel, false);
	assert_int_equal(env_checkpoint(f->env, &(struct env_ckpt_params){.turn = 1}, &m1), 0);
	snprintf(head, sizeof(head), "%s", f->env->head);
	env_exec(f, "echo y >/work/y");
	assert_int_equal(env_checkpoint(f->env, &p, &m2), 0);
	ret_us = fixture_now_us();
	assert_int_equal(atomic_load(&t.calls), 1);
	assert_true(t.at_us > 0 && t.at_us <= ret_us);
	assert_true(t.running);
	/* Before the commit: the head was still the parent's when the environment ran again. */
	assert_string_equal(t.head, head);
	assert_string_equal(f->env->head, m2.id);
	assert_progress(f);
	env_manifest_finish(&m1);
	env_manifest_finish(&m2);
}

/* Cancelled while CRIU dumps: the dump runs to its end (never killed), then its images are
 * discarded; the environment runs, the head is unchanged. */
static void test_cancel_during_dump(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m2 = {0};
	struct thawed_log t = {0};
	struct canceller c;
	char head[ENV_ID_MAX + 1];
	uint64_t t0;
	struct env_ckpt_params p = {.turn = 2, .thawed = on_thawed, .userdata = &t};
	int r;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	start_env(f, "dump", 256);
	t.env = f->env;
	assert_int_equal(env_checkpoint(f->env, &(struct env_ckpt_params){.turn = 1}, &m1), 0);
	snprintf(head, sizeof(head), "%s", f->env->head);
	print_message("a full dump of this environment: %" PRIu64 " ms, %" PRIu64
		      " MiB of images\n",
		      m1.dump_us / 1000, m1.criu_bytes >> 20);
	/* The hog's memory is in the images: the dump has something to take its time over. */
	assert_true(m1.criu_bytes >= 256ull << 20);

	/* CRIU's first file in criu/: the dump is running (the FS delta is done). */
	canceller_start(&c, f->env, "criu", 0);
	p.cancel = &c.cancel;
	t0 = fixture_now_us();
	r = env_checkpoint(f->env, &p, &m2);
	canceller_join(&c);
	print_message("cancel during dump: flag at %" PRIu64 " ms (criu/%s), thawed %" PRIu64
		      " ms after it\n",
		      (c.at_us - t0) / 1000, c.file, (t.at_us - c.at_us) / 1000);
	assert_int_equal(r, -ECANCELED);
	assert_int_equal(atomic_load(&t.calls), 1);
	assert_true(t.running);
	assert_progress(f);
	assert_true(env_count_procs(f->env) >= 4); /* init, server, dd, sleep: none killed */
	assert_int_equal(count_partial(f->env), 0);
	assert_int_equal(count_checkpoints(f->env), 1);
	assert_string_equal(f->env->head, head);
	env_manifest_finish(&m1);
}

/* A failure after the freeze (CRIU cannot start): thawed once all the same, the environment
 * runs, no partial checkpoint, the head unchanged, the error returned. */
static void test_thawed_on_failure(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m2 = {0};
	struct thawed_log t = {0};
	atomic_bool cancel;
	char head[ENV_ID_MAX + 1], criu[PATH_MAX];
	struct env_ckpt_params p = {
		.turn = 2, .cancel = &cancel, .thawed = on_thawed, .userdata = &t};
	int r;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	start_env(f, "failure", 0);
	t.env = f->env;
	atomic_init(&cancel, false);
	assert_int_equal(env_checkpoint(f->env, &(struct env_ckpt_params){.turn = 1}, &m1), 0);
	snprintf(head, sizeof(head), "%s", f->env->head);
	env_exec(f, "echo z >/work/z");
	snprintf(criu, sizeof(criu), "%s", f->env->criu);
	snprintf(f->env->criu, sizeof(f->env->criu), "%s/no-such-criu", f->dir);
	r = env_checkpoint(f->env, &p, &m2);
	snprintf(f->env->criu, sizeof(f->env->criu), "%s", criu);
	assert_true(r < 0 && r != -ECANCELED);
	assert_int_equal(atomic_load(&t.calls), 1);
	assert_true(t.running);
	assert_progress(f);
	assert_int_equal(count_partial(f->env), 0);
	assert_int_equal(count_checkpoints(f->env), 1);
	assert_string_equal(f->env->head, head);
	/* And the next one, with CRIU back, works. */
	assert_int_equal(env_checkpoint(f->env, &p, &m2), 0);
	assert_int_equal(atomic_load(&t.calls), 2);
	env_manifest_finish(&m1);
	env_manifest_finish(&m2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_cancel_before, envckpt_fx_setup,
						envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_cancel_mid_copy, envckpt_fx_setup,
						envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_thawed_once, envckpt_fx_setup,
						envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_cancel_during_dump, envckpt_fx_setup,
						envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_thawed_on_failure, envckpt_fx_setup,
						envckpt_fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
