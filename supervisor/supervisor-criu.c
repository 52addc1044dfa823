/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <criu/criu.h>

#include "log.h"
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

int sv_criu_version(const char *binary)
{
	criu_opts *o;
	int r;

	r = opts_new(binary, &o);
	if (r < 0)
		return r;
	r = criu_local_get_version(o);
	criu_local_free_opts(o);
	return r < 0 ? r : r;
}

/* libcriu returns its own negative codes (-EBADE and friends) for its failures; they are
 * passed on as they are: every one is negative and distinct from success. */
int sv_criu_dump(const char *binary, pid_t pid, const char *freeze_cgroup, int images_fd,
		 bool leave_running)
{
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
	r = criu_local_set_log_file(o, "dump.log");
	if (r >= 0 && freeze_cgroup)
		r = criu_local_set_freeze_cgroup(o, freeze_cgroup);
	if (r >= 0)
		r = criu_local_add_external(o, "mnt[/usr]:usr");
	if (r >= 0)
		r = criu_local_add_external(o, "mnt[/etc]:etc");
	if (r >= 0)
		r = criu_local_dump(o);
	criu_local_free_opts(o);
	if (r < 0)
		return log_debug_errno(r, "CRIU dump of pid %d failed (dump.log in the images).",
				       (int)pid);
	return 0;
}

int sv_criu_restore(const char *binary, int images_fd, const char *root, pid_t *ret_pid)
{
	criu_opts *o;
	int r;

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
	if (r >= 0)
		r = criu_local_restore_child(o);
	criu_local_free_opts(o);
	if (r <= 0)
		return log_debug_errno(r < 0 ? r : -ECHILD,
				       "CRIU restore into %s failed (restore.log in the images).",
				       root);
	*ret_pid = (pid_t)r;
	return 0;
}
