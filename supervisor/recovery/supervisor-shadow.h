/* SPDX-License-Identifier: MIT */
/*
 * Shadows: their layouts (PROTO_SHADOW_REGION, PROTO_SHADOW_PARKED), the pairing of shadow
 * rank r with primary rank r of the same engine, the layout check, and PROMOTE_MAPs sent
 * early: as soon as a parked shadow's layout equals its primary's, it imports the primary's
 * regions (and again whenever one is re-announced), so at promotion only COMMIT remains.
 */
#pragma once

#include "supervisor-engines.h"

int shadow_on_region(struct supervisor *s, struct sv_client *c,
		     const struct proto_shadow_region *r);
int shadow_on_parked(struct supervisor *s, struct sv_client *c,
		     const struct proto_shadow_parked *p);
/* A shadow withdraws one of its regions (PROTO_REGION_RELEASE of its id). Returns whether
 * id was one. */
bool shadow_release(struct sv_worker *w, uint64_t id);
/* A (re)connected shadow holds no imported handle: every MAP is to be sent again. */
void shadow_forget_maps(struct sv_worker *w);
/* A primary's region was announced: refresh the early MAPs of its engine. */
void shadow_primary_announced(struct supervisor *s, struct sv_worker *w);

/* The primary's layout (weights + kv regions by creation order): hash and count. */
uint64_t shadow_primary_layout(const struct sv_worker *w, uint32_t *ret_n);
/* 0 when shadow sh can take over primary p's memory; else -errno and why in msg. */
int shadow_layout_check(const struct sv_worker *p, const struct sv_worker *sh, char *msg,
			size_t cap);
/* Sends sh the MAPs of p's regions it does not hold yet (force: all). Returns how many were
 * sent, or -errno. */
int shadow_send_maps(struct supervisor *s, struct sv_worker *p, struct sv_worker *sh, bool force);
/* Adds the promotion view of w to its WORKER_INFO: layout, parked, port, ready. */
void shadow_worker_info(struct supervisor *s, const struct sv_worker *w, struct proto_msg *m);
/* Sends every shadow of e that pairs with a live primary its missing MAPs. */
void shadow_sync(struct supervisor *s, struct sv_engine *e);
