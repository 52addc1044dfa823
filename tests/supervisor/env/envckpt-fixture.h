/* SPDX-License-Identifier: MIT */
/* What the environment tests and the env-recovery benchmark share: a base directory a
 * sandbox runtime would provide, a hash of a file tree, the in-environment server's client. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The cgroup v2 hierarchy the environment tests create their cgroups under. */
#define FIXTURE_CGROUP_V2 "/sys/fs/cgroup/unified"
/* What fixture_env_preconditions() checks, as a skip reason. */
#define FIXTURE_ENV_NEEDS "root, cgroup v2 at " FIXTURE_CGROUP_V2 " and CRIU >= 4.2 needed"

/* Real environments can run here: root, cgroup v2 at FIXTURE_CGROUP_V2, CRIU >= 4.2. */
bool fixture_env_preconditions(void);
/* Runs the shell command fmt inside the environment whose init is pid (every namespace it has:
 * nsenter -a; after a restore that includes CRIU's time namespace, without which a process
 * left behind makes the next checkpoint fail) and whose cgroup is cgroup (joined too, so the
 * tracer and the freezer see it as the environment's); stdio to /dev/null. Returns system()'s
 * status. */
int fixture_env_exec(const char *cgroup, pid_t pid, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* A shell prefix that moves the shell into every cgroup pid is in, in every hierarchy (v2, and
 * the v1 ones of an environment's limits: a process outside them cannot be dumped):
 * "echo $$ >A/cgroup.procs && echo $$ >B/cgroup.procs && ". 0 or -errno. */
int fixture_join_prefix(pid_t pid, char *buf, size_t cap);

/* Makes dir a base: usr/ etc/ dev/ proc/ tmp/ root/ work/ and the merged-/usr symlinks
 * (bin, lib, lib64, sbin); copies server_bin to dir/work/server when given. */
int fixture_make_base(const char *dir, const char *server_bin);
/* Hash of the tree under dir (paths, types, modes, owners, sizes, mtimes of files, contents,
 * symlink targets), never following a symlink; skips the top-level names in skip (NULL-ended). */
int fixture_tree_hash(const char *dir, const char *const *skip, uint64_t *ret);
/* The same over contents, types, modes and link targets only (no owners, sizes of
 * directories or times): a tree rebuilt by replaying the same actions hashes alike. */
int fixture_content_hash(const char *dir, const char *const *skip, uint64_t *ret);
/* Sends req to the server at addr (a unix socket path, or a TCP port on 127.0.0.1 as a decimal
 * string: envckpt-server's argument) and reads its one-line answer until the server closes
 * the connection (bounded by timeout_ms; connects again until the server listens). */
int fixture_ask(const char *addr, const char *req, char *ans, size_t cap, int timeout_ms);
/* The same, a TCP port in the network namespace of the environment whose cgroup is cgroup
 * (environments have their own: issue 19). */
int fixture_ask_in(const char *cgroup, const char *addr, const char *req, char *ans, size_t cap,
		   int timeout_ms);
/* Waits (bounded) until path exists. */
int fixture_wait_file(const char *path, int timeout_ms);
/* A free loopback TCP port. */
int fixture_free_port(uint16_t *ret);
uint64_t fixture_now_us(void);
