/* SPDX-License-Identifier: MIT */
/*
 * Environments of container images (issue 20): the image's layers, top first, are the
 * overlay's lower directories (no host /usr or /etc); its config (Env, WorkingDir, User,
 * Entrypoint + Cmd) runs the init. The environment records the image's id in <dir>/image
 * (the store refuses to remove an image some environment records); e->image holds it, and
 * the layers are found again from the store (<state_dir>/images, two levels above e->dir) at
 * every mount, so that env_reopen and env_restore know them.
 */
#pragma once

#include <sys/types.h>

#include "supervisor-env.h"

#define ENV_IMAGE_GROUPS_MAX 64

/* What the init runs as, resolved before the launch (the user in the image's /etc/passwd
 * and /etc/group, read beneath the mounted root). */
struct env_image_run {
	char **argv, **envp;
	char workdir[PATH_MAX];
	uid_t uid;
	gid_t gid;
	/* the primary group, then the user's other groups in the image's /etc/group */
	gid_t groups[ENV_IMAGE_GROUPS_MAX];
	size_t n_groups;
};

/* Resolves what (a stored image's name or id, or oci:DIR[:TAG] / docker-archive:FILE[:REF],
 * imported when the store lacks it) and records it as e's image. why: the store's reason. */
int env_image_attach(struct sv_env *e, const char *state_dir, const char *what, char *why,
		     size_t cap);
/* A create that failed after env_image_attach: its record of the image goes (the image
 * stays removable). Nothing when p names no image. */
void env_image_forget(const struct sv_env *e, const struct env_params *p);
/* Reads <dir>/image back (env_reopen): 0, -ENOENT when e is no image's. */
int env_image_reopen(struct sv_env *e);
/* The overlay of e's image layers and upper layer at e->root (the new mount API, one
 * lowerdir+ per layer: no limit of the legacy option string). */
int env_image_mount(const struct sv_env *e);
/* Before the launch, with e->root mounted. A command the image lacks (no /bin/sh for --cmd
 * or the default, an Entrypoint/Cmd not found in its PATH) or a User it does not know:
 * -ENOEXEC or -ESRCH, e->error says which. */
int env_image_run_prepare(struct sv_env *e, struct env_image_run *ret);
/* What an `env exec` in e runs as by default, as `docker exec` (runc) sets it: the image's
 * Env (PATH, HOME of the user, HOSTNAME added when it sets none), its WorkingDir, and user
 * (the request's, else the image's User) with its supplementary groups, read beneath root
 * (the environment's root as its init sees it). No argv, no command looked for. -ESRCH: a
 * user name the image does not know. */
int env_image_exec_prepare(const struct sv_env *e, int root, const char *user,
			   struct env_image_run *ret);
void env_image_run_finish(struct env_image_run *r);
/* In the launched child, last: the user, the working directory, exec. Returns on failure
 * (errno set). */
int env_image_exec(const struct env_image_run *r);
