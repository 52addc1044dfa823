/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench env-scaling's memory rows (issue 23 item 5): what a checkpoint and a restore
 * cost when the environment's process holds 10 MiB, 100 MiB or 1 GiB of touched anonymous
 * memory, side by side in one environment:
 *   - "dirtied": the process rewrote one byte of every page, then a checkpoint: "full" (the
 *     CRIU dump copies all of it: this kernel has no soft-dirty tracking, so no pre-dump);
 *   - "idle": the process did not run (a file written from outside, as `env write` does),
 *     then a checkpoint with the tracer's activity counter: "fs-only" (the images
 *     hard-linked from the last dump, nothing of the memory copied);
 *   - "idle, old": the same turn without the activity counter (`[env] activity = no`, the
 *     behaviour before issue 23 item 3): every checkpoint full.
 * Then each of the three is restored (its time), and the restored process proves its memory is
 * the checkpoint's: it checks every page's byte against the value it last wrote before it
 * writes the next one, and says so.
 *
 * The holder is one python3 process (the host's /usr), the environment's init. It waits in
 * open() of the FIFO /memhold/go (a blocked open holds no file CRIU must dump), touches its
 * memory, and answers on /memhold/ack; the bench drives both FIFOs from outside, through the
 * overlay's mount, so no other process runs in the environment. After each answer the bench
 * waits until the holder is back in that open() (/proc/PID/syscall): a freeze while it is on
 * its way there would find a task in user code and make the next idle turn full.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bench-env-kinds.h"
#include "bench-env-mem.h"
#include "bench-measure.h"
#include "log.h"
#include "supervisor-envtrace.h"
#include "util.h"

/* How long the holder may take to answer: a 1 GiB touch, or a restored process's first run. */
#define MEM_ANSWER_MS 60000

static const char holder_py[] =
	"# Written by belayer-bench env-scaling (bench-env-mem.c).\n"
	"import sys\n"
	"n = int(sys.argv[1]) << 20\n"
	"pages = n // 4096\n"
	"b = bytearray(n)\n"
	"v = 0\n"
	"while True:\n"
	"    with open('/memhold/go') as f:\n"
	"        f.read()\n"
	"    ok = b[::4096] == bytes([v]) * pages\n"
	"    v = v % 255 + 1\n"
	"    b[::4096] = bytes([v]) * pages\n"
	"    with open('/memhold/ack', 'w') as f:\n"
	"        f.write('%d %s\\n' % (v, 'intact' if ok else 'changed'))\n";

int bench_env_mem_prepare(const char *base)
{
	char path[PATH_MAX];
	_cleanup_close_ int fd = -1;

	snprintf(path, sizeof(path), "%s/memhold", base);
	if (mkdir(path, 0755) < 0 && errno != EEXIST)
		return -errno;
	snprintf(path, sizeof(path), "%s/memhold/go", base);
	if (mkfifo(path, 0600) < 0 && errno != EEXIST)
		return -errno;
	snprintf(path, sizeof(path), "%s/memhold/ack", base);
	if (mkfifo(path, 0600) < 0 && errno != EEXIST)
		return -errno;
	snprintf(path, sizeof(path), "%s/memhold/hold.py", base);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, holder_py, sizeof(holder_py) - 1) != sizeof(holder_py) - 1)
		return -errno;
	return 0;
}

/* Whether the holder (the environment's init: its sh exec'd python3) waits in its open() of go
 * again: its answer is written before it gets there, and a checkpoint taken while it is still
 * on its way sees a task in user code (no baseline: the next idle turn would be full). */
static bool mem_parked(const struct sv_env *e)
{
	char path[64], buf[64], want[16];
	_cleanup_close_ int fd = -1;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/syscall", (int)e->pid);
	snprintf(want, sizeof(want), "%d ", SYS_openat);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	return strncmp(buf, want, strlen(want)) == 0;
}

/* One round: the holder checks its pages, writes the next value into each and answers "V
 * intact" (every page held the value it wrote last) or "V changed". 0 when the answer is want
 * intact, -EIO otherwise, -ETIMEDOUT when it never came. */
static int mem_round(const struct sv_env *e, unsigned want)
{
	char path[PATH_MAX], buf[64], expect[64];
	_cleanup_close_ int ack = -1, go = -1;
	uint64_t deadline = bench_now_ns() + (uint64_t)MEM_ANSWER_MS * 1000000;
	struct pollfd pfd;
	ssize_t n = 0;

	/* the reader first: the holder's open() of ack for writing then returns at once */
	snprintf(path, sizeof(path), "%s/memhold/ack", e->root);
	ack = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (ack < 0)
		return log_error_errno(-errno, "Failed to open %s: %m", path);
	/* ENXIO until the holder waits in its open() of go (it may be starting, or restored) */
	snprintf(path, sizeof(path), "%s/memhold/go", e->root);
	while ((go = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0) {
		if (errno != ENXIO || bench_now_ns() > deadline)
			return log_error_errno(errno == ENXIO ? -ETIMEDOUT : -errno,
					       "The memory holder of %s does not listen: %m",
					       e->id);
		(void)nanosleep(&(struct timespec){.tv_nsec = 10 * 1000000}, NULL);
	}
	if (write(go, "go\n", 3) != 3)
		return log_error_errno(-errno, "Failed to write to %s: %m", path);
	go = safe_close(go); /* its EOF ends the holder's read */
	pfd = (struct pollfd){.fd = ack, .events = POLLIN};
	if (poll(&pfd, 1, MEM_ANSWER_MS) == 1)
		n = read(ack, buf, sizeof(buf) - 1);
	if (n <= 0)
		return log_error_errno(-ETIMEDOUT, "The memory holder of %s did not answer.",
				       e->id);
	buf[n] = '\0';
	snprintf(expect, sizeof(expect), "%u intact\n", want);
	if (strcmp(buf, expect) != 0)
		return log_error_errno(-EIO,
				       "The memory holder of %s answered \"%.*s\", not %u intact.",
				       e->id, (int)strcspn(buf, "\n"), buf, want);
	while (!mem_parked(e)) {
		if (bench_now_ns() > deadline)
			return log_error_errno(
				-ETIMEDOUT, "The memory holder of %s does not wait again.", e->id);
		(void)nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
	}
	return 0;
}

/* Restores id (its time into row), then one round: the memory must be the checkpoint's. */
static int mem_restore(struct sv_env *e, const char *id, unsigned want, struct mem_row *row)
{
	struct env_manifest m;
	uint64_t t0;
	int r;

	/* the writeback of the images just dumped is not the restore's (as bench-env-scaling) */
	sync();
	t0 = bench_now_ns();
	r = env_restore(e, id, &m);

	if (r < 0)
		return log_error_errno(r, "Restore of %s to %s failed: %m (%s)", e->id, id,
				       e->error);
	row->restore_us = (bench_now_ns() - t0) / 1000;
	env_manifest_finish(&m);
	return mem_round(e, want);
}

int bench_env_mem(const struct env_params *base_p, unsigned mb, struct bench_mem *ret)
{
	char ids[3][ENV_ID_MAX + 1], first[ENV_ID_MAX + 1], name[32], cmd[64];
	struct envtrace_options o = {0};
	struct sv_envtrace *et = NULL;
	struct env_params p = *base_p;
	struct kinds_row ignored;
	struct sv_env *e = NULL;
	int r;

	*ret = (struct bench_mem){.mb = mb};
	/* without the tracer, no activity counter: the idle turn is full too (its kind says) */
	if (envtrace_create(&o, &et) < 0)
		log_info("No tracer for the memory rows: the idle turn is checkpointed full.");
	snprintf(name, sizeof(name), "mem%u", mb);
	snprintf(cmd, sizeof(cmd), "exec python3 /memhold/hold.py %u", mb);
	p.id = name;
	p.cmd = cmd;
	r = env_create(&p, &e);
	if (r < 0) {
		log_error_errno(r, "Failed to create the environment: %m");
		goto out;
	}
	if (et)
		r = envtrace_watch_add(et, e->cgroup, e->root, BENCH_KINDS_WATCH);
	/* its memory touched (value 1), the chain's first checkpoint (full, a walk) */
	if (r >= 0)
		r = mem_round(e, 1);
	if (r >= 0)
		r = bench_kinds_checkpoint(e, "mem", 1, &et, &ignored, first, sizeof(first));
	/* dirtied: every page rewritten (value 2) */
	if (r >= 0)
		r = mem_round(e, 2);
	if (r >= 0)
		r = bench_kinds_checkpoint(e, "mem", 2, &et, &ret->dirtied.ck, ids[0],
					   sizeof(ids[0]));
	/* idle: a file written from outside, the process parked in open() */
	if (r >= 0)
		r = bench_kinds_write(e, "mem.txt", 1);
	if (r >= 0)
		r = bench_kinds_checkpoint(e, "mem", 3, &et, &ret->idle.ck, ids[1], sizeof(ids[1]));
	/* the same turn the old way: no activity counter */
	if (r >= 0)
		r = bench_kinds_write(e, "mem.txt", 2);
	if (r >= 0)
		r = bench_kinds_checkpoint(e, "mem", 4, NULL, &ret->idle_old.ck, ids[2],
					   sizeof(ids[2]));
	/* each restored: the memory of all three is value 2's, the next round writes 3 */
	if (r >= 0)
		r = mem_restore(e, ids[0], 3, &ret->dirtied);
	if (r >= 0)
		r = mem_restore(e, ids[1], 3, &ret->idle);
	if (r >= 0)
		r = mem_restore(e, ids[2], 3, &ret->idle_old);
out:
	if (e)
		env_destroy(e);
	envtrace_destroy(et);
	return r;
}
