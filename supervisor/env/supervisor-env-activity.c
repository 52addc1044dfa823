/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-env-activity.h"
#include "supervisor-env.h"

/* Open paths looked at per checkpoint at most: more counts as changed (a full dump). */
#define OPEN_PATHS_MAX 4096

static int read_text(const char *path, char *buf, size_t cap)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, cap - 1);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return (int)n;
}

/* The start time (field 22) of /proc/PID/task/TID/stat: after the command's ')' . */
static uint64_t task_start(const char *stat)
{
	const char *p = strrchr(stat, ')');
	unsigned long long v = 0;

	if (!p)
		return 0;
	p++;
	/* fields 3..21 skipped: state .. itrealvalue */
	for (int i = 0; i < 19 && p; i++)
		p = strchr(p + 1, ' ');
	if (p)
		(void)sscanf(p, " %llu", &v);
	return v;
}

static uint64_t mix(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	return h ^ (h >> 33);
}

struct tasks_walk {
	uint64_t hash;
	bool running;
	int error;
};

static int tasks_of(pid_t pid, void *userdata)
{
	struct tasks_walk *w = userdata;
	char path[64], buf[1024];
	struct dirent *de;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	while ((de = readdir(d))) {
		int tid = atoi(de->d_name);

		if (tid <= 0)
			continue;
		/* "running", "-1 sp pc" (not in a syscall: caught in user mode, or in an
		 * exception's return), or "nr args... sp pc" */
		snprintf(path, sizeof(path), "/proc/%d/task/%d/syscall", (int)pid, tid);
		if (read_text(path, buf, sizeof(buf)) < 0) {
			w->error = -errno;
			continue;
		}
		if (strncmp(buf, "running", 7) == 0 || strncmp(buf, "-1", 2) == 0)
			w->running = true;
		snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid, tid);
		if (read_text(path, buf, sizeof(buf)) < 0) {
			w->error = -errno;
			continue;
		}
		/* a sum: the order of the walk does not matter */
		w->hash += mix(((uint64_t)tid << 40) ^ task_start(buf));
	}
	closedir(d);
	return 0;
}

int env_activity_tasks(const struct sv_env *e, uint64_t *ret_hash)
{
	struct tasks_walk w = {0};
	int r = env_walk_procs(e, tasks_of, &w);

	if (r < 0)
		return r;
	if (w.error < 0)
		return w.error;
	*ret_hash = w.hash;
	return w.running ? 0 : 1;
}

bool env_activity_unchanged(const struct sv_env *e, env_activity_fn fn, void *userdata, int parked,
			    uint64_t tasks_hash, uint64_t *ret_count)
{
	const struct env_activity *a = &e->act;
	uint32_t watch;
	uint64_t count = UINT64_MAX;
	const char *why = NULL;

	if (!fn || fn(userdata, &watch, &count) < 0) {
		count = UINT64_MAX;
		why = "no tracer";
	} else if (!a->valid)
		why = "no baseline (a restore, or a task in user code at the last dump)";
	else if (!e->head[0] || strcmp(a->ckpt, e->head) != 0)
		why = "the head is not the last dump's checkpoint";
	else if (watch != a->watch)
		why = "watched anew since the last dump";
	else if (count != a->count)
		why = "its processes ran";
	else if (parked <= 0)
		why = parked < 0 ? "its tasks unreadable" : "a task is in user code";
	else if (tasks_hash != a->tasks)
		why = "its tasks changed";
	*ret_count = count;
	if (why) {
		log_debug("Checkpoint of %s dumps its processes: %s.", e->id, why);
		return false;
	}
	return true;
}

bool env_activity_idle_since_dump(const struct sv_env *e, env_activity_fn fn, void *userdata)
{
	const struct env_activity *a = &e->act;
	uint64_t c1, c2, tasks;
	uint32_t watch;

	if (!fn || !a->valid || !e->head[0] || strcmp(a->ckpt, e->head) != 0)
		return false;
	if (fn(userdata, &watch, &c1) < 0 || watch != a->watch || c1 != a->count)
		return false;
	if (env_activity_tasks(e, &tasks) != 1 || tasks != a->tasks)
		return false;
	return fn(userdata, &watch, &c2) >= 0 && c2 == c1;
}

struct open_walk {
	dev_t overlay; /* the root's st_dev: only its files are the delta's */
	char **paths;
	size_t n;
	bool overflow, deleted;
};

/* path: how the process names what link (its /proc fd, cwd, exe or map_files entry) reaches.
 * Only files of the overlay count (not pipes, sockets, memfds, shared anonymous memory, the
 * read-only binds of /usr and /etc); one deleted since it was opened counts as changed. */
static int open_add(struct open_walk *w, const char *link, const char *path)
{
	size_t len = strlen(path);
	struct stat st;

	if (path[0] != '/')
		return 0; /* pipe:[..], socket:[..], anon_inode:.. */
	if (stat(link, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (st.st_dev != w->overlay)
		return 0;
	if (len > 10 && strcmp(path + len - 10, " (deleted)") == 0) {
		w->deleted = true;
		return 0;
	}
	if (w->n == OPEN_PATHS_MAX) {
		w->overflow = true;
		return 0;
	}
	w->paths[w->n] = strdup(path + 1);
	if (!w->paths[w->n])
		return -ENOMEM;
	w->n++;
	return 0;
}

static int open_link(struct open_walk *w, const char *link)
{
	char target[PATH_MAX];
	ssize_t n = readlink(link, target, sizeof(target) - 1);

	if (n < 0)
		return errno == ENOENT ? 0 : -errno;
	target[n] = '\0';
	return open_add(w, link, target);
}

/* Every path process pid holds: its fds, cwd, executable and file mappings, as it sees them
 * (relative to its root: the environment's). */
static int open_of(pid_t pid, void *userdata)
{
	struct open_walk *w = userdata;
	char path[PATH_MAX], line[PATH_MAX + 128];
	struct dirent *de;
	FILE *f;
	DIR *d;
	int r;

	snprintf(path, sizeof(path), "/proc/%d/cwd", (int)pid);
	r = open_link(w, path);
	snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
	if (r >= 0)
		r = open_link(w, path);
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	while (r >= 0 && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/fd/%s", (int)pid, de->d_name);
		r = open_link(w, path);
	}
	closedir(d);
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return errno == ENOENT ? 0 : -errno;
	while (r >= 0 && fgets(line, sizeof(line), f)) {
		char *p = strchr(line, '/'), link[96];

		if (!p)
			continue;
		p[strcspn(p, "\n")] = '\0';
		/* "start-end perms ...": the mapping's own link */
		snprintf(link, sizeof(link), "/proc/%d/map_files/%.*s", (int)pid,
			 (int)strcspn(line, " "), line);
		r = open_add(w, link, p);
	}
	fclose(f);
	return r;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* For each open path, its entry in m (found[i]) and in base (was[i]). */
static void entries_of(const struct env_manifest *m, char **paths, size_t n,
		       const struct env_entry **found)
{
	for (size_t i = 0; i < m->n_entries; i++) {
		char *key = m->entries[i].path;
		char **hit = bsearch(&key, paths, n, sizeof(*paths), cmp_str);

		if (hit)
			found[hit - paths] = &m->entries[i];
	}
}

static bool entry_same(const struct env_entry *a, const struct env_entry *b)
{
	if (!a || !b)
		return a == b;
	if (a->kind != b->kind)
		return false;
	/* A directory holding a cwd needs its path only (CRIU checks no directory's times). */
	if (a->kind == ENV_ENTRY_DIR)
		return true;
	return a->size == b->size && a->mtime_ns == b->mtime_ns && a->ino == b->ino &&
	       a->mode == b->mode && a->data_key == b->data_key && strcmp(a->src, b->src) == 0 &&
	       strcmp(a->target ?: "", b->target ?: "") == 0;
}

/* Whether the dirty-set delta removed path (relative): it, or a directory it is below. */
static bool gone_has(const struct env_fs_gone *g, const char *path)
{
	for (size_t i = 0; i < g->n; i++) {
		size_t n = strlen(g->paths[i]);

		if (strcmp(g->paths[i], path) == 0 ||
		    (g->below && g->below[i] && strncmp(g->paths[i], path, n) == 0 &&
		     path[n] == '/'))
			return true;
	}
	return false;
}

bool env_activity_open_changed(const struct sv_env *e, const struct env_manifest *base,
			       const struct env_manifest *m, const struct env_fs_gone *gone)
{
	struct open_walk w = {0};
	const struct env_entry **now = NULL, **was = NULL;
	bool changed = false;
	const char *why = NULL;
	size_t k = 0;
	int r;

	{
		struct stat st;

		if (stat(e->root, &st) < 0)
			return true;
		w.overlay = st.st_dev;
	}
	w.paths = calloc(OPEN_PATHS_MAX, sizeof(*w.paths));
	if (!w.paths)
		return true;
	r = env_walk_procs(e, open_of, &w);
	if (r < 0 || w.overflow || w.deleted) {
		changed = true;
		why = r < 0	   ? "its open files unreadable"
		      : w.overflow ? "too many open files"
				   : "a deleted file is open";
		goto out;
	}
	qsort(w.paths, w.n, sizeof(*w.paths), cmp_str);
	/* unique */
	for (size_t i = 0; i < w.n; i++) {
		if (k && strcmp(w.paths[k - 1], w.paths[i]) == 0) {
			free(w.paths[i]);
			continue;
		}
		w.paths[k++] = w.paths[i];
	}
	w.n = k;
	now = calloc(w.n + 1, sizeof(*now));
	was = calloc(w.n + 1, sizeof(*was));
	if (!now || !was) {
		changed = true;
		why = "out of memory";
		goto out;
	}
	entries_of(m, w.paths, w.n, now);
	if (base)
		entries_of(base, w.paths, w.n, was);
	/* A partial index: what the delta did not touch is as it was. */
	for (size_t i = 0; gone && i < w.n; i++)
		if (!now[i] && !gone_has(gone, w.paths[i]))
			now[i] = was[i];
	for (size_t i = 0; i < w.n && !changed; i++)
		if (!entry_same(now[i], was[i])) {
			changed = true;
			log_debug("Checkpoint of %s dumps its processes: /%s is open and changed.",
				  e->id, w.paths[i]);
		}
out:
	if (why)
		log_debug("Checkpoint of %s dumps its processes: %s.", e->id, why);
	for (size_t i = 0; i < w.n; i++)
		free(w.paths[i]);
	free(w.paths);
	free(now);
	free(was);
	return changed;
}

int env_activity_link_images(int ckfd, const char *from, int criufd)
{
	char name[ENV_ID_MAX + 8];
	_cleanup_close_ int src = -1;

	snprintf(name, sizeof(name), "%s/criu", from);
	src = openat(ckfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return src < 0 ? -errno : env_link_images(src, criufd);
}

void env_activity_note_dump(struct sv_env *e, env_activity_fn fn, void *userdata, int parked,
			    uint64_t tasks_hash, uint64_t before, const char *id)
{
	struct env_activity *a = &e->act;
	uint64_t cpu = 0;

	*a = (struct env_activity){0};
	snprintf(a->ckpt, sizeof(a->ckpt), "%s", id);
	snprintf(a->images, sizeof(a->images), "%s", id);
	a->tasks = tasks_hash;
	a->valid = parked > 0 && before != UINT64_MAX && fn &&
		   fn(userdata, &a->watch, &a->count) >= 0 && a->count == before;
	if (env_activity_cpu_ns(e, &cpu) >= 0)
		log_debug("Dump %s of %s: activity %" PRIu64 " (%" PRIu64
			  " as frozen), CPU %" PRIu64 " ns, %s.",
			  id, e->id, a->count, before, cpu, a->valid ? "baseline" : "no baseline");
}

int env_activity_cpu_ns(const struct sv_env *e, uint64_t *ret)
{
	char path[PATH_MAX], buf[512];
	unsigned long long v;
	const char *p;
	int r;

	snprintf(path, sizeof(path), "%s/cpu.stat", e->cgroup);
	r = read_text(path, buf, sizeof(buf));
	if (r >= 0 && (p = strstr(buf, "usage_usec ")) && sscanf(p + 11, "%llu", &v) == 1) {
		*ret = (uint64_t)v * 1000;
		return 0;
	}
	return r < 0 ? r : -ENODATA;
}

static bool dirty_track;

#define PME_SOFT_DIRTY (1ull << 55)

static void probe_dirty_track(void)
{
	long page = sysconf(_SC_PAGESIZE);
	char *map = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
	_cleanup_close_ int fd = -1;
	uint64_t pme = 0;

	if (map == MAP_FAILED)
		return;
	map[0] = 1;
	fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd >= 0 &&
	    pread(fd, &pme, sizeof(pme), (off_t)((uintptr_t)map / (uintptr_t)page * sizeof(pme))) ==
		    sizeof(pme))
		dirty_track = (pme & PME_SOFT_DIRTY) != 0;
	(void)munmap(map, (size_t)page);
}

bool env_mem_dirty_track(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	(void)pthread_once(&once, probe_dirty_track);
	return dirty_track;
}

const char *env_mem_mode(void)
{
	return env_mem_dirty_track() ? "pre-dump" : "full";
}

enum env_mem_plan env_mem_plan(bool soft_dirty, bool idle)
{
	return soft_dirty && !idle ? ENV_MEM_PRE_DUMP : ENV_MEM_FULL;
}
