/* SPDX-License-Identifier: MIT */
/* Shared by the HTTP handlers (engine-http.c: the API and server; engine-http-admin.c: weights
 * and debug endpoints): replies and strict JSON field readers. Each reader answers 400 itself
 * and returns false/NULL when a field is present with a wrong type or range. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <event2/http.h>
#include <json-c/json.h>

#include "util.h"

/* Sends o (consumed) as the JSON reply with status code. */
void send_json(struct evhttp_request *hreq, int code, json_object *o);
/* {"error": {"message", "type", "code"}} with status code. */
void send_error(struct evhttp_request *hreq, int code, const char *fmt, ...) _printf_(3, 4);
/* The POST body as a JSON object, or NULL after replying 400/405. */
json_object *body_json(struct evhttp_request *hreq);
/* true when every field of o is in allowed (NULL-terminated). */
bool known_fields(struct evhttp_request *hreq, json_object *o, const char *what,
		  const char *const *allowed);
bool get_int(struct evhttp_request *hreq, json_object *o, const char *key, int64_t lo, int64_t hi,
	     int64_t *v);
bool get_num(struct evhttp_request *hreq, json_object *o, const char *key, double lo, double hi,
	     double *v);
bool get_bool(struct evhttp_request *hreq, json_object *o, const char *key, bool *v);
/* The string, "" when absent and not required, NULL after replying 400. */
const char *get_str(struct evhttp_request *hreq, json_object *o, const char *key, bool required);
json_object *ids_array(const uint32_t *tok, uint32_t n);

/* engine-http-admin.c */
void http_on_model_info(struct evhttp_request *hreq, void *arg);
void http_on_update_disk(struct evhttp_request *hreq, void *arg);
void http_on_init_group(struct evhttp_request *hreq, void *arg);
void http_on_update_dist(struct evhttp_request *hreq, void *arg);
void http_on_debug_kv(struct evhttp_request *hreq, void *arg);
void http_on_debug(struct evhttp_request *hreq, void *arg);
void http_on_debug_headers(struct evhttp_request *hreq, void *arg);
