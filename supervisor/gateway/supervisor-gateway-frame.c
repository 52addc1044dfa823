/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "supervisor-gateway-frame.h"
#include "util.h"

void gw_frame_init(struct gw_frame *f, uint64_t max_header, uint64_t max_body)
{
	*f = (struct gw_frame){.max_header = max_header, .max_body = max_body};
	gw_frame_reset(f);
}

void gw_frame_finish(struct gw_frame *f)
{
	if (!f)
		return;
	free(f->line);
	f->line = NULL;
	f->line_len = f->line_cap = 0;
}

void gw_frame_reset(struct gw_frame *f)
{
	f->state = GW_FRAME_HEAD;
	f->refused = false;
	f->refusal = (struct gw_frame_refusal){0};
	f->consumed = 0;
	f->head_len = 0;
	f->line_len = 0;
	f->head_bytes = 0;
	f->first_line = false;
	f->clen = -1;
	f->chunked = f->bad_clen = f->bad_te = false;
}

static bool refuse(struct gw_frame *f, int code, enum gw_reject why, const char *msg)
{
	f->refused = true;
	f->refusal = (struct gw_frame_refusal){.code = code, .why = why, .msg = msg};
	return true;
}

/* ---- the head --------------------------------------------------------------------------- */

static const char *const methods[] = {"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"};

static bool request_line(struct gw_frame *f, const char *s, size_t len)
{
	const char *sp = memchr(s, ' ', len), *last = NULL;
	size_t mlen;

	for (const char *p = s; p < s + len; p++)
		if (*p == ' ')
			last = p;
	if (!sp || last == sp || len - (size_t)(last + 1 - s) < 8 ||
	    strncmp(last + 1, "HTTP/1.", 7) != 0)
		return refuse(f, 400, GW_REJECT_MALFORMED, "the request line is not HTTP/1.x");
	mlen = (size_t)(sp - s);
	for (size_t i = 0; i < ARRAY_SIZE(methods); i++)
		if (strlen(methods[i]) == mlen && strncmp(s, methods[i], mlen) == 0)
			return false;
	return refuse(f, 501, GW_REJECT_MALFORMED, "the method is not supported");
}

static bool is_header(const char *s, size_t len, const char *name)
{
	size_t n = strlen(name);

	return len > n && s[n] == ':' && strncasecmp(s, name, n) == 0;
}

/* The value of a header line, its surrounding whitespace stripped. */
static const char *header_value(const char *s, size_t len, size_t *ret_len)
{
	const char *v = memchr(s, ':', len) + 1, *end = s + len;

	while (v < end && (*v == ' ' || *v == '\t'))
		v++;
	while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	*ret_len = (size_t)(end - v);
	return v;
}

static void header_line(struct gw_frame *f, const char *s, size_t len)
{
	const char *v;
	size_t vlen;

	if (is_header(s, len, "Content-Length")) {
		int64_t n = 0;

		v = header_value(s, len, &vlen);
		if (!vlen || vlen > 18)
			f->bad_clen = true;
		for (size_t i = 0; i < vlen && !f->bad_clen; i++) {
			if (v[i] < '0' || v[i] > '9')
				f->bad_clen = true;
			n = n * 10 + (v[i] - '0');
		}
		/* a repeated Content-Length must say the same */
		if (f->clen >= 0 && f->clen != n)
			f->bad_clen = true;
		f->clen = n;
	} else if (is_header(s, len, "Transfer-Encoding")) {
		v = header_value(s, len, &vlen);
		if (f->chunked || vlen != 7 || strncasecmp(v, "chunked", 7) != 0)
			f->bad_te = true;
		f->chunked = true;
	}
}

/* The head is complete: how its body is framed, and whether it may come. */
static bool head_end(struct gw_frame *f)
{
	if (f->bad_te)
		return refuse(f, 501, GW_REJECT_MALFORMED,
			      "a Transfer-Encoding other than chunked is not supported");
	if (f->bad_clen)
		return refuse(f, 400, GW_REJECT_MALFORMED, "the Content-Length is not valid");
	if (f->chunked && f->clen >= 0)
		return refuse(f, 400, GW_REJECT_MALFORMED,
			      "a request with both Content-Length and Transfer-Encoding");
	if (f->clen > 0 && (uint64_t)f->clen > f->max_body)
		return refuse(f, 413, GW_REJECT_BODY_SIZE,
			      "the request body exceeds the gateway's gateway_max_body");
	f->head_len = f->head_bytes;
	f->body_left = f->clen > 0 ? (uint64_t)f->clen : 0;
	f->body_total = 0;
	f->ch = GW_CHUNK_SIZE;
	f->digits = 0;
	f->size = 0;
	f->trailer_len = 0;
	f->state = f->chunked || f->body_left ? GW_FRAME_BODY : GW_FRAME_DONE;
	return false;
}

/* Appends to the incomplete line; its length never exceeds max_header (checked before). */
static int line_add(struct gw_frame *f, const char *p, size_t n)
{
	if (f->line_len + n > f->line_cap) {
		size_t cap = MAX(MAX(f->line_cap * 2, f->line_len + n), (size_t)128);
		char *line = realloc(f->line, cap);

		if (!line)
			return -ENOMEM;
		f->line = line;
		f->line_cap = cap;
	}
	if (n)
		memcpy(f->line + f->line_len, p, n);
	f->line_len += n;
	return 0;
}

/* Head bytes, line by line, up to the head's end: *ret_used of them taken. */
static bool head_feed(struct gw_frame *f, const char *p, size_t n, size_t *ret_used)
{
	size_t used = 0;

	while (n && f->state == GW_FRAME_HEAD) {
		const char *lf = memchr(p, '\n', n);
		size_t take = lf ? (size_t)(lf - p) + 1 : n, len;
		const char *s;

		f->head_bytes += take;
		if (f->head_bytes > f->max_header)
			return refuse(f, 431, GW_REJECT_HEADER_SIZE,
				      "the request line and headers exceed the gateway's "
				      "gateway_max_header");
		if (line_add(f, p, lf ? take - 1 : take) < 0)
			return refuse(f, 503, _GW_REJECT_MAX, "out of memory");
		p += take;
		n -= take;
		used += take;
		if (!lf)
			break;
		len = f->line_len;
		s = f->line;
		if (len && s[len - 1] == '\r')
			len--;
		if (!f->first_line) {
			/* empty lines before a request line are ignored (RFC 9112 §2.2) */
			if (len && request_line(f, s, len))
				return true;
			f->first_line = len > 0;
		} else if (!len) {
			if (head_end(f))
				return true;
		} else {
			header_line(f, s, len);
		}
		f->line_len = 0;
	}
	*ret_used = used;
	return false;
}

/* ---- the body --------------------------------------------------------------------------- */

/* Body bytes: counted down (Content-Length) or their chunk framing checked, up to the body's
 * end: *ret_used of them taken. */
static bool body_feed(struct gw_frame *f, const char *p, size_t n, size_t *ret_used)
{
	size_t used = 0;

	if (!f->chunked) {
		used = MIN(f->body_left, n);
		f->body_left -= used;
		if (!f->body_left)
			f->state = GW_FRAME_DONE;
		*ret_used = used;
		return false;
	}
	while (n && f->state == GW_FRAME_BODY) {
		char ch = *p;
		size_t take = 1;
		int h;

		switch (f->ch) {
		case GW_CHUNK_SIZE:
			h = hex_digit(ch);
			if (h >= 0 && f->digits < 15) {
				f->size = f->size * 16 + (uint64_t)h;
				f->digits++;
			} else if ((ch == '\r' || ch == '\n') && f->digits) {
				f->body_total += f->size;
				if (f->body_total > f->max_body)
					return refuse(f, 413, GW_REJECT_BODY_SIZE,
						      "the request body exceeds the gateway's "
						      "gateway_max_body");
				f->ch = ch == '\r' ? GW_CHUNK_SIZE_LF
					: f->size  ? GW_CHUNK_DATA
						   : GW_CHUNK_TRAILER;
				f->body_left = f->size;
			} else {
				return refuse(f, 400, GW_REJECT_MALFORMED,
					      "malformed chunked framing (a chunk size)");
			}
			break;
		case GW_CHUNK_SIZE_LF:
			if (ch != '\n')
				return refuse(f, 400, GW_REJECT_MALFORMED,
					      "malformed chunked framing (a chunk size line)");
			f->ch = f->size ? GW_CHUNK_DATA : GW_CHUNK_TRAILER;
			break;
		case GW_CHUNK_DATA:
			take = MIN(n, f->body_left);
			f->body_left -= take;
			if (!f->body_left)
				f->ch = GW_CHUNK_DATA_CR;
			break;
		case GW_CHUNK_DATA_CR:
		case GW_CHUNK_DATA_LF:
			if (ch == '\n') {
				f->ch = GW_CHUNK_SIZE;
				f->digits = 0;
				f->size = 0;
			} else if (ch == '\r' && f->ch == GW_CHUNK_DATA_CR) {
				f->ch = GW_CHUNK_DATA_LF;
			} else {
				return refuse(f, 400, GW_REJECT_MALFORMED,
					      "malformed chunked framing (no CRLF after a chunk)");
			}
			break;
		case GW_CHUNK_TRAILER:
			if (ch == '\n') {
				if (f->trailer_len == 0)
					f->state = GW_FRAME_DONE;
				f->trailer_len = 0;
			} else if (ch != '\r') {
				f->trailer_len++;
			}
			if (++f->head_bytes > f->max_header)
				return refuse(f, 431, GW_REJECT_HEADER_SIZE,
					      "the request's trailer exceeds the gateway's "
					      "gateway_max_header");
			break;
		}
		p += take;
		n -= take;
		used += take;
	}
	*ret_used = used;
	return false;
}

bool gw_frame_feed(struct gw_frame *f, const char *p, size_t n, size_t *ret_used,
		   struct gw_frame_refusal *ret)
{
	size_t head = 0, body = 0;

	*ret_used = 0;
	if (!f->refused && f->state == GW_FRAME_HEAD && head_feed(f, p, n, &head))
		goto refused;
	if (!f->refused && f->state == GW_FRAME_BODY && body_feed(f, p + head, n - head, &body))
		goto refused;
	if (f->refused)
		goto refused;
	*ret_used = head + body;
	f->consumed += head + body;
	return false;
refused:
	*ret = f->refusal;
	return true;
}
