/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine-client.h"
#include "util.h"

int client_connect(uint16_t port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int r = -errno;

		close(fd);
		return r;
	}
	return fd;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

int client_send(int fd, const char *method, const char *path, const char *body)
{
	char hdr[512];
	size_t blen = body ? strlen(body) : 0;
	int n, r;

	n = snprintf(hdr, sizeof(hdr),
		     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
		     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
		     method, path, blen);
	if (n < 0 || (size_t)n >= sizeof(hdr))
		return -EINVAL;
	r = write_all(fd, hdr, (size_t)n);
	return r ?: write_all(fd, body ? body : "", blen);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* De-chunks body in place: 0 or -EBADMSG. */
static int dechunk(char *body, size_t len, size_t *ret_len)
{
	size_t in = 0, out = 0;

	for (;;) {
		char *end;
		unsigned long sz;

		if (in >= len)
			return -EBADMSG;
		sz = strtoul(body + in, &end, 16);
		if (end == body + in)
			return -EBADMSG;
		end = strstr(end, "\r\n");
		if (!end)
			return -EBADMSG;
		in = (size_t)(end - body) + 2;
		if (sz == 0)
			break;
		if (sz > len - in || len - in - sz < 2)
			return -EBADMSG;
		memmove(body + out, body + in, sz);
		out += sz;
		in += sz + 2;
	}
	body[out] = '\0';
	*ret_len = out;
	return 0;
}

int client_recv(int fd, int timeout_ms, struct http_response *ret)
{
	int64_t deadline = now_ms() + timeout_ms;
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap + 1), *hend, *body;
	bool chunked = false;
	int r;

	if (!buf)
		return -ENOMEM;
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int64_t left = deadline - now_ms();
		ssize_t k;

		if (left <= 0) {
			free(buf);
			return -ETIMEDOUT;
		}
		r = poll(&p, 1, (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			continue;
		if (len == cap) {
			char *nb;

			if (cap >= CLIENT_BODY_MAX) {
				free(buf);
				return -EFBIG;
			}
			nb = realloc(buf, 2 * cap + 1);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		k = recv(fd, buf + len, cap - len, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			r = -errno;
			free(buf);
			return r;
		}
		if (k == 0)
			break; /* Connection: close ends the response */
		len += (size_t)k;
	}
	buf[len] = '\0';
	hend = strstr(buf, "\r\n\r\n");
	if (!hend || sscanf(buf, "HTTP/1.%*d %d", &ret->status) != 1) {
		free(buf);
		return -EBADMSG;
	}
	*hend = '\0';
	for (char *l = strstr(buf, "\r\n"); l; l = strstr(l + 2, "\r\n"))
		if (strncasecmp(l + 2, "Transfer-Encoding: chunked", 26) == 0)
			chunked = true;
	body = hend + 4;
	ret->len = len - (size_t)(body - buf);
	memmove(buf, body, ret->len + 1);
	ret->body = buf;
	if (chunked && dechunk(buf, ret->len, &ret->len) < 0) {
		free(buf);
		ret->body = NULL;
		return -EBADMSG;
	}
	return 0;
}

int client_request(uint16_t port, const char *method, const char *path, const char *body,
		   int timeout_ms, struct http_response *ret)
{
	int fd = client_connect(port), r;

	if (fd < 0)
		return fd;
	r = client_send(fd, method, path, body);
	r = r ?: client_recv(fd, timeout_ms, ret);
	close(fd);
	return r;
}

void http_response_free(struct http_response *r)
{
	if (!r)
		return;
	free(r->body);
	r->body = NULL;
}

int sse_foreach(const char *body, int (*fn)(const char *data, void *ud), void *ud)
{
	const char *p = body;
	int n = 0;

	while ((p = strstr(p, "data: "))) {
		const char *end = strstr(p, "\n\n");
		char *ev;
		int r;

		if (!end)
			return -EBADMSG;
		ev = strndup(p + 6, (size_t)(end - p - 6));
		if (!ev)
			return -ENOMEM;
		r = fn(ev, ud);
		free(ev);
		if (r)
			return r;
		n++;
		p = end + 2;
	}
	return n;
}
