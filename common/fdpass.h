/* SPDX-License-Identifier: MIT */
/*
 * One message per packet over SOCK_SEQPACKET, with file descriptors passed by SCM_RIGHTS.
 * Received fds are always O_CLOEXEC. Truncation is an error, never silent: a packet larger
 * than the buffer is -EMSGSIZE, more fds than room for them is -EBADMSG, and in both cases
 * every fd that did arrive is closed.
 */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#define FDPASS_MAX_FDS 16

/* Sends buf (len > 0) and nfds (<= FDPASS_MAX_FDS) fds as one packet. flags: MSG_DONTWAIT
 * etc. (MSG_NOSIGNAL is always added). Returns bytes sent or -errno. */
ssize_t fdpass_send(int sock, const void *buf, size_t len, const int *fds, size_t nfds, int flags);

/* Receives one packet into buf and up to max_fds fds into ret_fds (*ret_nfds set).
 * Returns bytes received, 0 when the peer closed the connection, or -errno. */
ssize_t fdpass_recv(int sock, void *buf, size_t cap, int *ret_fds, size_t max_fds, size_t *ret_nfds,
		    int flags);
