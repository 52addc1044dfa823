/* SPDX-License-Identifier: MIT */
/* The environments' seccomp filter, an allow-list (supervisor-env-seccomp.c says what it
 * allows and why). */
#pragma once

#include <linux/filter.h>

/* Compiles the filter into ret (its program malloc'd, kept for the supervisor's life). 0 or
 * -errno. */
int env_seccomp_build(struct sock_fprog *ret);
