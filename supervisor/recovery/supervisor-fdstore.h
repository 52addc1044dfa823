/* SPDX-License-Identifier: MIT */
/*
 * systemd's file descriptor store (FileDescriptorStoreMax= in the unit): every region fd the
 * supervisor holds is also handed to the service manager (FDSTORE=1, named after the region),
 * and taken back from it (LISTEN_FDS/LISTEN_FDNAMES) when the supervisor is restarted. So a
 * supervisor crash or restart loses nothing, not even the memory of a worker that had already
 * died: the journal says what each fd is, the store keeps it alive meanwhile.
 * Without systemd (no NOTIFY_SOCKET) or with [supervisor] fd_store = no, all of it is a no-op.
 */
#pragma once

#include "supervisor.h"

/* Stores rg's fd (replacing an older one of the same region). */
void fdstore_put(struct supervisor *s, const struct sv_region *rg);
/* Drops the region's fd from the store. */
void fdstore_remove(struct supervisor *s, const struct sv_region *rg);
/* After the journal replay: gives each restored region its fd back from the store. Fds that
 * match no region are closed and dropped from the store. Returns how many were attached. */
int fdstore_restore(struct supervisor *s);
