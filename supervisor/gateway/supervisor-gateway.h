/* SPDX-License-Identifier: MIT */
/*
 * The gateway (DESIGN §1.3): one HTTP listener per [engine.NAME] with gateway_listen, in the
 * supervisor's event loop (libevent evhttp server, evhttp client connections upstream; nothing
 * blocks). Token-in/token-out requests (SGLang POST /generate with input_ids, OpenAI POST
 * /v1/completions with a token-id prompt), and text and chat requests whose engine returns token
 * ids (vLLM's return_token_ids), are journaled token by token; when the engine's
 * worker group fails and is replaced (promotion or cold restart), every in-flight request is
 * resubmitted to the recovered worker with prompt = original + generated so far and the
 * remaining budget, and the continuation is spliced into the client's stream. Requests that
 * arrive while the engine recovers wait for it (bounded). Every other path is proxied as is.
 *
 * The gateway watches the engine's recovery state (struct sv_engine: rec, n_recoveries,
 * primary_ready, primary_port) from a timer of its own on the loop, so the recovery state
 * machine needs no call into it.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct gw_stats;
struct supervisor;

/* Starts the listeners of every engine with a gateway_listen. 0 or -errno (logged). */
int gateway_start(struct supervisor *s, struct event_base *base);
/* Fails every request in flight (503), closes the listeners and upstream connections. */
void gateway_stop(struct supervisor *s);
/* Gateway i's counters (NULL past the last), its engine's name, and its requests in the gateway
 * and waiting for a recovery now. */
const struct gw_stats *gateway_stats(size_t i, const char **ret_name, uint32_t *ret_in_flight,
				     uint32_t *ret_waiting);
