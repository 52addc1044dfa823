/* SPDX-License-Identifier: MIT */
/*
 * The gateway's scanner of client request framing (supervisor-gateway-frame.c), which sees
 * every byte a client sends before evhttp does, on arbitrary bytes with small limits
 * (gateway_max_header 256, gateway_max_body 1024). Beyond "no crash, no leak":
 *   - the verdict (the refusal, or how far the request got and how many bytes it took) is the
 *     same fed whole, byte by byte, and in pieces split where the input says (to a frame reset
 *     after it read the first piece, as a kept-alive connection's next request is);
 *   - a feed never takes more bytes than it is given, takes them all while the request lasts,
 *     none once it is over, and the bytes taken add up to the request's length;
 *   - the verdict is the one a second, line-oriented reading of the same rules gives (ref_*
 *     below): no head over max_header, no body over max_body, no malformed framing gets
 *     through, and nothing within them is refused.
 *
 * Input: byte 0 (low 3 bits): k, the number of split lengths that follow (bytes 1..k, each
 * 0-255, used in turn until the bytes run out; a 0 is an empty feed), then the client's bytes.
 */
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "fuzz-common.h"
#include "supervisor-gateway-frame.h"
#include "util.h"

#define MAX_HEADER 256
#define MAX_BODY   1024

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct verdict {
	bool refused;
	int code;
	enum gw_reject why;
	const char *msg; /* NULL: any (the reference reading does not word them) */
	enum gw_frame_state state;
	uint64_t consumed, head_len;
};

static void verdict_check_same(const struct verdict *a, const struct verdict *b)
{
	FUZZ_CHECK(a->refused == b->refused);
	if (a->refused) {
		FUZZ_CHECK(a->code == b->code);
		FUZZ_CHECK(a->why == b->why);
		FUZZ_CHECK(!a->msg || !b->msg || strcmp(a->msg, b->msg) == 0);
		return;
	}
	FUZZ_CHECK(a->state == b->state);
	FUZZ_CHECK(a->consumed == b->consumed);
	if (a->state != GW_FRAME_HEAD)
		FUZZ_CHECK(a->head_len == b->head_len);
}

/* Feeds [p, p + n) in pieces of the given lengths, cycled (all of it at once when none), to a
 * frame that read the first dirty bytes and was reset, as a kept-alive connection's is. */
static struct verdict feed(const char *p, size_t n, const uint8_t *lens, size_t k, size_t dirty)
{
	struct gw_frame_refusal r = {0};
	struct verdict v = {0};
	struct gw_frame f;
	uint64_t taken = 0;
	size_t off = 0, i = 0, idle = 0, used_dirty;
	bool refused = false;

	gw_frame_init(&f, MAX_HEADER, MAX_BODY);
	if (dirty) {
		(void)gw_frame_feed(&f, p, dirty, &used_dirty, &r);
		gw_frame_reset(&f);
	}
	while (!refused) {
		size_t m = k ? lens[i % k] : n - off, used = 42;
		enum gw_frame_state before = f.state;

		i++;
		m = MIN(m, n - off);
		/* a cycle of empty feeds: the rest at once */
		idle = m ? 0 : idle + 1;
		if (k && idle > k)
			m = n - off;
		refused = gw_frame_feed(&f, p + off, m, &used, &r);
		if (!refused) {
			FUZZ_CHECK(used <= m);
			FUZZ_CHECK(before != GW_FRAME_DONE || used == 0);
			FUZZ_CHECK(used == m || f.state == GW_FRAME_DONE);
			taken += used;
			FUZZ_CHECK(f.consumed == taken);
		}
		off += m;
		if (off == n && (m || !k || idle > k))
			break;
	}
	if (refused) {
		struct gw_frame_refusal again = {0};
		size_t used;

		/* sticky */
		FUZZ_CHECK(gw_frame_feed(&f, "x", 1, &used, &again));
		FUZZ_CHECK(again.code == r.code && again.why == r.why && again.msg == r.msg);
		v = (struct verdict){.refused = true, .code = r.code, .why = r.why, .msg = r.msg};
	} else {
		v = (struct verdict){
			.state = f.state, .consumed = f.consumed, .head_len = f.head_len};
		if (f.state == GW_FRAME_HEAD)
			FUZZ_CHECK(f.consumed == n);
	}
	gw_frame_finish(&f);
	return v;
}

/* ---- the reference reading: the same rules, line by line over the whole input ------------ */

static const char *const methods[] = {"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"};

static struct verdict ref_refuse(int code, enum gw_reject why)
{
	return (struct verdict){.refused = true, .code = code, .why = why};
}

static bool ref_request_line(const char *s, size_t len, int *ret_code)
{
	size_t first = len, last = len, mlen;

	for (size_t i = 0; i < len; i++)
		if (s[i] == ' ') {
			if (first == len)
				first = i;
			last = i;
		}
	/* METHOD SP ... SP HTTP/1.x, the version at least 8 bytes */
	if (first == len || first == last || len - last - 1 < 8 ||
	    memcmp(s + last + 1, "HTTP/1.", 7) != 0) {
		*ret_code = 400;
		return false;
	}
	mlen = first;
	for (size_t i = 0; i < ARRAY_SIZE(methods); i++)
		if (strlen(methods[i]) == mlen && memcmp(s, methods[i], mlen) == 0)
			return true;
	*ret_code = 501;
	return false;
}

static char ascii_lower(char ch)
{
	return ch >= 'A' && ch <= 'Z' ? (char)(ch - 'A' + 'a') : ch;
}

/* The header's value, trimmed of SP and HT, when the line is "name:value" (name's case aside). */
static bool ref_header(const char *s, size_t len, const char *name, const char **ret_v,
		       size_t *ret_vlen)
{
	size_t n = strlen(name), a, b;

	if (len <= n || s[n] != ':')
		return false;
	for (size_t i = 0; i < n; i++)
		if (ascii_lower(s[i]) != ascii_lower(name[i]))
			return false;
	a = n + 1;
	b = len;
	while (a < b && (s[a] == ' ' || s[a] == '\t'))
		a++;
	while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
		b--;
	*ret_v = s + a;
	*ret_vlen = b - a;
	return true;
}

static struct verdict ref_chunked(const char *p, size_t n, size_t off, uint64_t head_len)
{
	uint64_t total = 0, trailer_bytes = head_len;
	size_t i = off;

	for (;;) {
		uint64_t size = 0;
		unsigned digits = 0;
		int h;

		/* the size line: 1-15 hex digits, then LF or CRLF */
		for (;; i++) {
			if (i == n)
				goto partial;
			h = p[i] >= '0' && p[i] <= '9'	 ? p[i] - '0'
			    : p[i] >= 'a' && p[i] <= 'f' ? p[i] - 'a' + 10
			    : p[i] >= 'A' && p[i] <= 'F' ? p[i] - 'A' + 10
							 : -1;
			if (h < 0 || digits == 15)
				break;
			size = size * 16 + (uint64_t)h;
			digits++;
		}
		if (!digits || (p[i] != '\r' && p[i] != '\n'))
			return ref_refuse(400, GW_REJECT_MALFORMED);
		total += size;
		if (total > MAX_BODY)
			return ref_refuse(413, GW_REJECT_BODY_SIZE);
		if (p[i++] == '\r') {
			if (i == n)
				goto partial;
			if (p[i++] != '\n')
				return ref_refuse(400, GW_REJECT_MALFORMED);
		}
		if (!size)
			break;
		/* the data, then LF or CRLF */
		if (n - i <= size)
			goto partial;
		i += size;
		if (p[i] == '\r') {
			if (++i == n)
				goto partial;
		}
		if (p[i++] != '\n')
			return ref_refuse(400, GW_REJECT_MALFORMED);
	}
	/* trailer lines up to an empty one (CRs aside), counted with the head */
	for (bool empty = true;; i++) {
		if (i == n)
			goto partial;
		if (++trailer_bytes > MAX_HEADER)
			return ref_refuse(431, GW_REJECT_HEADER_SIZE);
		if (p[i] == '\n') {
			if (empty)
				return (struct verdict){.state = GW_FRAME_DONE,
							.consumed = i + 1,
							.head_len = head_len};
			empty = true;
		} else if (p[i] != '\r') {
			empty = false;
		}
	}
partial:
	return (struct verdict){.state = GW_FRAME_BODY, .consumed = n, .head_len = head_len};
}

static struct verdict ref_read(const char *p, size_t n)
{
	bool seen_request = false, bad_clen = false, bad_te = false, chunked = false;
	int64_t clen = -1;
	size_t off = 0;

	for (;;) {
		const char *lf = memchr(p + off, '\n', n - off);
		size_t end = lf ? (size_t)(lf - p) : n, len = end - off;
		const char *s = p + off, *v;
		size_t vlen;
		int code;

		if ((lf ? end + 1 : n) > MAX_HEADER)
			return ref_refuse(431, GW_REJECT_HEADER_SIZE);
		if (!lf)
			return (struct verdict){.state = GW_FRAME_HEAD, .consumed = n};
		off = end + 1;
		if (len && s[len - 1] == '\r')
			len--;
		if (!seen_request) {
			if (len && !ref_request_line(s, len, &code))
				return ref_refuse(code, GW_REJECT_MALFORMED);
			seen_request = len > 0;
			continue;
		}
		if (len == 0)
			break;
		if (ref_header(s, len, "Content-Length", &v, &vlen)) {
			int64_t x = 0;

			if (!vlen || vlen > 18)
				bad_clen = true;
			for (size_t i = 0; i < vlen && !bad_clen; i++) {
				if (v[i] < '0' || v[i] > '9')
					bad_clen = true;
				else
					x = x * 10 + (v[i] - '0');
			}
			if (!bad_clen && clen >= 0 && clen != x)
				bad_clen = true;
			if (!bad_clen)
				clen = x;
		} else if (ref_header(s, len, "Transfer-Encoding", &v, &vlen)) {
			if (chunked || vlen != 7 || strncasecmp(v, "chunked", 7) != 0)
				bad_te = true;
			chunked = true;
		}
	}
	/* the head's end */
	if (bad_te)
		return ref_refuse(501, GW_REJECT_MALFORMED);
	if (bad_clen)
		return ref_refuse(400, GW_REJECT_MALFORMED);
	if (chunked && clen >= 0)
		return ref_refuse(400, GW_REJECT_MALFORMED);
	if (clen > MAX_BODY)
		return ref_refuse(413, GW_REJECT_BODY_SIZE);
	if (chunked)
		return ref_chunked(p, n, off, off);
	if (clen <= 0 || n - off >= (uint64_t)clen)
		return (struct verdict){.state = GW_FRAME_DONE,
					.consumed = off + (uint64_t)MAX(clen, 0),
					.head_len = off};
	return (struct verdict){.state = GW_FRAME_BODY, .consumed = n, .head_len = off};
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t one = 1;
	const uint8_t *lens;
	const char *p;
	struct verdict whole, bytes, pieces, ref;
	size_t k, n;

	if (size < 1)
		return 0;
	k = data[0] & 7;
	if (size < 1 + k)
		return 0;
	lens = data + 1;
	p = (const char *)data + 1 + k;
	n = size - 1 - k;

	whole = feed(p, n, NULL, 0, 0);
	bytes = feed(p, n, &one, 1, 0);
	pieces = feed(p, n, lens, k, k ? MIN((size_t)lens[0], n) : 0);
	verdict_check_same(&whole, &bytes);
	verdict_check_same(&whole, &pieces);
	ref = ref_read(p, n);
	verdict_check_same(&whole, &ref);
	return 0;
}
