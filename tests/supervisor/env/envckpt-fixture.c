/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "envckpt-fixture.h"
#include "util.h"
#include "supervisor-criu.h"

bool fixture_env_preconditions(void)
{
	const char *criu = sv_criu_binary(NULL);

	return geteuid() == 0 && access(FIXTURE_CGROUP_V2 "/cgroup.procs", F_OK) == 0 && criu &&
	       sv_criu_version(criu) >= 40200;
}

/* The mount point of the cgroup hierarchy named by a /proc/PID/cgroup line's controller list
 * ("" for v2; "cpu,cpuacct"; "name=systemd"): from /proc/self/mountinfo. */
static int hierarchy_mount(const char *ctls, char *ret, size_t cap)
{
	char line[4096], first[64], mp[PATH_MAX];
	_cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");

	if (!f)
		return -errno;
	snprintf(first, sizeof(first), "%.*s", (int)strcspn(ctls, ","), ctls);
	while (fgets(line, sizeof(line), f)) {
		char *dash = strstr(line, " - "), *super = dash ? strrchr(dash, ' ') : NULL;
		bool v2 = dash && strncmp(dash + 3, "cgroup2 ", 8) == 0;
		bool v1 = dash && strncmp(dash + 3, "cgroup ", 7) == 0;

		if (!super || (first[0] ? !v1 : !v2))
			continue;
		if (first[0]) {
			/* the super options: "rw,cpu,cpuacct\n" */
			char *o = super + 1, *hit = strstr(o, first);
			size_t n = strlen(first);

			if (!hit || (hit != o && hit[-1] != ',') ||
			    (hit[n] != ',' && hit[n] != '\n' && hit[n] != 0))
				continue;
		}
		if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) == 1) {
			snprintf(ret, cap, "%s", mp);
			return 0;
		}
	}
	return -ENOENT;
}

int fixture_join_prefix(pid_t pid, char *buf, size_t cap)
{
	char path[64], line[PATH_MAX], mnt[PATH_MAX];
	_cleanup_fclose_ FILE *f = NULL;
	size_t len = 0;

	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	buf[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		/* N:CONTROLLERS:PATH; "/" is every process's unless it was moved */
		char *c = strchr(line, ':'), *p = c ? strchr(c + 1, ':') : NULL;
		int n;

		if (!p)
			continue;
		*p++ = 0;
		p[strcspn(p, "\n")] = 0;
		if (strcmp(p, "/") == 0 || hierarchy_mount(c + 1, mnt, sizeof(mnt)) < 0)
			continue;
		n = snprintf(buf + len, cap - len, "echo $$ >%s%s/cgroup.procs && ", mnt, p);
		if (n < 0 || (size_t)n >= cap - len)
			return -ENAMETOOLONG;
		len += (size_t)n;
	}
	return 0;
}

int fixture_env_exec(const char *cgroup, pid_t pid, const char *fmt, ...)
{
	char inner[2048], join[2048], cmd[4200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(inner, sizeof(inner), fmt, ap);
	va_end(ap);
	if (fixture_join_prefix(pid, join, sizeof(join)) < 0)
		snprintf(join, sizeof(join), "echo $$ >%s/cgroup.procs && ", cgroup);
	snprintf(cmd, sizeof(cmd),
		 "%sexec nsenter -t %d -a -r -w sh -c '%s' </dev/null >/dev/null 2>&1", join,
		 (int)pid, inner);
	return system(cmd);
}

uint64_t fixture_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static int copy_file(const char *from, const char *to, mode_t mode)
{
	char buf[65536];
	int in, out, r = 0;
	ssize_t n;

	in = open(from, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -errno;
	out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	if (out < 0) {
		r = -errno;
		close(in);
		return r;
	}
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n) {
			r = -EIO;
			break;
		}
	if (n < 0)
		r = -errno;
	close(in);
	close(out);
	return r;
}

int fixture_make_base(const char *dir, const char *server_bin)
{
	static const char *const dirs[] = {"usr", "etc", "dev", "proc", "tmp", "root", "work"};
	static const char *const links[][2] = {{"bin", "usr/bin"},
					       {"lib", "usr/lib"},
					       {"lib64", "usr/lib64"},
					       {"sbin", "usr/sbin"}};
	char path[PATH_MAX];

	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return -errno;
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, dirs[i]);
		if (mkdir(path, strcmp(dirs[i], "tmp") == 0 ? 01777 : 0755) < 0 && errno != EEXIST)
			return -errno;
	}
	snprintf(path, sizeof(path), "%s/tmp", dir);
	(void)chmod(path, 01777);
	for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, links[i][0]);
		if (symlink(links[i][1], path) < 0 && errno != EEXIST)
			return -errno;
	}
	if (server_bin) {
		snprintf(path, sizeof(path), "%s/work/server", dir);
		return copy_file(server_bin, path, 0755);
	}
	return 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int hash_dir(int dirfd, const char *rel, const char *const *skip, uint64_t *h,
		    unsigned depth, bool meta_times)
{
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int fd = dup(dirfd), r = 0;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

	if (!d)
		return -errno;
	if (depth > 64) {
		closedir(d);
		return -ELOOP;
	}
	while ((de = readdir(d))) {
		bool skipped = false;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		for (size_t i = 0; depth == 0 && skip && skip[i] && !skipped; i++)
			skipped = strcmp(skip[i], de->d_name) == 0;
		if (skipped)
			continue;
		if (n == cap) {
			char **a = realloc(names, (cap ? cap * 2 : 32) * sizeof(*a));

			if (!a) {
				r = -ENOMEM;
				break;
			}
			names = a;
			cap = cap ? cap * 2 : 32;
		}
		names[n++] = strdup(de->d_name);
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof(*names), cmp_names);
	for (size_t i = 0; r >= 0 && i < n; i++) {
		char sub[PATH_MAX];
		struct stat st;
		uint64_t meta[5];

		snprintf(sub, sizeof(sub), "%s/%s", rel, names[i]);
		if (fstatat(dirfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = -errno;
			break;
		}
		*h = fnv(*h, sub, strlen(sub) + 1);
		meta[0] = st.st_mode;
		meta[1] = st.st_uid;
		meta[2] = st.st_gid;
		meta[3] = S_ISDIR(st.st_mode) ? 0 : (uint64_t)st.st_size;
		/* Directory mtimes change when the test itself looks (atime aside); files' do not. */
		meta[4] = S_ISREG(st.st_mode) ? (uint64_t)st.st_mtim.tv_sec * 1000000000ull +
							(uint64_t)st.st_mtim.tv_nsec
					      : 0;
		if (!meta_times)
			meta[1] = meta[2] = meta[4] = 0;
		*h = fnv(*h, meta, sizeof(meta));
		if (S_ISLNK(st.st_mode)) {
			char tgt[PATH_MAX];
			ssize_t k = readlinkat(dirfd, names[i], tgt, sizeof(tgt));

			if (k < 0) {
				r = -errno;
				break;
			}
			*h = fnv(*h, tgt, (size_t)k);
		} else if (S_ISREG(st.st_mode)) {
			char buf[65536];
			int f = openat(dirfd, names[i], O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
			ssize_t k;

			if (f < 0) {
				r = -errno;
				break;
			}
			while ((k = read(f, buf, sizeof(buf))) > 0)
				*h = fnv(*h, buf, (size_t)k);
			close(f);
		} else if (S_ISDIR(st.st_mode)) {
			int sfd = openat(dirfd, names[i],
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sfd < 0) {
				r = -errno;
				break;
			}
			r = hash_dir(sfd, sub, NULL, h, depth + 1, meta_times);
			close(sfd);
		}
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return r;
}

int fixture_tree_hash(const char *dir, const char *const *skip, uint64_t *ret)
{
	uint64_t h = 0xcbf29ce484222325ull;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), r;

	if (fd < 0)
		return -errno;
	r = hash_dir(fd, "", skip, &h, 0, true);
	close(fd);
	if (r >= 0)
		*ret = h;
	return r;
}

int fixture_content_hash(const char *dir, const char *const *skip, uint64_t *ret)
{
	uint64_t h = 0xcbf29ce484222325ull;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), r;

	if (fd < 0)
		return -errno;
	r = hash_dir(fd, "", skip, &h, 0, false);
	close(fd);
	if (r >= 0)
		*ret = h;
	return r;
}

/* A socket of family in the network namespace of the environment whose cgroup is cgroup (that
 * of a process of it: a restored environment has a new one), or ours when cgroup is NULL.
 * setns() moves this thread only, and back at once; the socket keeps its namespace. */
static int socket_in(const char *cgroup, int family)
{
	_cleanup_close_ int self = -1, ns = -1;
	char path[PATH_MAX];
	FILE *f;
	int pid = 0, s, r;

	if (!cgroup)
		return socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup);
	f = fopen(path, "re");
	if (!f)
		return -1;
	r = fscanf(f, "%d", &pid);
	fclose(f);
	if (r != 1) {
		errno = ESRCH;
		return -1;
	}
	snprintf(path, sizeof(path), "/proc/%d/ns/net", pid);
	ns = open(path, O_RDONLY | O_CLOEXEC);
	self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	if (ns < 0 || self < 0 || setns(ns, CLONE_NEWNET) < 0)
		return -1;
	s = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	r = errno;
	if (setns(self, CLONE_NEWNET) < 0)
		abort(); /* a test thread left in an environment's namespace would lie */
	errno = r;
	return s;
}

/* A connected stream socket to the server at addr: a unix socket path (starting with '/') or
 * a TCP port on 127.0.0.1 (in cgroup's environment: socket_in), as envckpt-server takes it;
 * retries until the deadline. */
static int ask_connect(const char *cgroup, const char *addr, uint64_t deadline)
{
	struct sockaddr_un su = {.sun_family = AF_UNIX};
	struct sockaddr_in si = {.sin_family = AF_INET};
	struct sockaddr *sa;
	socklen_t salen;
	int s;

	if (addr[0] == '/') {
		if (strlen(addr) >= sizeof(su.sun_path))
			return -ENAMETOOLONG;
		memcpy(su.sun_path, addr, strlen(addr));
		sa = (struct sockaddr *)&su;
		salen = sizeof(su);
	} else {
		char *end;
		unsigned long port = strtoul(addr, &end, 10);

		if (*addr == '\0' || *end != '\0' || port == 0 || port > UINT16_MAX)
			return -EINVAL;
		si.sin_port = htons((uint16_t)port);
		si.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		sa = (struct sockaddr *)&si;
		salen = sizeof(si);
	}
	/* The server may still be starting: retry the connect until the deadline. */
	for (;;) {
		s = socket_in(sa->sa_family == AF_INET ? cgroup : NULL, sa->sa_family);
		if (s >= 0 && connect(s, sa, salen) == 0)
			return s;
		if (s < 0 && errno != ESRCH && errno != ENOENT)
			return -errno;
		if (s >= 0)
			close(s);
		if (fixture_now_us() > deadline)
			return -ETIMEDOUT;
		(void)poll(NULL, 0, 5);
	}
}

int fixture_ask(const char *addr, const char *req, char *ans, size_t cap, int timeout_ms)
{
	return fixture_ask_in(NULL, addr, req, ans, cap, timeout_ms);
}

int fixture_ask_in(const char *cgroup, const char *addr, const char *req, char *ans, size_t cap,
		   int timeout_ms)
{
	uint64_t deadline = fixture_now_us() + (uint64_t)timeout_ms * 1000;
	size_t got = 0;
	int s, r = -ETIMEDOUT;

	s = ask_connect(cgroup, addr, deadline);
	if (s < 0)
		return s;
	if (write(s, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(s);
		return -EIO;
	}
	/* Reads until the server closes the connection, not just until the newline: a caller that
	 * checkpoints right after an answer must not catch the server between its write and its
	 * close, holding a connected TCP socket that CRIU (without --tcp-established) refuses. */
	while (got + 1 < cap) {
		int left = (int)((deadline - fixture_now_us()) / 1000);
		ssize_t n;

		if (left <= 0 || poll(&(struct pollfd){.fd = s, .events = POLLIN}, 1, left) <= 0)
			break;
		n = read(s, ans + got, cap - 1 - got);
		if (n <= 0) { /* the close (or a reset after the answer) */
			r = memchr(ans, '\n', got) ? 0 : n < 0 ? -errno : -EIO;
			break;
		}
		got += (size_t)n;
	}
	if (got + 1 >= cap && memchr(ans, '\n', got))
		r = 0; /* a full buffer with the whole answer line: no room left to see the close */
	ans[got] = '\0';
	ans[strcspn(ans, "\n")] = '\0';
	close(s);
	return r;
}

int fixture_wait_file(const char *path, int timeout_ms)
{
	uint64_t deadline = fixture_now_us() + (uint64_t)timeout_ms * 1000;

	while (access(path, F_OK) < 0) {
		if (fixture_now_us() > deadline)
			return -ETIMEDOUT;
		(void)poll(NULL, 0, 2);
	}
	return 0;
}

int fixture_free_port(uint16_t *ret)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t len = sizeof(sa);
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (s < 0)
		return -errno;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    getsockname(s, (struct sockaddr *)&sa, &len) < 0) {
		close(s);
		return -errno;
	}
	*ret = ntohs(sa.sin_port);
	close(s);
	return 0;
}
