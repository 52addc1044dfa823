/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench gateway: the gateway's cost under load (issue 18, item 5).
 *
 * The engine stand-in on the emulated GPU behind the supervisor's gateway, and C keep-alive
 * clients on loopback (one epoll loop in this process), each sending K requests one after
 * the other, to the engine directly and through the gateway, for /generate (a short prompt,
 * max_new_tokens tokens, greedy, not streamed) and /health. Per case: throughput (answered
 * requests per second of the case's wall time), p50 and p99 latency (from the request's first
 * byte sent, or its connect, to its response's last byte), errors (non-200 answers and failed
 * connections), the kernel's listen-queue overflows meanwhile (TcpExt ListenOverflows: the
 * whole machine's), and the ratio gateway/direct.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench-measure.h"
#include "bench-recovery.h"
#include "bench.h"
#include "log.h"
#include "util.h"

#define MAX_CLIENTS   4096
#define MAX_CASES     4
#define RBUF	      16384
#define CASE_LIMIT_MS 120000 /* a case still running then counts what is left as errors */
/* /generate runs at the engine's pace (the stand-in's on host kernels: ~100 requests/s,
 * whatever the batch): its clients send fewer, about this many in all. */
#define GENERATE_TOTAL 2000

enum path {
	P_GENERATE,
	P_HEALTH,
	P_COUNT
};
static const char *const path_names[P_COUNT] = {"/generate", "/health"};

struct conn {
	int fd;
	size_t sent, rlen;
	int left; /* requests still to send */
	uint64_t t0;
	char rbuf[RBUF];
};

struct load {
	const char *req;
	size_t req_len;
	uint16_t port;
	int epfd;
	struct conn *c;
	double *lat_ms;
	uint64_t n_lat, errors, open;
};

struct result {
	double rps, p50_ms, p99_ms;
	uint64_t ok, errors, overflows;
};

/* TcpExt ListenOverflows of /proc/net/netstat (0 when unreadable). */
static uint64_t listen_overflows(void)
{
	char names[4096], values[4096];
	uint64_t v = 0;
	FILE *f = fopen("/proc/net/netstat", "re");

	if (!f)
		return 0;
	while (fgets(names, sizeof(names), f) && fgets(values, sizeof(values), f)) {
		char *sn, *sv, *n = strtok_r(names, " \n", &sn), *x = strtok_r(values, " \n", &sv);

		if (!n || strcmp(n, "TcpExt:") != 0)
			continue;
		while ((n = strtok_r(NULL, " \n", &sn)) && (x = strtok_r(NULL, " \n", &sv)))
			if (strcmp(n, "ListenOverflows") == 0)
				v = strtoull(x, NULL, 10);
	}
	fclose(f);
	return v;
}

static int conn_open(struct load *l, struct conn *c)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons(l->port)};
	int one = 1;

	c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return -errno;
	(void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->sent = c->rlen = 0;
	c->t0 = bench_now_ns();
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS)
		return -errno;
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, c->fd,
		      &(struct epoll_event){.events = EPOLLIN | EPOLLOUT, .data.ptr = c}) < 0)
		return -errno;
	l->open++;
	return 0;
}

static void conn_close(struct load *l, struct conn *c)
{
	if (c->fd < 0)
		return;
	(void)epoll_ctl(l->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	l->open--;
}

/* The request failed (connection error, a non-200 answer, or the server closed): counted;
 * the client goes on with its next request on a new connection. */
static void conn_error(struct load *l, struct conn *c)
{
	l->errors++;
	conn_close(l, c);
	if (--c->left > 0 && conn_open(l, c) < 0) {
		l->errors += (uint64_t)c->left;
		c->left = 0;
		conn_close(l, c);
	}
}

static void conn_write(struct load *l, struct conn *c)
{
	while (c->sent < l->req_len) {
		ssize_t k = send(c->fd, l->req + c->sent, l->req_len - c->sent, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			break;
		if (k <= 0) {
			conn_error(l, c);
			return;
		}
		c->sent += (size_t)k;
	}
	(void)epoll_ctl(
		l->epfd, EPOLL_CTL_MOD, c->fd,
		&(struct epoll_event){.events = c->sent < l->req_len ? EPOLLIN | EPOLLOUT : EPOLLIN,
				      .data.ptr = c});
}

/* The length of a whole response at the start of buf, 0: not whole yet, -1: malformed. */
static long response_len(const char *buf, size_t n, int *status, bool *close_after)
{
	const char *end = memmem(buf, n, "\r\n\r\n", 4), *h;
	size_t head;
	long body = 0;

	if (!end)
		return n > RBUF - 1 ? -1 : 0;
	head = (size_t)(end - buf) + 4;
	if (sscanf(buf, "HTTP/1.%*d %d", status) != 1)
		return -1;
	*close_after = false;
	for (h = buf; h < end; h = memchr(h, '\n', (size_t)(end - h)) + 1) {
		if (strncasecmp(h, "Content-Length:", 15) == 0)
			body = strtol(h + 15, NULL, 10);
		else if (strncasecmp(h, "Connection: close", 17) == 0)
			*close_after = true;
		else if (strncasecmp(h, "Transfer-Encoding: chunked", 26) == 0) {
			const char *z = memmem(end, n - (size_t)(end - buf), "\r\n0\r\n\r\n", 7);

			return z ? (long)(z + 7 - buf) : 0;
		}
		if (!memchr(h, '\n', (size_t)(end - h)))
			break;
	}
	return head + (size_t)body <= n ? (long)(head + (size_t)body) : 0;
}

static void conn_read(struct load *l, struct conn *c)
{
	for (;;) {
		ssize_t k = recv(c->fd, c->rbuf + c->rlen, RBUF - 1 - c->rlen, 0);
		bool close_after;
		int status = 0;
		long len;

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			return;
		if (k <= 0) {
			conn_error(l, c);
			return;
		}
		c->rlen += (size_t)k;
		len = response_len(c->rbuf, c->rlen, &status, &close_after);
		if (len < 0 || (len > 0 && status != 200)) {
			conn_error(l, c);
			return;
		}
		if (len == 0)
			continue;
		l->lat_ms[l->n_lat++] = bench_ms_between(c->t0, bench_now_ns());
		memmove(c->rbuf, c->rbuf + len, c->rlen - (size_t)len);
		c->rlen -= (size_t)len;
		if (--c->left == 0) {
			conn_close(l, c);
			return;
		}
		if (close_after) {
			conn_close(l, c);
			if (conn_open(l, c) < 0)
				conn_error(l, c);
			return;
		}
		c->sent = 0;
		c->t0 = bench_now_ns();
		conn_write(l, c);
		return;
	}
}

/* clients keep-alive connections to port, each sending req per_client times. */
static int load_run(uint16_t port, const char *req, int clients, int per_client, struct result *ret)
{
	struct load l = {.req = req, .req_len = strlen(req), .port = port};
	uint64_t t0, ov0 = listen_overflows();
	struct epoll_event ev[256];
	int r = 0;

	*ret = (struct result){0};
	l.epfd = epoll_create1(EPOLL_CLOEXEC);
	l.c = calloc((size_t)clients, sizeof(*l.c));
	l.lat_ms = calloc((size_t)clients * (size_t)per_client, sizeof(*l.lat_ms));
	if (l.epfd < 0 || !l.c || !l.lat_ms) {
		r = -ENOMEM;
		goto out;
	}
	t0 = bench_now_ns();
	for (int i = 0; i < clients; i++) {
		l.c[i] = (struct conn){.fd = -1, .left = per_client};
		if (conn_open(&l, &l.c[i]) < 0) {
			r = log_error_errno(errno, "Failed to connect to port %u: %m", port);
			goto out;
		}
	}
	while (l.open > 0) {
		int n = epoll_wait(l.epfd, ev, ARRAY_SIZE(ev), 1000);

		if (n < 0 && errno != EINTR) {
			r = log_error_errno(errno, "epoll_wait: %m");
			goto out;
		}
		for (int i = 0; i < n; i++) {
			struct conn *c = ev[i].data.ptr;

			if (c->fd < 0)
				continue;
			if (ev[i].events & (EPOLLERR | EPOLLHUP) && !(ev[i].events & EPOLLIN))
				conn_error(&l, c);
			else if (c->sent < l.req_len && ev[i].events & EPOLLOUT)
				conn_write(&l, c);
			else if (ev[i].events & EPOLLIN)
				conn_read(&l, c);
		}
		if (bench_ms_between(t0, bench_now_ns()) > CASE_LIMIT_MS) {
			for (int i = 0; i < clients; i++) {
				l.errors += (uint64_t)l.c[i].left;
				conn_close(&l, &l.c[i]);
			}
			log_warning("A case ran past %d s; its unanswered requests count as "
				    "errors.",
				    CASE_LIMIT_MS / 1000);
		}
	}
	ret->ok = l.n_lat;
	ret->errors = l.errors;
	ret->rps = (double)l.n_lat / (bench_ms_between(t0, bench_now_ns()) / 1000.0);
	if (l.n_lat) {
		qsort(l.lat_ms, l.n_lat, sizeof(*l.lat_ms), bench_cmp_double);
		ret->p50_ms = l.lat_ms[l.n_lat / 2];
		ret->p99_ms = l.lat_ms[MIN(l.n_lat - 1, l.n_lat * 99 / 100)];
	}
	ret->overflows = listen_overflows() - ov0;
out:
	if (l.c)
		for (int i = 0; i < clients; i++)
			conn_close(&l, &l.c[i]);
	if (l.epfd >= 0)
		close(l.epfd);
	free(l.c);
	free(l.lat_ms);
	return r;
}

struct opts {
	int clients[MAX_CASES], n_clients, requests, tokens;
	bool quick, json;
};

struct pair {
	struct result direct, gateway;
};

static int parse_clients(const char *s, struct opts *o)
{
	char *end;

	o->n_clients = 0;
	do {
		long v = strtol(s, &end, 10);

		if (end == s || v < 1 || v > MAX_CLIENTS || o->n_clients == MAX_CASES)
			return -EINVAL;
		o->clients[o->n_clients++] = (int)v;
		s = end + (*end == ',');
	} while (*end == ',');
	return *end ? -EINVAL : 0;
}

static int per_client_generate(const struct opts *o, int clients)
{
	return MAX(MIN(o->requests, GENERATE_TOTAL / clients), MIN(o->requests, 2));
}

/* Until a small /generate through the gateway answers 200 (the engine ready behind it). */
static int wait_serving(uint16_t gport, const char *req)
{
	for (int i = 0; i < 600; i++) {
		struct result w;

		if (load_run(gport, req, 1, 1, &w) == 0 && w.ok == 1)
			return 0;
		(void)usleep(100000);
	}
	return log_error_errno(ETIMEDOUT, "The engine did not serve through the gateway");
}

static void print_row(int clients, const char *path, const char *via, const struct result *x)
{
	printf("%7d  %-9s  %-7s  %9.0f  %8.2f  %8.2f  %6" PRIu64 "  %9" PRIu64 "\n", clients, path,
	       via, x->rps, x->p50_ms, x->p99_ms, x->errors, x->overflows);
}

static void print_json_result(const char *name, const struct result *x)
{
	printf("\"%s\":{\"rps\":%.1f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"ok\":%" PRIu64
	       ",\"errors\":%" PRIu64 ",\"listen_overflows\":%" PRIu64 "}",
	       name, x->rps, x->p50_ms, x->p99_ms, x->ok, x->errors, x->overflows);
}

int bench_gateway(const struct bench_args *a, int argc, char **argv)
{
	static const struct option options[] = {{"json", no_argument, NULL, 'j'},
						{"quick", no_argument, NULL, 'q'},
						{"clients", required_argument, NULL, 'c'},
						{"requests", required_argument, NULL, 'n'},
						{"tokens", required_argument, NULL, 't'},
						{"help", no_argument, NULL, 'h'},
						{}};
	struct opts o = {.clients = {64, 1000},
			 .n_clients = 2,
			 .requests = 200,
			 .tokens = 4,
			 .json = a->json};
	struct pair res[MAX_CASES][P_COUNT] = {};
	char wfile[4200], dir[] = "/tmp/belayer-bench-gateway.XXXXXX", config[8400];
	char body[256], gen[512];
	const char *reqs[P_COUNT] = {gen, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"};
	struct rec_paths p = {};
	struct rec_world w = {.sup_pid = -1, .sup_pidfd = -1};
	struct rlimit rl;
	uint16_t port, gport;
	uint64_t errors = 0;
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jqc:n:t:h", options, NULL)) >= 0)
		switch (c) {
		case 'j':
			o.json = true;
			break;
		case 'q':
			o.quick = true;
			o.clients[0] = 16;
			o.n_clients = 1;
			o.requests = 10;
			break;
		case 'c':
			if (parse_clients(optarg, &o) < 0)
				return log_error_errno(EINVAL,
						       "--clients: N[,N...], 1..%d, at "
						       "most %d",
						       MAX_CLIENTS, MAX_CASES);
			break;
		case 'n':
			o.requests = atoi(optarg);
			break;
		case 't':
			o.tokens = atoi(optarg);
			break;
		case 'h':
			printf("Usage: belayer-bench gateway [--json] [--quick] [--clients "
			       "N[,N...]] "
			       "[--requests K] [--tokens N]\n");
			return 0;
		default:
			return -EINVAL;
		}
	if (o.requests < 1 || o.requests > 100000 || o.tokens < 1 || o.tokens > 256)
		return log_error_errno(EINVAL, "--requests 1..100000, --tokens 1..256");
	/* a thousand clients: their sockets here, the gateway's and the engine's */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	snprintf(body, sizeof(body),
		 "{\"input_ids\":[1,2,3,4,5,6,7,8],\"sampling_params\":{\"max_new_tokens\":%d,"
		 "\"temperature\":0}}",
		 o.tokens);
	snprintf(gen, sizeof(gen),
		 "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
		 "Content-Length: %zu\r\n\r\n%s",
		 strlen(body), body);
	rec_paths_init(&p, a, BENCH_BUILD_ROOT);
	(void)rec_guard_install();
	if (!mkdtemp(dir))
		return log_error_errno(errno, "mkdtemp: %m");
	rec_guard_dir(dir);
	snprintf(wfile, sizeof(wfile), "%s/w.safetensors", dir);
	r = rec_gen_weights(&p, wfile, 8u << 20, 1);
	r = r ?: rec_free_port(&port);
	r = r ?: rec_free_port(&gport);
	if (r < 0)
		goto out;
	snprintf(config, sizeof(config),
		 "[engine.bench]\n"
		 "primary = %s --model %s --port {port} --kv-cache-bytes 64M\n"
		 "env = LD_PRELOAD=%s\n"
		 "port = %u\n"
		 "gateway_listen = 127.0.0.1:%u\n",
		 p.engine, wfile, p.shim, port, gport);
	r = rec_world_open(&w, &p, 1, 8u << 20, config);
	r = r ?: rec_wait_port(gport, 60000);
	r = r ?: wait_serving(gport, gen);
	if (r < 0)
		goto out;
	for (int i = 0; i < o.n_clients; i++)
		for (int k = 0; k < P_COUNT; k++) {
			struct pair *x = &res[i][k];

			int n = k == P_GENERATE ? per_client_generate(&o, o.clients[i])
						: o.requests;

			/* direct first, then the gateway: the same engine, warmed alike */
			r = load_run(port, reqs[k], o.clients[i], n, &x->direct);
			r = r ?: load_run(gport, reqs[k], o.clients[i], n, &x->gateway);
			if (r < 0)
				goto out;
			errors += x->direct.errors + x->gateway.errors;
		}
	if (o.json) {
		printf("{\"requests_per_client\":%d,\"generate_total_max\":%d,\"new_tokens\":%d,"
		       "\"cases\":[",
		       o.requests, GENERATE_TOTAL, o.tokens);
		for (int i = 0; i < o.n_clients; i++)
			for (int k = 0; k < P_COUNT; k++) {
				const struct pair *x = &res[i][k];

				printf("%s{\"clients\":%d,\"path\":\"%s\",\"requests_per_client\":%"
				       "d,",
				       i || k ? "," : "", o.clients[i], path_names[k],
				       k == P_GENERATE ? per_client_generate(&o, o.clients[i])
						       : o.requests);
				print_json_result("direct", &x->direct);
				printf(",");
				print_json_result("gateway", &x->gateway);
				printf(",\"rps_ratio\":%.3f,\"added_p50_ms\":%.3f}",
				       x->direct.rps > 0 ? x->gateway.rps / x->direct.rps : 0,
				       x->gateway.p50_ms - x->direct.p50_ms);
			}
		printf("]}\n");
	} else {
		printf("gateway: keep-alive clients on loopback, each sending its requests one at "
		       "a "
		       "time: %d to /health, as many to /generate but %d in all at most "
		       "(8-token prompt, %d new tokens, not streamed)\n\n",
		       o.requests, GENERATE_TOTAL, o.tokens);
		printf("%7s  %-9s  %-7s  %9s  %8s  %8s  %6s  %9s\n", "clients", "path", "via",
		       "req/s", "p50 ms", "p99 ms", "errors", "overflows");
		for (int i = 0; i < o.n_clients; i++)
			for (int k = 0; k < P_COUNT; k++) {
				const struct pair *x = &res[i][k];

				print_row(o.clients[i], path_names[k], "direct", &x->direct);
				print_row(o.clients[i], path_names[k], "gateway", &x->gateway);
				printf("%7s  %-9s  %-7s  %8.2fx  %+8.2f\n", "", "", "ratio",
				       x->direct.rps > 0 ? x->gateway.rps / x->direct.rps : 0,
				       x->gateway.p50_ms - x->direct.p50_ms);
			}
		printf("\noverflows: the machine's listen-queue overflows during the case "
		       "(TcpExt ListenOverflows)\n");
	}
	if (errors)
		r = log_error_errno(EPROTO, "%" PRIu64 " requests failed", errors);
out:
	rec_world_close(&w);
	(void)unlink(wfile);
	(void)rmdir(dir);
	return r < 0 ? r : 0;
}
