/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "supervisor-gateway-http.h"

/* RFC 9110 §7.6.1's hop-by-hop headers, and the framing evhttp writes itself. */
static const char *const hop_by_hop[] = {
	"Connection", "Keep-Alive",	   "Proxy-Connection", "TE",   "Trailer",
	"Upgrade",    "Transfer-Encoding", "Content-Length",   "Host",
};

/* Whether name is one of the comma-separated tokens of list. */
static bool list_has(const char *list, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = list; p && *p;) {
		size_t len;

		p += strspn(p, " \t,");
		len = strcspn(p, ",");
		while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
			len--;
		if (len == n && strncasecmp(p, name, n) == 0)
			return true;
		p = strchr(p, ',');
	}
	return false;
}

void gw_http_copy_headers(struct evkeyvalq *to, const struct evkeyvalq *from)
{
	for (const struct evkeyval *h = from->tqh_first; h; h = h->next.tqe_next) {
		bool hop = false;

		for (size_t i = 0; i < sizeof(hop_by_hop) / sizeof(hop_by_hop[0]); i++)
			hop |= strcasecmp(h->key, hop_by_hop[i]) == 0;
		/* every Connection header of the message names headers of this hop only */
		for (const struct evkeyval *c = from->tqh_first; c && !hop; c = c->next.tqe_next)
			hop = strcasecmp(c->key, "Connection") == 0 && list_has(c->value, h->key);
		if (!hop)
			evhttp_add_header(to, h->key, h->value);
	}
}

/* Appends ", value" to header key of h, or adds it. */
static void header_append(struct evkeyvalq *h, const char *key, const char *value)
{
	const char *old = evhttp_find_header(h, key);
	char *v;

	if (!old) {
		evhttp_add_header(h, key, value);
		return;
	}
	if (asprintf(&v, "%s, %s", old, value) < 0)
		return; /* ENOMEM: the header stays as the client sent it */
	evhttp_remove_header(h, key);
	evhttp_add_header(h, key, v);
	free(v);
}

void gw_http_add_via(struct evkeyvalq *h)
{
	header_append(h, "Via", GW_VIA);
}

void gw_http_add_forwarded(struct evkeyvalq *h, const char *client_addr)
{
	gw_http_add_via(h);
	if (client_addr && *client_addr)
		header_append(h, "X-Forwarded-For", client_addr);
}

void gw_http_close_if_asked(struct evhttp_request *creq)
{
	const struct evkeyvalq *in = evhttp_request_get_input_headers(creq);
	struct evkeyvalq *out = evhttp_request_get_output_headers(creq);

	for (const struct evkeyval *h = in->tqh_first; h; h = h->next.tqe_next)
		if (strcasecmp(h->key, "Connection") == 0 && list_has(h->value, "close")) {
			/* evhttp closes after a reply whose own Connection says close */
			evhttp_remove_header(out, "Connection");
			evhttp_add_header(out, "Connection", "close");
			return;
		}
}

bool gw_http_engine_failed(int code)
{
	/* 500: vLLM's EngineDeadError, SGLang's scheduler crash; 502-504: a dying server or a
	 * proxy of the engine's own. */
	return code == 500 || code == 502 || code == 503 || code == 504;
}

const char *gw_http_error_type(int code)
{
	switch (code) {
	case 400:
		return "BadRequestError";
	case 408:
		return "RequestTimeoutError";
	case 413:
		return "RequestTooLargeError";
	case 431:
		return "RequestHeaderFieldsTooLargeError";
	case 501:
		return "NotImplementedError";
	case 503:
		return "ServiceUnavailableError";
	case 504:
		return "GatewayTimeoutError";
	default:
		return "BadGatewayError";
	}
}

const char *gw_http_reason(int code)
{
	switch (code) {
	case 400:
		return "Bad Request";
	case 408:
		return "Request Timeout";
	case 413:
		return "Payload Too Large";
	case 431:
		return "Request Header Fields Too Large";
	case 501:
		return "Not Implemented";
	case 503:
		return "Service Unavailable";
	case 504:
		return "Gateway Timeout";
	default:
		return "Error";
	}
}

int gw_http_error_json(char *buf, size_t cap, int code, const char *msg)
{
	json_object *o = json_object_new_object(), *e = json_object_new_object();
	int n;

	json_object_object_add(e, "message", json_object_new_string(msg));
	json_object_object_add(e, "type", json_object_new_string(gw_http_error_type(code)));
	json_object_object_add(e, "code", json_object_new_int(code));
	json_object_object_add(o, "error", e);
	n = snprintf(buf, cap, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	return n < 0 || (size_t)n >= cap ? -ENOBUFS : n;
}

void gw_nodelay(int fd)
{
	if (fd >= 0)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
}
