/* SPDX-License-Identifier: MIT */
/*
 * What test-envckpt and test-envckpt-cancel share (cmocka, test helpers; envckpt-fixture.[ch]
 * holds what the env-recovery benchmark shares too): each test's environment, in a fresh
 * temporary directory with its base, state directory and cgroup parent.
 */
#pragma once

#include <limits.h>

#include "supervisor-env.h"

struct envckpt_fx {
	char *dir;
	char base[PATH_MAX], state[PATH_MAX], cgparent[PATH_MAX];
	char sock[PATH_MAX]; /* the unix server's socket in the environment */
	char tcp[16];	     /* the TCP server's port on 127.0.0.1, as fixture_ask takes it */
	struct sv_env *env;
};

/* cmocka fixtures: a zeroed envckpt_fx in *state; the teardown destroys the environment, its
 * cgroup parent and the directory (ENVCKPT_KEEP=1 keeps the directory: the state and CRIU logs
 * of a failed run, for a look). */
int envckpt_fx_setup(void **state);
int envckpt_fx_teardown(void **state);
/* A fresh directory (mkdtemp of prefix) with a base that holds the environment's server. */
void envckpt_fx_prepare(struct envckpt_fx *f, const char *prefix);
/* Creates environment id running cmd in the prepared directory (keep: checkpoints kept, 0 for
 * the default) and waits until its /work/ready exists. */
void envckpt_fx_create(struct envckpt_fx *f, const char *id, const char *cmd, unsigned keep);
