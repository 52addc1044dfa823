/* SPDX-License-Identifier: MIT */
/*
 * The BPF environment is real: bpf/selfcheck.bpf.c, built by the bpf/ machinery, loads,
 * attaches to a syscall tracepoint, filters on this process through its rodata, and delivers
 * ring-buffer events that user space receives. Needs root and tracefs (tools/dev setup).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <bpf/libbpf.h>

#include "selfcheck.h"
#include "selfcheck.skel.h"
#include "test-util.h"

#define MAX_EVENTS     16
#define POLL_BUDGET_MS 5000

struct received {
	struct selfcheck_event events[MAX_EVENTS];
	size_t n;
};

static int on_event(void *ctx, void *data, size_t size)
{
	struct received *r = ctx;

	if (size != sizeof(struct selfcheck_event))
		return -EBADMSG;
	if (r->n < MAX_EVENTS)
		memcpy(&r->events[r->n], data, sizeof(struct selfcheck_event));
	r->n++;
	return 0;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A pid argument no process can have (above PID_MAX_LIMIT, 2^22): getpgid fails with ESRCH
 * and the value identifies this call in the event. */
static unsigned long long make_cookie(void)
{
	uint32_t r = 0;

	assert_int_equal(getrandom(&r, sizeof(r), 0), sizeof(r));
	return 0x40000000ULL | (r & 0x3fffffffU);
}

static int silent_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	if (level == LIBBPF_DEBUG)
		return 0;
	return vfprintf(stderr, fmt, ap);
}

static void test_tracepoint_ringbuf_event(void **state)
{
	struct selfcheck *skel = NULL;
	struct ring_buffer *rb = NULL;
	struct received got = {0};
	unsigned long long mine, other;
	pid_t child;
	int status, r;
	int64_t deadline;

	(void)state;
	TEST_REQUIRE(test_is_root(), "loading BPF programs needs root");
	TEST_REQUIRE(access("/sys/kernel/tracing/events/syscalls", F_OK) == 0,
		     "tracefs is not mounted at /sys/kernel/tracing (tools/dev setup mounts it)");
	libbpf_set_print(silent_print);

	skel = selfcheck__open();
	assert_non_null(skel);
	skel->rodata->target_tgid = (unsigned int)getpid();
	r = selfcheck__load(skel);
	assert_int_equal(r, 0);
	r = selfcheck__attach(skel);
	assert_int_equal(r, 0);
	rb = ring_buffer__new(bpf_map__fd(skel->maps.events), on_event, &got, NULL);
	assert_non_null(rb);

	mine = make_cookie();
	do
		other = make_cookie();
	while (other == mine);

	/* Another process makes the same syscall first: the rodata filter must drop it, and the
	 * ring buffer is ordered, so a leak would show up before our own event. */
	child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		(void)syscall(SYS_getpgid, (pid_t)other);
		_exit(0);
	}
	assert_int_equal(waitpid(child, &status, 0), child);
	assert_true(WIFEXITED(status));

	errno = 0;
	assert_int_equal(syscall(SYS_getpgid, (pid_t)mine), -1);
	assert_int_equal(errno, ESRCH);

	deadline = now_ms() + POLL_BUDGET_MS;
	while (got.n == 0 && now_ms() < deadline) {
		r = ring_buffer__poll(rb, 100);
		assert_true(r >= 0 || r == -EINTR);
	}
	/* Drain anything else already submitted, without waiting. */
	assert_true(ring_buffer__consume(rb) >= 0);

	assert_int_equal(got.n, 1);
	assert_int_equal(got.events[0].tgid, (unsigned int)getpid());
	assert_int_equal(got.events[0].tid, (unsigned int)gettid());
	assert_int_equal(got.events[0].arg0, mine);

	ring_buffer__free(rb);
	selfcheck__destroy(skel);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tracepoint_ringbuf_event),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
