/* SPDX-License-Identifier: MIT */
/*
 * belayerctl env exec|read|write (issue 20 items 2, 3):
 *   env exec ID [--cwd DIR] [--env K=V]... [--user U] [--timeout S] [--stdin FILE]
 *            [--max-output BYTES] [--stream] -- CMD [ARG]...
 *       runs CMD in the environment; its stdout and stderr come out on ours; belayerctl exits
 *       with its status (128 + N when killed by signal N, 124 when it timed out). --json: one
 *       object with the output, the status, truncation flags and the wall time.
 *   env read ID PATH [--max BYTES]        the file's content on stdout (--json: and its mode)
 *   env write ID PATH [--mode OCTAL] [--user U] < DATA
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "belayerctl.h"
#include "util.h"

/* The supervisor answers an exec when it ends: wait for its timeout and a margin. */
#define EXEC_MARGIN_MS 30000

static int write_all(int fd, const void *p, size_t n)
{
	for (const char *q = p; n > 0;) {
		ssize_t k = write(fd, q, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		q += k;
		n -= (size_t)k;
	}
	return 0;
}

/* fd's bytes (a pipe or terminal too) in a memfd, the form the supervisor takes. */
static int to_memfd(int fd)
{
	_cleanup_close_ int m = memfd_create("belayerctl", MFD_CLOEXEC);
	char buf[1 << 16];
	struct stat st;
	ssize_t n;

	if (m < 0)
		return -errno;
	if (fd < 0)
		goto done;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		n = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		return n < 0 ? -errno : (int)n;
	}
	while ((n = read(fd, buf, sizeof(buf))) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || write_all(m, buf, (size_t)n) < 0)
			return -errno;
	}
done:
	n = m;
	m = -1;
	return (int)n;
}

/* NUL-separated strings for a FIELD_STRV. */
struct strv {
	char buf[PROTO_EXEC_ARGV_MAX];
	uint32_t len, count;
};

static int strv_add(struct strv *v, const char *s, size_t cap)
{
	size_t n = strlen(s) + 1;

	if (n > cap - v->len || n > sizeof(v->buf) - v->len || v->count >= 256)
		return -E2BIG;
	memcpy(v->buf + v->len, s, n);
	v->len += (uint32_t)n;
	v->count++;
	return 0;
}

/* Connects and sends m: the socket, or -1 (said on stderr). */
static int send_request(const struct ctl_options *ro, const struct proto_msg *m)
{
	int sock = ctl_connect(ro), r;

	if (sock < 0)
		return -1;
	r = proto_send(sock, m, 0);
	if (r < 0) {
		fprintf(stderr, "belayerctl: send failed: %s\n", strerror(-r));
		(void)close(sock);
		return -1;
	}
	return sock;
}

static json_object *json_bytes(const char *p, size_t n)
{
	return json_object_new_string_len(p, (int)n);
}

static int do_exec(const struct ctl_options *o, int argc, char **argv)
{
	static const struct option options[] = {
		{"cwd", required_argument, NULL, 'd'},
		{"env", required_argument, NULL, 'e'},
		{"user", required_argument, NULL, 'u'},
		{"timeout", required_argument, NULL, 't'},
		{"stdin", required_argument, NULL, 'i'},
		{"max-output", required_argument, NULL, 'm'},
		{"stream", no_argument, NULL, 's'},
		{"json", no_argument, NULL, 'j'},
		{},
	};
	static struct strv args, envs;
	struct proto_msg m = {.type = PROTO_ENV_EXEC};
	struct proto_env_exec *q = &m.env_exec;
	struct ctl_options ro = *o;
	_cleanup_close_ int sock = -1, in = -1;
	char *out[2] = {NULL, NULL};
	size_t len[2] = {0, 0};
	const char *stdin_path = NULL;
	uint64_t v;
	int c, r = 0;

	/* exec ID [OPTION]... [--] CMD...: the options stop at the command ("+"). */
	if (argc < 2 || copy_arg(q->env, sizeof(q->env), argv[1], "ID") < 0)
		return fprintf(stderr, "belayerctl: env exec: missing ID\n"), 2;
	argc--;
	argv++;
	optind = 0;
	while ((c = getopt_long(argc, argv, "+", options, NULL)) >= 0) {
		switch (c) {
		case 'd':
			r = copy_arg(q->cwd, sizeof(q->cwd), optarg, "--cwd");
			break;
		case 'e':
			r = strchr(optarg, '=') && optarg[0] != '='
				    ? strv_add(&envs, optarg, PROTO_EXEC_ENVV_MAX)
				    : -EINVAL;
			break;
		case 'u':
			r = copy_arg(q->user, sizeof(q->user), optarg, "--user");
			break;
		case 't':
			r = parse_u64(optarg, &v);
			if (r >= 0 && (v == 0 || v > 24 * 3600))
				r = -EINVAL;
			q->timeout_ms = (uint32_t)(v * 1000);
			break;
		case 'i':
			stdin_path = optarg;
			break;
		case 'm':
			r = parse_u64(optarg, &v);
			if (r >= 0 && (v == 0 || v > UINT32_MAX))
				r = -EINVAL;
			q->max_output = (uint32_t)v;
			break;
		case 's':
			q->flags |= EXEC_FLAG_STREAM;
			break;
		case 'j':
			break;
		default:
			return 2;
		}
		if (r < 0) {
			fprintf(stderr, "belayerctl: bad value for an option of env exec\n");
			return 2;
		}
	}
	if (optind >= argc)
		return fprintf(stderr, "belayerctl: env exec %s: missing the command\n", q->env), 2;
	for (; optind < argc; optind++)
		if (strv_add(&args, argv[optind], PROTO_EXEC_ARGV_MAX) < 0)
			return fprintf(stderr, "belayerctl: env exec: command too long\n"), 2;
	q->argv = (struct proto_blob){args.buf, args.len, args.count};
	q->envv = (struct proto_blob){envs.buf, envs.len, envs.count};
	if (stdin_path) {
		_cleanup_close_ int f = strcmp(stdin_path, "-") == 0
						? dup(0)
						: open(stdin_path, O_RDONLY | O_CLOEXEC);

		if (f < 0)
			return fprintf(stderr, "belayerctl: %s: %m\n", stdin_path), -1;
		in = to_memfd(f);
	} else
		in = to_memfd(-1);
	if (in < 0)
		return fprintf(stderr, "belayerctl: stdin: %s\n", strerror(-in)), -1;
	q->fd = in;
	ro.timeout_ms = (int)((q->timeout_ms ? q->timeout_ms : 60000) + EXEC_MARGIN_MS);
	sock = send_request(&ro, &m);
	if (sock < 0)
		return -1;
	for (;;) {
		struct proto_msg a;

		r = ctl_recv(sock, &ro, &a);
		if (r < 0)
			return -1;
		if (a.type == PROTO_ENV_EXEC_OUT) {
			int i = (int)a.exec_out.stream - 1;

			if (o->json) {
				char *n = realloc(out[i], len[i] + a.exec_out.data.len);

				if (!n)
					return -1;
				memcpy(n + len[i], a.exec_out.data.data, a.exec_out.data.len);
				out[i] = n;
				len[i] += a.exec_out.data.len;
			} else
				(void)write_all(i + 1, a.exec_out.data.data, a.exec_out.data.len);
			proto_msg_finish(&a);
			continue;
		}
		if (a.type != PROTO_ENV_EXEC_DONE) {
			proto_msg_finish(&a);
			continue;
		}
		{
			const struct proto_env_exec_done *d = &a.exec_done;
			int status = d->timed_out ? 124
				     : d->signal  ? 128 + (int)d->signal
						  : d->exit_code;

			if (o->json) {
				json_object *j = json_object_new_object();

				json_object_object_add(j, "exit_code",
						       json_object_new_int(d->exit_code));
				json_object_object_add(j, "signal",
						       json_object_new_int((int)d->signal));
				json_object_object_add(j, "timed_out",
						       json_object_new_boolean(d->timed_out));
				json_object_object_add(j, "stdout", json_bytes(out[0], len[0]));
				json_object_object_add(j, "stderr", json_bytes(out[1], len[1]));
				json_object_object_add(j, "stdout_truncated",
						       json_object_new_boolean(d->truncated & 1));
				json_object_object_add(j, "stderr_truncated",
						       json_object_new_boolean(d->truncated & 2));
				json_object_object_add(j, "stdout_bytes", json_u64(d->out_bytes));
				json_object_object_add(j, "stderr_bytes", json_u64(d->err_bytes));
				json_object_object_add(j, "wall_us", json_u64(d->wall_us));
				json_object_object_add(j, "pid", json_u64(d->pid));
				json_print(j, true);
				status = 0;
			} else if (d->timed_out || d->truncated)
				fprintf(stderr, "belayerctl: %s%s%s\n",
					d->timed_out ? "timed out, process group killed" : "",
					d->timed_out && d->truncated ? "; " : "",
					d->truncated ? "output truncated" : "");
			fflush(stdout);
			free(out[0]);
			free(out[1]);
			exit(status);
		}
	}
}

static int do_file(const struct ctl_options *o, bool write, int argc, char **argv)
{
	static const struct option options[] = {
		{"max", required_argument, NULL, 'm'},
		{"mode", required_argument, NULL, 'M'},
		{"user", required_argument, NULL, 'u'},
		{"json", no_argument, NULL, 'j'},
		{},
	};
	struct proto_msg m = {.type = write ? PROTO_ENV_FILE_WRITE : PROTO_ENV_FILE_READ};
	struct proto_env_file *q = &m.env_file;
	struct ctl_options ro = *o;
	_cleanup_close_ int sock = -1, data = -1;
	struct proto_msg a;
	char *end;
	int c, r = 0;

	optind = 0;
	while ((c = getopt_long(argc, argv, "", options, NULL)) >= 0) {
		switch (c) {
		case 'm':
			r = parse_u64(optarg, &q->max);
			break;
		case 'M':
			errno = 0;
			q->mode = (uint32_t)strtoul(optarg, &end, 8);
			r = errno || *end || q->mode > 07777 ? -EINVAL : 0;
			break;
		case 'u':
			r = copy_arg(q->user, sizeof(q->user), optarg, "--user");
			break;
		case 'j':
			break;
		default:
			return 2;
		}
		if (r < 0)
			return fprintf(stderr, "belayerctl: bad value for an option\n"), 2;
	}
	if (argc - optind != 2 || copy_arg(q->env, sizeof(q->env), argv[optind], "ID") < 0 ||
	    copy_arg(q->path, sizeof(q->path), argv[optind + 1], "PATH") < 0)
		return fprintf(stderr, "belayerctl: env %s ID PATH\n", write ? "write" : "read"), 2;
	if (write) {
		data = to_memfd(0);
		if (data < 0)
			return fprintf(stderr, "belayerctl: stdin: %s\n", strerror(-data)), -1;
		q->fd = data;
	}
	ro.timeout_ms = 120000;
	sock = send_request(&ro, &m);
	if (sock < 0)
		return -1;
	r = ctl_recv(sock, &ro, &a);
	if (r < 0)
		return -1;
	if (write) {
		if (o->json) {
			json_object *j = json_object_new_object();

			json_object_object_add(j, "bytes", json_u64(a.end.count));
			json_print(j, true);
		}
		return 0;
	}
	if (a.type != PROTO_ENV_FILE_DATA)
		return proto_msg_finish(&a), -1;
	if (o->json) {
		json_object *j = json_object_new_object();
		char *buf = malloc(a.env_file.size + 1);

		if (!buf ||
		    pread(a.env_file.fd, buf, a.env_file.size, 0) != (ssize_t)a.env_file.size)
			return proto_msg_finish(&a), -1;
		json_object_object_add(j, "path", json_object_new_string(a.env_file.path));
		json_object_object_add(j, "size", json_u64(a.env_file.size));
		json_object_object_add(j, "mode", json_u64(a.env_file.mode));
		json_object_object_add(j, "uid", json_u64(a.env_file.uid));
		json_object_object_add(j, "gid", json_u64(a.env_file.gid));
		json_object_object_add(j, "content", json_bytes(buf, a.env_file.size));
		json_print(j, true);
		free(buf);
	} else {
		char buf[1 << 16];
		ssize_t n;

		for (off_t off = 0; (n = pread(a.env_file.fd, buf, sizeof(buf), off)) > 0; off += n)
			if (write_all(1, buf, (size_t)n) < 0)
				break;
	}
	proto_msg_finish(&a);
	return 0;
}

int cmd_env_exec(const struct ctl_options *o, int argc, char **argv)
{
	if (strcmp(argv[0], "exec") == 0)
		return do_exec(o, argc, argv);
	return do_file(o, strcmp(argv[0], "write") == 0, argc, argv);
}
