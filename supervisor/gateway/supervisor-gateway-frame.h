/* SPDX-License-Identifier: MIT */
/*
 * A client's HTTP/1.x request framing, scanned byte by byte as it arrives from the network and
 * before evhttp parses it (supervisor-gateway-limits.c feeds it): the request line's shape and
 * method, the head's size against gateway_max_header, how the body is framed (Content-Length,
 * or chunked, strictly: no chunk extensions, a CRLF after each chunk, the trailer counted
 * with the head) and its size against gateway_max_body. Pure: no libevent, no sockets, no
 * clock; the same verdict however the bytes are split (tests/fuzz/fuzz-frame.c checks it).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "supervisor-gateway-stats.h"

enum gw_frame_state {
	GW_FRAME_HEAD, /* the request line and headers (or empty lines before them) */
	GW_FRAME_BODY, /* the body */
	GW_FRAME_DONE, /* the request is over: what follows is a pipelined request's */
};

/* A chunked body's framing (RFC 9112 §7.1). */
enum gw_frame_chunk {
	GW_CHUNK_SIZE,	  /* hex digits of a chunk size */
	GW_CHUNK_SIZE_LF, /* the size line's LF after its CR */
	GW_CHUNK_DATA,	  /* the chunk's bytes */
	GW_CHUNK_DATA_CR, /* the CRLF after them */
	GW_CHUNK_DATA_LF, /* its LF */
	GW_CHUNK_TRAILER, /* trailer lines after the last chunk, up to an empty one */
};

struct gw_frame_refusal {
	int code;	    /* the HTTP status; 0: closed without an answer */
	enum gw_reject why; /* _GW_REJECT_MAX: not a refusal (not counted) */
	const char *msg;    /* static */
};

struct gw_frame {
	uint64_t max_header, max_body;
	enum gw_frame_state state;
	bool refused; /* sticky: every later feed answers refusal again */
	struct gw_frame_refusal refusal;
	uint64_t consumed; /* bytes of the request so far */
	uint64_t head_len; /* the head's bytes, once it is complete */
	/* the head */
	char *line; /* its incomplete line, line_len bytes (not NUL-terminated) */
	size_t line_len, line_cap;
	uint64_t head_bytes; /* the head's, then the trailer's too */
	bool first_line;
	int64_t clen; /* -1: no Content-Length */
	bool chunked, bad_clen, bad_te;
	/* the body */
	uint64_t body_left, body_total;
	enum gw_frame_chunk ch;
	unsigned digits;
	uint64_t size;
	uint64_t trailer_len; /* of the trailer line being read */
};

/* The caller allocates f; gw_frame_finish() frees what feeding allocated. */
void gw_frame_init(struct gw_frame *f, uint64_t max_header, uint64_t max_body);
void gw_frame_finish(struct gw_frame *f);
/* A new request begins (a kept-alive connection's next one): the line buffer is kept. */
void gw_frame_reset(struct gw_frame *f);

/*
 * Feeds the next n bytes of the connection. Returns true with *ret the refusal (also kept in
 * f, returned again by every later feed) when the request must be refused; else false, with
 * *ret_used the bytes of p that belong to the request: all of them while it lasts, fewer when
 * it ends within p, none once it is over (f->state GW_FRAME_DONE, f->consumed its length).
 * Out of memory for the head's line is a refusal too (503).
 */
bool gw_frame_feed(struct gw_frame *f, const char *p, size_t n, size_t *ret_used,
		   struct gw_frame_refusal *ret);
