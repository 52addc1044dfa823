/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * An environment's device allow-list (issue 19), shared by the cgroup v2 device program
 * (envdev.bpf.c) and the v1 devices controller's rules (supervisor-env-devices.c), so that the
 * two cannot disagree. Plain C only: the BPF side sees vmlinux.h, user space the system's
 * headers.
 *
 * Everything not listed is refused (open and mknod), block devices all. Read and write are
 * allowed on every entry; mknod only on the nodes Belayer's own /dev holds: the launch makes
 * them inside the environment's cgroups, and CRIU restores that tmpfs's content (tar) from
 * inside them too (with mknod refused on these as well, a restore fails: "Can't restore tmpfs
 * content"). An agent cannot mknod anyway (no CAP_MKNOD), and a node it finds cannot be
 * opened unless listed here.
 */
#pragma once

#define ENVDEV_ANY_MINOR 0xffffffffu

/* X(major, minor, mknod): character devices only. */
#define ENVDEV_ALLOWED(X)                                                       \
	X(1, 3, 1)		    /* /dev/null */                             \
	X(1, 5, 1)		    /* /dev/zero */                             \
	X(1, 7, 1)		    /* /dev/full */                             \
	X(1, 8, 1)		    /* /dev/random */                           \
	X(1, 9, 1)		    /* /dev/urandom */                          \
	X(5, 0, 1)		    /* /dev/tty */                              \
	X(5, 2, 0)		    /* /dev/pts/ptmx (/dev/ptmx links to it) */ \
	X(136, ENVDEV_ANY_MINOR, 0) /* /dev/pts/N: the environment's own devpts */
