/* SPDX-License-Identifier: MIT */
/*
 * The environments' seccomp filter (issue 19): an allow-list. A system call not named here is
 * refused with EPERM, so that one a future kernel adds stays closed until someone reads what
 * it does; what Docker's default profile refuses is refused here too (its mounts, file
 * handles, BPF, perf, modules, kexec, keys, namespaces, clocks, reboot, and io_uring, which
 * Docker now refuses as well), plus kcmp, pidfd_getfd and the NUMA calls that Docker gives only
 * to a container with CAP_SYS_PTRACE or CAP_SYS_NICE.
 *
 * Numbers above the last system call this list was reviewed against say ENOSYS rather than
 * EPERM, as runc does since 1.0: a program built for a newer kernel than the list then takes
 * the fallback it has for an older kernel (glibc's clone3, faccessat2, close_range ... each
 * fall back on ENOSYS and fail on EPERM).
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <unistd.h>

#include "supervisor-env-seccomp.h"
#include "util.h"

/* Allowed without looking at arguments; names this architecture or libseccomp lacks are
 * skipped (refused). */
static const char *const allowed[] = {
	/* files and directories */
	"read",
	"write",
	"readv",
	"writev",
	"pread64",
	"pwrite64",
	"preadv",
	"pwritev",
	"preadv2",
	"pwritev2",
	"open",
	"openat",
	"openat2",
	"creat",
	"close",
	"close_range",
	"lseek",
	"_llseek",
	"dup",
	"dup2",
	"dup3",
	"fcntl",
	"fcntl64",
	"flock",
	"fsync",
	"fdatasync",
	"sync",
	"syncfs",
	"sync_file_range",
	"truncate",
	"ftruncate",
	"truncate64",
	"ftruncate64",
	"fallocate",
	"fadvise64",
	"fadvise64_64",
	"readahead",
	"stat",
	"fstat",
	"lstat",
	"newfstatat",
	"stat64",
	"fstat64",
	"lstat64",
	"fstatat64",
	"statx",
	"statfs",
	"fstatfs",
	"statfs64",
	"fstatfs64",
	"access",
	"faccessat",
	"faccessat2",
	"getdents",
	"getdents64",
	"readlink",
	"readlinkat",
	"mkdir",
	"mkdirat",
	"rmdir",
	"unlink",
	"unlinkat",
	"rename",
	"renameat",
	"renameat2",
	"link",
	"linkat",
	"symlink",
	"symlinkat",
	"chmod",
	"fchmod",
	"fchmodat",
	"fchmodat2",
	"chown",
	"fchown",
	"lchown",
	"fchownat",
	"chown32",
	"fchown32",
	"lchown32",
	"umask",
	"utime",
	"utimes",
	"utimensat",
	"futimesat",
	"getcwd",
	"chdir",
	"fchdir",
	"chroot",
	"mknod",
	"mknodat",
	"copy_file_range",
	"sendfile",
	"sendfile64",
	"splice",
	"tee",
	"vmsplice",
	"getxattr",
	"lgetxattr",
	"fgetxattr",
	"setxattr",
	"lsetxattr",
	"fsetxattr",
	"listxattr",
	"llistxattr",
	"flistxattr",
	"removexattr",
	"lremovexattr",
	"fremovexattr",
	"inotify_init",
	"inotify_init1",
	"inotify_add_watch",
	"inotify_rm_watch",
	"pipe",
	"pipe2",
	"memfd_create",
	"io_setup",
	"io_destroy",
	"io_submit",
	"io_getevents",
	"io_pgetevents",
	"io_cancel",
	/* memory */
	"brk",
	"mmap",
	"mmap2",
	"munmap",
	"mremap",
	"mprotect",
	"pkey_mprotect",
	"pkey_alloc",
	"pkey_free",
	"madvise",
	"mincore",
	"mlock",
	"mlock2",
	"munlock",
	"mlockall",
	"munlockall",
	"msync",
	"membarrier",
	"remap_file_pages",
	"get_mempolicy",
	"cachestat",
	/* processes: clone, unshare and personality are below, with their arguments */
	"fork",
	"vfork",
	"execve",
	"execveat",
	"exit",
	"exit_group",
	"wait4",
	"waitid",
	"waitpid",
	"kill",
	"tkill",
	"tgkill",
	"rt_sigqueueinfo",
	"rt_tgsigqueueinfo",
	"getpid",
	"getppid",
	"gettid",
	"getpgid",
	"setpgid",
	"getpgrp",
	"getsid",
	"setsid",
	"getuid",
	"geteuid",
	"getgid",
	"getegid",
	"getresuid",
	"getresgid",
	"getgroups",
	"setuid",
	"setgid",
	"setreuid",
	"setregid",
	"setresuid",
	"setresgid",
	"setgroups",
	"setfsuid",
	"setfsgid",
	"getuid32",
	"geteuid32",
	"getgid32",
	"getegid32",
	"getresuid32",
	"getresgid32",
	"getgroups32",
	"setuid32",
	"setgid32",
	"setreuid32",
	"setregid32",
	"setresuid32",
	"setresgid32",
	"setgroups32",
	"setfsuid32",
	"setfsgid32",
	"capget",
	"capset",
	"prctl",
	"arch_prctl",
	"set_tid_address",
	"set_robust_list",
	"get_robust_list",
	"futex",
	"futex_time64",
	"futex_waitv",
	"futex_wake",
	"futex_wait",
	"futex_requeue",
	"rseq",
	"set_thread_area",
	"get_thread_area",
	"restart_syscall",
	"sched_yield",
	"sched_getaffinity",
	"sched_setaffinity",
	"sched_getparam",
	"sched_setparam",
	"sched_getscheduler",
	"sched_setscheduler",
	"sched_get_priority_max",
	"sched_get_priority_min",
	"sched_rr_get_interval",
	"sched_getattr",
	"sched_setattr",
	"getpriority",
	"setpriority",
	"ioprio_get",
	"ioprio_set",
	"getrlimit",
	"setrlimit",
	"ugetrlimit",
	"prlimit64",
	"getrusage",
	"times",
	"sysinfo",
	"uname",
	"getcpu",
	"pidfd_open",
	"pidfd_send_signal",
	"process_mrelease",
	/* Debuggers (strace, gdb, py-spy) on the environment's own processes, as Docker since
	 * Linux 4.8, whose seccomp checks a traced call again after the tracer changed it. The
	 * environment holds no CAP_SYS_PTRACE, so only its own uid's processes. */
	"ptrace",
	"process_vm_readv",
	"process_vm_writev",
	/* a filter of a process's own only narrows what it may do */
	"seccomp",
	"landlock_create_ruleset",
	"landlock_add_rule",
	"landlock_restrict_self",
	/* signals */
	"rt_sigaction",
	"rt_sigprocmask",
	"rt_sigreturn",
	"rt_sigpending",
	"rt_sigtimedwait",
	"rt_sigtimedwait_time64",
	"rt_sigsuspend",
	"sigaltstack",
	"signalfd",
	"signalfd4",
	"pause",
	"alarm",
	"sigreturn",
	"sigprocmask",
	"sigaction",
	"sigsuspend",
	"sigpending",
	/* time (reading it; setting the clock is the host's) */
	"time",
	"gettimeofday",
	"clock_gettime",
	"clock_getres",
	"clock_nanosleep",
	"clock_gettime64",
	"clock_getres_time64",
	"clock_nanosleep_time64",
	"nanosleep",
	"getitimer",
	"setitimer",
	"timer_create",
	"timer_settime",
	"timer_gettime",
	"timer_getoverrun",
	"timer_delete",
	"timer_settime64",
	"timer_gettime64",
	"timerfd_create",
	"timerfd_settime",
	"timerfd_gettime",
	"timerfd_settime64",
	"timerfd_gettime64",
	/* waiting on many fds */
	"select",
	"_newselect",
	"pselect6",
	"pselect6_time64",
	"poll",
	"ppoll",
	"ppoll_time64",
	"epoll_create",
	"epoll_create1",
	"epoll_ctl",
	"epoll_wait",
	"epoll_pwait",
	"epoll_pwait2",
	"eventfd",
	"eventfd2",
	/* sockets: socket itself is below, by family */
	"socketpair",
	"bind",
	"listen",
	"accept",
	"accept4",
	"connect",
	"getsockname",
	"getpeername",
	"sendto",
	"recvfrom",
	"send",
	"recv",
	"sendmsg",
	"recvmsg",
	"sendmmsg",
	"recvmmsg",
	"recvmmsg_time64",
	"setsockopt",
	"getsockopt",
	"shutdown",
	/* System V and POSIX IPC (the environment's own ipc namespace) */
	"msgget",
	"msgsnd",
	"msgrcv",
	"msgctl",
	"semget",
	"semop",
	"semtimedop",
	"semctl",
	"shmget",
	"shmat",
	"shmdt",
	"shmctl",
	"mq_open",
	"mq_unlink",
	"mq_timedsend",
	"mq_timedreceive",
	"mq_notify",
	"mq_getsetattr",
	/* the rest: its own uts namespace's names, terminals, randomness */
	"ioctl",
	"getrandom",
	"sethostname",
	"setdomainname",
};

/* The namespace flags of clone and unshare (Docker's 0x7E020000): none may be asked for. A new
 * user namespace needs no capability and gives every one over what it then creates; the
 * others need CAP_SYS_ADMIN, which an environment lacks, but say so here too. */
#define NS_FLAGS                                                                       \
	(CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | \
	 CLONE_NEWPID | CLONE_NEWNET)

/* The last system call the list was reviewed against: file_setattr, Linux 6.17, the same
 * number on x86-64 and on the generic table (aarch64) since they were unified at 403. */
#define LAST_REVIEWED 469

#if defined(__x86_64__)
#define AUDIT_ARCH_NATIVE AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define AUDIT_ARCH_NATIVE AUDIT_ARCH_AARCH64
#endif

static int add_rules(scmp_filter_ctx ctx)
{
	/* personality: the default, PER_LINUX32, UNAME26 and the query, as Docker; not
	 * ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC and the rest that weaken an exploit's odds */
	static const unsigned long persona[] = {PER_LINUX, PER_LINUX32, UNAME26,
						UNAME26 | PER_LINUX32, 0xffffffffUL};
	/* socket: local, IPv4, IPv6 and netlink (getifaddrs, ip); not AF_PACKET, AF_VSOCK,
	 * AF_KEY, AF_ALG ... */
	static const int families[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};
	int r = 0;

	for (size_t i = 0; i < ARRAY_SIZE(allowed) && r >= 0; i++) {
		int nr = seccomp_syscall_resolve_name(allowed[i]);

		/* < 0: a name this architecture lacks, or one it multiplexes (socketcall) */
		if (nr >= 0)
			r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
	}
	for (size_t i = 0; i < ARRAY_SIZE(persona) && r >= 0; i++)
		r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(personality), 1,
				     SCMP_A0(SCMP_CMP_EQ, persona[i]));
	for (size_t i = 0; i < ARRAY_SIZE(families) && r >= 0; i++)
		r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1,
				     SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)families[i]));
	if (r >= 0)
		r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
				     SCMP_A0(SCMP_CMP_MASKED_EQ, NS_FLAGS, 0));
	if (r >= 0)
		r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(unshare), 1,
				     SCMP_A0(SCMP_CMP_MASKED_EQ, NS_FLAGS, 0));
	/* clone3's flags are in memory a filter cannot read: ENOSYS, so that libc falls back
	 * to clone, as Docker does */
	if (r >= 0)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
	return r;
}

/* libseccomp 2.5 exports a program only to an fd: through a memfd into memory of our own,
 * room left in front for the prefix. */
static int export_filter(scmp_filter_ctx ctx, size_t room, struct sock_fprog *ret)
{
	_cleanup_close_ int fd = memfd_create("belayer-seccomp", MFD_CLOEXEC);
	struct sock_filter *p;
	off_t size;
	int r;

	if (fd < 0)
		return -errno;
	r = seccomp_export_bpf(ctx, fd);
	if (r < 0)
		return r;
	size = lseek(fd, 0, SEEK_END);
	if (size <= 0 || size % sizeof(struct sock_filter) ||
	    size / sizeof(struct sock_filter) + room > BPF_MAXINSNS)
		return -EINVAL;
	p = calloc((size_t)size / sizeof(struct sock_filter) + room, sizeof(*p));
	if (!p)
		return -ENOMEM;
	if (pread(fd, p + room, (size_t)size, 0) != size) {
		free(p);
		return -EIO;
	}
	ret->filter = p;
	ret->len = (unsigned short)(size / sizeof(struct sock_filter) + room);
	return 0;
}

int env_seccomp_build(struct sock_fprog *ret)
{
#ifdef AUDIT_ARCH_NATIVE
	/* In front of libseccomp's program (its jumps are relative, so it moves as it is): on
	 * the native architecture, a number past LAST_REVIEWED (or an x32 one, bit 30) says
	 * ENOSYS. */
	const struct sock_filter prefix[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_NATIVE, 0, 3),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, LAST_REVIEWED, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
	};
#else
	const struct sock_filter prefix[1] = {BPF_JUMP(BPF_JMP | BPF_JA, 0, 0, 0)};
#endif
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
	int r;

	if (!ctx)
		return -ENOMEM;
	r = add_rules(ctx);
	if (r >= 0)
		r = export_filter(ctx, ARRAY_SIZE(prefix), ret);
	if (r >= 0)
		memcpy(ret->filter, prefix, sizeof(prefix));
	seccomp_release(ctx);
	return r;
}
