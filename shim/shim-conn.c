/* SPDX-License-Identifier: MIT */
/*
 * The connection to the supervisor, owned by one shim thread so that no CUDA call ever waits
 * on a socket. Producers (the CUDA wrappers) append ids to a bounded queue under the regions
 * lock and never block (shim-conn-queue.c): while disconnected they queue nothing, and when
 * the queue is full they drop the item and ask for a resync. Either way the thread
 * (re)connects with backoff,
 * says hello and announces every live region from a snapshot taken atomically with the
 * queue's reset, so each region is announced once per connection, whatever raced.
 *
 * Version changes of a region are sent as a new REGION_ANNOUNCE of the same id (with a fresh
 * fd): the supervisor treats an announce of an id it holds as an update.
 *
 * fork(): the child gets an empty queue, no socket, no thread; its first CUDA use connects
 * with its own pid. The parent's socket is never used by the child.
 *
 * The thread also reads what the supervisor sends (promotion, shim-shadow.c): while the
 * queue is empty it polls the socket and an eventfd the producers poke (a non-blocking
 * write, so producers still never wait), and runs the shadow's park timer.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include "log.h"
#include "shim-capture.h"
#include "shim-classify.h"
#include "shim-config.h"
#include "shim-conn-queue.h"
#include "shim-conn.h"
#include "shim-meminfo.h"
#include "shim-device.h"
#include "shim-ipc.h"
#include "shim-nccl.h"
#include "shim-real.h"
#include "shim-regions.h"
#include "shim-role.h"
#include "shim-shadow-scratch.h"
#include "shim-shadow.h"
#include "util.h"

static int sock = -1;
static bool session; /* hello sent on sock; the thread's own */
static bool thread_started;
static bool warned_absent;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* With the regions lock held (regions_snapshot): the new session starts from an empty
 * queue, producers queue from now on. */
static void mark_connected(void)
{
	conn_queue_set_connected_locked(true);
}

static void disconnect(void)
{
	session = false;
	regions_lock();
	conn_queue_set_connected_locked(false);
	regions_unlock();
	sock = safe_close(sock);
}

/* Sends one message from the shim thread: waits for room (a slow supervisor only delays
 * this thread), gives up after 5 s without progress. */
static int send_msg(const struct proto_msg *m)
{
	for (;;) {
		struct pollfd p = {.fd = sock, .events = POLLOUT};
		int r = proto_send(sock, m, MSG_DONTWAIT);

		if (r != -EAGAIN)
			return r;
		r = poll(&p, 1, 5000);
		if (r == 0)
			return -ETIMEDOUT;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

static int connect_supervisor(void)
{
	const struct shim_config *c = shim_config();
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	_cleanup_close_ int fd = -1;

	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	memcpy(sa.sun_path, c->socket_path, strlen(c->socket_path));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return -errno;
	return TAKE_FD(fd);
}

/* Connects; the first failure in this process is the shim's one log line. */
static int try_connect(void)
{
	int r = connect_supervisor();

	if (r < 0) {
		if (!warned_absent) {
			warned_absent = true;
			log_warning_errno(
				r,
				"No supervisor at %s (%m): running pass-through, will keep trying.",
				shim_config()->socket_path);
		}
		return r;
	}
	sock = r;
	return 0;
}

static int send_hello(void)
{
	const struct shim_config *c = shim_config();
	const struct real_extra *x = real_extra();
	struct proto_msg m = {.type = PROTO_HELLO};
	int n = 0;

	m.hello.pid = (uint32_t)getpid();
	memcpy(m.hello.engine_id, c->engine_id, sizeof(m.hello.engine_id));
	m.hello.role = shim_role(); /* a promoted shadow says hello again as a primary */
	m.hello.rank = c->rank;
	shim_busy++;
	if (x->cuDeviceGetCount && x->cuDeviceGetCount(&n) != CUDA_SUCCESS)
		n = 0;
	shim_busy--;
	n = MIN(n, PROTO_MAX_DEVICES);
	for (int i = 0; i < n; i++) {
		CUdevice d = i;

		shim_busy++;
		if (x->cuDeviceGet)
			(void)x->cuDeviceGet(&d, i);
		shim_busy--;
		shim_device_uuid(d, m.hello.device_uuid[i]);
	}
	m.hello.n_devices = (uint32_t)n;
	return send_msg(&m);
}

static int announce_all(void)
{
	_cleanup_free_ uint64_t *ids = NULL, *sids = NULL;
	size_t n = 0, ns = 0;
	int r;

	r = regions_snapshot(mark_connected, &ids, &n, &sids, &ns);
	if (r < 0)
		return r;
	shadow_session_reset();
	for (size_t i = 0; i < ns; i++) {
		struct proto_msg m;

		if (!regions_build_shadow_region(sids[i], &m))
			continue;
		r = send_msg(&m);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; i < n; i++) {
		struct proto_msg m;

		if (!regions_build_announce(ids[i], &m))
			continue;
		r = send_msg(&m);
		proto_msg_finish(&m);
		if (r < 0)
			return r;
	}
	r = meminfo_announce_all(send_msg);
	if (r < 0)
		return r;
	return nccl_announce_all(send_msg);
}

/* Handles whatever the supervisor sent. Returns 0, 1 when this process just became a
 * primary, or -errno once the supervisor hung up or the connection failed. */
static int read_incoming(void)
{
	int promoted = 0;

	for (;;) {
		struct proto_msg m;
		int r = proto_recv(sock, &m, MSG_DONTWAIT);

		if (r == -EAGAIN || r == -EWOULDBLOCK)
			return promoted;
		if (r == -EBADMSG || r == -EPROTONOSUPPORT)
			continue; /* a message we cannot read is dropped, the connection stays */
		if (r < 0)
			return r;
		/* A shadow's PROMOTE_MAP imports and maps: the shim's own driver calls. */
		capture_relax_thread();
		r = shadow_on_message(&m, send_msg);
		proto_msg_finish(&m);
		if (r < 0)
			return r;
		if (r == 1)
			promoted = 1;
	}
}

/* Idle: waits for queued items, the supervisor, or the shadow's park timer. */
static int idle_wait(void)
{
	int wake_fd = conn_queue_wake_fd();
	struct pollfd p[2] = {{.fd = sock, .events = POLLIN}, {.fd = wake_fd, .events = POLLIN}};
	long timeout = shadow_tick(send_msg);
	eventfd_t v;
	int r;

	if (timeout < 0)
		return (int)timeout;
	r = poll(p, wake_fd >= 0 ? 2 : 1, (int)timeout);
	if (r < 0)
		return errno == EINTR ? 0 : -errno;
	if (wake_fd >= 0 && p[1].revents)
		(void)eventfd_read(wake_fd, &v);
	if (p[0].revents)
		return read_incoming();
	return 0;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void *conn_thread(void *arg)
{
	long backoff = 50;

	(void)arg;
	for (;;) {
		struct proto_msg m;
		struct conn_queue_item it;
		int r;

		if (sock < 0) {
			r = try_connect();
			if (r < 0) {
				sleep_ms(backoff);
				backoff = MIN(backoff * 2, 5000L);
				continue;
			}
			backoff = 50;
		}
		if (!session) {
			r = send_hello();
			if (r >= 0)
				r = announce_all();
			if (r < 0) {
				log_debug_errno(r, "Lost the supervisor while announcing: %m");
				disconnect();
			} else
				session = true;
			continue;
		}

		r = conn_queue_pop(&it);
		if (r == 0) {
			/* Idle: also notices a supervisor that went away, so that its successor
			 * gets everything again without waiting for our next message. */
			r = idle_wait();
			if (r < 0) {
				log_debug_errno(
					r, "The supervisor connection ended (%m), reconnecting.");
				disconnect();
			} else if (r == 1)
				session = false; /* promoted: hello as a primary, announce all */
			continue;
		}
		if (r < 0) {
			/* Something was dropped: start a new session, which re-announces all. */
			log_debug("Queue overflowed, resynchronizing with the supervisor.");
			disconnect();
			continue;
		}

		/* Exports and imports below are the shim's own driver calls. */
		capture_relax_thread();
		if (it.type == CONN_ANNOUNCE) {
			if (!regions_build_announce(it.id, &m))
				continue;
		} else if (it.type == CONN_SHADOW_REGION) {
			if (!regions_build_shadow_region(it.id, &m))
				continue;
		} else if (it.type == CONN_NCCL_COMM) {
			if (!nccl_build_comm(it.id, &m))
				continue;
		} else if (it.type == CONN_MEM_INFO) {
			if (!meminfo_build(it.id, &m))
				continue;
		} else if (it.type >= CONN_NCCL_FINALIZE && it.type <= CONN_NCCL_ABORT) {
			m = (struct proto_msg){.type = PROTO_NCCL_COMM_END};
			m.nccl_comm_end.id = it.id;
			m.nccl_comm_end.how = it.type == CONN_NCCL_FINALIZE  ? NCCL_END_FINALIZE
					      : it.type == CONN_NCCL_DESTROY ? NCCL_END_DESTROY
									     : NCCL_END_ABORT;
		} else {
			m = (struct proto_msg){.type = PROTO_REGION_RELEASE};
			m.release.id = it.id;
		}
		r = send_msg(&m);
		proto_msg_finish(&m);
		if (r < 0) {
			log_debug_errno(r, "Lost the supervisor: %m");
			disconnect();
		}
	}
	return NULL;
}

static void atfork_prepare(void)
{
	regions_lock();
	conn_queue_atfork_prepare();
}

static void atfork_parent(void)
{
	conn_queue_atfork_parent();
	regions_unlock();
}

static void atfork_child(void)
{
	conn_queue_atfork_child();
	/* The parent's connection stays the parent's: our copy of the fd is just closed. */
	sock = safe_close(sock);
	session = false;
	__atomic_store_n(&thread_started, false, __ATOMIC_RELEASE);
	warned_absent = false;
	classify_reset_after_fork();
	meminfo_reset_after_fork();
	regions_reset_after_fork();
	ipc_reset_after_fork();
	shadow_scratch_reset_after_fork();
	shadow_reset_after_fork();
	nccl_reset_after_fork();
}

static void register_atfork(void)
{
	(void)pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

void conn_start(void)
{
	sigset_t all, old;
	pthread_attr_t attr;
	pthread_t t;
	int r;

	if (__atomic_load_n(&thread_started, __ATOMIC_ACQUIRE) ||
	    __atomic_exchange_n(&thread_started, true, __ATOMIC_ACQ_REL))
		return;
	(void)pthread_once(&atfork_once, register_atfork);
	/* Before the thread exists, so it is visible to it; producers check it, -1 is fine. */
	conn_queue_open();

	/* The first attempt happens here, on the calling thread (a non-blocking connect to a
	 * local socket), so whether a supervisor is there is settled before the first CUDA call
	 * returns; hello and announcements are the thread's work. */
	(void)try_connect();

	/* The thread must never take a signal the host program expects on its own threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	r = pthread_create(&t, &attr, conn_thread, NULL);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r != 0) {
		log_warning_errno(
			-r, "Failed to start the supervisor thread (%m): running pass-through.");
		return;
	}
	(void)pthread_setname_np(t, "belayer-shim");
}
