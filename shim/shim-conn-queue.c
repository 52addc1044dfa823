/* SPDX-License-Identifier: MIT */
/*
 * The connection's outgoing queue: a bounded ring of ids, appended by producers under the
 * regions lock. Producers never block: while disconnected they queue nothing, and when the
 * queue is full they drop the item and ask for a resync (the connection thread then starts a
 * new session, which re-announces every live region). They poke an eventfd with a
 * non-blocking write so that an idle connection thread wakes up.
 */

#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>

#include "shim-config.h"
#include "shim-conn-queue.h"
#include "util.h"

static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static int wake_fd = -1;
static struct conn_queue_item *ring;
static size_t ring_head, ring_count, ring_cap;
static bool resync;
static bool connected; /* written with the regions lock held, read by producers under it */

bool conn_active_locked(void)
{
	return connected;
}

void conn_enqueue_locked(enum conn_item type, uint64_t id)
{
	pthread_mutex_lock(&qlock);
	if (!ring) {
		ring_cap = shim_config()->queue_max;
		ring = calloc(ring_cap, sizeof(*ring));
	}
	if (!ring || ring_count == ring_cap) {
		/* Dropping is safe only because a resync re-announces everything from scratch. */
		resync = true;
	} else {
		ring[(ring_head + ring_count) % ring_cap] = (struct conn_queue_item){type, id};
		ring_count++;
	}
	pthread_mutex_unlock(&qlock);
	if (wake_fd >= 0)
		(void)eventfd_write(wake_fd, 1); /* non-blocking: at worst the counter saturates */
}

void conn_queue_open(void)
{
	wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

int conn_queue_wake_fd(void)
{
	return wake_fd;
}

void conn_queue_set_connected_locked(bool on)
{
	pthread_mutex_lock(&qlock);
	ring_head = ring_count = 0;
	resync = false;
	pthread_mutex_unlock(&qlock);
	connected = on;
}

int conn_queue_pop(struct conn_queue_item *ret)
{
	int r = 1;

	pthread_mutex_lock(&qlock);
	if (resync)
		r = -EOVERFLOW;
	else if (ring_count == 0)
		r = 0;
	else {
		*ret = ring[ring_head];
		ring_head = (ring_head + 1) % ring_cap;
		ring_count--;
	}
	pthread_mutex_unlock(&qlock);
	return r;
}

void conn_queue_atfork_prepare(void)
{
	pthread_mutex_lock(&qlock);
}

void conn_queue_atfork_parent(void)
{
	pthread_mutex_unlock(&qlock);
}

void conn_queue_atfork_child(void)
{
	pthread_mutex_init(&qlock, NULL);
	/* The parent's eventfd would wake the parent's thread: the child makes its own. */
	wake_fd = safe_close(wake_fd);
	ring_head = ring_count = 0;
	resync = false;
	connected = false;
}
