/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <systemd/sd-daemon.h>

#include "log.h"
#include "supervisor-client.h"
#include "supervisor-handler.h"
#include "supervisor-journal.h"
#include "supervisor-offload.h"
#include "supervisor-server.h"
#include "supervisor-subsystem.h"

#define ACCEPT_BURST 64
#define READ_BURST   32

struct client_events {
	struct event *rd, *wr;
};

static struct event_base *base;
static int listen_fd = -1;
static char last_status[256];

static void client_close(struct supervisor *s, struct sv_client *c)
{
	struct client_events *ce = c->ev;

	if (ce) {
		if (ce->rd)
			event_free(ce->rd);
		if (ce->wr)
			event_free(ce->wr);
		free(ce);
		c->ev = NULL;
	}
	client_free(s, c);
}

/* Closes every connection marked closing (by its own callback, or by an event fan-out). */
static void sweep(struct supervisor *s)
{
	for (struct sv_client *c = s->clients, *next; c; c = next) {
		next = c->next;
		if (c->closing)
			client_close(s, c);
	}
}

/* The supervisor is a singleton per process; callbacks get the client, this gets the rest. */
static struct supervisor *the;

static void on_client(evutil_socket_t fd, short what, void *arg)
{
	struct sv_client *c = arg;
	struct client_events *ce = c->ev;
	int r = 0;

	(void)fd;
	if (what & EV_WRITE) {
		r = client_flush(the, c);
		if (r == 0 && !c->outq)
			event_del(ce->wr);
	}
	if (r == 0 && (what & EV_READ))
		for (int i = 0; i < READ_BURST && !c->closing; i++) {
			r = handler_read(the, c);
			if (r == -EAGAIN) {
				r = 0;
				break;
			}
			if (r < 0)
				break;
		}
	if (r < 0)
		c->closing = true;
	sweep(the);
}

static void want_write(struct supervisor *s, struct sv_client *c)
{
	struct client_events *ce = c->ev;

	(void)s;
	if (ce && ce->wr && !event_pending(ce->wr, EV_WRITE, NULL))
		event_add(ce->wr, NULL);
}

static void on_pidfd(evutil_socket_t fd, short what, void *arg)
{
	struct sv_worker *w = arg;

	(void)fd;
	(void)what;
	SUBSYSTEMS_FOREACH (the, it)
		if ((*it)->worker_died)
			(*it)->worker_died(the, w);
	sweep(the);
}

static int watch_worker(struct supervisor *s, struct sv_worker *w)
{
	struct event *ev = event_new(base, w->pidfd, EV_READ, on_pidfd, w);

	(void)s;
	if (!ev || event_add(ev, NULL) < 0) {
		if (ev)
			event_free(ev);
		return log_warning_errno(-ENOMEM, "Failed to watch pid %d, ignoring.", w->pid);
	}
	w->watch = ev;
	return 0;
}

static void unwatch_worker(struct supervisor *s, struct sv_worker *w)
{
	(void)s;
	if (w->watch)
		event_free(w->watch);
	w->watch = NULL;
}

/* Modules' fds and timers on the loop (sv_hooks.watch_fd, sv_hooks.every), freed at exit
 * before the modules close the fds. */
#define MAX_WATCHES 16
static struct event *ev_watches[MAX_WATCHES];
static void (*watch_cb[MAX_WATCHES])(struct supervisor *s);

static void on_watch(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	watch_cb[(uintptr_t)arg](the);
	sweep(the);
}

/* fd readable (tv NULL) or a timer (fd -1) calls cb until the loop ends. */
static int watch_add(int fd, const struct timeval *tv, void (*cb)(struct supervisor *s))
{
	uintptr_t i;

	for (i = 0; i < MAX_WATCHES && ev_watches[i]; i++)
		;
	if (i == MAX_WATCHES)
		return -ENOSPC;
	ev_watches[i] = event_new(base, fd, fd >= 0 ? EV_READ | EV_PERSIST : EV_PERSIST, on_watch,
				  (void *)i);
	if (!ev_watches[i] || event_add(ev_watches[i], tv) < 0) {
		if (ev_watches[i])
			event_free(ev_watches[i]);
		ev_watches[i] = NULL;
		return -ENOMEM;
	}
	watch_cb[i] = cb;
	return 0;
}

static int watch_fd(struct supervisor *s, int fd, void (*cb)(struct supervisor *s))
{
	(void)s;
	return watch_add(fd, NULL, cb);
}

static int every(struct supervisor *s, uint64_t interval_us, void (*cb)(struct supervisor *s))
{
	struct timeval tv = {.tv_sec = (time_t)(interval_us / 1000000),
			     .tv_usec = (suseconds_t)(interval_us % 1000000)};

	(void)s;
	return watch_add(-1, &tv, cb);
}

static const struct sv_hooks hooks = {
	.want_write = want_write,
	.watch_worker = watch_worker,
	.unwatch_worker = unwatch_worker,
	.watch_fd = watch_fd,
	.every = every,
};

static void on_accept(evutil_socket_t fd, short what, void *arg)
{
	struct supervisor *s = arg;

	(void)what;
	for (int i = 0; i < ACCEPT_BURST; i++) {
		struct client_events *ce;
		struct sv_client *c;
		int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (cfd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warning_errno(negative_errno(), "accept failed: %m, ignoring.");
			break;
		}
		c = client_new(s, cfd);
		if (!c)
			continue;
		ce = calloc(1, sizeof(*ce));
		c->ev = ce;
		if (ce) {
			ce->rd = event_new(base, cfd, EV_READ | EV_PERSIST, on_client, c);
			ce->wr = event_new(base, cfd, EV_WRITE | EV_PERSIST, on_client, c);
		}
		if (!ce || !ce->rd || !ce->wr || event_add(ce->rd, NULL) < 0) {
			client_close(s, c);
			continue;
		}
	}
}

static void update_status(struct supervisor *s)
{
	uint64_t n, bytes, workers = 0;
	char status[256];

	for (struct sv_worker *w = s->reg.workers; w; w = w->next)
		workers += w->state != WORKER_DEAD;
	registry_totals(&s->reg, REGION_RETAINED, &n, &bytes);
	snprintf(status, sizeof(status),
		 "STATUS=%" PRIu64 " live workers, %" PRIu64 " regions retained (%" PRIu64 " MiB)",
		 workers, n, bytes >> 20);
	if (strcmp(status, last_status) != 0) {
		(void)sd_notify(0, status);
		memcpy(last_status, status, sizeof(status));
	}
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct supervisor *s = arg;

	(void)fd;
	(void)what;
	SUBSYSTEMS_FOREACH (s, it)
		if ((*it)->tick)
			(*it)->tick(s);
	update_status(s);
	sweep(s);
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	(void)sd_notify(0, "WATCHDOG=1");
}

static void on_offload(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	offload_complete(arg);
	sweep(arg);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	(void)what;
	(void)arg;
	if (sig == SIGHUP) {
		log_info("SIGHUP: configuration is read at start only; restart to apply changes.");
		return;
	}
	log_info("Signal %d: exiting.", (int)sig);
	(void)sd_notify(0, "STOPPING=1");
	event_base_loopbreak(base);
}

static bool address_is_loopback(const char *addr)
{
	struct in_addr a4;
	struct in6_addr a6;

	if (inet_pton(AF_INET, addr, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, addr, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6);
	return false;
}

static void on_http(struct evhttp_request *req, void *arg)
{
	struct supervisor *s = arg;
	const char *uri = evhttp_request_get_uri(req);
	struct evbuffer *out;
	char *text = NULL;
	size_t len = 0;
	FILE *f;

	if (evhttp_request_get_command(req) != EVHTTP_REQ_GET ||
	    (strcmp(uri, "/metrics") != 0 && strncmp(uri, "/metrics?", 9) != 0)) {
		evhttp_send_error(req, HTTP_NOTFOUND, "only GET /metrics");
		return;
	}
	f = open_memstream(&text, &len);
	if (!f) {
		evhttp_send_error(req, HTTP_INTERNAL, NULL);
		return;
	}
	metrics_write_prometheus(s, f);
	(void)fclose(f);
	out = evbuffer_new();
	if (out)
		evbuffer_add(out, text, len);
	free(text);
	if (!out) {
		evhttp_send_error(req, HTTP_INTERNAL, NULL);
		return;
	}
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  "text/plain; version=0.0.4");
	evhttp_send_reply(req, HTTP_OK, "OK", out);
	evbuffer_free(out);
}

static int http_start(struct supervisor *s, struct evhttp **ret)
{
	struct evhttp *http;

	*ret = NULL;
	if (s->config.http_port == 0)
		return 0;
	/* Metrics reveal what runs on the node: never beyond the node itself. */
	if (!address_is_loopback(s->config.http_address))
		return log_error_errno(-EADDRNOTAVAIL,
				       "[metrics] http_address=%s is not a loopback address.",
				       s->config.http_address);
	http = evhttp_new(base);
	if (!http)
		return -ENOMEM;
	evhttp_set_allowed_methods(http, EVHTTP_REQ_GET);
	evhttp_set_gencb(http, on_http, s);
	if (!evhttp_bind_socket_with_handle(http, s->config.http_address,
					    (uint16_t)s->config.http_port)) {
		evhttp_free(http);
		return log_error_errno(-EADDRINUSE, "Failed to listen on %s:%u for metrics.",
				       s->config.http_address, s->config.http_port);
	}
	log_info("Prometheus metrics on http://%s:%u/metrics", s->config.http_address,
		 s->config.http_port);
	*ret = http;
	return 0;
}

static int mkdir_parent(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *slash;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = '\0';
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return log_error_errno(negative_errno(), "Failed to create %s: %m", dir);
	return 0;
}

static int listen_socket(struct supervisor *s)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	const char *path = s->config.socket;
	_cleanup_close_ int fd = -1;
	gid_t gid = (gid_t)-1;
	int r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return log_error_errno(-ENAMETOOLONG, "Socket path too long: %s", path);
	memcpy(sa.sun_path, path, strlen(path));
	if (s->config.socket_group[0]) {
		struct group *gr = getgrnam(s->config.socket_group);

		if (!gr)
			return log_error_errno(-ENOENT, "No group %s for the socket.",
					       s->config.socket_group);
		gid = gr->gr_gid;
	}
	r = mkdir_parent(path);
	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return log_error_errno(negative_errno(), "socket() failed: %m");
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int probe;

		if (errno != EADDRINUSE)
			return log_error_errno(negative_errno(), "Failed to bind %s: %m", path);
		/* A socket file from a previous run: stale unless someone still listens. */
		probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			(void)safe_close(probe);
			return log_error_errno(-EADDRINUSE,
					       "Another supervisor listens on %s already.", path);
		}
		(void)safe_close(probe);
		(void)unlink(path);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			return log_error_errno(negative_errno(), "Failed to bind %s: %m", path);
	}
	if (chmod(path, (mode_t)s->config.socket_mode) < 0)
		return log_error_errno(negative_errno(), "Failed to chmod %s: %m", path);
	if (gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) < 0)
		return log_error_errno(negative_errno(), "Failed to chown %s: %m", path);
	if (listen(fd, SOMAXCONN) < 0)
		return log_error_errno(negative_errno(), "listen() failed: %m");
	return TAKE_FD(fd);
}

/* The journal's records, to every subsystem that keeps some. */
static int replay_record(void *userdata, const struct journal_record *rec)
{
	struct supervisor *s = userdata;

	SUBSYSTEMS_FOREACH (s, it)
		if ((*it)->journal_record) {
			int r = (*it)->journal_record(s, rec);

			if (r < 0)
				return r;
		}
	return 0;
}

/* At exit, after the offload thread stopped: the connections, then the subsystems (the last
 * started first), then what is left of the registry. */
static void teardown(struct supervisor *s)
{
	size_t n = 0;

	while (s->clients)
		client_close(s, s->clients);
	SUBSYSTEMS_FOREACH (s, it)
		n++;
	while (n--)
		if (s->subsystems[n]->finish)
			s->subsystems[n]->finish(s);
	for (struct sv_worker *w = s->reg.workers; w; w = w->next)
		unwatch_worker(s, w);
	registry_finish(&s->reg);
}

int server_run(struct supervisor *s)
{
	struct event *ev_listen = NULL, *ev_tick = NULL, *ev_wd = NULL, *ev_off = NULL,
		     *ev_sig[4] = {NULL};
	static const int sigs[4] = {SIGTERM, SIGINT, SIGHUP, 0};
	struct evhttp *http = NULL;
	uint64_t wd_usec = 0;
	int r;

	the = s;
	s->hooks = &hooks;
	signal(SIGPIPE, SIG_IGN);
	base = event_base_new();
	if (!base)
		return log_error_errno(-ENOMEM, "Failed to create the event loop.");

	if (s->config.journal) {
		r = journal_open(s->config.state_dir, replay_record, s, &s->journal);
		if (r < 0)
			goto out;
		SUBSYSTEMS_FOREACH (s, it)
			if ((*it)->journal_replayed)
				(*it)->journal_replayed(s);
	}
	r = offload_start(s);
	if (r < 0)
		goto out;

	r = listen_socket(s);
	if (r < 0)
		goto out;
	listen_fd = r;
	ev_listen = event_new(base, listen_fd, EV_READ | EV_PERSIST, on_accept, s);
	ev_tick = event_new(base, -1, EV_PERSIST, on_tick, s);
	ev_off = event_new(base, offload_fd(s), EV_READ | EV_PERSIST, on_offload, s);
	r = -ENOMEM;
	if (!ev_listen || !ev_tick || !ev_off || event_add(ev_listen, NULL) < 0 ||
	    event_add(ev_tick, &(struct timeval){.tv_sec = 1}) < 0 || event_add(ev_off, NULL) < 0)
		goto out;
	for (int i = 0; sigs[i]; i++) {
		ev_sig[i] = evsignal_new(base, sigs[i], on_signal, s);
		if (!ev_sig[i] || event_add(ev_sig[i], NULL) < 0)
			goto out;
	}
	if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0) {
		ev_wd = event_new(base, -1, EV_PERSIST, on_watchdog, s);
		if (!ev_wd ||
		    event_add(ev_wd, &(struct timeval){
					     .tv_sec = (time_t)(wd_usec / 2000000),
					     .tv_usec = (suseconds_t)(wd_usec / 2 % 1000000)}) < 0)
			goto out;
	}
	r = http_start(s, &http);
	if (r < 0)
		goto out;
	/* In the list's order (main's): each may rely on those before it. */
	SUBSYSTEMS_FOREACH (s, it)
		if ((*it)->start) {
			r = (*it)->start(s, base);
			if (r < 0)
				goto out;
		}

	log_info("Listening on %s.", s->config.socket);
	(void)sd_notify(0, "READY=1");
	update_status(s);
	r = event_base_dispatch(base) < 0 ? -EIO : 0;

out:
	for (size_t i = 0; i < MAX_WATCHES; i++)
		if (ev_watches[i])
			event_free(ev_watches[i]);
	memset(ev_watches, 0, sizeof(ev_watches));
	SUBSYSTEMS_FOREACH (s, it)
		if ((*it)->stop)
			(*it)->stop(s);
	if (http)
		evhttp_free(http);
	for (int i = 0; i < 4; i++)
		if (ev_sig[i])
			event_free(ev_sig[i]);
	if (ev_wd)
		event_free(ev_wd);
	if (ev_off)
		event_free(ev_off);
	if (ev_tick)
		event_free(ev_tick);
	if (ev_listen)
		event_free(ev_listen);
	offload_stop(s);
	teardown(s);
	if (listen_fd >= 0) {
		(void)unlink(s->config.socket);
		listen_fd = safe_close(listen_fd);
	}
	journal_close(s->journal);
	s->journal = NULL;
	event_base_free(base);
	base = NULL;
	return r;
}
