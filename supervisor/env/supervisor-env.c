/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/kcmp.h>
#include <linux/magic.h>

#include "log.h"
#include "util.h"
#include "supervisor-env-devices.h"
#include "supervisor-env-disk.h"
#include "supervisor-env-fs.h"
#include "supervisor-env-net.h"
#include "supervisor-env.h"
#include "supervisor-env-image.h"

#define KILL_WAIT_MS 10000

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

static int mkdir_p(const char *path, mode_t mode)
{
	char buf[PATH_MAX];

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++)
		if (*p == '/') {
			*p = '\0';
			if (mkdir(buf, 0755) < 0 && errno != EEXIST)
				return -errno;
			*p = '/';
		}
	if (mkdir(buf, mode) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static int read_or_make_uuid(const char *dir, uint8_t uuid[16])
{
	char path[PATH_MAX];
	_cleanup_close_ int fd = -1;

	snprintf(path, sizeof(path), "%s/uuid", dir);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0)
		return read(fd, uuid, 16) == 16 ? 0 : -EBADMSG;
	if (errno != ENOENT)
		return -errno;
	if (getrandom(uuid, 16, 0) != 16)
		return -EIO;
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, uuid, 16) != 16 || fsync(fd) < 0)
		return -EIO;
	return 0;
}

static int write_small(const char *dir, const char *name, const char *text)
{
	char path[PATH_MAX];
	_cleanup_close_ int fd = -1;
	size_t n = strlen(text);

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, text, n) != (ssize_t)n || fsync(fd) < 0)
		return -EIO;
	return 0;
}

static int read_small(const char *dir, const char *name, char *buf, size_t cap)
{
	char path[PATH_MAX];
	_cleanup_close_ int fd = -1;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, cap - 1);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return 0;
}

static void read_head(struct sv_env *e)
{
	char path[PATH_MAX];
	FILE *f;

	snprintf(path, sizeof(path), "%s/head", e->dir);
	f = fopen(path, "re");
	if (!f)
		return;
	if (!fgets(e->head, sizeof(e->head), f) || !env_id_valid(e->head))
		e->head[0] = '\0';
	fclose(f);
}

static int env_prepare(const struct env_params *p, struct sv_env **ret)
{
	_cleanup_free_ struct sv_env *e = NULL;
	char ckpt[PATH_MAX];
	int r;

	if (!p->id || !env_id_valid(p->id))
		return -EINVAL;
	if (p->cmd && strlen(p->cmd) >= ENV_CMD_MAX)
		return -E2BIG;
	if (!p->state_dir || !p->cgroup_parent || strlen(p->state_dir) > PATH_MAX - 128 ||
	    strlen(p->cgroup_parent) > PATH_MAX - 128)
		return -ENAMETOOLONG;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	snprintf(e->id, sizeof(e->id), "%s", p->id);
	snprintf(e->dir, sizeof(e->dir), "%s/envs/%s", p->state_dir, p->id);
	snprintf(e->root, sizeof(e->root), "%s/root", e->dir);
	snprintf(e->cgroup, sizeof(e->cgroup), "%s/%s", p->cgroup_parent, p->id);
	snprintf(e->cmd, sizeof(e->cmd), "%s", p->cmd ? p->cmd : "");
	snprintf(e->criu, sizeof(e->criu), "%s", p->criu ? p->criu : "criu");
	if (p->base && !realpath(p->base, e->base))
		return -errno;
	e->keep = p->keep ? p->keep : ENV_KEEP_DEFAULT;
	e->ghost_limit = p->ghost_limit ? p->ghost_limit : ENV_GHOST_LIMIT_DEFAULT;
	e->limits = p->limits;
	e->net = p->net > ENV_NET_DEFAULT && p->net < _ENV_NET_MAX ? p->net : ENV_NET_NONE;
	snprintf(e->slirp4netns, sizeof(e->slirp4netns), "%s",
		 p->slirp4netns && *p->slirp4netns ? p->slirp4netns : "slirp4netns");
	/* A user namespace for the network none only: slirp's tap and the host's namespace are
	 * the host user namespace's, and CRIU dumps a tree in a user namespace only when its
	 * network namespace belongs to it (a restore's fresh one for slirp could not) */
	e->userns_base = e->net == ENV_NET_NONE ? p->userns_base : 0;
	env_disk_layout(e);
	snprintf(ckpt, sizeof(ckpt), "%s/ckpt", e->dir);
	r = mkdir_p(e->dir, 0700);
	if (r >= 0)
		r = mkdir_p(ckpt, 0700);
	if (r < 0)
		return log_debug_errno(r, "Failed to create %s: %m", e->dir);
	(void)chmod(e->dir, 0700);
	r = read_or_make_uuid(e->dir, e->uuid);
	if (r < 0)
		return r;
	read_head(e);
	*ret = TAKE_PTR(e);
	return 0;
}

int env_create_stopped(const struct env_params *p, struct sv_env **ret)
{
	struct sv_env *e;
	int r;

	r = env_prepare(p, &e);
	if (r < 0)
		return r;
	/* The layer's tmpfs pages are the environment's memory: past memory_max a big write is
	 * killed before it gets ENOSPC. */
	if (e->limits.disk && e->limits.memory && e->limits.disk >= e->limits.memory)
		log_warning("Environment %s: its disk limit (%" PRIu64 " bytes) is not below its "
			    "memory limit (%" PRIu64 " bytes), which its writable layer counts "
			    "against: a large write is OOM-killed rather than refused with ENOSPC.",
			    e->id, e->limits.disk, e->limits.memory);
	r = env_disk_mount(e);
	if (r < 0)
		goto fail;
	if ((mkdir(e->upper, 0755) < 0 && errno != EEXIST) ||
	    (mkdir(e->work, 0700) < 0 && errno != EEXIST) ||
	    (mkdir(e->root, 0755) < 0 && errno != EEXIST)) {
		r = -errno;
		goto fail;
	}
	if (p->image) {
		char why[512] = "";

		r = env_image_attach(e, p->state_dir, p->image, why, sizeof(why));
		if (r < 0) {
			if (p->error && p->error_cap)
				snprintf(p->error, p->error_cap, "%s", why);
			goto fail;
		}
	}
	r = mkdir_p(p->cgroup_parent, 0755);
	if (r < 0)
		goto fail;
	if (mkdir(e->cgroup, 0755) < 0) {
		r = log_debug_errno(-errno, "Failed to create cgroup %s: %m", e->cgroup);
		goto fail;
	}
	r = env_limits_setup(e);
	if (r >= 0)
		r = env_devices_setup(e);
	if (r < 0) {
		(void)rmdir(e->cgroup);
		env_limits_remove(e);
		env_devices_remove(e);
		goto fail;
	}
	*ret = e;
	return 0;
fail:
	env_disk_unmount(e);
	env_image_forget(e, p);
	free(e);
	return r;
}

void env_write_identity(const struct sv_env *e)
{
	char limits[128];

	/* What a restarted supervisor needs to take the environment back (env_reopen). */
	(void)write_small(e->dir, "base", e->base);
	(void)write_small(e->dir, "cmd", e->cmd);
	snprintf(limits, sizeof(limits), "%" PRIu64 " %" PRIu64 " %" PRIu32 " %" PRIu64,
		 e->limits.pids, e->limits.memory, e->limits.cpu_millis, e->limits.disk);
	(void)write_small(e->dir, "limits", limits);
	(void)write_small(e->dir, "net", env_net_to_string(e->net));
	/* its user namespace's base, 0 without: its layers were made for it */
	snprintf(limits, sizeof(limits), "%" PRIu32, e->userns_base);
	(void)write_small(e->dir, "userns", limits);
}

int env_create(const struct env_params *p, struct sv_env **ret)
{
	struct sv_env *e;
	struct stat st;
	int r;

	if (!p->image && (!p->base || stat(p->base, &st) < 0 || !S_ISDIR(st.st_mode)))
		return -ENOTDIR;
	r = env_create_stopped(p, &e);
	if (r < 0)
		return r;
	r = env_mount_overlay(e);
	if (r < 0)
		goto fail_cg;
	r = env_launch(e);
	if (r < 0)
		goto fail_mount;
	env_write_identity(e);
	*ret = e;
	return 0;
fail_mount:
	(void)umount2(e->root, MNT_DETACH);
fail_cg:
	(void)rmdir(e->cgroup);
	env_limits_remove(e);
	env_devices_remove(e);
	env_disk_unmount(e);
	if (p->error && p->error_cap && !p->error[0] && e->error[0])
		snprintf(p->error, p->error_cap, "%s", e->error);
	env_image_forget(e, p);
	free(e);
	return r;
}

/* The overlay mounted at root: its upperdir and workdir, from our mount table. */
static int overlay_dirs(const char *root, char *upper, char *work, char *lower)
{
	_cleanup_free_ char *line = NULL;
	size_t cap = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");
	int r = -ENOENT;

	if (!f)
		return -errno;
	while (getline(&line, &cap, f) > 0) {
		char mnt[PATH_MAX], fstype[64], *sep, *opt, *save = NULL;

		if (sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 || strcmp(mnt, root) != 0)
			continue;
		sep = strstr(line, " - ");
		if (!sep || sscanf(sep, " - %63s", fstype) != 1 || strcmp(fstype, "overlay") != 0) {
			r = -EMEDIUMTYPE;
			continue;
		}
		sep = strchr(sep + 3, ' ');
		sep = sep ? strchr(sep + 1, ' ') : NULL;
		if (!sep)
			continue;
		for (opt = strtok_r(sep + 1, ",\n", &save); opt;
		     opt = strtok_r(NULL, ",\n", &save)) {
			if (strncmp(opt, "upperdir=", 9) == 0)
				snprintf(upper, PATH_MAX, "%s", opt + 9);
			else if (strncmp(opt, "workdir=", 8) == 0)
				snprintf(work, PATH_MAX, "%s", opt + 8);
			else if (strncmp(opt, "lowerdir=", 9) == 0)
				snprintf(lower, PATH_MAX, "%s", opt + 9);
		}
		/* Belayer's own overlays name their layers by the mounting process's fds (so that
		 * the agent's mount table names no host path): nothing to adopt them by. */
		r = upper[0] && work[0] && lower[0] && !strchr(lower, ':') &&
				    strncmp(upper, "/proc/", 6) != 0
			    ? 0
			    : -EMEDIUMTYPE;
	}
	fclose(f);
	return r;
}

/* Calls fn (NULL: none) for every process of cgroup and its descendants; stops at fn's first
 * negative return and returns it. Otherwise returns how many processes there were. */
static int walk_procs(const char *cgroup, unsigned depth, int (*fn)(pid_t pid, void *userdata),
		      void *userdata)
{
	char path[PATH_MAX];
	int n = 0, pid, r = 0;
	FILE *f;
	DIR *d;
	struct dirent *de;

	if (depth > 32)
		return -ELOOP;
	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (r >= 0 && fscanf(f, "%d", &pid) == 1) {
		n++;
		if (fn)
			r = fn((pid_t)pid, userdata);
	}
	fclose(f);
	if (r < 0)
		return r;
	d = opendir(cgroup);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		int k;

		if (de->d_type != DT_DIR || de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", cgroup, de->d_name);
		k = walk_procs(path, depth + 1, fn, userdata);
		if (k < 0 && fn && k != -ENOENT) {
			r = k;
			break;
		}
		if (k > 0)
			n += k;
	}
	closedir(d);
	return r < 0 ? r : n;
}

int env_count_procs(const struct sv_env *e)
{
	return walk_procs(e->cgroup, 0, NULL, NULL);
}

/* The namespaces a restorable tree shares with its init. cgroup, net and user are checked
 * only when the init has its own (an environment shares the host's otherwise, and a process
 * may have made a nested one). */
static const struct {
	const char *name;
	bool if_own;
} env_ns[] = {
	{"pid", false},	 {"mnt", false},   {"uts", false}, {"ipc", false},
	{"time", false}, {"cgroup", true}, {"net", true},  {"user", true},
};

struct ns_check {
	struct stat ns[ARRAY_SIZE(env_ns)];
	bool want[ARRAY_SIZE(env_ns)];
	char cgroups[2048]; /* the init's /proc/PID/cgroup: every hierarchy's cgroup */
	char *why;
	size_t cap;
};

/* /proc/pid/cgroup into buf ("" when unreadable). */
static void read_cgroups(pid_t pid, char *buf, size_t cap)
{
	char path[64];
	_cleanup_close_ int fd = -1;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, buf, cap - 1) : -1;
	buf[n > 0 ? n : 0] = '\0';
}

static int ns_stat(pid_t pid, const char *name, struct stat *ret)
{
	char path[64];

	if (pid > 0)
		snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)pid, name);
	else
		snprintf(path, sizeof(path), "/proc/self/ns/%s", name);
	return stat(path, ret) < 0 ? -errno : 0;
}

static void proc_comm(pid_t pid, char *buf, size_t cap)
{
	char path[64];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	f = fopen(path, "re");
	if (!f || !fgets(buf, (int)cap, f))
		snprintf(buf, cap, "?");
	buf[strcspn(buf, "\n")] = '\0';
	if (f)
		fclose(f);
}

static int ns_check_one(pid_t pid, void *userdata)
{
	struct ns_check *c = userdata;

	for (size_t i = 0; i < ARRAY_SIZE(env_ns); i++) {
		struct stat st;
		char comm[32];

		if (!c->want[i])
			continue;
		/* Gone meanwhile (a zombie has no namespaces): nothing of it is dumped. */
		if (ns_stat(pid, env_ns[i].name, &st) < 0)
			return 0;
		if (st.st_dev == c->ns[i].st_dev && st.st_ino == c->ns[i].st_ino)
			continue;
		proc_comm(pid, comm, sizeof(comm));
		snprintf(c->why, c->cap,
			 "pid %d (%s) is not in the environment's %s namespace: it joined from "
			 "outside without it (enter with nsenter -a); a checkpoint would not "
			 "restore",
			 (int)pid, comm, env_ns[i].name);
		return -ENOTRECOVERABLE;
	}
	/* The limits' v1 cgroups too: the cgroup namespace's root in each hierarchy is the
	 * init's cgroup there, and CRIU cannot dump a process outside it. */
	{
		char cg[sizeof(c->cgroups)], comm[32];

		read_cgroups(pid, cg, sizeof(cg));
		if (cg[0] && strcmp(cg, c->cgroups) != 0) {
			proc_comm(pid, comm, sizeof(comm));
			snprintf(c->why, c->cap,
				 "pid %d (%s) is not in all of the environment's cgroups (the "
				 "limits' v1 ones too): it joined from outside without them; "
				 "a checkpoint would not dump",
				 (int)pid, comm);
			return -ENOTRECOVERABLE;
		}
	}
	return 0;
}

/* The parent (PPid in /proc/pid/status) of pid, or -errno. */
static pid_t parent_of(pid_t pid)
{
	char path[64], line[256];
	_cleanup_fclose_ FILE *f = NULL;
	int ppid = -1;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "PPid: %d", &ppid) == 1)
			break;
	return ppid > 0 ? (pid_t)ppid : -ESRCH;
}

struct vfork_find {
	pid_t child, parent;
};

static int in_vfork(pid_t pid, void *userdata)
{
	struct vfork_find *v = userdata;
	pid_t ppid = parent_of(pid);

	/* Another process (not a thread: cgroup.procs lists thread groups) on its parent's
	 * address space is a vfork child before its exec or exit. A parent that is not in the
	 * environment is not dumped. */
	if (ppid <= 0 || syscall(SYS_kcmp, pid, ppid, KCMP_VM, 0, 0) != 0)
		return 0;
	v->child = pid;
	v->parent = ppid;
	return -EBUSY;
}

int env_vfork_pending(const struct sv_env *e, char *why, size_t cap)
{
	struct vfork_find v = {0};
	int r = walk_procs(e->cgroup, 0, in_vfork, &v);

	if (r != -EBUSY)
		return r < 0 ? r : 0;
	snprintf(why, cap, "process %d is a vfork child of %d that has not exec'd yet",
		 (int)v.child, (int)v.parent);
	return -EBUSY;
}

int env_check_namespaces(const struct sv_env *e, char *why, size_t cap)
{
	struct ns_check c = {.why = why, .cap = cap};
	int r;

	if (e->pid <= 0)
		return -ESRCH;
	for (size_t i = 0; i < ARRAY_SIZE(env_ns); i++) {
		struct stat self;

		r = ns_stat(e->pid, env_ns[i].name, &c.ns[i]);
		if (r == -ENOENT && strcmp(env_ns[i].name, "time") == 0)
			continue; /* a kernel without time namespaces */
		if (r < 0)
			return log_debug_errno(r, "Failed to read %s's %s namespace: %m", e->id,
					       env_ns[i].name);
		c.want[i] = !env_ns[i].if_own || ns_stat(0, env_ns[i].name, &self) < 0 ||
			    self.st_dev != c.ns[i].st_dev || self.st_ino != c.ns[i].st_ino;
	}
	read_cgroups(e->pid, c.cgroups, sizeof(c.cgroups));
	r = walk_procs(e->cgroup, 0, ns_check_one, &c);
	return r < 0 ? r : 0;
}

struct root_find {
	pid_t pid;
};

static int root_is(pid_t pid, void *userdata)
{
	return pid == ((struct root_find *)userdata)->pid ? -EEXIST : 0;
}

int env_check_root(const struct sv_env *e, pid_t pid, char *why, size_t cap)
{
	_cleanup_close_ int pidfd = -1;
	struct root_find f = {.pid = pid};
	siginfo_t si = {0};
	int r;

	/* Our child: its pid cannot be reused before we reap it, so the pidfd is of the root. */
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0 ||
	    waitid((idtype_t)P_PIDFD, (id_t)pidfd, &si, WEXITED | WNOHANG | WNOWAIT) < 0 ||
	    si.si_pid != 0) {
		snprintf(why, cap, "the restored root (pid %d) is not running", (int)pid);
		return -ESRCH;
	}
	r = walk_procs(e->cgroup, 0, root_is, &f);
	if (r == -EEXIST)
		return 0;
	snprintf(why, cap, "the restored root (pid %d) is not in %s", (int)pid, e->cgroup);
	return r < 0 ? r : -ESRCH;
}

/* The cgroup an adopted environment is killed, frozen and restored through: a canonical,
 * absolute cgroup v2 directory below its hierarchy's root (never the root: cgroup.kill there
 * would kill the host), holding pid. Anything else would have later paths built on an
 * unchecked component. */
static int adopt_cgroup_check(const char *cgroup, pid_t pid)
{
	char canon[PATH_MAX], parent[PATH_MAX + 4];
	struct stat st, pst;
	struct statfs sf;
	int r;

	if (!cgroup || cgroup[0] != '/' || !realpath(cgroup, canon) || strcmp(canon, cgroup) != 0)
		return log_debug_errno(-EINVAL, "Cgroup \"%s\" is not a canonical absolute path.",
				       cgroup ? cgroup : "");
	if (statfs(cgroup, &sf) < 0 || sf.f_type != CGROUP2_SUPER_MAGIC)
		return log_debug_errno(-ENOTDIR, "%s is not a cgroup v2 directory.", cgroup);
	snprintf(parent, sizeof(parent), "%s/..", cgroup);
	if (stat(cgroup, &st) < 0 || stat(parent, &pst) < 0)
		return -errno;
	if (st.st_dev != pst.st_dev)
		return log_debug_errno(-EPERM, "%s is the root of its cgroup hierarchy.", cgroup);
	{
		struct root_find f = {.pid = pid};

		r = walk_procs(cgroup, 0, root_is, &f);
	}
	if (r != -EEXIST)
		return log_debug_errno(-ESRCH, "Process %d is not in cgroup %s.", (int)pid, cgroup);
	return 0;
}

int env_adopt(const struct env_params *p, const char *cgroup, const char *root, pid_t pid,
	      struct sv_env **ret)
{
	struct sv_env *e;
	char upper[PATH_MAX] = "", work[PATH_MAX] = "", lower[PATH_MAX] = "";
	char rootp[PATH_MAX];
	int r;

	if (!realpath(root, rootp))
		return -errno;
	r = adopt_cgroup_check(cgroup, pid);
	if (r < 0)
		return r;
	r = overlay_dirs(rootp, upper, work, lower);
	if (r < 0)
		return log_debug_errno(r, "%s is not a single-lower overlay mount: %m", rootp);
	r = env_prepare(p, &e);
	if (r < 0)
		return r;
	snprintf(e->root, sizeof(e->root), "%s", rootp);
	snprintf(e->upper, sizeof(e->upper), "%s", upper);
	snprintf(e->work, sizeof(e->work), "%s", work);
	snprintf(e->base, sizeof(e->base), "%s", lower);
	snprintf(e->cgroup, sizeof(e->cgroup), "%s", cgroup);
	e->pid = pid;
	e->adopted = true;
	e->userns_base = 0; /* its namespaces are its runtime's, whatever [env] userns says */
	*ret = e;
	return 0;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Waits (bounded) for "populated 0" in cgroup.events: poll() wakes on its changes. */
static int wait_unpopulated(const char *cgroup)
{
	char path[PATH_MAX], buf[256];
	uint64_t deadline = mono_ms() + KILL_WAIT_MS;
	_cleanup_close_ int fd = -1;

	snprintf(path, sizeof(path), "%s/cgroup.events", cgroup);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	for (;;) {
		ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
		uint64_t now = mono_ms();

		if (n < 0)
			return -errno;
		buf[n] = '\0';
		if (strstr(buf, "populated 0"))
			return 0;
		if (now >= deadline)
			return -ETIMEDOUT;
		(void)poll(&(struct pollfd){.fd = fd, .events = POLLPRI}, 1,
			   (int)(deadline - now < 100 ? deadline - now : 100));
	}
}

int env_kill(struct sv_env *e)
{
	char path[PATH_MAX];
	int r;

	/* Its network goes with it (a restore or a rebuild starts another helper). */
	env_net_stop(e);
	snprintf(path, sizeof(path), "%s/cgroup.kill", e->cgroup);
	r = env_write_file(path, "1");
	if (r < 0 && r != -ENOENT)
		return log_debug_errno(r, "Failed to kill %s: %m", e->cgroup);
	r = wait_unpopulated(e->cgroup);
	if (r < 0)
		return log_debug_errno(r, "Environment %s did not die: %m", e->id);
	if (e->pid > 0 && !e->adopted) {
		/* Our child, not reaped, so the pid is still its: killed even when it is not in
		 * the cgroup (a restore that put it elsewhere), so that the wait cannot hang. */
		(void)kill(e->pid, SIGKILL);
		(void)waitpid(e->pid, NULL, 0);
	}
	e->pid = 0;
	return 0;
}

static void wipe_dir(const char *path)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd >= 0)
		(void)env_fs_wipe(fd);
}

void env_destroy(struct sv_env *e)
{
	if (!e)
		return;
	/* An adopted environment is its runtime's: forgotten, not killed. */
	if (!e->adopted) {
		static const char *const identity[] = {"uuid",	 "base", "cmd",	  "head",
						       "limits", "net",	 "image", "userns"};

		(void)env_kill(e);
		if (umount2(e->root, 0) < 0 && errno != EINVAL)
			(void)umount2(e->root, MNT_DETACH);
		(void)rmdir(e->cgroup);
		env_limits_remove(e);
		env_devices_remove(e);
		/* Its writable layer goes with it: an environment created later under the same id
		 * starts from its base. */
		wipe_dir(e->upper);
		wipe_dir(e->work);
		env_disk_unmount(e);
		/* Forgotten for good: not taken back after a restart, and an environment created
		 * later under the same id gets a new identity, so these checkpoints (kept on disk)
		 * are foreign to it. */
		for (size_t i = 0; i < ARRAY_SIZE(identity); i++) {
			char path[PATH_MAX];

			snprintf(path, sizeof(path), "%s/%s", e->dir, identity[i]);
			(void)unlink(path);
		}
	}
	env_manifest_finish(&e->head_index);
	free(e);
}

int env_fresh_cgroup(struct sv_env *e)
{
	int r;

	if (rmdir(e->cgroup) < 0 && errno != ENOENT)
		return -errno;
	if (mkdir(e->cgroup, 0755) < 0)
		return -errno;
	/* its limits and device rules again (v2: the new directory has none; v1: CRIU and the
	 * launch join them); an adopted environment keeps the devices its runtime gave it */
	r = env_limits_setup(e);
	return r < 0 || e->adopted ? r : env_devices_setup(e);
}

int env_rebuild(struct sv_env *e)
{
	_cleanup_close_ int upper = -1, work = -1;
	int r;

	if (e->adopted)
		return -EOPNOTSUPP;
	r = env_kill(e);
	if (r < 0)
		return r;
	if (umount2(e->root, 0) < 0 && errno != EINVAL)
		return -errno;
	upper = open(e->upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	work = open(e->work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (upper < 0 || work < 0)
		return -errno;
	r = env_fs_wipe(upper);
	if (r >= 0)
		r = env_fs_wipe(work);
	if (r >= 0)
		r = env_mount_overlay(e);
	if (r >= 0)
		r = env_fresh_cgroup(e);
	if (r >= 0)
		r = env_launch(e);
	if (r >= 0) {
		e->head[0] = '\0';
		env_manifest_finish(&e->head_index);
		e->head_valid = false;
	}
	return r;
}

/* The process of the cgroup that is pid 1 of its namespace (NSpid ends in 1). */
static pid_t find_init(const char *cgroup)
{
	char path[PATH_MAX], line[256];
	pid_t found = 0;
	FILE *procs;
	int pid;

	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup);
	procs = fopen(path, "re");
	if (!procs)
		return 0;
	while (!found && fscanf(procs, "%d", &pid) == 1) {
		FILE *st;

		snprintf(path, sizeof(path), "/proc/%d/status", pid);
		st = fopen(path, "re");
		while (st && fgets(line, sizeof(line), st))
			if (strncmp(line, "NSpid:", 6) == 0) {
				char *last = strrchr(line, '\t');

				if (last && strtol(last + 1, NULL, 10) == 1 &&
				    strchr(line + 7, '\t'))
					found = pid;
			}
		if (st)
			fclose(st);
	}
	fclose(procs);
	return found;
}

int env_reopen(const struct env_params *p, struct sv_env **ret)
{
	char path[PATH_MAX];
	struct sv_env *e;
	int r;

	r = env_prepare(p, &e);
	if (r < 0)
		return r;
	if (read_small(e->dir, "base", e->base, sizeof(e->base)) < 0 || !e->base[0]) {
		free(e);
		return -ENOENT; /* not made by env_create (adopted, or older): not ours to take */
	}
	(void)read_small(e->dir, "cmd", e->cmd, sizeof(e->cmd));
	if (strncmp(e->base, "image:", 6) == 0 && env_image_reopen(e) < 0) {
		free(e);
		return -ENOENT; /* its image record is gone: not one env_create finished */
	}
	/* its own limits (a create's may differ from the configuration's) */
	{
		char limits[128];
		struct env_limits l = {0};

		/* the disk limit is the fourth; an environment whose file lacks it was made
		 * before disk limits existed: its layer is on the state directory */
		if (read_small(e->dir, "limits", limits, sizeof(limits)) >= 0 &&
		    sscanf(limits, "%" SCNu64 " %" SCNu64 " %" SCNu32 " %" SCNu64, &l.pids,
			   &l.memory, &l.cpu_millis, &l.disk) >= 3)
			e->limits = l;
		else
			e->limits.disk = 0;
		env_disk_layout(e);
		/* its own user namespace, or none (whatever [env] userns says now; none when
		 * made before the option was) */
		e->userns_base = 0;
		if (read_small(e->dir, "userns", limits, sizeof(limits)) >= 0)
			(void)sscanf(limits, "%" SCNu32, &e->userns_base);
	}
	/* its network (none for one created before networks were kept) */
	{
		char net[16];
		enum env_net n;

		if (read_small(e->dir, "net", net, sizeof(net)) >= 0 &&
		    env_net_from_string(net, &n) >= 0 && n != ENV_NET_DEFAULT)
			e->net = n;
		else
			e->net = ENV_NET_NONE;
	}
	/* A supervisor that died inside a checkpoint left the environment frozen. */
	snprintf(path, sizeof(path), "%s/cgroup.freeze", e->cgroup);
	if (access(path, F_OK) == 0)
		(void)env_write_file(path, "0");
	e->pid = find_init(e->cgroup);
	/* The writable layer's tmpfs is mounted in our mount namespace, which a supervisor
	 * restarted in a namespace of its own (systemd's ProtectSystem) or a reboot does not
	 * have: a running environment's layer is then out of reach (a checkpoint would see it
	 * empty), so the environment stops and comes back from its head, by a restore. */
	if (!env_disk_mounted(e)) {
		if (e->pid > 0) {
			log_warning("Environment %s's writable layer (a tmpfs: disk limit) is not "
				    "mounted here: stopped, restore it from its head.",
				    e->id);
			(void)env_kill(e);
		}
		r = env_disk_mount(e);
		if (r < 0) {
			free(e);
			return r;
		}
	}
	/* Attached to the cgroup, the device program outlives us; a cgroup made by someone
	 * else since (or an older Belayer's) gets it now. */
	if (e->pid > 0) {
		r = env_devices_ensure(e);
		if (r < 0)
			log_warning_errno(
				r, "Environment %s has no device program on %s: %m, ignoring.",
				e->id, e->cgroup);
	}
	/* The previous supervisor's slirp4netns exited with it (its --exit-fd): another one. */
	if (e->pid > 0 && e->net == ENV_NET_SLIRP) {
		_cleanup_close_ int netns = -1;

		snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)e->pid);
		netns = open(path, O_RDONLY | O_CLOEXEC);
		if (netns < 0 || env_net_start(e, netns) < 0)
			log_warning(
				"Environment %s has no egress until it is restored: %s, ignoring.",
				e->id, e->error[0] ? e->error : "its network namespace is gone");
		e->error[0] = '\0';
	}
	*ret = e;
	return 0;
}

int env_walk_procs(const struct sv_env *e, int (*fn)(pid_t pid, void *userdata), void *userdata)
{
	return walk_procs(e->cgroup, 0, fn, userdata);
}
