/* SPDX-License-Identifier: MIT */
/*
 * `env exec` (issue 20 item 2): a command run inside an environment with exactly its
 * isolation, on the supervisor's loop without blocking it.
 *
 * How a command gets in (supervisor-env-exec-spawn.c): the supervisor forks a helper that
 * joins the init's namespaces through its pidfd (mount, pid for its children, uts, ipc, net,
 * time, and user when the environment has one of its own) and clone3()s the command with
 * CLONE_INTO_CGROUP (the environment's v2 cgroup) and CLONE_PARENT (the supervisor is its
 * parent, so its pidfd and exit status are the supervisor's; the helper exits at once and was
 * never in the environment's cgroup or pid namespace). The supervisor moves the command into
 * the environment's v1 limit cgroups, then lets it go: it joins the cgroup namespace, makes
 * a session of its own (so its process group is the one a timeout kills), takes its stdio
 * (stdin: a sealed memfd copy of what the client sent; stdout, stderr: pipes to the
 * supervisor), its directory and user, gives up what the environment's init gave up
 * (env_sandbox_enter: capabilities, no_new_privs, seccomp) and execs. In an environment of
 * a container image, the environment, directory and user default to the image's Env,
 * WorkingDir and User (with its groups), as under `docker exec` (env_image_exec_prepare).
 *
 * Output is read on the loop, bounded per stream (max_output; what is past it is counted and
 * dropped, the reply says truncated). The reply goes when the command has exited and both
 * pipes are closed (every process that inherited them exited or closed them), or at the
 * timeout: then the command's process group is killed (SIGKILL) and the reply says so; a
 * process that left the group (setsid) and still holds the pipes only loses them (EPIPE).
 * So a background process an exec starts must redirect its output (`server >log 2>&1 &`),
 * or the exec waits for it until its timeout; once the exec is over it belongs to the
 * environment (reparented to its init) and is checkpointed with it.
 *
 * While an exec or a file operation runs, the environment refuses checkpoint, restore,
 * rebuild and destroy (-EBUSY: the command's parent is the supervisor, outside the
 * environment, and its stdio are the supervisor's pipes: CRIU cannot dump either), and an
 * exec or file operation is refused while one of those runs.
 */
#pragma once

#include <stdint.h>

#include "supervisor.h"

struct event_base;

#define ENV_EXEC_TIMEOUT_DEFAULT_MS 60000u
#define ENV_EXEC_TIMEOUT_MAX_MS	    (24u * 3600 * 1000)
#define ENV_EXEC_OUTPUT_DEFAULT	    (1u << 20)
#define ENV_EXEC_OUTPUT_MAX	    (2u << 20) /* both streams fit [limits] max_queued_bytes */
#define ENV_EXEC_STDIN_MAX	    (16u << 20)
#define ENV_EXEC_MAX		    256 /* running at once, all environments together */

/* At start, on the loop thread. */
void env_exec_start(struct event_base *base);
/* Kills every running exec's process group and forgets them (supervisor exit). */
void env_exec_stop(struct supervisor *s);

int env_exec_dispatch(struct supervisor *s, struct sv_client *c, struct proto_msg *m);
int env_file_dispatch(struct supervisor *s, struct sv_client *c, struct proto_msg *m);
