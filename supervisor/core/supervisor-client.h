/* SPDX-License-Identifier: MIT */
/*
 * One connection: its peer credentials (SO_PEERCRED, fixed at connect time), its bounded
 * output queue, its error budget. Nothing here blocks: replies that do not fit the socket now
 * are queued, and a peer that lets its queue grow past max_queued_bytes is a slow reader and
 * is disconnected.
 */
#pragma once

#include "util.h"
#include "supervisor.h"

/* Takes fd (an accepted connection). Returns the client, or NULL when the peer is refused
 * (the fd is closed after an error reply; the refusal is counted). */
struct sv_client *client_new(struct supervisor *s, int fd);
void client_free(struct supervisor *s, struct sv_client *c);
struct sv_client *client_by_serial(struct supervisor *s, uint64_t serial);

/* Sends m (its fds are duplicated, the caller keeps them) or queues it. */
int client_send(struct supervisor *s, struct sv_client *c, const struct proto_msg *m);
int client_send_error(struct supervisor *s, struct sv_client *c, int code,
		      enum proto_type in_reply_to, const char *fmt, ...) _printf_(5, 6);
/* Writes queued packets until the socket is full. 0, or -errno when the peer is gone. */
int client_flush(struct supervisor *s, struct sv_client *c);

/* Counts a refusal of this client's message: replies with ERROR, and marks the client for
 * closing when it has used up its error budget. Returns -code. */
int client_refuse(struct supervisor *s, struct sv_client *c, enum reject_reason why, int code,
		  enum proto_type in_reply_to, const char *fmt, ...) _printf_(6, 7);
