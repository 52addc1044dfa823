/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Environment side-effect tracing (DESIGN §2): which paths did the processes of a watched
 * cgroup change, which commands did they run. Only syscall tracepoints and tp_btf attach on
 * our kernels (DESIGN §6), so every way of changing the file system is traced at its syscall:
 * the arguments are remembered at sys_enter (per thread, keyed by pid_tgid) and the event is
 * sent at sys_exit only when the call succeeded.
 *
 * Path resolution happens here, while the process and its fds still exist: a relative path
 * is sent together with the directory it is relative to (the dirfd's file, or the cwd),
 * whose name is read by walking the dentry chain up to the process's root, crossing mounts
 * (struct mount's mnt_parent/mnt_mountpoint). A file opened for writing is named by the
 * dentry of the file the call returned, which is canonical (symlinks already followed). A
 * walk that does not reach the root, or a string cut at its bound, is flagged; user space
 * then forces a full diff for the environment rather than miss a change.
 *
 * Filtering: the current task's cgroup v2 id and its ancestors are looked up in `watched`,
 * so cgroups created below a watched one after the watch began are covered. The answer per
 * cgroup is cached in `cg_verdicts`, tagged with `watch_gen`, which user space bumps after
 * every change of `watched` (a verdict computed from an older map is never reused).
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "envtrace.h"

#define AT_FDCWD      -100
#define O_ACCMODE     00000003
#define O_CREAT	      00000100
#define O_TRUNC	      00001000
#define O_TMPFILE_DIR 020000000 /* __O_TMPFILE without O_DIRECTORY */
#define FMODE_WRITE   0x2
#define PROT_WRITE    0x2
#define MAP_TYPE      0x0f
#define MAP_SHARED    0x01
#define MAP_SHARED_V  0x03
#define MAP_ANONYMOUS 0x20
#define AF_UNIX	      1
#define SB_KERNMOUNT  (1u << 22) /* include/linux/fs.h: a kernel-internal mount's superblock */

#define EPERM	     1
#define ENOENT	     2
#define EACCES	     13
#define EEXIST	     17
#define ENOTDIR	     20
#define EISDIR	     21
#define EROFS	     30
#define ENAMETOOLONG 36
#define ELOOP	     40

/* argv bytes kept per exec (<= ENVTRACE_ARGV_MAX); set before load. */
const volatile __u32 argv_max = ENVTRACE_ARGV_MAX;

/* 0: wake the consumer for every record (the kernel's default). Else wake it only once this
 * many bytes wait: each wakeup is an irq_work self-IPI in the traced process, a VM exit on
 * virtual machines; the consumer then also drains on a timer. Set before load. */
const volatile __u32 wakeup_bytes = 0;

/* Bumped by user space after each change of `watched`. */
__u32 watch_gen = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); /* user space may resize before load */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ENVTRACE_MAX_ENVS);
	__type(key, __u64);
	__type(value, struct envtrace_watch);
} watched SEC(".maps");

struct verdict {
	__u32 gen;
	__u32 env_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, struct verdict);
} cg_verdicts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ENVTRACE_MAX_ENVS);
	__type(key, __u32);
	__type(value, struct envtrace_env_stats);
} env_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

/* How a remembered path argument is resolved at exit. */
enum {
	ARG_NONE = 0,
	ARG_PATH,      /* dfd + user string (a NULL string means dfd itself) */
	ARG_RESULT_FD, /* the fd the call returned */
};

struct pending {
	__u32 type;
	__u32 op;
	__u32 env_id;
	__u32 flags;
	__u8 kind[2];
	__s32 dfd[2];
	__u64 path[2];
	__u64 aux;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct pending);
} pendings SEC(".maps");

struct scratch {
	struct envtrace_event ev;
	char data[ENVTRACE_DATA_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch_map SEC(".maps");

static __always_inline struct envtrace_env_stats *stats_of(__u32 env_id)
{
	return bpf_map_lookup_elem(&env_stats, &env_id);
}

/* The watched environment of the current task's cgroup (deepest watched ancestor), or 0. */
static __always_inline __u32 current_env(void)
{
	__u64 cg = bpf_get_current_cgroup_id();
	__u32 gen = *(volatile __u32 *)&watch_gen;
	struct verdict *v, nv = {.gen = gen};

	v = bpf_map_lookup_elem(&cg_verdicts, &cg);
	if (v && v->gen == gen)
		return v->env_id;

	for (int level = 0; level < ENVTRACE_CG_LEVELS; level++) {
		__u64 anc = bpf_get_current_ancestor_cgroup_id(level);
		struct envtrace_watch *w;

		if (anc == 0)
			break;
		w = bpf_map_lookup_elem(&watched, &anc);
		if (w)
			nv.env_id = w->env_id;
		if (anc == cg)
			break;
	}
	(void)bpf_map_update_elem(&cg_verdicts, &cg, &nv, BPF_ANY);
	return nv.env_id;
}

static __always_inline void emit(struct scratch *s, __u32 data_len)
{
	struct envtrace_env_stats *st = stats_of(s->ev.env_id);
	__u64 size, flags = 0;

	if (data_len > ENVTRACE_DATA_SIZE)
		data_len = ENVTRACE_DATA_SIZE;
	s->ev.data_len = data_len;
	size = sizeof(s->ev) + data_len;
	/* Re-check after an optimization barrier so that the verifier sees the bound. */
	barrier_var(size);
	if (size > sizeof(*s))
		size = sizeof(*s);
	if (wakeup_bytes)
		flags = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) + size >= wakeup_bytes
				? BPF_RB_FORCE_WAKEUP
				: BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&events, s, size, flags) == 0) {
		if (st)
			st->events++;
	} else {
		__u32 zero = 0;
		__u64 *d = bpf_map_lookup_elem(&drops, &zero);

		if (d)
			(*d)++;
		if (st)
			st->drops++;
	}
}

static __always_inline struct scratch *event_begin(__u32 type, __u32 op, __u32 env_id)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	__u64 id = bpf_get_current_pid_tgid();

	if (!s)
		return NULL;
	s->ev.type = type;
	s->ev.op = op;
	s->ev.env_id = env_id;
	s->ev.pid = id >> 32;
	s->ev.tid = (__u32)id;
	s->ev.flags = 0;
	s->ev.ts_ns = bpf_ktime_get_ns();
	s->ev.cgroup_id = bpf_get_current_cgroup_id();
	s->ev.ret = 0;
	s->ev.aux = 0;
	s->ev.npaths = 0;
	s->ev.pflags[0] = 0;
	s->ev.pflags[1] = 0;
	s->ev.data_len = 0;
	return s;
}

static __always_inline struct file *fd_to_file(struct task_struct *task, int fd)
{
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **arr;
	struct file *f = NULL;

	if (!fdt || fd < 0 || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return NULL;
	arr = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), &arr[fd]))
		return NULL;
	return f;
}

/* A file of a kernel-internal mount (SB_KERNMOUNT: a memfd, SysV or hugetlb memfd memory, a
 * pipe, a socket) is named by no path of any file system (linkat refuses it across mounts):
 * nothing done to it changes what a checkpoint's file-system delta holds (its pages are
 * process memory, which CRIU dumps). Its path never resolves, so without this check any
 * ftruncate or shared writable mapping of a memfd read as "needs full diff": CRIU's parasite
 * maps one at every dump (issue 23 item 1). */
static __always_inline bool file_is_internal(struct file *f)
{
	return f && (BPF_CORE_READ(f, f_inode, i_sb, s_flags) & SB_KERNMOUNT);
}

struct walk {
	struct dentry *d;
	struct vfsmount *vmnt;
	struct dentry *root_d;
	struct vfsmount *root_m;
	__u32 off;
	int status; /* 0 walking, 1 reached the root, -1 failed */
};

/* One step up the dentry chain (a bpf_loop callback: verified once, not per iteration). */
static long walk_step(__u32 i, void *arg)
{
	struct walk *w = arg;
	struct dentry *d = w->d, *parent, *mnt_root;
	struct vfsmount *vm = w->vmnt;
	const unsigned char *name;
	struct scratch *s;
	__u32 zero = 0;
	long n;

	if (d == w->root_d && vm == w->root_m) {
		w->status = 1;
		return 1;
	}
	mnt_root = BPF_CORE_READ(vm, mnt_root);
	if (d == mnt_root) {
		struct mount *m = (void *)vm - bpf_core_field_offset(struct mount, mnt);
		struct mount *pm = BPF_CORE_READ(m, mnt_parent);

		if (pm == m || !pm) {
			/* The namespace's root mount: the process's root lies elsewhere (an fd
			 * from outside its chroot); the path is still absolute here. */
			w->status = 1;
			return 1;
		}
		w->d = BPF_CORE_READ(m, mnt_mountpoint);
		w->vmnt = (void *)pm + bpf_core_field_offset(struct mount, mnt);
		return 0;
	}
	parent = BPF_CORE_READ(d, d_parent);
	if (!parent || parent == d) {
		w->status = -1; /* detached: a pipe, a socket, an unmounted tree */
		return 1;
	}
	s = bpf_map_lookup_elem(&scratch_map, &zero);
	if (!s || w->off > ENVTRACE_DATA_MASK - ENVTRACE_NAME_MAX) {
		w->status = -1;
		return 1;
	}
	name = BPF_CORE_READ(d, d_name.name);
	n = bpf_probe_read_kernel_str(&s->data[w->off & ENVTRACE_DATA_MASK], ENVTRACE_NAME_MAX,
				      name);
	if (n <= 1) {
		w->status = -1;
		return 1;
	}
	w->off += n;
	w->d = parent;
	return 0;
}

/* Appends the components of (d, mnt) leaf first and the empty terminator; returns the new
 * offset, and whether the walk reached the root in *ok. */
static __always_inline __u32 put_dir(struct scratch *s, __u32 off, struct task_struct *task,
				     struct dentry *d, struct vfsmount *mnt, bool *ok)
{
	struct walk w = {
		.d = d,
		.vmnt = mnt,
		.root_d = BPF_CORE_READ(task, fs, root.dentry),
		.root_m = BPF_CORE_READ(task, fs, root.mnt),
		.off = off,
	};

	*ok = false;
	if (d && mnt) {
		bpf_loop(ENVTRACE_DEPTH_MAX, walk_step, &w, 0);
		*ok = w.status == 1;
	}
	off = w.off;
	if (off > ENVTRACE_DATA_MASK) {
		*ok = false;
		return off;
	}
	s->data[off & ENVTRACE_DATA_MASK] = 0;
	return off + 1;
}

/* Appends path number idx: the user string, then the directory it is relative to. */
static __always_inline __u32 put_path(struct scratch *s, __u32 off, int idx, int dfd,
				      const char *upath, struct task_struct *task)
{
	__u8 pf = 0;
	bool ok = false, absolute = false;
	long n = 1;

	if (off > ENVTRACE_DATA_MASK - 2) {
		s->ev.pflags[idx & 1] = ENVTRACE_PATH_TRUNC;
		return off;
	}
	if (upath) {
		n = bpf_probe_read_user_str(&s->data[off & ENVTRACE_DATA_MASK], ENVTRACE_PATH_MAX,
					    upath);
		if (n <= 0) {
			s->data[off & ENVTRACE_DATA_MASK] = 0;
			n = 1;
			pf |= ENVTRACE_PATH_TRUNC;
		} else if (n >= ENVTRACE_PATH_MAX) {
			pf |= ENVTRACE_PATH_TRUNC;
		}
		absolute = s->data[off & ENVTRACE_DATA_MASK] == '/';
	} else {
		s->data[off & ENVTRACE_DATA_MASK] = 0;
	}
	off += n;
	if (absolute) {
		if (off <= ENVTRACE_DATA_MASK) {
			s->data[off & ENVTRACE_DATA_MASK] = 0;
			off++;
		}
		ok = true;
	} else if (dfd == AT_FDCWD) {
		off = put_dir(s, off, task, BPF_CORE_READ(task, fs, pwd.dentry),
			      BPF_CORE_READ(task, fs, pwd.mnt), &ok);
	} else {
		struct file *f = fd_to_file(task, dfd);

		off = put_dir(s, off, task, f ? BPF_CORE_READ(f, f_path.dentry) : NULL,
			      f ? BPF_CORE_READ(f, f_path.mnt) : NULL, &ok);
		if (!upath)
			pf |= ENVTRACE_PATH_FROM_FD;
	}
	if (ok)
		pf |= ENVTRACE_PATH_RESOLVED;
	s->ev.pflags[idx & 1] = pf;
	return off;
}

static __always_inline void flag_full_diff(__u32 env_id, __u32 reason, long long ret)
{
	struct envtrace_env_stats *st = stats_of(env_id);
	struct scratch *s;

	if (st)
		st->full_diff++;
	s = event_begin(ENVTRACE_EV_FULL_DIFF, reason, env_id);
	if (!s)
		return;
	s->ev.ret = ret;
	emit(s, 0);
}

/* Remembers a call of a watched process until its exit. */
static __always_inline int stash(__u32 op, int dfd0, const void *p0, int dfd1, const void *p1,
				 __u32 flags)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 env = current_env();
	struct pending p = {
		.type = ENVTRACE_EV_FILE,
		.op = op,
		.env_id = env,
		.flags = flags,
		.kind = {ARG_PATH, p1 || dfd1 != AT_FDCWD ? ARG_PATH : ARG_NONE},
		.dfd = {dfd0, dfd1},
		.path = {(__u64)p0, (__u64)p1},
	};

	if (!env)
		return 0;
	if (bpf_map_update_elem(&pendings, &id, &p, BPF_ANY))
		flag_full_diff(env, ENVTRACE_FULL_PENDING_FULL, 0);
	return 0;
}

static __always_inline int stash_fd(__u32 op, int fd, __u32 flags)
{
	if (current_env() &&
	    file_is_internal(fd_to_file((struct task_struct *)bpf_get_current_task(), fd)))
		return 0;
	return stash(op, fd, NULL, AT_FDCWD, NULL, flags);
}

static __always_inline bool creat_failure_may_have_changed(long ret)
{
	switch (-ret) {
	case EEXIST:
	case ENOENT:
	case ENOTDIR:
	case EACCES:
	case EPERM:
	case EROFS:
	case ELOOP:
	case ENAMETOOLONG:
	case EISDIR:
		return false;
	}
	return true;
}

static __always_inline int finish(struct trace_event_raw_sys_exit *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct task_struct *task;
	struct pending *p;
	struct scratch *s;
	long ret = ctx->ret;
	__u32 off = 0;
	int n = 0;

	p = bpf_map_lookup_elem(&pendings, &id);
	if (!p)
		return 0;
	if (p->type == ENVTRACE_EV_FULL_DIFF) {
		if (ret >= 0 || ret < -4095)
			flag_full_diff(p->env_id, p->op, ret);
		goto out;
	}
	if (ret < 0) {
		/* A failed call changed nothing, except an O_CREAT open that failed after it
		 * created the file: resolve its path as given. */
		if (p->kind[0] != ARG_RESULT_FD || !creat_failure_may_have_changed(ret))
			goto out;
		p->kind[0] = ARG_PATH;
	}
	s = event_begin(ENVTRACE_EV_FILE, p->op, p->env_id);
	if (!s)
		goto out;
	s->ev.flags = p->flags;
	s->ev.ret = ret;
	s->ev.aux = p->aux;
	task = (struct task_struct *)bpf_get_current_task();
	if (p->kind[0] == ARG_RESULT_FD) {
		struct file *f = fd_to_file(task, (int)ret);
		bool ok;

		s->data[0] = 0; /* rel "": the components name the file */
		off = put_dir(s, 1, task, f ? BPF_CORE_READ(f, f_path.dentry) : NULL,
			      f ? BPF_CORE_READ(f, f_path.mnt) : NULL, &ok);
		s->ev.pflags[0] = ENVTRACE_PATH_FROM_FD | (ok ? ENVTRACE_PATH_RESOLVED : 0);
		n = 1;
	} else if (p->kind[0] == ARG_PATH) {
		off = put_path(s, off, 0, p->dfd[0], (const char *)p->path[0], task);
		n = 1;
		if (p->kind[1] == ARG_PATH) {
			off = put_path(s, off, 1, p->dfd[1], (const char *)p->path[1], task);
			n = 2;
		}
	}
	s->ev.npaths = n;
	emit(s, off);
out:
	bpf_map_delete_elem(&pendings, &id);
	return 0;
}

#define ARG(i)	((long)ctx->args[i])
#define UPTR(i) ((const void *)ctx->args[i])

#define ENTER(sc) \
	SEC("tp/syscalls/sys_enter_" #sc) int enter_##sc(struct trace_event_raw_sys_enter *ctx)
#define EXIT(sc)                                                                             \
	SEC("tp/syscalls/sys_exit_" #sc) int exit_##sc(struct trace_event_raw_sys_exit *ctx) \
	{                                                                                    \
		return finish(ctx);                                                          \
	}

static __always_inline bool open_changes(__u64 flags)
{
	if ((flags & O_TMPFILE_DIR) != 0)
		return false; /* nameless until linkat(), which is traced */
	return (flags & O_ACCMODE) != 0 || (flags & (O_CREAT | O_TRUNC)) != 0;
}

static __always_inline int stash_open(int dfd, const void *path, __u64 flags)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 env;
	struct pending p = {};

	if (!open_changes(flags))
		return 0;
	env = current_env();
	if (!env)
		return 0;
	p.type = ENVTRACE_EV_FILE;
	p.op = ENVTRACE_OP_OPEN;
	p.env_id = env;
	p.flags = (__u32)flags;
	p.kind[0] = ARG_RESULT_FD;
	p.dfd[0] = dfd;
	p.path[0] = (__u64)path;
	if (bpf_map_update_elem(&pendings, &id, &p, BPF_ANY))
		flag_full_diff(env, ENVTRACE_FULL_PENDING_FULL, 0);
	return 0;
}

ENTER(open)
{
	return stash_open(AT_FDCWD, UPTR(0), ARG(1));
}
EXIT(open)

ENTER(creat)
{
	return stash_open(AT_FDCWD, UPTR(0), O_CREAT | O_TRUNC | 1);
}
EXIT(creat)

ENTER(openat)
{
	return stash_open((int)ARG(0), UPTR(1), ARG(2));
}
EXIT(openat)

ENTER(openat2)
{
	__u64 flags = 0;

	if (bpf_probe_read_user(&flags, sizeof(flags), UPTR(2)))
		flags = O_ACCMODE; /* unreadable: assume the worst */
	return stash_open((int)ARG(0), UPTR(1), flags);
}
EXIT(openat2)

/* The handle names no path we can read: a write open forces a full diff. */
ENTER(open_by_handle_at)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct pending p = {};
	__u32 env;

	if (!open_changes(ARG(2)))
		return 0;
	env = current_env();
	if (!env)
		return 0;
	p.type = ENVTRACE_EV_FULL_DIFF;
	p.op = ENVTRACE_FULL_OPEN_BY_HANDLE;
	p.env_id = env;
	if (bpf_map_update_elem(&pendings, &id, &p, BPF_ANY))
		flag_full_diff(env, ENVTRACE_FULL_PENDING_FULL, 0);
	return 0;
}
EXIT(open_by_handle_at)

ENTER(truncate)
{
	return stash(ENVTRACE_OP_TRUNCATE, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(truncate)

ENTER(ftruncate)
{
	return stash_fd(ENVTRACE_OP_TRUNCATE, (int)ARG(0), 0);
}
EXIT(ftruncate)

ENTER(unlink)
{
	return stash(ENVTRACE_OP_UNLINK, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(unlink)

ENTER(unlinkat)
{
	return stash(ENVTRACE_OP_UNLINK, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, (__u32)ARG(2));
}
EXIT(unlinkat)

ENTER(rmdir)
{
	return stash(ENVTRACE_OP_RMDIR, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(rmdir)

ENTER(rename)
{
	return stash(ENVTRACE_OP_RENAME, AT_FDCWD, UPTR(0), AT_FDCWD, UPTR(1), 0);
}
EXIT(rename)

ENTER(renameat)
{
	return stash(ENVTRACE_OP_RENAME, (int)ARG(0), UPTR(1), (int)ARG(2), UPTR(3), 0);
}
EXIT(renameat)

ENTER(renameat2)
{
	return stash(ENVTRACE_OP_RENAME, (int)ARG(0), UPTR(1), (int)ARG(2), UPTR(3), (__u32)ARG(4));
}
EXIT(renameat2)

ENTER(mkdir)
{
	return stash(ENVTRACE_OP_MKDIR, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(mkdir)

ENTER(mkdirat)
{
	return stash(ENVTRACE_OP_MKDIR, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, 0);
}
EXIT(mkdirat)

ENTER(link)
{
	return stash(ENVTRACE_OP_LINK, AT_FDCWD, UPTR(0), AT_FDCWD, UPTR(1), 0);
}
EXIT(link)

ENTER(linkat)
{
	return stash(ENVTRACE_OP_LINK, (int)ARG(0), UPTR(1), (int)ARG(2), UPTR(3), (__u32)ARG(4));
}
EXIT(linkat)

ENTER(symlink)
{
	return stash(ENVTRACE_OP_SYMLINK, AT_FDCWD, UPTR(1), AT_FDCWD, NULL, 0);
}
EXIT(symlink)

ENTER(symlinkat)
{
	return stash(ENVTRACE_OP_SYMLINK, (int)ARG(1), UPTR(2), AT_FDCWD, NULL, 0);
}
EXIT(symlinkat)

ENTER(chmod)
{
	return stash(ENVTRACE_OP_CHMOD, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(chmod)

ENTER(fchmod)
{
	return stash_fd(ENVTRACE_OP_CHMOD, (int)ARG(0), 0);
}
EXIT(fchmod)

ENTER(fchmodat)
{
	return stash(ENVTRACE_OP_CHMOD, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, 0);
}
EXIT(fchmodat)

ENTER(fchmodat2)
{
	return stash(ENVTRACE_OP_CHMOD, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, (__u32)ARG(3));
}
EXIT(fchmodat2)

ENTER(chown)
{
	return stash(ENVTRACE_OP_CHOWN, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(chown)

ENTER(lchown)
{
	return stash(ENVTRACE_OP_CHOWN, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(lchown)

ENTER(fchown)
{
	return stash_fd(ENVTRACE_OP_CHOWN, (int)ARG(0), 0);
}
EXIT(fchown)

ENTER(fchownat)
{
	return stash(ENVTRACE_OP_CHOWN, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, (__u32)ARG(4));
}
EXIT(fchownat)

ENTER(utimensat)
{
	return stash(ENVTRACE_OP_UTIMES, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, (__u32)ARG(3));
}
EXIT(utimensat)

ENTER(futimesat)
{
	return stash(ENVTRACE_OP_UTIMES, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, 0);
}
EXIT(futimesat)

ENTER(utimes)
{
	return stash(ENVTRACE_OP_UTIMES, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(utimes)

ENTER(utime)
{
	return stash(ENVTRACE_OP_UTIMES, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(utime)

ENTER(setxattr)
{
	return stash(ENVTRACE_OP_XATTR, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(setxattr)

ENTER(lsetxattr)
{
	return stash(ENVTRACE_OP_XATTR, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(lsetxattr)

ENTER(fsetxattr)
{
	return stash_fd(ENVTRACE_OP_XATTR, (int)ARG(0), 0);
}
EXIT(fsetxattr)

ENTER(removexattr)
{
	return stash(ENVTRACE_OP_XATTR, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(removexattr)

ENTER(lremovexattr)
{
	return stash(ENVTRACE_OP_XATTR, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(lremovexattr)

ENTER(fremovexattr)
{
	return stash_fd(ENVTRACE_OP_XATTR, (int)ARG(0), 0);
}
EXIT(fremovexattr)

ENTER(setxattrat)
{
	return stash(ENVTRACE_OP_XATTR, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, (__u32)ARG(2));
}
EXIT(setxattrat)

ENTER(removexattrat)
{
	return stash(ENVTRACE_OP_XATTR, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, (__u32)ARG(2));
}
EXIT(removexattrat)

ENTER(mknod)
{
	return stash(ENVTRACE_OP_MKNOD, AT_FDCWD, UPTR(0), AT_FDCWD, NULL, 0);
}
EXIT(mknod)

ENTER(mknodat)
{
	return stash(ENVTRACE_OP_MKNOD, (int)ARG(0), UPTR(1), AT_FDCWD, NULL, 0);
}
EXIT(mknodat)

/* bind() of a unix socket to a path creates a socket file (relative to the cwd). */
ENTER(bind)
{
	unsigned short family = 0;
	const char *addr = UPTR(1);
	char first = 0;

	if (ARG(2) <= 2 || bpf_probe_read_user(&family, sizeof(family), addr) || family != AF_UNIX)
		return 0;
	/* An abstract address (leading NUL) creates no file. */
	if (bpf_probe_read_user(&first, 1, addr + 2) == 0 && first == 0)
		return 0;
	return stash(ENVTRACE_OP_BIND, AT_FDCWD, addr + 2, AT_FDCWD, NULL, 0);
}
EXIT(bind)

/* io_uring does file I/O and path operations without syscalls we see. */
SEC("tp/syscalls/sys_exit_io_uring_setup")
int exit_io_uring_setup(struct trace_event_raw_sys_exit *ctx)
{
	__u32 env;

	if (ctx->ret < 0)
		return 0;
	env = current_env();
	if (env)
		flag_full_diff(env, ENVTRACE_FULL_IO_URING, ctx->ret);
	return 0;
}

/* A shared mapping of a file opened for writing changes it without syscalls (also after a
 * later mprotect, which needs the fd to have been writable). Not a memfd (file_is_internal):
 * CRIU's parasite maps one ("CRIUMFD", made with memfd_create by a syscall injected into each
 * dumped task, so this runs in the task's context, in its cgroup) at every dump. */
ENTER(mmap)
{
	__u64 id = bpf_get_current_pid_tgid();
	long flags = ARG(3), type = flags & MAP_TYPE;
	struct pending p = {};
	struct file *f;
	__u32 env;

	if ((type != MAP_SHARED && type != MAP_SHARED_V) || (flags & MAP_ANONYMOUS) ||
	    (int)ARG(4) < 0)
		return 0;
	env = current_env();
	if (!env)
		return 0;
	f = fd_to_file((struct task_struct *)bpf_get_current_task(), (int)ARG(4));
	if (f && !(BPF_CORE_READ(f, f_mode) & FMODE_WRITE))
		return 0;
	if (file_is_internal(f))
		return 0;
	p.type = ENVTRACE_EV_FULL_DIFF;
	p.op = ENVTRACE_FULL_MMAP_SHARED;
	p.env_id = env;
	if (bpf_map_update_elem(&pendings, &id, &p, BPF_ANY))
		flag_full_diff(env, ENVTRACE_FULL_PENDING_FULL, 0);
	return 0;
}
EXIT(mmap)

SEC("tp/sched/sched_process_exec")
int on_exec(struct trace_event_raw_sched_process_exec *ctx)
{
	__u32 env = current_env();
	struct envtrace_env_stats *st;
	struct task_struct *task;
	unsigned long start, end;
	__u32 off = 1;
	__u64 len;
	struct scratch *s;
	long n;

	if (!env)
		return 0;
	st = stats_of(env);
	if (st)
		st->execs++;
	s = event_begin(ENVTRACE_EV_EXEC, 0, env);
	if (!s)
		return 0;
	n = bpf_probe_read_kernel_str(&s->data[0], ENVTRACE_PATH_MAX,
				      (void *)ctx + (ctx->__data_loc_filename & 0xffff));
	if (n > 0)
		off = n;
	else
		s->data[0] = 0;
	task = (struct task_struct *)bpf_get_current_task();
	start = BPF_CORE_READ(task, mm, arg_start);
	end = BPF_CORE_READ(task, mm, arg_end);
	len = end > start ? end - start : 0;
	if (len > argv_max)
		len = argv_max;
	if (len > ENVTRACE_ARGV_MAX)
		len = ENVTRACE_ARGV_MAX;
	if (off > ENVTRACE_DATA_MASK)
		return 0;
	barrier_var(len);
	if (len > ENVTRACE_ARGV_MAX)
		len = ENVTRACE_ARGV_MAX;
	if (bpf_probe_read_user(&s->data[off & ENVTRACE_DATA_MASK], len, (void *)start))
		len = 0;
	s->ev.aux = len;
	emit(s, off + len);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	struct scratch *s;
	__u32 env;

	if (child->pid != child->tgid)
		return 0; /* a thread */
	env = current_env();
	if (!env)
		return 0;
	s = event_begin(ENVTRACE_EV_FORK, 0, env);
	if (!s)
		return 0;
	s->ev.aux = child->pid;
	emit(s, 0);
	return 0;
}

SEC("tp/sched/sched_process_exit")
int on_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct task_struct *task;
	struct scratch *s;
	__u32 env;

	/* A thread that exits inside a syscall (exit_group from another thread) never reaches
	 * sys_exit: forget its arguments here. */
	bpf_map_delete_elem(&pendings, &id);
	if ((__u32)id != (__u32)(id >> 32))
		return 0;
	env = current_env();
	if (!env)
		return 0;
	s = event_begin(ENVTRACE_EV_EXIT, 0, env);
	if (!s)
		return 0;
	task = (struct task_struct *)bpf_get_current_task();
	s->ev.aux = BPF_CORE_READ(task, exit_code);
	emit(s, 0);
	return 0;
}

/* --- Process activity (issue 23 item 3; envtrace.h's envtrace_env_stats.activity) ---------
 * A checkpoint keeps the previous process images only when no task of the environment ran
 * user code since they were dumped. User code runs only after a syscall returns (a result, or
 * a signal's handler), after a task is created, or when it was running already; so: count
 * every syscall entry and completion, every signal delivery, every task created or exited.
 * The freezer interrupts a sleeping syscall with -ERESTART* and the kernel re-enters it after
 * the thaw, without user code in between: those returns and re-entries are not activity (a
 * thread's pending restart is remembered between them), or every freeze would look like
 * activity. CRIU's parasite runs syscalls in the dumped tasks while they are ptraced: not
 * counted (a tracee inside the environment runs only when its tracer, counted, lets it). A
 * task that was running user code when frozen is seen by user space instead
 * (/proc/PID/task/TID/syscall is "-1" or "running"). */
#define ERESTARTSYS	      512
#define ERESTARTNOINTR	      513
#define ERESTARTNOHAND	      514
#define ERESTART_RESTARTBLOCK 516

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u8);
} restarts SEC(".maps");

static __always_inline void activity_add(__u32 env)
{
	struct envtrace_env_stats *st = stats_of(env);

	if (st)
		st->activity++;
}

static __always_inline bool current_ptraced(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	return BPF_CORE_READ(task, ptrace) != 0;
}

/* Every syscall of every process on the node passes here twice: raw (tp_btf) tracepoints, which
 * cost a fraction of the classic ones' (no perf record is built). */
SEC("tp_btf/sys_enter")
int BPF_PROG(activity_enter, struct pt_regs *regs, long nr)
{
	__u64 id;
	__u32 env = current_env();

	if (!env || current_ptraced())
		return 0;
	id = bpf_get_current_pid_tgid();
	/* An evicted mark counts a restart as activity: a full dump, never a missed one. */
	if (bpf_map_lookup_elem(&restarts, &id)) {
		bpf_map_delete_elem(&restarts, &id);
		return 0;
	}
	activity_add(env);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(activity_exit, struct pt_regs *regs, long ret)
{
	__u32 env = current_env();
	__u64 id;
	__u8 one = 1;

	if (!env || current_ptraced())
		return 0;
	if (ret == -ERESTARTSYS || ret == -ERESTARTNOINTR || ret == -ERESTARTNOHAND ||
	    ret == -ERESTART_RESTARTBLOCK) {
		id = bpf_get_current_pid_tgid();
		if (bpf_map_update_elem(&restarts, &id, &one, BPF_ANY))
			activity_add(env);
		return 0;
	}
	activity_add(env);
	return 0;
}

SEC("tp/signal/signal_deliver")
int activity_signal(void *ctx)
{
	__u32 env = current_env();
	__u64 id = bpf_get_current_pid_tgid();

	if (!env || current_ptraced())
		return 0;
	/* A handler (or the default action) instead of the restart. */
	bpf_map_delete_elem(&restarts, &id);
	activity_add(env);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(activity_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 env = current_env();

	if (env)
		activity_add(env);
	return 0;
}

SEC("tp/sched/sched_process_exit")
int activity_task_exit(void *ctx)
{
	__u32 env = current_env();
	__u64 id = bpf_get_current_pid_tgid();

	bpf_map_delete_elem(&restarts, &id);
	if (env)
		activity_add(env);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
