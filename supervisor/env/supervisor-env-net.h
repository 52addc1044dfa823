/* SPDX-License-Identifier: MIT */
/*
 * An environment's network (issue 19): none (its own network namespace, loopback only),
 * slirp (its own, with user-mode egress through slirp4netns) or host (the host's namespace,
 * only where [env] allow_host_net says so; checked by the caller).
 *
 * slirp4netns is the supervisor's child, outside the environment's cgroup and namespaces (CRIU
 * never sees it): it joins the environment's network namespace only to make its tap device and
 * hands the device's fd back to its parent process, which stays in the host's namespace and
 * forwards the environment's packets through host sockets. --disable-host-loopback keeps the
 * host's 127.0.0.1 services (engines, gateway, metrics) out of reach; --enable-sandbox and
 * --enable-seccomp confine slirp4netns itself (an empty root, no execve, mount, ptrace,
 * setns). Its --exit-fd is a pipe the supervisor holds: it exits with the supervisor, and a
 * restarted supervisor starts another (env_reopen). A reaper thread per helper waits for it
 * and logs its exit when nobody asked for it: the environment then has no egress until it is
 * restored or rebuilt. A restore gives the environment a fresh network namespace, so the
 * helper is started again against that one before CRIU puts the processes in it.
 */
#pragma once

#include "proto.h"

struct sv_env;
struct env_net_helper;

/* Starts e's helper when e->net is ENV_NET_SLIRP (else nothing) against the network namespace
 * netns_fd and waits until it has configured tap0 (10.0.2.100/24, default route and DNS
 * through 10.0.2.2 and 10.0.2.3). A helper e still has is stopped first. Its stdout and
 * stderr go to <e->dir>/slirp4netns.log. 0 or -errno (e->error says why). */
int env_net_start(struct sv_env *e, int netns_fd);
/* Whether slirp4netns (a path, or a name searched on PATH) is there to run: 0 or -ENOENT (a
 * create asking for slirp is refused at once, rather than failing in its job). */
int env_net_slirp_available(const char *slirp4netns);
/* Stops e's helper, if any, and waits for it. */
void env_net_stop(struct sv_env *e);
