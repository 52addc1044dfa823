/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "belayerctl.h"
#include "log.h"
#include "util.h"

int ctl_connect(const struct ctl_options *o)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	_cleanup_close_ int fd = -1;

	if (strlen(o->socket) >= sizeof(sa.sun_path))
		return log_error_errno(-ENAMETOOLONG, "Socket path too long: %s", o->socket);
	memcpy(sa.sun_path, o->socket, strlen(o->socket));
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return log_error_errno(negative_errno(), "socket() failed: %m");
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return log_error_errno(negative_errno(), "Cannot reach the supervisor at %s: %m",
				       o->socket);
	return TAKE_FD(fd);
}

int ctl_request(int sock, enum ctl_cmd cmd, uint32_t pid, enum ctl_action act, int32_t dev,
		uint64_t arg)
{
	struct proto_msg m = {.type = PROTO_CTL};

	m.ctl.cmd = cmd;
	m.ctl.pid = pid;
	m.ctl.act = act;
	m.ctl.dev = dev;
	m.ctl.arg = arg;
	return proto_send(sock, &m, 0);
}

int ctl_recv(int sock, const struct ctl_options *o, struct proto_msg *ret)
{
	struct pollfd p = {.fd = sock, .events = POLLIN};
	int r;

	for (;;) {
		r = poll(&p, 1, o->timeout_ms);
		if (r > 0)
			break;
		if (r == 0)
			return log_error_errno(-ETIMEDOUT,
					       "The supervisor did not answer in time.");
		if (errno != EINTR)
			return negative_errno();
	}
	r = proto_recv(sock, ret, 0);
	if (r == -ECONNRESET)
		return log_error_errno(r, "The supervisor closed the connection.");
	if (r < 0)
		return log_error_errno(r, "Bad reply from the supervisor: %m");
	if (ret->type == PROTO_ERROR) {
		log_error("Refused: %s (%s)", ret->error.message, strerror(ret->error.code));
		return -ret->error.code;
	}
	return 0;
}

int ctl_query(const struct ctl_options *o, enum ctl_cmd cmd, uint32_t pid, enum ctl_action act,
	      int32_t dev, uint64_t arg, int (*cb)(const struct proto_msg *m, void *userdata),
	      void *userdata)
{
	_cleanup_close_ int sock = ctl_connect(o);
	int r;

	if (sock < 0)
		return sock;
	r = ctl_request(sock, cmd, pid, act, dev, arg);
	if (r < 0)
		return log_error_errno(r, "Failed to send the request: %m");
	for (;;) {
		struct proto_msg m;

		r = ctl_recv(sock, o, &m);
		if (r < 0)
			return r;
		if (m.type == PROTO_END) {
			proto_msg_finish(&m);
			return 0;
		}
		r = cb ? cb(&m, userdata) : 0;
		proto_msg_finish(&m);
		if (r < 0)
			return r;
	}
}

void format_uuid(const uint8_t u[PROTO_UUID_LEN], char buf[37])
{
	snprintf(buf, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
		 u[13], u[14], u[15]);
}

void format_bytes(uint64_t b, char *buf, size_t cap)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	size_t u = 0;
	double v = (double)b;

	while (v >= 1024 && u + 1 < ARRAY_SIZE(units)) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, cap, "%" PRIu64 " B", b);
	else
		snprintf(buf, cap, "%.1f %s", v, units[u]);
}

void format_age(uint64_t ms, char *buf, size_t cap)
{
	if (ms < 1000)
		snprintf(buf, cap, "%" PRIu64 "ms", ms);
	else if (ms < 120000)
		snprintf(buf, cap, "%.1fs", (double)ms / 1000);
	else if (ms < 7200000)
		snprintf(buf, cap, "%" PRIu64 "m", ms / 60000);
	else
		snprintf(buf, cap, "%" PRIu64 "h", ms / 3600000);
}

void json_print(json_object *j, bool line)
{
	puts(json_object_to_json_string_ext(j, line ? JSON_C_TO_STRING_PLAIN
						    : JSON_C_TO_STRING_PRETTY |
							       JSON_C_TO_STRING_SPACED));
	fflush(stdout);
	json_object_put(j);
}

json_object *json_u64(uint64_t v)
{
	/* json-c 0.16 has uint64 objects; they print as unsigned. */
	return json_object_new_uint64(v);
}

int parse_u64(const char *s, uint64_t *ret)
{
	char *end;

	errno = 0;
	*ret = strtoull(s, &end, 0);
	return errno || !*s || *end ? -EINVAL : 0;
}

int copy_arg(char *dst, size_t cap, const char *src, const char *what)
{
	if (strlen(src) >= cap) {
		fprintf(stderr, "belayerctl: %s longer than %zu bytes\n", what, cap - 1);
		return -E2BIG;
	}
	memcpy(dst, src, strlen(src) + 1);
	return 0;
}
