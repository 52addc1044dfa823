/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"
#include "supervisor-criu-remap.h"

/* images/magic.h: IMG_COMMON_MAGIC, then REMAP_FPATH_MAGIC. */
#define IMG_COMMON_MAGIC  0x54564319u
#define REMAP_FPATH_MAGIC 0x59133954u
/* images/remap-file-path.proto: orig_id = 1, remap_id = 2, remap_type = 3 (LINKED = 0, the
 * default when absent, GHOST = 1, PROCFS = 2). */
#define REMAP_TYPE_FIELD  3
#define REMAP_TYPE_LINKED 0
#define ENTRY_MAX	  64u /* three varints of at most 10 bytes, and their keys */

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *ret)
{
	uint64_t v = 0;

	for (unsigned shift = 0; shift < 64; shift += 7) {
		if (*pos >= len)
			return -EBADMSG;
		v |= (uint64_t)(p[*pos] & 0x7f) << shift;
		if (!(p[(*pos)++] & 0x80)) {
			*ret = v;
			return 0;
		}
	}
	return -EBADMSG;
}

/* 1 for a linked remap, 0 for another kind, or -EBADMSG. Only varint fields are CRIU's. */
static int entry_is_linked(const uint8_t *p, size_t len)
{
	uint64_t key, value, type = REMAP_TYPE_LINKED;
	size_t pos = 0;

	while (pos < len) {
		if (varint(p, len, &pos, &key) < 0 || (key & 7) != 0 ||
		    varint(p, len, &pos, &value) < 0)
			return -EBADMSG;
		if (key >> 3 == REMAP_TYPE_FIELD)
			type = value;
	}
	return type == REMAP_TYPE_LINKED;
}

int sv_criu_remap_count_linked(const uint8_t *buf, size_t len)
{
	size_t pos = 8;
	int n = 0;

	if (len < 8 || le32(buf) != IMG_COMMON_MAGIC || le32(buf + 4) != REMAP_FPATH_MAGIC)
		return -EBADMSG;
	while (pos < len) {
		uint32_t size;
		int r;

		if (len - pos < 4)
			return -EBADMSG;
		size = le32(buf + pos);
		pos += 4;
		if (size > ENTRY_MAX || size > len - pos)
			return -EBADMSG;
		r = entry_is_linked(buf + pos, size);
		if (r < 0)
			return r;
		n += r;
		pos += size;
	}
	return n;
}

int sv_criu_images_linked_remaps(int images_fd)
{
	_cleanup_free_ uint8_t *buf = NULL;
	_cleanup_close_ int fd = -1;
	size_t len = 0;
	ssize_t n;

	fd = openat(images_fd, "remap-fpath.img", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	buf = malloc(SV_CRIU_REMAP_IMG_MAX + 1);
	if (!buf)
		return -ENOMEM;
	while ((n = read(fd, buf + len, SV_CRIU_REMAP_IMG_MAX + 1 - len)) > 0)
		len += (size_t)n;
	if (n < 0)
		return -errno;
	if (len > SV_CRIU_REMAP_IMG_MAX)
		return -EFBIG;
	return sv_criu_remap_count_linked(buf, len);
}

struct held_filter {
	const char *path; /* NULL: any */
	bool linked;	  /* only files whose nlink > 0 */
};

/* Appends one held file of pid's (link: /proc/PID/fd/N or /proc/PID/map_files/RANGE) when its
 * name is deleted and it passes the filter; a mapping already named is not named again. */
static size_t held_one(const char *link, pid_t pid, const char *comm, const char *what,
		       const struct held_filter *flt, char *buf, size_t cap)
{
	static const char deleted[] = " (deleted)";
	const size_t dl = sizeof(deleted) - 1;
	char target[PATH_MAX], entry[PATH_MAX + 96];
	size_t used = strlen(buf), tl;
	struct stat st;
	ssize_t n;

	n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return 0;
	target[n] = '\0';
	tl = (size_t)n;
	if (tl <= dl || strcmp(target + tl - dl, deleted) != 0 || stat(link, &st) < 0 ||
	    !S_ISREG(st.st_mode) || (flt->linked && st.st_nlink == 0))
		return 0;
	target[tl - dl] = '\0';
	if (flt->path && strcmp(target, flt->path) != 0)
		return 0;
	snprintf(entry, sizeof(entry), "pid %d (%s) %s: %s", (int)pid, comm, what, target);
	if (strstr(buf, entry))
		return 0;
	if (used + 1 < cap)
		snprintf(buf + used, cap - used, "%s%s", used ? "; " : "", entry);
	return 1;
}

static size_t held_dir(pid_t pid, const char *sub, const char *comm, const struct held_filter *flt,
		       char *buf, size_t cap)
{
	char path[64], link[128], what[96];
	struct dirent *de;
	size_t found = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, sub);
	d = opendir(path);
	if (!d)
		return 0;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(link, sizeof(link), "%s/%s", path, de->d_name);
		if (strcmp(sub, "fd") == 0)
			snprintf(what, sizeof(what), "fd %s", de->d_name);
		else
			snprintf(what, sizeof(what), "mapping");
		found += held_one(link, pid, comm, what, flt, buf, cap);
	}
	closedir(d);
	return found;
}

static size_t held_deleted(int procs_fd, const struct held_filter *flt, char *buf, size_t cap)
{
	_cleanup_fclose_ FILE *f = NULL;
	int fd = dup(procs_fd);
	size_t found = 0;
	int pid;

	if (cap)
		buf[0] = '\0';
	if (fd < 0 || lseek(fd, 0, SEEK_SET) < 0 || !(f = fdopen(fd, "re"))) {
		if (fd >= 0)
			(void)close(fd);
		return 0;
	}
	while (fscanf(f, "%d", &pid) == 1) {
		char path[64], comm[32] = "?";
		_cleanup_fclose_ FILE *c = NULL;

		snprintf(path, sizeof(path), "/proc/%d/comm", pid);
		c = fopen(path, "re");
		if (c && fgets(comm, sizeof(comm), c))
			comm[strcspn(comm, "\n")] = '\0';
		found += held_dir(pid, "fd", comm, flt, buf, cap);
		found += held_dir(pid, "map_files", comm, flt, buf, cap);
	}
	return found;
}

static int open_procs(const char *cgroup)
{
	char path[PATH_MAX];

	if (snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	return open(path, O_RDONLY | O_CLOEXEC);
}

size_t sv_criu_held_unlinked(int procs_fd, char *buf, size_t cap)
{
	const struct held_filter flt = {.linked = true};

	return held_deleted(procs_fd, &flt, buf, cap);
}

size_t sv_criu_ghost_holders(const char *line, const char *cgroup, char *buf, size_t cap)
{
	static const char pre[] = "Can't dump ghost file ";
	const char *start = strstr(line, pre), *end;
	_cleanup_close_ int procs = -1;
	char path[PATH_MAX];
	struct held_filter flt = {.path = path};

	if (cap)
		buf[0] = '\0';
	if (!start)
		return 0;
	start += sizeof(pre) - 1;
	end = strstr(start, " of ");
	if (!end || (size_t)(end - start) >= sizeof(path))
		return 0;
	memcpy(path, start, (size_t)(end - start));
	path[end - start] = '\0';
	procs = open_procs(cgroup);
	return procs < 0 ? 0 : held_deleted(procs, &flt, buf, cap);
}

int sv_criu_refuse_linked_remaps(int images_fd, const char *cgroup, char *error, size_t cap)
{
	_cleanup_close_ int procs = -1;
	char held[1024] = "";
	int r;

	r = sv_criu_images_linked_remaps(images_fd);
	if (r == 0)
		return 0;
	if (r < 0) {
		snprintf(error, cap, "CRIU's remap-fpath.img cannot be read: %s", strerror(-r));
		return r;
	}
	procs = open_procs(cgroup);
	if (procs >= 0)
		(void)sv_criu_held_unlinked(procs, held, sizeof(held));
	/* The files first: the reply and the event cut long lines. */
	snprintf(error, cap,
		 "%s: held open under a deleted name while another hard link remains, which CRIU "
		 "saves only as a link made for the dump's length (close it, or remove the other "
		 "links)",
		 *held ? held : "a mapped file");
	return -EBUSY;
}
