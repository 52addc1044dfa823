/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-env-sandbox.h"
#include "supervisor-env-seccomp.h"
#include "util.h"

#define CAP(c) (1ull << (c))

uint64_t env_sandbox_caps(void)
{
	return CAP(CAP_CHOWN) | CAP(CAP_DAC_OVERRIDE) | CAP(CAP_FSETID) | CAP(CAP_FOWNER) |
	       CAP(CAP_SETGID) | CAP(CAP_SETUID) | CAP(CAP_SETFCAP) | CAP(CAP_SETPCAP) |
	       CAP(CAP_NET_BIND_SERVICE) | CAP(CAP_SYS_CHROOT) | CAP(CAP_KILL) |
	       CAP(CAP_AUDIT_WRITE);
}

static struct sock_fprog filter;
static pthread_once_t filter_once = PTHREAD_ONCE_INIT;
static int filter_error;

static void filter_init(void)
{
	filter_error = env_seccomp_build(&filter);
	if (filter_error < 0)
		log_error_errno(filter_error,
				"Failed to build the environments' seccomp filter: %m");
}

const struct sock_fprog *env_sandbox_filter(void)
{
	(void)pthread_once(&filter_once, filter_init);
	if (filter_error < 0) {
		errno = -filter_error;
		return NULL;
	}
	return &filter;
}

int env_sandbox_loopback_up(void)
{
	struct ifreq ifr = {.ifr_name = "lo"};
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), r;

	if (fd < 0)
		return -1;
	r = ioctl(fd, SIOCGIFFLAGS, &ifr);
	if (r == 0) {
		ifr.ifr_flags |= IFF_UP;
		r = ioctl(fd, SIOCSIFFLAGS, &ifr);
	}
	(void)close(fd);
	return r;
}

int env_sandbox_netns_new(void)
{
	_cleanup_close_ int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	int ns, r;

	if (self < 0)
		return -errno;
	if (unshare(CLONE_NEWNET) < 0)
		return -errno;
	ns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	r = ns < 0 ? -errno : env_sandbox_loopback_up() < 0 ? -errno : 0;
	if (setns(self, CLONE_NEWNET) < 0) {
		/* this thread would serve everything after in a namespace of nothing */
		log_error_errno(-errno,
				"Failed to return to the supervisor's network namespace: %m");
		abort();
	}
	if (r < 0) {
		if (ns >= 0)
			(void)close(ns);
		return r;
	}
	return ns;
}

uint64_t env_sandbox_netns_of(pid_t pid)
{
	char path[64];
	struct stat theirs, ours;

	snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
	if (stat(path, &theirs) < 0 || stat("/proc/self/ns/net", &ours) < 0 ||
	    (theirs.st_ino == ours.st_ino && theirs.st_dev == ours.st_dev))
		return 0;
	return (uint64_t)theirs.st_ino;
}

static void add(char *buf, size_t cap, const char *what)
{
	size_t n = strlen(buf);

	snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", what);
}

static bool same_ns(pid_t pid, const char *ns)
{
	char path[64];
	struct stat theirs, ours;

	snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)pid, ns);
	if (stat(path, &theirs) < 0)
		return false;
	snprintf(path, sizeof(path), "/proc/self/ns/%s", ns);
	return stat(path, &ours) == 0 && theirs.st_ino == ours.st_ino &&
	       theirs.st_dev == ours.st_dev;
}

void env_sandbox_report(pid_t pid, char *buf, size_t cap)
{
	char path[64], line[256];
	unsigned long long eff = 0;
	int nnp = -1, seccomp = -1;
	FILE *f;

	buf[0] = '\0';
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	while (f && fgets(line, sizeof(line), f)) {
		(void)sscanf(line, "CapEff: %llx", &eff);
		(void)sscanf(line, "NoNewPrivs: %d", &nnp);
		(void)sscanf(line, "Seccomp: %d", &seccomp);
	}
	if (f)
		fclose(f);
	if (same_ns(pid, "net"))
		add(buf, cap, "shares the supervisor's network namespace");
	if (same_ns(pid, "cgroup"))
		add(buf, cap, "shares the supervisor's cgroup namespace");
	if (eff & ~env_sandbox_caps())
		add(buf, cap, "capabilities beyond an environment's");
	if (nnp != 1)
		add(buf, cap, "no no_new_privs");
	if (seccomp != 2)
		add(buf, cap, "no seccomp filter");
}

int env_sandbox_enter(const struct sock_fprog *prog)
{
	uint64_t keep = env_sandbox_caps();
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[2] = {
		{.effective = (uint32_t)keep, .permitted = (uint32_t)keep},
		{.effective = (uint32_t)(keep >> 32), .permitted = (uint32_t)(keep >> 32)},
	};

	/* The bounding set first (it needs CAP_SETPCAP, kept), up to the kernel's last
	 * capability: prctl says EINVAL past it. */
	for (int c = 0; c < 64; c++) {
		if (keep & CAP(c))
			continue;
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
			if (errno == EINVAL)
				break;
			return -1;
		}
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
		return -1;
	if (syscall(SYS_capset, &h, d) < 0)
		return -1;
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return -1;
	return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, prog);
}
