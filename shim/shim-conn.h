/* SPDX-License-Identifier: MIT */
/* The connection to the supervisor (shim-conn.c). */
#pragma once

/* Starts the connection thread once per process (after fork, once per child): on the first
 * CUDA context, the first converted allocation or the first NCCL communicator. */
void conn_start(void);
