/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "envdev.h"
#include "envdev.skel.h"
#include "log.h"
#include "supervisor-env-devices.h"
#include "supervisor-env.h"
#include "util.h"

static int v1_write(const char *dir, const char *file, const char *value)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	return env_write_file(path, value);
}

/* The v1 rules: deny all first (a new cgroup inherits its parent's "a *:* rwm"), then each
 * entry. The kernel takes one rule per write. */
int env_devices_v1_apply(const char *dir)
{
	char rule[64];
	int r;

	r = v1_write(dir, "devices.deny", "a");
	if (r < 0)
		return r;
#define ENVDEV_RULE(maj, min, mk)                                                    \
	if ((min) == ENVDEV_ANY_MINOR)                                               \
		snprintf(rule, sizeof(rule), "c %u:* rw%s", (maj), (mk) ? "m" : ""); \
	else                                                                         \
		snprintf(rule, sizeof(rule), "c %u:%u rw%s", (maj), (unsigned)(min), \
			 (mk) ? "m" : "");                                           \
	r = v1_write(dir, "devices.allow", rule);                                    \
	if (r < 0)                                                                   \
		return r;
	ENVDEV_ALLOWED(ENVDEV_RULE)
#undef ENVDEV_RULE
	return 0;
}

/* The program, loaded once per process and kept (an fd, O_CLOEXEC): loading costs about 10 ms
 * here (libbpf reads the kernel's BTF), an attach a syscall, and a restore attaches it to its
 * fresh cgroup. Environment jobs run on several threads. */
static pthread_mutex_t prog_lock = PTHREAD_MUTEX_INITIALIZER;
static struct envdev *prog_skel;

static int prog_fd(void)
{
	int fd;

	pthread_mutex_lock(&prog_lock);
	if (!prog_skel)
		prog_skel = envdev__open_and_load();
	fd = prog_skel ? bpf_program__fd(prog_skel->progs.envdev_allow) : -errno;
	pthread_mutex_unlock(&prog_lock);
	return fd;
}

int env_devices_attach(const char *cgroup)
{
	_cleanup_close_ int cg = open(cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int fd;

	if (cg < 0)
		return -errno;
	fd = prog_fd();
	if (fd < 0)
		return fd;
	/* No link: the attachment holds the program, and lives as long as the cgroup. */
	if (bpf_prog_attach(fd, cg, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI) < 0)
		return -errno;
	return 0;
}

int env_devices_attached(const char *cgroup)
{
	_cleanup_close_ int cg = open(cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	uint32_t flags = 0, n = 0;

	if (cg < 0)
		return -errno;
	if (bpf_prog_query(cg, BPF_CGROUP_DEVICE, 0, &flags, NULL, &n) < 0)
		return -errno;
	return (int)n;
}

int env_devices_setup(const struct sv_env *e)
{
	char dir[PATH_MAX], parent[PATH_MAX];
	int r;

	r = env_limits_v1_dir(e, "devices", dir, sizeof(dir));
	if (r >= 0) {
		snprintf(parent, sizeof(parent), "%s", dir);
		*strrchr(parent, '/') = 0;
		if ((mkdir(parent, 0755) < 0 && errno != EEXIST) ||
		    (mkdir(dir, 0755) < 0 && errno != EEXIST))
			return log_debug_errno(-errno, "Failed to create %s: %m", dir);
		r = env_devices_v1_apply(dir);
		if (r < 0)
			return log_debug_errno(r, "Failed to set %s's v1 device rules: %m", e->id);
	} else if (r != -ENOENT) {
		return r;
	}
	r = env_devices_attach(e->cgroup);
	if (r < 0)
		return log_debug_errno(r, "Failed to attach %s's device program to %s: %m", e->id,
				       e->cgroup);
	return 0;
}

int env_devices_join(const struct sv_env *e, pid_t pid)
{
	char dir[PATH_MAX], v[32];

	if (env_limits_v1_dir(e, "devices", dir, sizeof(dir)) < 0)
		return 0;
	snprintf(v, sizeof(v), "%d", (int)pid);
	return v1_write(dir, "cgroup.procs", v);
}

int env_devices_ensure(const struct sv_env *e)
{
	int n = env_devices_attached(e->cgroup);

	if (n < 0)
		return n;
	return n > 0 ? 0 : env_devices_attach(e->cgroup);
}

void env_devices_remove(const struct sv_env *e)
{
	char dir[PATH_MAX];

	if (env_limits_v1_dir(e, "devices", dir, sizeof(dir)) >= 0)
		(void)rmdir(dir);
}
