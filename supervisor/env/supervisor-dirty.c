/* SPDX-License-Identifier: MIT */
/* Dirty-path set: an open-addressing hash set of strings (see supervisor-dirty.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "supervisor-dirty.h"
#include "util.h"

/* Entries: a path and whether it stands for its whole subtree or only for the object itself
 * (a directory whose entries changed: its own mtime and size, not its children). */
struct entry {
	bool subtree;
	char path[];
};

struct sv_dirty {
	struct entry **slots;
	size_t nslots; /* a power of 2 */
	size_t count;
	bool full_diff;
	const char *reason;
	char reason_buf[128];
	uint64_t drops_seen;
};

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ULL; /* FNV-1a */

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ULL;
	}
	return h;
}

int dirty_create(struct sv_dirty **ret)
{
	struct sv_dirty *d = calloc(1, sizeof(*d));

	if (!d)
		return -ENOMEM;
	d->nslots = 256;
	d->slots = calloc(d->nslots, sizeof(*d->slots));
	if (!d->slots) {
		free(d);
		return -ENOMEM;
	}
	*ret = d;
	return 0;
}

static void clear_slots(struct sv_dirty *d)
{
	for (size_t i = 0; i < d->nslots; i++) {
		free(d->slots[i]);
		d->slots[i] = NULL;
	}
	d->count = 0;
}

void dirty_destroy(struct sv_dirty *d)
{
	if (!d)
		return;
	clear_slots(d);
	free(d->slots);
	free(d);
}

static struct entry **find_slot(struct entry **slots, size_t nslots, const char *s, size_t n)
{
	size_t i = hash_bytes(s, n) & (nslots - 1);

	while (slots[i] && (strncmp(slots[i]->path, s, n) != 0 || slots[i]->path[n] != 0))
		i = (i + 1) & (nslots - 1);
	return &slots[i];
}

static int grow(struct sv_dirty *d)
{
	size_t nslots = d->nslots * 2;
	struct entry **slots = calloc(nslots, sizeof(*slots));

	if (!slots)
		return -ENOMEM;
	for (size_t i = 0; i < d->nslots; i++) {
		struct entry *e = d->slots[i];

		if (e)
			*find_slot(slots, nslots, e->path, strlen(e->path)) = e;
	}
	free(d->slots);
	d->slots = slots;
	d->nslots = nslots;
	return 0;
}

static int add(struct sv_dirty *d, const char *path, bool subtree)
{
	struct entry **slot;
	size_t n;
	int r;

	if (!path || path[0] != '/')
		return -EINVAL;
	if ((d->count + 1) * 2 > d->nslots) {
		r = grow(d);
		if (r < 0) {
			/* Out of memory still must not lose the change. */
			dirty_require_full_diff(d, "out of memory");
			return r;
		}
	}
	n = strlen(path);
	slot = find_slot(d->slots, d->nslots, path, n);
	if (*slot) {
		(*slot)->subtree |= subtree;
		return 0;
	}
	*slot = malloc(sizeof(struct entry) + n + 1);
	if (!*slot) {
		dirty_require_full_diff(d, "out of memory");
		return -ENOMEM;
	}
	(*slot)->subtree = subtree;
	memcpy((*slot)->path, path, n + 1);
	d->count++;
	return 0;
}

int dirty_add(struct sv_dirty *d, const char *path)
{
	return add(d, path, true);
}

int dirty_add_self(struct sv_dirty *d, const char *path)
{
	return add(d, path, false);
}

bool dirty_covers(const struct sv_dirty *d, const char *path)
{
	size_t n = strlen(path);
	bool self = true;

	/* path itself (any kind), then each ancestor with a subtree entry. */
	for (;;) {
		struct entry *e = *find_slot(d->slots, d->nslots, path, n ? n : 1);

		if (e && (self || e->subtree))
			return true;
		if (n <= 1)
			return false;
		self = false;
		while (n > 0 && path[n - 1] != '/')
			n--;
		if (n > 1)
			n--; /* drop the '/' too, except the root's */
	}
}

size_t dirty_count(const struct sv_dirty *d)
{
	return d->count;
}

static int cmp_item(const void *a, const void *b)
{
	return strcmp(((const struct dirty_item *)a)->path, ((const struct dirty_item *)b)->path);
}

int dirty_list(const struct sv_dirty *d, struct dirty_item **ret, size_t *ret_n)
{
	struct dirty_item *v = calloc(d->count + 1, sizeof(*v));
	size_t n = 0;

	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < d->nslots; i++) {
		if (!d->slots[i])
			continue;
		v[n].path = d->slots[i]->path;
		v[n].subtree = d->slots[i]->subtree;
		n++;
	}
	qsort(v, n, sizeof(*v), cmp_item);
	*ret = v;
	*ret_n = n;
	return 0;
}

void dirty_require_full_diff(struct sv_dirty *d, const char *reason)
{
	if (d->full_diff)
		return;
	d->full_diff = true;
	snprintf(d->reason_buf, sizeof(d->reason_buf), "%s", reason ? reason : "unknown");
	d->reason = d->reason_buf;
}

bool dirty_needs_full_diff(const struct sv_dirty *d, const char **ret_reason)
{
	if (ret_reason)
		*ret_reason = d->full_diff ? d->reason : NULL;
	return d->full_diff;
}

/* Calls that add or remove a directory entry change the directory itself (mtime, size). */
static bool changes_parent(const struct envtrace_record *rec)
{
	switch (rec->op) {
	case ENVTRACE_OP_OPEN:
		return (rec->flags & O_CREAT) != 0;
	case ENVTRACE_OP_UNLINK:
	case ENVTRACE_OP_RMDIR:
	case ENVTRACE_OP_RENAME:
	case ENVTRACE_OP_MKDIR:
	case ENVTRACE_OP_LINK:
	case ENVTRACE_OP_SYMLINK:
	case ENVTRACE_OP_MKNOD:
	case ENVTRACE_OP_BIND:
		return true;
	}
	return false;
}

static int add_parent(struct sv_dirty *d, const char *path)
{
	const char *slash = strrchr(path, '/');
	char buf[PATH_MAX];
	size_t n;

	if (!slash)
		return 0;
	n = slash == path ? 1 : (size_t)(slash - path);
	if (n >= sizeof(buf)) {
		dirty_require_full_diff(d, "path too long");
		return -ENAMETOOLONG;
	}
	memcpy(buf, path, n);
	buf[n] = 0;
	return dirty_add_self(d, buf);
}

int dirty_apply(struct sv_dirty *d, const struct envtrace_record *rec)
{
	int r = 0;

	switch (rec->type) {
	case ENVTRACE_EV_FULL_DIFF:
		dirty_require_full_diff(d, envtrace_full_diff_reason_to_string(rec->op));
		return 0;
	case ENVTRACE_EV_FILE:
		break;
	default:
		return 0;
	}
	if (rec->unresolved)
		dirty_require_full_diff(d, "unresolved path");
	for (unsigned int i = 0; i < rec->npaths && i < 2; i++) {
		const char *names[3] = {rec->path[i], rec->alias[i][0], rec->alias[i][1]};

		for (size_t k = 0; k < ARRAY_SIZE(names); k++) {
			int q;

			if (!names[k])
				continue;
			q = dirty_add(d, names[k]);
			if (q == 0 && changes_parent(rec))
				q = add_parent(d, names[k]);
			if (q < 0 && r == 0)
				r = q;
		}
	}
	return r;
}

void dirty_note_drops(struct sv_dirty *d, uint64_t drops)
{
	if (drops != d->drops_seen)
		dirty_require_full_diff(d, "ring buffer overflow: records lost");
	d->drops_seen = drops;
}

void dirty_reset(struct sv_dirty *d)
{
	clear_slots(d);
	d->full_diff = false;
	d->reason = NULL;
}

static void add_proc_path(struct sv_dirty *d, const char *p, const char *root)
{
	size_t rl = strlen(root);

	if (p[0] != '/' || strstr(p, " (deleted)"))
		return;
	if (rl > 1) {
		if (strncmp(p, root, rl) != 0 || (p[rl] != '/' && p[rl] != 0))
			return;
		p += rl;
		if (!*p)
			p = "/";
	}
	(void)dirty_add(d, p);
}

static void scan_pid(struct sv_dirty *d, const char *pid, const char *root)
{
	char path[PATH_MAX], target[PATH_MAX], line[PATH_MAX + 256];
	DIR *fds;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%s/fdinfo", pid);
	fds = opendir(path);
	if (fds) {
		struct dirent *de;

		while ((de = readdir(fds))) {
			unsigned int flags = 0;
			ssize_t n;

			if (de->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "/proc/%s/fdinfo/%s", pid, de->d_name);
			f = fopen(path, "re");
			if (!f)
				continue;
			while (fgets(line, sizeof(line), f)) {
				if (sscanf(line, "flags: %o", &flags) == 1)
					break;
			}
			fclose(f);
			if ((flags & O_ACCMODE) == O_RDONLY)
				continue;
			snprintf(path, sizeof(path), "/proc/%s/fd/%s", pid, de->d_name);
			n = readlink(path, target, sizeof(target) - 1);
			if (n <= 0)
				continue;
			target[n] = 0;
			add_proc_path(d, target, root);
		}
		closedir(fds);
	}
	snprintf(path, sizeof(path), "/proc/%s/maps", pid);
	f = fopen(path, "re");
	if (!f)
		return;
	/* "start-end perms offset dev inode   path": perms "rw-s" is a shared writable map. */
	while (fgets(line, sizeof(line), f)) {
		char perms[8], *p;

		if (sscanf(line, "%*s %7s", perms) != 1 || perms[1] != 'w' || perms[3] != 's')
			continue;
		p = strchr(line, '/');
		if (!p)
			continue;
		p[strcspn(p, "\n")] = 0;
		add_proc_path(d, p, root);
	}
	fclose(f);
}

static int scan_cgroup(struct sv_dirty *d, const char *cg, const char *root, int depth)
{
	char path[PATH_MAX], pid[32];
	struct dirent *de;
	FILE *f;
	DIR *dir;

	if (depth > 64)
		return -ELOOP;
	snprintf(path, sizeof(path), "%s/cgroup.procs", cg);
	f = fopen(path, "re");
	if (!f)
		return negative_errno();
	while (fgets(pid, sizeof(pid), f)) {
		pid[strcspn(pid, "\n")] = 0;
		scan_pid(d, pid, root);
	}
	fclose(f);
	dir = opendir(cg);
	if (!dir)
		return negative_errno();
	while ((de = readdir(dir))) {
		if (de->d_type != DT_DIR || de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", cg, de->d_name);
		(void)scan_cgroup(d, path, root, depth + 1);
	}
	closedir(dir);
	return 0;
}

int dirty_rescan_writers(struct sv_dirty *d, const char *cgroup_path, const char *root_path)
{
	return scan_cgroup(d, cgroup_path, root_path ? root_path : "/", 0);
}
