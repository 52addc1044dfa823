/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-env-sandbox.h"
#include "util.h"

#define CAP(c) (1ull << (c))

uint64_t env_sandbox_caps(void)
{
	return CAP(CAP_CHOWN) | CAP(CAP_DAC_OVERRIDE) | CAP(CAP_FSETID) | CAP(CAP_FOWNER) |
	       CAP(CAP_SETGID) | CAP(CAP_SETUID) | CAP(CAP_SETFCAP) | CAP(CAP_SETPCAP) |
	       CAP(CAP_NET_BIND_SERVICE) | CAP(CAP_SYS_CHROOT) | CAP(CAP_KILL) |
	       CAP(CAP_AUDIT_WRITE);
}

/* Refused with EPERM: the system calls Docker's default profile blocks because they reach
 * past a container (its documentation's list), and the newer ones of the same kind. */
static const char *const denied[] = {
	/* mounts and file handles: the host's files through a bind mount's file handle */
	"mount",
	"umount2",
	"pivot_root",
	"move_mount",
	"open_tree",
	"fsopen",
	"fsconfig",
	"fsmount",
	"fspick",
	"mount_setattr",
	"open_by_handle_at",
	"name_to_handle_at",
	/* the kernel */
	"bpf",
	"perf_event_open",
	"init_module",
	"finit_module",
	"delete_module",
	"kexec_load",
	"kexec_file_load",
	"iopl",
	"ioperm",
	"syslog",
	"lookup_dcookie",
	"userfaultfd",
	"fanotify_init",
	"io_uring_setup",
	"io_uring_enter",
	"io_uring_register",
	"uselib",
	"ustat",
	"sysfs",
	"vhangup",
	"quotactl",
	"quotactl_fd",
	"acct",
	"swapon",
	"swapoff",
	"reboot",
	/* keys, namespaces, clocks */
	"keyctl",
	"add_key",
	"request_key",
	"setns",
	"settimeofday",
	"clock_settime",
	"clock_adjtime",
	"adjtimex",
	/* NUMA policy of other processes' memory (Docker: only with CAP_SYS_NICE) */
	"mbind",
	"migrate_pages",
	"move_pages",
	"set_mempolicy",
};

static struct sock_fprog filter;
static pthread_once_t filter_once = PTHREAD_ONCE_INIT;
static int filter_error;

/* libseccomp 2.5 exports a program only to an fd: through a memfd into memory of our own. */
static int export_filter(scmp_filter_ctx ctx)
{
	_cleanup_close_ int fd = memfd_create("belayer-seccomp", MFD_CLOEXEC);
	off_t size;
	void *p;
	int r;

	if (fd < 0)
		return -errno;
	r = seccomp_export_bpf(ctx, fd);
	if (r < 0)
		return r;
	size = lseek(fd, 0, SEEK_END);
	if (size <= 0 || size % sizeof(struct sock_filter) || size > 65536)
		return -EINVAL;
	p = malloc((size_t)size);
	if (!p)
		return -ENOMEM;
	if (pread(fd, p, (size_t)size, 0) != size) {
		free(p);
		return -EIO;
	}
	filter.filter = p;
	filter.len = (unsigned short)(size / sizeof(struct sock_filter));
	return 0;
}

static int build_filter(void)
{
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	int r = 0;

	if (!ctx)
		return -ENOMEM;
	for (size_t i = 0; i < ARRAY_SIZE(denied) && r >= 0; i++) {
		int nr = seccomp_syscall_resolve_name(denied[i]);

		/* a name this architecture lacks has nothing to block */
		if (nr != __NR_SCMP_ERROR)
			r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
	}
	/* New user namespaces (root in one has every capability over what it creates); clone3's
	 * flags are in memory a filter cannot read: ENOSYS, so that libc falls back to clone,
	 * as Docker does. */
	if (r >= 0)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
				     SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
	if (r >= 0)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
				     SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
	if (r >= 0)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
	if (r >= 0)
		r = export_filter(ctx);
	seccomp_release(ctx);
	return r;
}

static void filter_init(void)
{
	filter_error = build_filter();
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
