/* SPDX-License-Identifier: MIT */
/*
 * A shadow's side of the session (shim-shadow.c): parking once its layout is complete, and
 * promotion to primary. Everything here runs on the connection thread.
 */
#pragma once

#include "proto.h"

/* A new session began (re-send regions and parked state). */
void shadow_session_reset(void);
/* ms until shadow_tick wants to run again (it may send PARKED). */
long shadow_tick(int (*send)(const struct proto_msg *m));
/* Handles a message from the supervisor; replies through send. Returns 1 when the process
 * just became a primary (a new hello and full announce must follow). */
int shadow_on_message(struct proto_msg *m, int (*send)(const struct proto_msg *m));
void shadow_reset_after_fork(void);
