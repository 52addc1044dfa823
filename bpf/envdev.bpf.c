/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * The device allow-list of envdev.h as a cgroup v2 device program (BPF_CGROUP_DEVICE), what
 * runc attaches to a container's cgroup on v2: the kernel runs it at every open and mknod of a
 * device node by a process of the cgroup (and below), and refuses the access when it returns
 * 0. On a hybrid host the v1 devices controller checks too; both must allow.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "envdev.h"

/* UAPI <linux/bpf.h>'s enum bpf_devcg_dev_type and bpf_devcg_acc_type: no kernel type uses
 * them, so the kernel's BTF (vmlinux.h) lacks them. */
#define DEVCG_DEV_CHAR	2
#define DEVCG_ACC_MKNOD 1

SEC("cgroup/dev")
int envdev_allow(struct bpf_cgroup_dev_ctx *ctx)
{
	__u32 type = ctx->access_type & 0xffff, access = ctx->access_type >> 16;
	__u32 major = ctx->major, minor = ctx->minor;

	if (type != DEVCG_DEV_CHAR)
		return 0;
#define ENVDEV_CHECK(maj, min, mk)                                           \
	if (major == (maj) && ((min) == ENVDEV_ANY_MINOR || minor == (min))) \
		return (mk) || !(access & DEVCG_ACC_MKNOD);
	ENVDEV_ALLOWED(ENVDEV_CHECK)
#undef ENVDEV_CHECK
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
