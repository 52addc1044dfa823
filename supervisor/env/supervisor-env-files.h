/* SPDX-License-Identifier: MIT */
/*
 * Files of an environment as its processes see them (issue 20 item 3: `env read`, `env
 * write`), for an agent's file tool calls, and the environment's users (`env exec --user`).
 *
 * Every path is resolved by the kernel inside the environment's root (openat2
 * RESOLVE_IN_ROOT on its init's /proc/PID/root, RESOLVE_NO_MAGICLINKS): "..", absolute
 * symlinks and relative ones that climb stay inside it, exactly as they would for a process
 * of the environment (`ln -s /etc/shadow x` reads the environment's /etc/shadow, never the
 * host's), and /proc magic links are refused. Only regular files are read or written, and
 * none on procfs or sysfs (the environment's /proc belongs to its processes). Sizes are
 * bounded: a larger file is refused, never cut.
 *
 * A write is atomic: a temporary file beside the target (".belayer-write.*"), its content,
 * owner and mode, then rename over the target, so a reader inside sees the old content or
 * the new, never a part; a symlink at the target is replaced, not followed. It is not
 * fsync'd (a checkpoint syncs the upper layer before it commits).
 *
 * Blocking (reads and writes of up to the bound): offload threads, not the loop.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define ENV_FILE_MAX_DEFAULT (16u << 20)  /* `env read` / `env write` bound */
#define ENV_FILE_READ_LIMIT  (256u << 20) /* the largest `env read --max` */
#define ENV_PASSWD_MAX	     (1u << 20)	  /* the environment's /etc/passwd, read for --user */

/* The environment's root as its init sees it: an O_PATH fd of /proc/PID/root, or -errno. */
int env_files_root(pid_t init);
/* path's content (at most max bytes, else -EFBIG) in a new sealed memfd (*ret_fd) and its
 * stat (*ret_st). The path is resolved to an O_PATH fd and opened (O_NOCTTY, O_NONBLOCK,
 * through that fd: the same inode) only once known to be a regular file. -EINVAL: not a
 * regular file (-EISDIR: a directory; *ret_st says what it is); -EPERM: on procfs/sysfs. */
int env_file_read(int root, const char *path, uint64_t max, int *ret_fd, struct stat *ret_st);
/* "a FIFO", "a character device", ...: the kind of file mode's type names, for errors. */
const char *env_file_kind(mode_t mode);
/* Replaces path with the first bytes of data_fd (a regular file; more than max: -EFBIG),
 * owned by uid:gid (host ids) with mode. *ret_n: the bytes written. ret_dir (NULL: not
 * wanted): the directory written in, as the kernel names the one resolved (its symlinks
 * followed), for the dirty set (the supervisor's writes are not the tracer's to see); "" when
 * it cannot be named. */
int env_file_write(int root, const char *path, int data_fd, uint64_t max, mode_t mode, uid_t uid,
		   gid_t gid, uint64_t *ret_n, char *ret_dir, size_t dir_cap);
/* user as the environment knows it: "" (root), "UID[:GID]", or "NAME[:GROUP]" looked up in
 * the environment's /etc/passwd and /etc/group. A numeric uid's group is its passwd entry's,
 * else 0. -ENOENT: no such user or group. */
int env_user_lookup(int root, const char *user, uid_t *ret_uid, gid_t *ret_gid);
/* Copies the first bytes of from (pread from offset 0) to to; -EFBIG when from holds more
 * than max. */
int env_file_copy_bounded(int from, int to, uint64_t max, uint64_t *ret_n);
/* The first bytes of from (at most max, else -EFBIG) in a new memfd sealed against any change,
 * its offset at 0: an fd of it, or -errno. */
int env_file_sealed_copy(int from, uint64_t max, uint64_t *ret_n);
/* An id inside the environment (whose init is pid) as the host knows it, through
 * /proc/PID/{uid,gid}_map (identity without a user namespace). -ERANGE: unmapped. */
int env_id_to_host(pid_t pid, bool gid, uint32_t id, uint32_t *ret);
