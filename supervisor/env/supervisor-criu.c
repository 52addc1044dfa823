/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criu/criu.h>

#include "log.h"
#include "util.h"
#include "supervisor-criu-watchdog.h"
#include "supervisor-criu.h"

#define CRIU_LOG_LEVEL 4

const char *sv_criu_binary(const char *configured)
{
	const char *env = secure_getenv("BELAYER_CRIU");

	if (configured && *configured)
		return access(configured, X_OK) == 0 ? configured : NULL;
	if (env && *env)
		return access(env, X_OK) == 0 ? env : NULL;
	if (access("/usr/local/sbin/criu", X_OK) == 0)
		return "/usr/local/sbin/criu";
	return "criu"; /* libcriu execs it through PATH; a missing one fails at the call */
}

static int opts_new(const char *binary, criu_opts **ret)
{
	criu_opts *o = NULL;
	int r;

	r = criu_local_init_opts(&o);
	if (r < 0)
		return r;
	r = criu_local_set_service_binary(o, binary);
	if (r < 0) {
		criu_local_free_opts(o);
		return r;
	}
	*ret = o;
	return 0;
}

int sv_criu_config_init(const char *dir)
{
	static const char text[] = "# Written by belayer-supervisor: see supervisor-criu.h.\n"
				   "network-lock skip\n";
	static char ours[PATH_MAX]; /* what this process set last */
	const char *theirs = getenv("CRIU_CONFIG_FILE");
	char path[PATH_MAX], tmp[PATH_MAX + 8];
	_cleanup_close_ int fd = -1;

	if (theirs && strcmp(theirs, ours) != 0) {
		log_info("CRIU_CONFIG_FILE is set (%s): environments' checkpoints need "
			 "\"network-lock skip\" in it, or iptables on the host.",
			 theirs);
		return 0;
	}
	if (snprintf(path, sizeof(path), "%s/criu.conf", dir) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return log_error_errno(-errno, "Failed to create %s: %m", dir);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0 || write(fd, text, sizeof(text) - 1) != (ssize_t)sizeof(text) - 1 ||
	    rename(tmp, path) < 0)
		return log_error_errno(-errno, "Failed to write %s: %m", path);
	if (setenv("CRIU_CONFIG_FILE", path, 1) < 0)
		return -errno;
	snprintf(ours, sizeof(ours), "%s", path);
	return 0;
}

int sv_criu_version(const char *binary)
{
	criu_opts *o;
	int r;

	r = opts_new(binary, &o);
	if (r < 0)
		return r;
	r = criu_local_get_version(o);
	criu_local_free_opts(o);
	return r;
}

/* The device nodes an environment in a user namespace has bind-mounted from the host. */
static const char *const dev_binds[] = {"null", "zero", "full", "random", "urandom", "tty"};

static int add_dev_binds(criu_opts *o, bool dump)
{
	char ext[64];
	int r = 0;

	for (size_t i = 0; i < ARRAY_SIZE(dev_binds) && r >= 0; i++) {
		if (dump)
			snprintf(ext, sizeof(ext), "mnt[/dev/%s]:dev-%s", dev_binds[i],
				 dev_binds[i]);
		else
			snprintf(ext, sizeof(ext), "mnt[dev-%s]:/dev/%s", dev_binds[i],
				 dev_binds[i]);
		r = criu_local_add_external(o, ext);
	}
	return r;
}

/* What a dump and a pre-dump share: the tree, the images, the freezer, the externals. */
static int dump_opts_new(const char *binary, pid_t pid, const char *freeze_cgroup, int images_fd,
			 bool leave_running, uint32_t ghost_limit, uint64_t netns_ino,
			 bool dev_bind, const char *const *dump_ctls, const char *log,
			 criu_opts **ret)
{
	char net[64];

	criu_opts *o;
	int r;

	r = opts_new(binary, &o);
	if (r < 0)
		return r;
	criu_local_set_pid(o, pid);
	criu_local_set_images_dir_fd(o, images_fd);
	criu_local_set_leave_running(o, leave_running);
	criu_local_set_log_level(o, CRIU_LOG_LEVEL);
	criu_local_set_file_locks(o, true);
	if (ghost_limit)
		criu_local_set_ghost_limit(o, ghost_limit);
	/* A file held open whose path no longer leads to it but whose fstat says it is linked:
	 * an overlay's base file replaced or deleted (the overlay reports the lower inode's
	 * nlink). Without --link-remap CRIU refuses it outright; with it, CRIU's linkat() into
	 * the overlay fails with ENOENT and CRIU saves the file as a ghost in the images (its
	 * overlayfs fallback, up to ghost_limit), as an unlinked one. */
	criu_local_set_link_remap(o, true);
	r = criu_local_set_log_file(o, log);
	if (r >= 0 && freeze_cgroup)
		r = criu_local_set_freeze_cgroup(o, freeze_cgroup);
	for (size_t i = 0; r >= 0 && dump_ctls && dump_ctls[i]; i++)
		r = criu_local_add_cg_dump_controller(o, dump_ctls[i]);
	if (r >= 0)
		r = criu_local_add_external(o, "mnt[/usr]:usr");
	if (r >= 0)
		r = criu_local_add_external(o, "mnt[/etc]:etc");
	if (r >= 0 && netns_ino) {
		snprintf(net, sizeof(net), "net[%" PRIu64 "]:" SV_CRIU_NETNS_KEY, netns_ino);
		r = criu_local_add_external(o, net);
	}
	if (r >= 0 && dev_bind)
		r = add_dev_binds(o, true);
	if (r < 0) {
		criu_local_free_opts(o);
		return r;
	}
	*ret = o;
	return 0;
}

/* Runs CRIU's dump or pre-dump with o (freed), under the watchdog. */
static int dump_run(criu_opts *o, pid_t pid, const char *freeze_cgroup, bool pre)
{
	struct sv_criu_watchdog *w =
		freeze_cgroup ? sv_criu_watchdog_start(pid, freeze_cgroup) : NULL;
	int r = pre ? criu_local_pre_dump(o) : criu_local_dump(o);

	if (sv_criu_watchdog_stop(w) && r >= 0)
		r = -ECHILD; /* cannot be: a dump whose CRIU was killed failed */
	criu_local_free_opts(o);
	return r;
}

/* libcriu returns its own negative codes (-EBADE and friends) for its failures; they are
 * passed on as they are: every one is negative and distinct from success. */
int sv_criu_dump(const char *binary, pid_t pid, const char *freeze_cgroup, int images_fd,
		 bool leave_running, uint32_t ghost_limit, uint64_t netns_ino, bool dev_bind,
		 const char *const *dump_ctls, const char *parent_images)
{
	criu_opts *o;
	int r;

	r = dump_opts_new(binary, pid, freeze_cgroup, images_fd, leave_running, ghost_limit,
			  netns_ino, dev_bind, dump_ctls, "dump.log", &o);
	if (r < 0)
		return r;
	/* CRIU's memory changes tracking: the pages unchanged since the pre-dump in
	 * parent_images are not copied again (CRIU links the two by a "parent" symlink in the
	 * images; the path is relative to them, criu.org/Directories) */
	if (parent_images) {
		criu_local_set_track_mem(o, true);
		r = criu_local_set_parent_images(o, parent_images);
		if (r < 0) {
			criu_local_free_opts(o);
			return r;
		}
	}
	r = dump_run(o, pid, freeze_cgroup, false);
	if (r < 0)
		return log_debug_errno(r, "CRIU dump of pid %d failed (dump.log in the images).",
				       (int)pid);
	return 0;
}

int sv_criu_pre_dump(const char *binary, pid_t pid, const char *freeze_cgroup, int images_fd,
		     uint64_t netns_ino, bool dev_bind, const char *const *dump_ctls)
{
	criu_opts *o;
	int r;

	/* a pre-dump always leaves the tree running; a ghost file is the final dump's */
	r = dump_opts_new(binary, pid, freeze_cgroup, images_fd, true, 0, netns_ino, dev_bind,
			  dump_ctls, "pre-dump.log", &o);
	if (r < 0)
		return r;
	criu_local_set_track_mem(o, true);
	r = dump_run(o, pid, freeze_cgroup, true);
	if (r < 0)
		return log_debug_errno(r,
				       "CRIU pre-dump of pid %d failed (pre-dump.log in the "
				       "images).",
				       (int)pid);
	return 0;
}

int sv_criu_restore(const char *binary, int images_fd, const char *root, int netns_fd,
		    const char *const *cg_roots, bool dev_bind, pid_t *ret_pid)
{
	criu_opts *o;
	int r, inherit = -1;

	r = opts_new(binary, &o);
	if (r < 0)
		return r;
	criu_local_set_images_dir_fd(o, images_fd);
	criu_local_set_log_level(o, CRIU_LOG_LEVEL);
	criu_local_set_file_locks(o, true);
	r = criu_local_set_log_file(o, "restore.log");
	if (r >= 0)
		r = criu_local_set_root(o, root);
	if (r >= 0)
		r = criu_local_add_external(o, "mnt[usr]:/usr");
	if (r >= 0)
		r = criu_local_add_external(o, "mnt[etc]:/etc");
	if (r >= 0 && dev_bind)
		r = add_dev_binds(o, false);
	for (size_t i = 0; r >= 0 && cg_roots && cg_roots[i] && cg_roots[i + 1]; i += 2)
		r = criu_local_add_cg_root(o, cg_roots[i], cg_roots[i + 1]);
	/* CRIU (libcriu's child) inherits it across its exec: a copy without O_CLOEXEC for the
	 * call's length (another child started meanwhile gets it too, a harmless namespace fd) */
	if (r >= 0 && netns_fd >= 0) {
		inherit = fcntl(netns_fd, F_DUPFD, 3);
		r = inherit < 0 ? -errno : criu_local_add_inherit_fd(o, inherit, SV_CRIU_NETNS_KEY);
	}
	if (r >= 0)
		r = criu_local_restore_child(o);
	if (inherit >= 0)
		(void)close(inherit);
	criu_local_free_opts(o);
	if (r <= 0)
		return log_debug_errno(r < 0 ? r : -ECHILD,
				       "CRIU restore into %s failed (restore.log in the images).",
				       root);
	*ret_pid = (pid_t)r;
	return 0;
}

/* Lines CRIU logs as errors and carries on from (seen in successful dumps here: the
 * sandbox's hard RLIMIT_NOFILE cannot be raised; a link remap of an overlay's base file that
 * cannot be linked, saved as a ghost file instead, or refused with a line of its own when over
 * the ghost limit). */
static bool error_is_benign(const char *text)
{
	static const char *const benign[] = {"rlimit: Can't setup RLIMIT_NOFILE", "trim failed: @"};

	for (size_t i = 0; i < ARRAY_SIZE(benign); i++)
		if (strncmp(text, benign[i], strlen(benign[i])) == 0)
			return true;
	return false;
}

/* CRIU's log lines: "(00.012345) Error (criu/files-reg.c:1030): TEXT", with "PID: " before
 * "Error" in a restored task's lines; before the log is set up, no timestamp. */
int sv_criu_log_error(int images_fd, const char *log, char *buf, size_t cap)
{
	_cleanup_fclose_ FILE *f = NULL;
	_cleanup_free_ char *line = NULL;
	bool skipped = false;
	size_t lcap = 0;
	ssize_t n;
	int fd;

	fd = openat(images_fd, log, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	f = fdopen(fd, "re");
	if (!f) {
		(void)close(fd);
		return -errno;
	}
	while ((n = getline(&line, &lcap, f)) > 0) {
		char *text = strstr(line, "Error (");

		text = text ? strstr(text, "): ") : NULL;
		if (!text)
			continue;
		text += 3;
		text[strcspn(text, "\n")] = '\0';
		if (!*text)
			continue;
		/* a benign line is the reason only when no other follows */
		if (error_is_benign(text)) {
			if (!skipped)
				snprintf(buf, cap, "%s", text);
			skipped = true;
			continue;
		}
		snprintf(buf, cap, "%s", text);
		return 0;
	}
	return skipped ? 0 : -ENOENT;
}
