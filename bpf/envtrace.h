/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Shared between envtrace.bpf.c and user space (supervisor/supervisor-envtrace.c): plain C
 * types only, since the BPF side sees vmlinux.h and user space sees the system headers.
 *
 * Wire format of one ring-buffer record: struct envtrace_event, then data_len bytes.
 * For ENVTRACE_EV_FILE and ENVTRACE_EV_FULL_DIFF the data holds npaths paths, each encoded as
 *   rel '\0' [component '\0']... '\0'
 * rel is the string the process passed (empty for fd-based calls, and for calls whose target
 * the kernel resolved to an open file, see ENVTRACE_PATH_FROM_FD). When rel does not start
 * with '/', the components name the directory it is relative to (the dirfd's, the cwd's or
 * the fd's own file), leaf first, up to the process's root; an empty component ends the list.
 * For ENVTRACE_EV_EXEC the data is the exec'd file name '\0' then aux bytes of argv (the
 * process's arg_start..arg_end: NUL-separated arguments).
 */
#pragma once

#define ENVTRACE_MAX_ENVS  1024 /* env ids are 1..ENVTRACE_MAX_ENVS-1; 0 = not watched */
#define ENVTRACE_NAME_MAX  256	/* one path component with its NUL */
#define ENVTRACE_PATH_MAX  4096 /* a user path string with its NUL */
#define ENVTRACE_DATA_MASK 8191 /* data offsets wrap here; the area is larger by PATH_MAX */
#define ENVTRACE_DATA_SIZE (ENVTRACE_DATA_MASK + 1 + ENVTRACE_PATH_MAX)
#define ENVTRACE_DEPTH_MAX 128	/* directory levels (and mount crossings) walked */
#define ENVTRACE_ARGV_MAX  4096 /* argv bytes kept per exec */
#define ENVTRACE_CG_LEVELS 32	/* cgroup ancestors looked at for a watched one */

enum envtrace_type {
	ENVTRACE_EV_FILE = 1, /* a successful call that changed the file system */
	ENVTRACE_EV_EXEC = 2,
	ENVTRACE_EV_FORK = 3,	   /* a new process (not a thread); aux = child pid */
	ENVTRACE_EV_EXIT = 4,	   /* a process (its last thread) exited; aux = exit code */
	ENVTRACE_EV_FULL_DIFF = 5, /* something bypasses syscall tracing; op = reason */
};

enum envtrace_op {
	ENVTRACE_OP_OPEN = 1, /* opened for write, create or truncate; flags = open flags */
	ENVTRACE_OP_TRUNCATE,
	ENVTRACE_OP_UNLINK,
	ENVTRACE_OP_RMDIR,
	ENVTRACE_OP_RENAME, /* path 0 = old, path 1 = new */
	ENVTRACE_OP_MKDIR,
	ENVTRACE_OP_LINK,    /* path 0 = existing, path 1 = new name */
	ENVTRACE_OP_SYMLINK, /* path 0 = the new link */
	ENVTRACE_OP_CHMOD,
	ENVTRACE_OP_CHOWN,
	ENVTRACE_OP_UTIMES,
	ENVTRACE_OP_XATTR,
	ENVTRACE_OP_MKNOD,
	ENVTRACE_OP_BIND, /* a unix socket bound to a path (creates it) */
	ENVTRACE_OP__MAX,
};

/* ENVTRACE_EV_FULL_DIFF reasons (in op). */
enum envtrace_full_diff_reason {
	ENVTRACE_FULL_IO_URING = 1,	  /* io_uring_setup: file operations without syscalls */
	ENVTRACE_FULL_MMAP_SHARED = 2,	  /* shared mapping of a file opened for writing */
	ENVTRACE_FULL_PENDING_FULL = 3,	  /* no room to remember a syscall's arguments */
	ENVTRACE_FULL_OPEN_BY_HANDLE = 4, /* open_by_handle_at for writing: path not resolvable */
};

/* Per-path flags (event pflags[i]). */
#define ENVTRACE_PATH_RESOLVED 0x1 /* the components reach the process's root */
#define ENVTRACE_PATH_FROM_FD  0x2 /* the components name the target itself (rel is "") */
#define ENVTRACE_PATH_TRUNC    0x4 /* a string or the walk was cut: not a usable path */

struct envtrace_event {
	unsigned int type; /* enum envtrace_type */
	unsigned int op;   /* enum envtrace_op, or the full-diff reason */
	unsigned int env_id;
	unsigned int pid; /* thread group id */
	unsigned int tid;
	unsigned int flags;	  /* open flags, rename flags, ... as the call passed them */
	unsigned long long ts_ns; /* bpf_ktime_get_ns */
	unsigned long long cgroup_id;
	long long ret; /* the syscall's result */
	long long aux;
	unsigned short npaths;
	unsigned char pflags[2];
	unsigned int data_len;
};

/* Value of the watched map (key: cgroup id, a cgroup v2 directory's inode number). */
struct envtrace_watch {
	unsigned int env_id;
	unsigned int pad;
};

/* Per environment and CPU (env_stats, a per-CPU array indexed by env id). */
struct envtrace_env_stats {
	unsigned long long events;    /* records submitted */
	unsigned long long drops;     /* records lost: ring buffer full */
	unsigned long long full_diff; /* full-diff conditions seen */
	unsigned long long execs;
	/* Process activity (issue 23 item 3): user code that ran or can run. Syscalls entered
	 * (a kernel restart of one the freezer interrupted excepted) and completed (a result
	 * other than -ERESTART*), signals delivered, tasks created and exited; not counted while
	 * the task is ptraced (CRIU's parasite). Unchanged over an interval in which every task
	 * sat in a syscall at its start and its end: none of them ran user code. */
	unsigned long long activity;
};
