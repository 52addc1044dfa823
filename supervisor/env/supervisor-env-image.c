/* SPDX-License-Identifier: MIT */
/*
 * Environments of container images (see supervisor-env-image.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "sv-image.h"
#include "supervisor-env-files.h"
#include "supervisor-env-image.h"

#define DEFAULT_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* <state_dir> of e: e->dir is <state_dir>/envs/<id> (env_prepare). */
static int state_of(const struct sv_env *e, char *buf, size_t cap)
{
	char *slash;

	snprintf(buf, cap, "%s", e->dir);
	for (int i = 0; i < 2; i++) {
		slash = strrchr(buf, '/');
		if (!slash || slash == buf)
			return -EINVAL;
		*slash = '\0';
	}
	return 0;
}

static int store_of(const struct sv_env *e, struct image_store **ret)
{
	char state[PATH_MAX], envs[PATH_MAX];
	int r = state_of(e, state, sizeof(state));

	if (r < 0)
		return r;
	snprintf(envs, sizeof(envs), "%s/envs", state);
	return image_store_open(state, envs, ret);
}

int env_image_attach(struct sv_env *e, const char *state_dir, const char *what, char *why,
		     size_t cap)
{
	_cleanup_free_ struct image_info *info = malloc(sizeof(*info));
	struct image_store *s;
	char envs[PATH_MAX];
	int r;

	if (!info)
		return -ENOMEM;
	snprintf(envs, sizeof(envs), "%s/envs", state_dir);
	r = image_store_open(state_dir, envs, &s);
	if (r < 0) {
		snprintf(why, cap, "cannot open the image store: %s", strerror(-r));
		return r;
	}
	r = image_store_use(s, what, e->dir, info, why, cap);
	image_store_close(s);
	if (r < 0)
		return r;
	snprintf(e->image, sizeof(e->image), "%s", info->id);
	/* what env_reopen requires of an environment env_create made; never a directory */
	snprintf(e->base, sizeof(e->base), "image:%s", info->id);
	return 0;
}

void env_image_forget(const struct sv_env *e, const struct env_params *p)
{
	char path[PATH_MAX];

	if (!p->image)
		return;
	snprintf(path, sizeof(path), "%s/image", e->dir);
	(void)unlink(path);
}

int env_image_reopen(struct sv_env *e)
{
	char path[PATH_MAX], buf[IMAGE_DIGEST_LEN + 2] = "";
	_cleanup_close_ int fd = -1;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/image", e->dir);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	if (n < IMAGE_DIGEST_LEN)
		return -EBADMSG;
	buf[IMAGE_DIGEST_LEN] = '\0';
	if (!image_digest_valid(buf))
		return -EBADMSG;
	snprintf(e->image, sizeof(e->image), "%s", buf);
	snprintf(e->base, sizeof(e->base), "image:%s", buf);
	return 0;
}

static int fsconfig_fd(int fs, const char *key, int fd)
{
	char path[32];

	/* through our fd, as env_mount_overlay does: the environment's mountinfo names no path
	 * of the supervisor's */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return fsconfig(fs, FSCONFIG_SET_STRING, key, path, 0) < 0 ? -errno : 0;
}

int env_image_mount(const struct sv_env *e)
{
	_cleanup_free_ struct image_info *info = malloc(sizeof(*info));
	_cleanup_close_ int fs = -1, mnt = -1, upper = -1, work = -1;
	int fds[IMAGE_LAYERS_MAX], n = 0, r;
	struct image_store *s;
	char path[PATH_MAX];

	if (!info)
		return -ENOMEM;
	r = store_of(e, &s);
	if (r < 0)
		return log_debug_errno(r, "Failed to open the image store of %s: %m", e->id);
	r = image_store_lookup(s, e->image, info);
	for (size_t i = 0; r >= 0 && i < info->n_layers; i++) {
		/* top first, as overlay stacks lowerdir+ */
		r = image_store_layer_path(s, info->layers[info->n_layers - 1 - i], path,
					   sizeof(path));
		if (r < 0)
			break;
		fds[n] = open(path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fds[n] < 0) {
			r = log_debug_errno(-errno, "Layer %s of %s: %m", path, e->id);
			break;
		}
		n++;
	}
	image_store_close(s);
	if (r >= 0 && n == 0)
		r = -ENOENT; /* an image of no layer: overlay needs one lower dir */
	if (r < 0)
		goto out;
	upper = open(e->upper, O_PATH | O_DIRECTORY | O_CLOEXEC);
	work = open(e->work, O_PATH | O_DIRECTORY | O_CLOEXEC);
	fs = fsopen("overlay", FSOPEN_CLOEXEC);
	if (upper < 0 || work < 0 || fs < 0) {
		r = -errno;
		goto out;
	}
	for (int i = 0; r >= 0 && i < n; i++)
		r = fsconfig_fd(fs, "lowerdir+", fds[i]);
	if (r >= 0)
		r = fsconfig_fd(fs, "upperdir", upper);
	if (r >= 0)
		r = fsconfig_fd(fs, "workdir", work);
	if (r >= 0 && fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
		r = -errno;
	if (r >= 0) {
		mnt = fsmount(fs, FSMOUNT_CLOEXEC, 0);
		if (mnt < 0 || move_mount(mnt, "", AT_FDCWD, e->root, MOVE_MOUNT_F_EMPTY_PATH) < 0)
			r = -errno;
	}
	if (r < 0) {
		log_debug_errno(r, "Failed to mount the image overlay of %s: %m", e->id);
		goto out;
	}
	/* Private: the environment's mount events stay in its namespace and ours in ours. */
	if (mount(NULL, e->root, NULL, MS_PRIVATE, NULL) < 0)
		r = -errno;
out:
	for (int i = 0; i < n; i++)
		(void)close(fds[i]);
	return r;
}

/* A file of the environment's root (/etc/passwd), read beneath it, bounded: a regular file
 * only, never opened before it is known to be one (env_file_read: the agent may have made it
 * a FIFO or a device node). */
static char *read_in_root(int root, const char *path)
{
	_cleanup_close_ int fd = -1;
	struct stat st;
	char *buf;
	ssize_t n;

	if (env_file_read(root, path, 1u << 20, &fd, &st) < 0)
		return NULL;
	buf = calloc(1, (size_t)st.st_size + 1);
	if (!buf)
		return NULL;
	n = pread(fd, buf, (size_t)st.st_size, 0);
	if (n < 0) {
		free(buf);
		return NULL;
	}
	buf[n] = '\0';
	return buf;
}

static bool parse_id(const char *s, unsigned long *ret)
{
	char *end;

	if (!s[0] || strspn(s, "0123456789") != strlen(s))
		return false;
	errno = 0;
	*ret = strtoul(s, &end, 10);
	return errno == 0 && *ret < (unsigned long)UINT32_MAX;
}

/* In an /etc/passwd or /etc/group text, the line whose field 0 (name) or field 2 (id) is
 * what: its fields, split in place (n at most 7). */
static bool find_entry(char *text, const char *what, bool by_id, char **f, int n)
{
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		int k = 0;

		f[k++] = line;
		for (char *c = line; *c && k < n; c++)
			if (*c == ':') {
				*c = '\0';
				f[k++] = c + 1;
			}
		if (k >= 3 && strcmp(f[by_id ? 2 : 0], what) == 0) {
			for (; k < n; k++)
				f[k] = (char *)"";
			return true;
		}
	}
	return false;
}

/* The groups of /etc/group whose member list names user, after gid (as runc sets them). */
static void supplementary_groups(int root, const char *user, gid_t gid, struct env_image_run *run)
{
	_cleanup_free_ char *groups = read_in_root(root, "/etc/group");

	run->groups[0] = gid;
	run->n_groups = 1;
	if (!groups || !user[0])
		return;
	for (char *save = NULL, *line = strtok_r(groups, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		char *f[4] = {line, NULL, NULL, NULL}, *msave = NULL;
		unsigned long id;
		int k = 1;

		for (char *c = line; *c && k < 4; c++)
			if (*c == ':') {
				*c = '\0';
				f[k++] = c + 1;
			}
		if (k < 4 || !parse_id(f[2], &id) || (gid_t)id == gid)
			continue;
		for (char *m = strtok_r(f[3], ",", &msave); m; m = strtok_r(NULL, ",", &msave))
			if (strcmp(m, user) == 0 && run->n_groups < ENV_IMAGE_GROUPS_MAX) {
				run->groups[run->n_groups++] = (gid_t)id;
				break;
			}
	}
}

/* Docker's User: "", "user", "uid", "user:group", "uid:gid" (names from the image's files).
 * Without a group, the user's supplementary groups come from the image's /etc/group. */
static int resolve_user(int root, const char *spec, struct env_image_run *run, char *home,
			size_t cap)
{
	uid_t *uid = &run->uid;
	gid_t *gid = &run->gid;
	char name[IMAGE_NAME_MAX + 1] = "";
	char user[IMAGE_NAME_MAX + 1], *group, *f[7];
	_cleanup_free_ char *passwd = read_in_root(root, "/etc/passwd");
	unsigned long id;
	bool numeric;

	snprintf(user, sizeof(user), "%s", spec[0] ? spec : "0");
	group = strchr(user, ':');
	if (group)
		*group++ = '\0';
	numeric = parse_id(user, &id);
	*uid = numeric ? (uid_t)id : 0;
	*gid = 0;
	snprintf(home, cap, "%s", numeric && id == 0 ? "/root" : "/");
	if (passwd && find_entry(passwd, user, numeric, f, 7)) {
		unsigned long u, g;

		if (!parse_id(f[2], &u) || !parse_id(f[3], &g))
			return -EBADMSG;
		*uid = (uid_t)u;
		*gid = (gid_t)g;
		snprintf(name, sizeof(name), "%s", f[0]);
		if (f[5][0] == '/')
			snprintf(home, cap, "%s", f[5]);
	} else if (!numeric)
		return -ESRCH; /* a user name the image does not know */
	if (group && group[0]) {
		_cleanup_free_ char *groups = NULL;

		if (!parse_id(group, &id)) {
			groups = read_in_root(root, "/etc/group");
			if (!groups || !find_entry(groups, group, false, f, 4) ||
			    !parse_id(f[2], &id))
				return -ESRCH;
		}
		*gid = (gid_t)id;
		run->groups[0] = *gid;
		run->n_groups = 1;
		return 0;
	}
	supplementary_groups(root, name, *gid, run);
	return 0;
}

static int push(char ***v, size_t *n, const char *s)
{
	char **grown = realloc(*v, (*n + 2) * sizeof(char *));

	if (!grown)
		return -ENOMEM;
	*v = grown;
	(*v)[*n] = strdup(s);
	if (!(*v)[*n])
		return -ENOMEM;
	(*v)[++*n] = NULL;
	return 0;
}

static bool has_key(char **envp, size_t n, const char *key)
{
	size_t k = strlen(key);

	for (size_t i = 0; i < n; i++)
		if (strncmp(envp[i], key, k) == 0 && envp[i][k] == '=')
			return true;
	return false;
}

/* Whether the image has cmd as an executable regular file: a path, or a name looked up in
 * the PATH of envp (as execvp will), beneath the mounted root. */
static bool image_has_command(const struct sv_env *e, const char *cmd, char **envp)
{
	struct open_how how = {.flags = O_PATH | O_CLOEXEC,
			       .resolve =
				       RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV};
	_cleanup_close_ int root = open(e->root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
	char buf[PATH_MAX];

	if (root < 0)
		return false;
	for (size_t i = 0; envp && envp[i]; i++)
		if (strncmp(envp[i], "PATH=", 5) == 0)
			path = envp[i] + 5;
	for (const char *p = path;;) {
		size_t n = strcspn(p, ":");
		struct stat st;
		int fd;

		if (strchr(cmd, '/'))
			snprintf(buf, sizeof(buf), "%s", cmd);
		else
			snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, cmd);
		fd = (int)syscall(SYS_openat2, root, buf, &how, sizeof(how));
		if (fd >= 0) {
			bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111);

			(void)close(fd);
			if (ok)
				return true;
		}
		if (strchr(cmd, '/') || !p[n])
			return false;
		p += n + 1;
	}
}

static int load_config(const struct sv_env *e, struct image_config *ret)
{
	struct image_store *s;
	int r = store_of(e, &s);

	if (r < 0)
		return r;
	r = image_store_config(s, e->image, ret);
	image_store_close(s);
	if (r < 0)
		return log_debug_errno(r, "Failed to read the config of image %s: %m", e->image);
	return 0;
}

/* The WorkingDir and the environment of c for a process of user's home: the image's Env, and
 * PATH, HOME, HOSTNAME when it sets none (as runc adds them). */
static int run_env(const struct sv_env *e, const struct image_config *c, const char *home,
		   struct env_image_run *ret)
{
	char buf[PATH_MAX + 16];
	size_t nenv = 0;
	int r = 0;

	snprintf(ret->workdir, sizeof(ret->workdir), "%s", c->workdir[0] ? c->workdir : "/");
	for (size_t i = 0; r >= 0 && i < c->n_env; i++)
		r = push(&ret->envp, &nenv, c->env[i]);
	if (r >= 0 && !has_key(ret->envp, nenv, "PATH"))
		r = push(&ret->envp, &nenv, DEFAULT_PATH);
	if (r >= 0 && !has_key(ret->envp, nenv, "HOME")) {
		snprintf(buf, sizeof(buf), "HOME=%s", home);
		r = push(&ret->envp, &nenv, buf);
	}
	if (r >= 0 && !has_key(ret->envp, nenv, "HOSTNAME")) {
		snprintf(buf, sizeof(buf), "HOSTNAME=%s", e->id);
		r = push(&ret->envp, &nenv, buf);
	}
	return r;
}

int env_image_run_prepare(struct sv_env *e, struct env_image_run *ret)
{
	_cleanup_close_ int root = -1;
	struct image_config c = {0};
	char home[PATH_MAX];
	size_t nargv = 0;
	int r;

	memset(ret, 0, sizeof(*ret));
	r = load_config(e, &c);
	if (r < 0)
		return r;
	root = open(e->root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	r = root < 0 ? -errno : resolve_user(root, c.user, ret, home, sizeof(home));
	if (r < 0) {
		snprintf(e->error, sizeof(e->error),
			 "the image's User \"%s\" is not in its /etc/passwd", c.user);
		goto out;
	}
	/* a --cmd is Docker's shell form; else Entrypoint + Cmd; else an init that waits */
	if (e->cmd[0] || c.n_argv == 0) {
		r = push(&ret->argv, &nargv, "/bin/sh");
		if (r >= 0)
			r = push(&ret->argv, &nargv, "-c");
		if (r >= 0)
			r = push(&ret->argv, &nargv, e->cmd[0] ? e->cmd : "exec sleep infinity");
	} else
		for (size_t i = 0; r >= 0 && i < c.n_argv; i++)
			r = push(&ret->argv, &nargv, c.argv[i]);
	if (r >= 0)
		r = run_env(e, &c, home, ret);
	if (r >= 0 && !image_has_command(e, ret->argv[0], ret->envp)) {
		snprintf(e->error, sizeof(e->error),
			 "the image has no %s%s (an image without a shell needs an Entrypoint or "
			 "Cmd "
			 "that stays up)",
			 ret->argv[0], strchr(ret->argv[0], '/') ? "" : " in its PATH");
		r = -ENOEXEC;
	}
out:
	image_config_finish(&c);
	if (r < 0)
		env_image_run_finish(ret);
	return r;
}

int env_image_exec_prepare(const struct sv_env *e, int root, const char *user,
			   struct env_image_run *ret)
{
	struct image_config c = {0};
	char home[PATH_MAX];
	int r;

	memset(ret, 0, sizeof(*ret));
	r = load_config(e, &c);
	if (r < 0)
		return r;
	r = resolve_user(root, user[0] ? user : c.user, ret, home, sizeof(home));
	if (r >= 0)
		r = run_env(e, &c, home, ret);
	image_config_finish(&c);
	if (r < 0)
		env_image_run_finish(ret);
	return r;
}

void env_image_run_finish(struct env_image_run *r)
{
	for (size_t i = 0; r->argv && r->argv[i]; i++)
		free(r->argv[i]);
	for (size_t i = 0; r->envp && r->envp[i]; i++)
		free(r->envp[i]);
	free(r->argv);
	free(r->envp);
	r->argv = r->envp = NULL;
}

int env_image_exec(const struct env_image_run *r)
{
	extern char **environ;

	/* a set-id change from root clears the capabilities the sandbox left, as in Docker */
	if (setgroups(r->n_groups, r->groups) < 0 || setresgid(r->gid, r->gid, r->gid) < 0 ||
	    setresuid(r->uid, r->uid, r->uid) < 0)
		return -1;
	if (chdir(r->workdir) < 0)
		return -1;
	/* execvp looks argv[0] up in the image's PATH: environ is the image's Env */
	environ = r->envp;
	execvp(r->argv[0], r->argv);
	return -1;
}
