/* SPDX-License-Identifier: MIT */
/*
 * CRIU, driven through libcriu (Debian 12's, pkg-config 'criu') pointed at a CRIU >= 4
 * binary with criu_set_service_binary (DESIGN §6: 3.17 fails on this kernel).
 *
 * Environments are dumped and restored the way DESIGN §6 verified: the environment's own
 * pid/mount/uts/ipc namespaces, its root an overlay mount, host /usr and /etc bind-mounted
 * read-only into it and declared external (dump: mnt[/usr]:usr, restore: mnt[usr]:/usr).
 * It has a network namespace of its own with loopback only (issue 19), plus slirp4netns's tap0
 * for a slirp environment (supervisor-env-net.h), which holds nothing worth dumping: it is
 * declared external (dump: net[INODE]:belayer-net, so CRIU runs no ip
 * or iptables tools), and a restore is given a fresh one (inherit-fd belayer-net). Listening
 * sockets and loopback servers are the processes' and come back in it; established TCP
 * connections are not dumped (no --tcp-established), so a checkpoint is taken between
 * requests.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* CRIU's own ghost-file limit when none is given (criu --ghost-limit): 1 MiB. */
#define SV_CRIU_GHOST_LIMIT_CRIU (1u << 20)

/* CRIU "locks" a dumped network namespace with iptables or nftables tools the host may not
 * have (Debian installs neither by default; CRIU then fails every dump). An environment's
 * namespace has loopback only: both ends of every connection are in the frozen environment
 * and nothing outside can reach it, so there is nothing to lock. libcriu of Debian 12 cannot
 * say "skip" (its setter refuses the value), and CRIU reads options from the file that
 * CRIU_CONFIG_FILE names in its RPC mode too: this writes dir/criu.conf ("network-lock skip")
 * and points CRIU_CONFIG_FILE at it. setenv(): call it before any thread starts. An
 * operator's CRIU_CONFIG_FILE is left as it is (it must then skip network locking itself, or
 * the host have iptables): logged. 0 or -errno. */
int sv_criu_config_init(const char *dir);

/* The CRIU binary: configured (non-empty), else $BELAYER_CRIU, else /usr/local/sbin/criu,
 * else "criu" on PATH. Returns a static or the given string; NULL when none is executable. */
const char *sv_criu_binary(const char *configured);
/* The key of an environment's external network namespace in CRIU's images. */
#define SV_CRIU_NETNS_KEY "belayer-net"

/* The binary's version as libcriu reports it (40101 for 4.1.1), or -errno. */
int sv_criu_version(const char *binary);

/* Dumps the tree rooted at pid (leave_running: it keeps running, else CRIU kills it) into
 * images_fd. freeze_cgroup (may be NULL): the cgroup v2 the tree is in, possibly frozen by the
 * caller already; CRIU seizes the tasks through its freezer (a frozen task cannot run CRIU's
 * parasite otherwise) and leaves it as it found it. ghost_limit: the largest deleted-but-open
 * file CRIU copies into the images, in bytes (0: CRIU's 1 MiB). The log is "dump.log" in
 * images_fd (sv_criu_log_error() reads why it failed). dev_bind: the tree's /dev nodes are
 * bind mounts of the host's (an environment in a user namespace: env_launch), external to the
 * dump like /usr and /etc. dump_ctls (NULL: all): the cgroup hierarchies to record, as
 * /proc/PID/cgroup names them (CRIU's --cgroup-dump-controller; see
 * env_limits_cgroup_names). parent_images (NULL: a full dump): a pre-dump's images
 * (sv_criu_pre_dump), as a path relative to images_fd: the dump tracks memory changes
 * (--track-mem) and copies only the pages dirtied since that pre-dump (--prev-images-dir; CRIU
 * leaves a "parent" symlink to it in the images, which a restore follows: it must stay
 * reachable as long as the images are restored). */
int sv_criu_dump(const char *binary, pid_t pid, const char *freeze_cgroup, int images_fd,
		 bool leave_running, uint32_t ghost_limit, uint64_t netns_ino, bool dev_bind,
		 const char *const *dump_ctls, const char *parent_images);
/* CRIU's pre-dump (issue 23 item 3): the tree's memory into images_fd while it keeps running
 * (CRIU stops it only while it collects the pages), tracking memory changes from then on, for
 * a later sv_criu_dump with parent_images. The other arguments as sv_criu_dump's; the log is
 * "pre-dump.log". Needs the kernel's soft-dirty page tracking (CONFIG_MEM_SOFT_DIRTY): without
 * it CRIU 4.2.1 refuses --track-mem ("Tracking memory is not available"). */
int sv_criu_pre_dump(const char *binary, pid_t pid, const char *freeze_cgroup, int images_fd,
		     uint64_t netns_ino, bool dev_bind, const char *const *dump_ctls);
/* Restores the tree in images_fd with root as the environment's root (the overlay mount);
 * the restored tree's root process becomes the caller's child. *ret_pid: its pid. netns_fd
 * (-1: none): the network namespace the tree gets, for a dump whose netns_ino was given.
 * cg_roots (NULL: none): controller, path pairs ending in NULL, CRIU's --cgroup-root: the
 * cgroup of each hierarchy the tree's root goes to, whichever it was dumped from. dev_bind as
 * the dump's. */
int sv_criu_restore(const char *binary, int images_fd, const char *root, int netns_fd,
		    const char *const *cg_roots, bool dev_bind, pid_t *ret_pid);
/* Why CRIU failed, in its own words: the text of the first "Error (file:line): TEXT" line of
 * log ("dump.log", "restore.log") in images_fd, skipping the ones CRIU logs as errors and
 * carries on from (the first of those when no other line follows). -ENOENT: no log, or no
 * such line. */
int sv_criu_log_error(int images_fd, const char *log, char *buf, size_t cap);
