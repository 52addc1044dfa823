/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * The smallest program that exercises what Belayer's BPF side relies on: a syscall
 * tracepoint (kprobes/fentry do not attach on our machines, DESIGN.md §6), a filter set
 * through const volatile rodata before load, and a ring buffer to user space. The env test
 * suite loads it to prove the kernel, the toolchain and libbpf work together.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "selfcheck.h"

/* Set by the loader before load; 0 watches nothing. */
const volatile unsigned int target_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} events SEC(".maps");

SEC("tp/syscalls/sys_enter_getpgid")
int selfcheck_getpgid(struct trace_event_raw_sys_enter *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct selfcheck_event *e;

	if (target_tgid == 0 || (__u32)(id >> 32) != target_tgid)
		return 0;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->tgid = id >> 32;
	e->tid = (__u32)id;
	e->arg0 = ctx->args[0];
	bpf_ringbuf_submit(e, 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
