/* SPDX-License-Identifier: MIT */
/*
 * The connection's outgoing queue (shim-conn-queue.c): producers (regions, NCCL records)
 * append ids under the regions lock and never block; the connection thread (shim-conn.c)
 * takes them and builds each message when it sends it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

enum conn_item {
	CONN_ANNOUNCE = 1,
	CONN_RELEASE = 2,
	CONN_SHADOW_REGION = 3,
	/* NCCL communicators (shim-nccl.c); the id is the communicator's. */
	CONN_NCCL_COMM = 4,
	CONN_NCCL_FINALIZE = 5,
	CONN_NCCL_DESTROY = 6,
	CONN_NCCL_ABORT = 7,
	/* a cuMemGetInfo answer (shim-meminfo.c); the id is device << 32 | call number */
	CONN_MEM_INFO = 8,
};

/* Producers, with the regions lock held. Queues an item; never blocks. */
void conn_enqueue_locked(enum conn_item item, uint64_t id);
/* Whether a session is on: while disconnected, producers queue nothing. */
bool conn_active_locked(void);

/* The connection thread's side. */
struct conn_queue_item {
	enum conn_item type;
	uint64_t id;
};
/* Makes the eventfd producers poke (before the thread exists); -1 is fine. */
void conn_queue_open(void);
/* The eventfd producers poke, -1 when there is none. */
int conn_queue_wake_fd(void);
/* With the regions lock held: drops everything queued and marks the session on or off. */
void conn_queue_set_connected_locked(bool on);
/* Takes the oldest item: 1, 0 when the queue is empty, -EOVERFLOW when something was dropped
 * (a new session must re-announce everything). */
int conn_queue_pop(struct conn_queue_item *ret);
/* fork(): the queue's lock is held across it; the child gets an empty queue of its own. */
void conn_queue_atfork_prepare(void);
void conn_queue_atfork_parent(void);
void conn_queue_atfork_child(void);
