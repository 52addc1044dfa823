/* SPDX-License-Identifier: MIT */
/*
 * The supervisor's message handler: reads one packet from a connection, bounds and decodes
 * it, and acts on it. Everything a peer can send goes through here, so this is what the fuzz
 * target drives. No event loop inside: the loop calls handler_read() when the socket is
 * readable and closes the connection when it returns an error or marks it closing.
 */
#pragma once

#include "supervisor.h"

/* Reads and handles one packet. Returns 0 (also when the packet was refused), -EAGAIN when
 * nothing was there, or -errno when the connection is finished. */
int handler_read(struct supervisor *s, struct sv_client *c);
/* Handles one decoded message; takes ownership of its fds. */
int handler_dispatch(struct supervisor *s, struct sv_client *c, struct proto_msg *m);
