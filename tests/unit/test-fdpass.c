/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "fdpass.h"
#include "test-util.h"
#include "util.h"

static int sv[2] = {-1, -1};

static int setup_pair(void **state)
{
	return socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0 ? 0 : -1;
}

static int teardown_pair(void **state)
{
	sv[0] = safe_close(sv[0]);
	sv[1] = safe_close(sv[1]);
	return 0;
}

static size_t count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	size_t n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	(void)closedir(d);
	return n - 1; /* the directory's own fd */
}

static bool same_file(int a, int b)
{
	struct stat sa, sb;

	assert_int_equal(fstat(a, &sa), 0);
	assert_int_equal(fstat(b, &sb), 0);
	return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int new_memfd(const char *name)
{
	int fd = memfd_create(name, MFD_CLOEXEC);

	assert_true(fd >= 0);
	return fd;
}

static void data_without_fds(void **state)
{
	char buf[64];
	int fds[4];
	size_t nfds = 99;

	assert_int_equal(fdpass_send(sv[0], "hello", 5, NULL, 0, 0), 5);
	assert_int_equal(fdpass_recv(sv[1], buf, sizeof(buf), fds, ARRAY_SIZE(fds), &nfds, 0), 5);
	assert_memory_equal(buf, "hello", 5);
	assert_int_equal(nfds, 0);

	/* max_fds 0 without fd arrays is fine when none come. */
	assert_int_equal(fdpass_send(sv[0], "x", 1, NULL, 0, 0), 1);
	assert_int_equal(fdpass_recv(sv[1], buf, sizeof(buf), NULL, 0, NULL, 0), 1);
}

static void several_fds_arrive_cloexec_and_intact(void **state)
{
	int sent[3], got[FDPASS_MAX_FDS];
	char buf[16], rd;
	size_t nfds = 0;
	int p[2];

	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	sent[0] = p[0];
	sent[1] = p[1];
	sent[2] = new_memfd("fdpass-test");

	assert_int_equal(fdpass_send(sv[0], "three", 5, sent, 3, 0), 5);
	assert_int_equal(fdpass_recv(sv[1], buf, sizeof(buf), got, ARRAY_SIZE(got), &nfds, 0), 5);
	assert_int_equal(nfds, 3);
	for (size_t i = 0; i < 3; i++) {
		int flags = fcntl(got[i], F_GETFD);

		assert_true(flags >= 0);
		assert_true(flags & FD_CLOEXEC);
		assert_int_not_equal(got[i], sent[i]);
		assert_true(same_file(got[i], sent[i]));
	}
	/* They work: a byte through the received pipe ends comes out of the original. */
	assert_int_equal(write(got[1], "z", 1), 1);
	assert_int_equal(read(sent[0], &rd, 1), 1);
	assert_int_equal(rd, 'z');

	for (size_t i = 0; i < 3; i++) {
		(void)safe_close(got[i]);
		(void)safe_close(sent[i]);
	}
}

static void max_fds_in_one_packet(void **state)
{
	int sent[FDPASS_MAX_FDS], got[FDPASS_MAX_FDS];
	size_t nfds = 0;
	char b;

	for (size_t i = 0; i < FDPASS_MAX_FDS; i++)
		sent[i] = new_memfd("fdpass-max");
	assert_int_equal(fdpass_send(sv[0], "m", 1, sent, FDPASS_MAX_FDS, 0), 1);
	assert_int_equal(fdpass_recv(sv[1], &b, 1, got, FDPASS_MAX_FDS, &nfds, 0), 1);
	assert_int_equal(nfds, FDPASS_MAX_FDS);
	for (size_t i = 0; i < FDPASS_MAX_FDS; i++) {
		assert_true(same_file(got[i], sent[i]));
		(void)safe_close(got[i]);
		(void)safe_close(sent[i]);
	}
}

static void truncated_data_is_emsgsize_and_fds_closed(void **state)
{
	char big[100] = {0}, small[10];
	int sent[2], got[4];
	size_t before, nfds = 99;

	sent[0] = new_memfd("a");
	sent[1] = new_memfd("b");
	assert_int_equal(fdpass_send(sv[0], big, sizeof(big), sent, 2, 0), (ssize_t)sizeof(big));
	before = count_open_fds();
	assert_int_equal(fdpass_recv(sv[1], small, sizeof(small), got, ARRAY_SIZE(got), &nfds, 0),
			 -EMSGSIZE);
	assert_int_equal(nfds, 0);
	assert_int_equal(count_open_fds(), before);

	/* The next packet is unaffected. */
	assert_int_equal(fdpass_send(sv[0], "ok", 2, NULL, 0, 0), 2);
	assert_int_equal(fdpass_recv(sv[1], small, sizeof(small), got, ARRAY_SIZE(got), &nfds, 0),
			 2);
	(void)safe_close(sent[0]);
	(void)safe_close(sent[1]);
}

static void more_fds_than_max_is_ebadmsg_and_fds_closed(void **state)
{
	int sent[3], got[2];
	size_t before, nfds = 99;
	char b;

	for (size_t i = 0; i < 3; i++)
		sent[i] = new_memfd("x");
	assert_int_equal(fdpass_send(sv[0], "3", 1, sent, 3, 0), 1);
	before = count_open_fds();
	assert_int_equal(fdpass_recv(sv[1], &b, 1, got, ARRAY_SIZE(got), &nfds, 0), -EBADMSG);
	assert_int_equal(nfds, 0);
	assert_int_equal(count_open_fds(), before);

	/* Fds but no room for any. */
	assert_int_equal(fdpass_send(sv[0], "1", 1, sent, 1, 0), 1);
	assert_int_equal(fdpass_recv(sv[1], &b, 1, got, 0, &nfds, 0), -EBADMSG);
	assert_int_equal(count_open_fds(), before);
	for (size_t i = 0; i < 3; i++)
		(void)safe_close(sent[i]);
}

/* A peer not using fdpass_send can pass more fds than our control buffer holds: the kernel
 * cuts them (MSG_CTRUNC) and the ones that did arrive must still be closed. */
static void control_truncation_is_ebadmsg_and_fds_closed(void **state)
{
	enum {
		N = FDPASS_MAX_FDS + 4
	};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * N)];
	} control;
	struct iovec iov = {.iov_base = "c", .iov_len = 1};
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control.buf,
		.msg_controllen = sizeof(control.buf),
	};
	struct cmsghdr *cmsg;
	int sent[N], got[FDPASS_MAX_FDS];
	size_t before, nfds = 99;
	char b;

	for (size_t i = 0; i < N; i++)
		sent[i] = new_memfd("ctrunc");
	memset(&control, 0, sizeof(control));
	cmsg = CMSG_FIRSTHDR(&mh);
	cmsg->cmsg_level = SOL_SOCKET;
	cmsg->cmsg_type = SCM_RIGHTS;
	cmsg->cmsg_len = CMSG_LEN(sizeof(int) * N);
	memcpy(CMSG_DATA(cmsg), sent, sizeof(sent));
	assert_int_equal(sendmsg(sv[0], &mh, MSG_NOSIGNAL), 1);

	before = count_open_fds();
	assert_int_equal(fdpass_recv(sv[1], &b, 1, got, FDPASS_MAX_FDS, &nfds, 0), -EBADMSG);
	assert_int_equal(nfds, 0);
	assert_int_equal(count_open_fds(), before);
	for (size_t i = 0; i < N; i++)
		(void)safe_close(sent[i]);
}

static void peer_close_reads_as_zero(void **state)
{
	char buf[8];
	int got[1];
	size_t nfds = 99;

	assert_int_equal(fdpass_send(sv[0], "last", 4, NULL, 0, 0), 4);
	sv[0] = safe_close(sv[0]);
	/* Queued data first, then end of stream. */
	assert_int_equal(fdpass_recv(sv[1], buf, sizeof(buf), got, 1, &nfds, 0), 4);
	assert_int_equal(fdpass_recv(sv[1], buf, sizeof(buf), got, 1, &nfds, 0), 0);
	assert_int_equal(nfds, 0);
}

static void send_to_closed_peer_is_epipe_not_sigpipe(void **state)
{
	sv[1] = safe_close(sv[1]);
	/* Without MSG_NOSIGNAL the default SIGPIPE action would kill the test here. */
	assert_int_equal(fdpass_send(sv[0], "x", 1, NULL, 0, 0), -EPIPE);
}

static void nonblocking_recv_on_empty_is_eagain(void **state)
{
	char b;
	size_t nfds;

	assert_int_equal(fdpass_recv(sv[1], &b, 1, NULL, 0, &nfds, MSG_DONTWAIT), -EAGAIN);
}

static void invalid_arguments_are_einval(void **state)
{
	int fds[FDPASS_MAX_FDS + 1] = {0};
	char b;

	assert_int_equal(fdpass_send(sv[0], "x", 0, NULL, 0, 0), -EINVAL);
	assert_int_equal(fdpass_send(sv[0], NULL, 1, NULL, 0, 0), -EINVAL);
	assert_int_equal(fdpass_send(sv[0], "x", 1, fds, FDPASS_MAX_FDS + 1, 0), -EINVAL);
	assert_int_equal(fdpass_send(sv[0], "x", 1, NULL, 1, 0), -EINVAL);
	assert_int_equal(fdpass_send(-1, "x", 1, NULL, 0, 0), -EINVAL);
	assert_int_equal(fdpass_recv(sv[1], &b, 1, NULL, 1, NULL, 0), -EINVAL);
}

/* Set in the receiving thread's handler, read by the main thread: atomics, not just volatile. */
static int signals_seen;

static void on_signal(int sig)
{
	__atomic_fetch_add(&signals_seen, 1, __ATOMIC_RELEASE);
}

struct receiver {
	ssize_t n;
	char buf[8];
	int done;
};

static void *receive_one(void *arg)
{
	struct receiver *r = arg;
	size_t nfds;

	r->n = fdpass_recv(sv[1], r->buf, sizeof(r->buf), NULL, 0, &nfds, 0);
	__atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Waits, bounded, until thread tid sleeps in the kernel (state S in /proc). */
static bool wait_thread_sleeping(pid_t tid)
{
	char path[64], stat[512];

	(void)snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	for (int i = 0; i < 5000; i++) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, stat, sizeof(stat) - 1) : -1;
		const char *paren;

		(void)safe_close(fd);
		if (n > 0) {
			stat[n] = '\0';
			paren = strrchr(stat, ')');
			if (paren && paren[1] == ' ' && paren[2] == 'S')
				return true;
		}
		(void)sched_yield();
		(void)nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
	}
	return false;
}

static pid_t receiver_tid;

static void *receive_one_tid(void *arg)
{
	__atomic_store_n(&receiver_tid, gettid(), __ATOMIC_RELEASE);
	return receive_one(arg);
}

static void interrupted_recv_is_retried(void **state)
{
	struct sigaction sa = {.sa_handler = on_signal}, old;
	struct receiver r = {0};
	pthread_t th;
	pid_t tid = 0;

	/* No SA_RESTART: the signal makes recvmsg fail with EINTR, which fdpass must retry. */
	assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
	assert_int_equal(pthread_create(&th, NULL, receive_one_tid, &r), 0);
	for (int i = 0; i < 5000 && !(tid = __atomic_load_n(&receiver_tid, __ATOMIC_ACQUIRE)); i++)
		(void)nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
	assert_true(tid > 0);
	assert_true(wait_thread_sleeping(tid));

	assert_int_equal(pthread_kill(th, SIGUSR1), 0);
	for (int i = 0; i < 5000 && __atomic_load_n(&signals_seen, __ATOMIC_ACQUIRE) == 0; i++)
		(void)nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
	assert_int_equal(__atomic_load_n(&signals_seen, __ATOMIC_ACQUIRE), 1);
	/* Still waiting, not returned with EINTR. */
	assert_int_equal(__atomic_load_n(&r.done, __ATOMIC_ACQUIRE), 0);

	assert_int_equal(fdpass_send(sv[0], "late", 4, NULL, 0, 0), 4);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(r.n, 4);
	assert_memory_equal(r.buf, "late", 4);
	assert_int_equal(sigaction(SIGUSR1, &old, NULL), 0);
}

#define PAIR_TEST(f) cmocka_unit_test_setup_teardown(f, setup_pair, teardown_pair)

int main(void)
{
	const struct CMUnitTest tests[] = {
		PAIR_TEST(data_without_fds),
		PAIR_TEST(several_fds_arrive_cloexec_and_intact),
		PAIR_TEST(max_fds_in_one_packet),
		PAIR_TEST(truncated_data_is_emsgsize_and_fds_closed),
		PAIR_TEST(more_fds_than_max_is_ebadmsg_and_fds_closed),
		PAIR_TEST(control_truncation_is_ebadmsg_and_fds_closed),
		PAIR_TEST(peer_close_reads_as_zero),
		PAIR_TEST(send_to_closed_peer_is_epipe_not_sigpipe),
		PAIR_TEST(nonblocking_recv_on_empty_is_eagain),
		PAIR_TEST(invalid_arguments_are_einval),
		PAIR_TEST(interrupted_recv_is_retried),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
