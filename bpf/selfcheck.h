/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Shared between selfcheck.bpf.c and user space: plain C types only, since the BPF side
 * sees vmlinux.h and user space sees the system headers.
 */
#pragma once

/* One getpgid() call made by the watched process, as seen at the syscall tracepoint. */
struct selfcheck_event {
	unsigned int tgid;
	unsigned int tid;
	unsigned long long arg0; /* getpgid's pid argument: the caller chooses it as a cookie */
};
