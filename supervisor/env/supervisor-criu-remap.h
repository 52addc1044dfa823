/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * CRIU's remap-fpath.img: how a dump saved the files its tasks held open by a path that no
 * longer leads to them. A ghost (the content copied into the images) restores from the
 * images alone; a linked remap is a hard link CRIU made in the environment's own file system
 * ("link_remap.N" beside the file) and, in a leave-running dump, removed again when the dump
 * ended: the checkpoint's file-system records, taken before, never hold it, and its restore
 * fails ("Can't get owner of link remap"). An environment's checkpoint with one is refused.
 */

/* The largest remap-fpath.img read (each entry is a few bytes: thousands of entries). */
#define SV_CRIU_REMAP_IMG_MAX (256u * 1024u)

/* Linked remaps in the image's bytes (the file as a whole: CRIU's two magics, then entries of
 * a 32-bit little-endian length and a RemapFilePathEntry), or -EBADMSG. */
int sv_criu_remap_count_linked(const uint8_t *buf, size_t len);

/* The same for images_fd's remap-fpath.img (none: 0). */
int sv_criu_images_linked_remaps(int images_fd);

/* Writes into buf "pid P (COMM) fd N: PATH" (or "mapping: PATH") for each fd and mapping of
 * the tasks in procs (a cgroup.procs file's fd) that holds a file still linked (nlink > 0)
 * under a deleted name, "; " between them: the files a linked remap is made for. Returns how
 * many (0: buf is ""). */
size_t sv_criu_held_unlinked(int procs_fd, char *buf, size_t cap);

/* The same for CRIU's "Can't dump ghost file PATH of N size, increase limit" line: who in the
 * cgroup v2 directory cgroup holds PATH under its deleted name. */
size_t sv_criu_ghost_holders(const char *line, const char *cgroup, char *buf, size_t cap);

/* After a dump into images_fd of the tasks in the cgroup v2 directory cgroup: 0 without a
 * linked remap; with one, -EBUSY and error says which files (sv_criu_held_unlinked) and what
 * to do. */
int sv_criu_refuse_linked_remaps(int images_fd, const char *cgroup, char *error, size_t cap);
