/* SPDX-License-Identifier: MIT */
/*
 * Loads bpf/envtrace.bpf.c and turns its ring-buffer records into paths (see
 * supervisor-envtrace.h for the integration API and bpf/envtrace.h for the wire format).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "envtrace.skel.h"
#include "log.h"
#include "pin-dir.h"
#include "supervisor-envtrace.h"
#include "util.h"

#define PATH_BUF (ENVTRACE_DATA_SIZE + 2)

struct watch_entry {
	uint64_t cgroup_id;
	int root_fd; /* -1: not in use */
	char *root;  /* the root's path as we see it, without trailing '/' ("" for "/") */
};

struct sv_envtrace {
	struct envtrace *skel;
	struct ring_buffer *rb;
	char *pin_dir; /* "": nothing pinned */
	int pin_lock;  /* the pin directory, flock()ed while this tracer lives; -1: none */
	char **pins;   /* the paths this tracer pinned: the only ones it removes */
	size_t n_pins;
	int ncpus;
	struct watch_entry watches[ENVTRACE_MAX_ENVS];
	/* Decode state for the callback in flight. */
	envtrace_record_cb cb;
	void *userdata;
	char path[2][PATH_BUF];
	char raw[2][PATH_BUF]; /* before normalization: ".." must be resolved by the kernel */
	char alias[2][2][PATH_BUF];
	bool activity; /* the activity programs are loaded */
};

static const char *const op_names[ENVTRACE_OP__MAX] = {
	[ENVTRACE_OP_OPEN] = "open",	 [ENVTRACE_OP_TRUNCATE] = "truncate",
	[ENVTRACE_OP_UNLINK] = "unlink", [ENVTRACE_OP_RMDIR] = "rmdir",
	[ENVTRACE_OP_RENAME] = "rename", [ENVTRACE_OP_MKDIR] = "mkdir",
	[ENVTRACE_OP_LINK] = "link",	 [ENVTRACE_OP_SYMLINK] = "symlink",
	[ENVTRACE_OP_CHMOD] = "chmod",	 [ENVTRACE_OP_CHOWN] = "chown",
	[ENVTRACE_OP_UTIMES] = "utimes", [ENVTRACE_OP_XATTR] = "xattr",
	[ENVTRACE_OP_MKNOD] = "mknod",	 [ENVTRACE_OP_BIND] = "bind",
};

const char *envtrace_op_to_string(unsigned int op)
{
	return op < ENVTRACE_OP__MAX && op_names[op] ? op_names[op] : "unknown";
}

const char *envtrace_full_diff_reason_to_string(unsigned int reason)
{
	switch (reason) {
	case ENVTRACE_FULL_IO_URING:
		return "io_uring";
	case ENVTRACE_FULL_MMAP_SHARED:
		return "shared writable mapping";
	case ENVTRACE_FULL_PENDING_FULL:
		return "too many calls in flight";
	case ENVTRACE_FULL_OPEN_BY_HANDLE:
		return "open_by_handle_at for writing";
	}
	return "unknown";
}

static int ensure_fs(const char *path, long magic, const char *type, const char *options)
{
	struct statfs sfs;

	if (statfs(path, &sfs) == 0 && (long)sfs.f_type == magic)
		return 0;
	if (mount(type, path, type, 0, options) < 0)
		return log_debug_errno(negative_errno(), "Failed to mount %s at %s: %m", type,
				       path);
	return 0;
}

int envtrace_setup_fs(void)
{
	int r;

	r = ensure_fs("/sys/fs/bpf", BPF_FS_MAGIC, "bpf", "mode=0700");
	if (r < 0)
		return r;
	return ensure_fs("/sys/kernel/tracing", TRACEFS_MAGIC, "tracefs", NULL);
}

/* A syscall tracepoint this kernel lacks (fchmodat2 before 6.6, the legacy calls on arm64)
 * would fail the whole attach: such programs are not loaded. */
static bool tracepoint_exists(const char *sec)
{
	static const char *const roots[] = {"/sys/kernel/tracing/events",
					    "/sys/kernel/debug/tracing/events"};
	const char *tp;
	char buf[256];

	if (strncmp(sec, "tp/", 3) != 0)
		return true;
	tp = sec + 3;
	for (size_t i = 0; i < ARRAY_SIZE(roots); i++) {
		snprintf(buf, sizeof(buf), "%s/%s", roots[i], tp);
		if (access(buf, F_OK) == 0)
			return true;
	}
	return false;
}

static int mkdir_p(const char *path, mode_t mode)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, mode) < 0 && errno != EEXIST)
			return negative_errno();
		*p = '/';
	}
	if (mkdir(buf, mode) < 0 && errno != EEXIST)
		return negative_errno();
	return 0;
}

/* Takes the pin directory: creates it (and progs/ below it) when missing and holds an exclusive
 * flock() on it for the tracer's life. A directory another live tracer holds is refused:
 * its pins are that tracer's. A lock dies with its holder, so a crashed run's pins are free to
 * replace. */
static int pin_dir_take(struct sv_envtrace *et)
{
	char progs[PATH_MAX];
	int r;

	r = mkdir_p(et->pin_dir, 0700);
	if (r < 0)
		return log_debug_errno(r, "Failed to create %s: %m", et->pin_dir);
	et->pin_lock = open(et->pin_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (et->pin_lock < 0)
		return log_debug_errno(negative_errno(), "Failed to open %s: %m", et->pin_dir);
	if (flock(et->pin_lock, LOCK_EX | LOCK_NB) < 0) {
		r = negative_errno();
		et->pin_lock = safe_close(et->pin_lock); /* not ours: unpin_all() leaves it */
		if (r == -EWOULDBLOCK)
			return log_error_errno(
				-EBUSY,
				"The BPF pin directory %s is held by another running "
				"supervisor: not tracing here, and its pins are left "
				"alone (give each supervisor its own state_dir or [env] "
				"pin_dir).",
				et->pin_dir);
		return log_debug_errno(r, "Failed to lock %s: %m", et->pin_dir);
	}
	if (snprintf(progs, sizeof(progs), "%s/progs", et->pin_dir) >= (int)sizeof(progs))
		return -ENAMETOOLONG;
	if (mkdir(progs, 0700) < 0 && errno != EEXIST)
		return log_debug_errno(negative_errno(), "Failed to create %s: %m", progs);
	return 0;
}

/* Pins one object at dir/name, replacing a dead holder's pin of that name (only names this
 * tracer pins itself are ever replaced), and remembers the path. */
static int pin_one(struct sv_envtrace *et, const char *dir, const char *name, bool is_map,
		   void *obj)
{
	char path[PATH_MAX], **pins;
	int r;

	if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	pins = realloc(et->pins, (et->n_pins + 1) * sizeof(*pins));
	if (!pins)
		return -ENOMEM;
	et->pins = pins;
	if (unlink(path) < 0 && errno != ENOENT)
		return log_debug_errno(negative_errno(), "Failed to replace %s: %m", path);
	r = is_map ? bpf_map__pin(obj, path) : bpf_program__pin(obj, path);
	if (r < 0)
		return log_debug_errno(r, "Failed to pin %s at %s: %m", is_map ? "map" : "program",
				       path);
	pins[et->n_pins] = strdup(path);
	if (!pins[et->n_pins]) {
		(void)unlink(path);
		return -ENOMEM;
	}
	et->n_pins++;
	return 0;
}

static int pin_all(struct sv_envtrace *et)
{
	char progs[PATH_MAX];
	struct bpf_program *prog;
	struct bpf_map *map;
	int r;

	snprintf(progs, sizeof(progs), "%s/progs", et->pin_dir);
	bpf_object__for_each_map(map, et->skel->obj)
	{
		const char *name = bpf_map__name(map);

		/* ".rodata"/".bss" are named "envtrace.rodata" etc.: pin them as rodata/bss. */
		if (strchr(name, '.'))
			name = strchr(name, '.') + 1;
		r = pin_one(et, et->pin_dir, name, true, map);
		if (r < 0)
			return r;
	}
	bpf_object__for_each_program(prog, et->skel->obj)
	{
		if (!bpf_program__autoload(prog))
			continue;
		r = pin_one(et, progs, bpf_program__name(prog), false, prog);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Removes the pins this tracer made, then its pin directory and progs/ if that left them empty;
 * whatever else is there (another program's pins) stays. */
static void unpin_all(struct sv_envtrace *et)
{
	char progs[PATH_MAX];

	for (size_t i = 0; i < et->n_pins; i++) {
		(void)unlink(et->pins[i]);
		free(et->pins[i]);
	}
	free(et->pins);
	et->pins = NULL;
	et->n_pins = 0;
	if (et->pin_lock >= 0) {
		snprintf(progs, sizeof(progs), "%s/progs", et->pin_dir);
		(void)rmdir(progs);
		(void)rmdir(et->pin_dir);
	}
	et->pin_lock = safe_close(et->pin_lock);
}

static int on_sample(void *ctx, void *data, size_t size);

int envtrace_create(const struct envtrace_options *opts, struct sv_envtrace **ret)
{
	static const struct envtrace_options defaults = {0};
	struct sv_envtrace *et;
	struct bpf_program *prog;
	int r;

	if (!opts)
		opts = &defaults;
	et = calloc(1, sizeof(*et));
	if (!et)
		return -ENOMEM;
	for (size_t i = 0; i < ARRAY_SIZE(et->watches); i++)
		et->watches[i].root_fd = -1;
	et->pin_lock = -1;
	if (opts->pin_dir && opts->pin_dir[0]) {
		et->pin_dir = strdup(opts->pin_dir);
	} else if (opts->state_dir && opts->state_dir[0]) {
		char dir[PATH_MAX];

		/* The name is the state directory's canonical path's: it must exist (with the
		 * journal off nothing else may have made it yet), as the journal makes it. */
		r = mkdir_p(opts->state_dir, 0700);
		if (r >= 0)
			r = pin_dir_for_state(opts->state_dir, dir, sizeof(dir));
		if (r < 0) {
			log_debug_errno(r, "No pin directory for state directory %s: %m",
					opts->state_dir);
			goto fail;
		}
		et->pin_dir = strdup(dir);
	} else {
		et->pin_dir = strdup("");
	}
	if (!et->pin_dir) {
		r = -ENOMEM;
		goto fail;
	}
	et->ncpus = libbpf_num_possible_cpus();
	if (et->ncpus <= 0) {
		r = et->ncpus < 0 ? et->ncpus : -EINVAL;
		goto fail;
	}
	/* tracefs is needed to attach; bpffs only to pin. */
	r = ensure_fs("/sys/kernel/tracing", TRACEFS_MAGIC, "tracefs", NULL);
	if (r < 0)
		goto fail;
	if (et->pin_dir[0]) {
		r = ensure_fs("/sys/fs/bpf", BPF_FS_MAGIC, "bpf", "mode=0700");
		if (r >= 0) /* before the slow load: a refusal costs nothing */
			r = pin_dir_take(et);
		if (r < 0)
			goto fail;
	}

	et->skel = envtrace__open();
	if (!et->skel) {
		r = negative_errno();
		log_debug_errno(r, "Failed to open the envtrace BPF object: %m");
		goto fail;
	}
	if (opts->ringbuf_bytes) {
		r = bpf_map__set_max_entries(et->skel->maps.events, (uint32_t)opts->ringbuf_bytes);
		if (r < 0)
			goto fail;
	}
	if (opts->argv_max)
		et->skel->rodata->argv_max = MIN(opts->argv_max, ENVTRACE_ARGV_MAX);
	if (opts->wakeup_bytes == 0) {
		uint64_t ring = bpf_map__max_entries(et->skel->maps.events);

		et->skel->rodata->wakeup_bytes = (uint32_t)MIN(256 * 1024, ring / 4);
	} else if (opts->wakeup_bytes > 0) {
		et->skel->rodata->wakeup_bytes = (uint32_t)MIN(opts->wakeup_bytes, UINT32_MAX);
	}
	bpf_object__for_each_program(prog, et->skel->obj)
	{
		if (!tracepoint_exists(bpf_program__section_name(prog)))
			(void)bpf_program__set_autoload(prog, false);
	}
	et->activity = !opts->no_activity;
	if (!et->activity) {
		(void)bpf_program__set_autoload(et->skel->progs.activity_enter, false);
		(void)bpf_program__set_autoload(et->skel->progs.activity_exit, false);
		(void)bpf_program__set_autoload(et->skel->progs.activity_signal, false);
		(void)bpf_program__set_autoload(et->skel->progs.activity_fork, false);
		(void)bpf_program__set_autoload(et->skel->progs.activity_task_exit, false);
	}
	r = envtrace__load(et->skel);
	if (r < 0) {
		log_debug_errno(r, "Failed to load the envtrace BPF programs: %m");
		goto fail;
	}
	r = envtrace__attach(et->skel);
	if (r < 0) {
		log_debug_errno(r, "Failed to attach the envtrace BPF programs: %m");
		goto fail;
	}
	if (et->pin_dir[0]) {
		r = pin_all(et);
		if (r < 0)
			goto fail;
	}
	et->rb = ring_buffer__new(bpf_map__fd(et->skel->maps.events), on_sample, et, NULL);
	if (!et->rb) {
		r = negative_errno();
		goto fail;
	}
	*ret = et;
	return 0;
fail:
	envtrace_destroy(et);
	return r;
}

void envtrace_destroy(struct sv_envtrace *et)
{
	if (!et)
		return;
	ring_buffer__free(et->rb);
	/* A clean stop leaves none of its pins behind (they would keep the ring buffer's memory);
	 * after a crash the next start with this pin directory replaces them. */
	unpin_all(et);
	envtrace__destroy(et->skel);
	for (size_t i = 0; i < ARRAY_SIZE(et->watches); i++) {
		safe_close(et->watches[i].root_fd);
		free(et->watches[i].root);
	}
	free(et->pin_dir);
	free(et);
}

int envtrace_fd(struct sv_envtrace *et)
{
	return ring_buffer__epoll_fd(et->rb);
}

int envtrace_ncpus(struct sv_envtrace *et)
{
	return et->ncpus;
}

int envtrace_prog_runtime(struct sv_envtrace *et, uint64_t *ret_ns, uint64_t *ret_count)
{
	struct bpf_program *prog;
	uint64_t ns = 0, count = 0;

	bpf_object__for_each_program(prog, et->skel->obj)
	{
		struct bpf_prog_info info = {0};
		uint32_t len = sizeof(info);

		if (bpf_program__fd(prog) < 0)
			continue;
		if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &len) < 0)
			return negative_errno();
		ns += info.run_time_ns;
		count += info.run_cnt;
	}
	*ret_ns = ns;
	*ret_count = count;
	return 0;
}

const char *envtrace_pin_dir(struct sv_envtrace *et)
{
	return et->pin_dir;
}

int envtrace_cgroup_id(const char *cgroup_path, uint64_t *ret)
{
	struct stat st;

	if (stat(cgroup_path, &st) < 0)
		return negative_errno();
	if (!S_ISDIR(st.st_mode))
		return -ENOTDIR;
	*ret = st.st_ino;
	return 0;
}

static void bump_generation(struct sv_envtrace *et)
{
	/* .bss is mmapped: the programs see the new generation at their next read, after the
	 * watched map update above it (seq_cst orders the store after the update syscall). */
	__atomic_add_fetch(&et->skel->bss->watch_gen, 1, __ATOMIC_SEQ_CST);
}

int envtrace_watch_add(struct sv_envtrace *et, const char *cgroup_path, const char *root_path,
		       uint32_t env_id)
{
	struct envtrace_watch w = {.env_id = env_id};
	struct watch_entry *e;
	_cleanup_close_ int root_fd = -1;
	char *root;
	uint64_t id;
	int r;

	if (env_id == 0 || env_id >= ENVTRACE_MAX_ENVS)
		return -EINVAL;
	e = &et->watches[env_id];
	if (e->root_fd >= 0)
		return -EEXIST;
	r = envtrace_cgroup_id(cgroup_path, &id);
	if (r < 0)
		return log_debug_errno(r, "Failed to find cgroup %s: %m", cgroup_path);
	if (!root_path)
		root_path = "/";
	root_fd = open(root_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0)
		return negative_errno();
	root = realpath(root_path, NULL);
	if (!root)
		return negative_errno();
	if (strcmp(root, "/") == 0)
		root[0] = 0;
	if (bpf_map__update_elem(et->skel->maps.watched, &id, sizeof(id), &w, sizeof(w),
				 BPF_NOEXIST) < 0) {
		r = negative_errno();
		free(root);
		return r;
	}
	bump_generation(et);
	e->cgroup_id = id;
	e->root_fd = TAKE_FD(root_fd);
	e->root = root;
	return 0;
}

int envtrace_watch_remove(struct sv_envtrace *et, uint32_t env_id)
{
	struct watch_entry *e;
	int r = 0;

	if (env_id == 0 || env_id >= ENVTRACE_MAX_ENVS)
		return -EINVAL;
	e = &et->watches[env_id];
	if (e->root_fd < 0)
		return -ENOENT;
	if (bpf_map__delete_elem(et->skel->maps.watched, &e->cgroup_id, sizeof(e->cgroup_id), 0) <
	    0)
		r = negative_errno();
	bump_generation(et);
	e->root_fd = safe_close(e->root_fd);
	free(e->root);
	e->root = NULL;
	return r;
}

int envtrace_env_stats(struct sv_envtrace *et, uint32_t env_id, struct envtrace_env_stats *ret)
{
	struct envtrace_env_stats *v;
	size_t n = (size_t)et->ncpus;

	if (env_id >= ENVTRACE_MAX_ENVS)
		return -EINVAL;
	v = calloc(n, sizeof(*v));
	if (!v)
		return -ENOMEM;
	if (bpf_map__lookup_elem(et->skel->maps.env_stats, &env_id, sizeof(env_id), v,
				 n * sizeof(*v), 0) < 0) {
		int r = negative_errno();

		free(v);
		return r;
	}
	*ret = (struct envtrace_env_stats){0};
	for (size_t i = 0; i < n; i++) {
		ret->events += v[i].events;
		ret->drops += v[i].drops;
		ret->full_diff += v[i].full_diff;
		ret->execs += v[i].execs;
		ret->activity += v[i].activity;
	}
	free(v);
	return 0;
}

bool envtrace_activity(const struct sv_envtrace *et)
{
	return et && et->activity;
}

int envtrace_drops(struct sv_envtrace *et, uint64_t *per_cpu, size_t n, uint64_t *ret_total)
{
	_cleanup_free_ uint64_t *v = calloc((size_t)et->ncpus, sizeof(uint64_t));
	uint32_t zero = 0;
	uint64_t total = 0;

	if (!v)
		return -ENOMEM;
	if (bpf_map__lookup_elem(et->skel->maps.drops, &zero, sizeof(zero), v,
				 (size_t)et->ncpus * sizeof(uint64_t), 0) < 0)
		return negative_errno();
	for (int i = 0; i < et->ncpus; i++) {
		if (per_cpu && (size_t)i < n)
			per_cpu[i] = v[i];
		total += v[i];
	}
	if (ret_total)
		*ret_total = total;
	return 0;
}

/*
 * Lexical normalization of an absolute path ("." and "//" dropped, ".." pops a component).
 * ".." after a symlinked component is where lexical and real paths differ: the caller also
 * resolves the path through the file system (aliases).
 */
static void normalize(char *p)
{
	char *out = p, *in = p, *end = p + strlen(p);

	/* Bounded by end, not by the NUL: writing the '/' after the last segment may overwrite
	 * it. */
	*out++ = '/';
	while (in < end) {
		char *seg;
		size_t len;

		while (in < end && *in == '/')
			in++;
		if (in == end)
			break;
		seg = in;
		while (in < end && *in != '/')
			in++;
		len = (size_t)(in - seg);
		if (len == 1 && seg[0] == '.')
			continue;
		if (len == 2 && seg[0] == '.' && seg[1] == '.') {
			if (out > p + 1) {
				out--; /* the '/' after the last component */
				while (out > p + 1 && out[-1] != '/')
					out--;
			}
			continue;
		}
		memmove(out, seg, len);
		out += len;
		*out++ = '/';
	}
	if (out > p + 1)
		out--;
	*out = 0;
}

/* Joins "components leaf first" + rel into buf; returns the bytes consumed from data, or -1. */
static ssize_t build_path(const char *data, size_t len, char *buf, char *raw, size_t bufsz,
			  bool *ret_rel)
{
	const char *rel = data, *comp[ENVTRACE_DEPTH_MAX + 1];
	size_t relen, ncomp = 0, pos = 0, used;

	relen = strnlen(rel, len);
	if (relen == len)
		return -1;
	used = relen + 1;
	/* Components follow, ended by an empty one. */
	for (;;) {
		size_t cl;

		if (used >= len)
			return -1;
		cl = strnlen(data + used, len - used);
		if (cl == len - used)
			return -1;
		if (cl == 0) {
			used++;
			break;
		}
		if (ncomp >= ARRAY_SIZE(comp))
			return -1;
		comp[ncomp++] = data + used;
		used += cl + 1;
	}
	*ret_rel = rel[0] != '/';
	if (rel[0] != '/') {
		for (size_t i = ncomp; i-- > 0;) {
			size_t cl = strlen(comp[i]);

			if (pos + cl + 2 >= bufsz)
				return -1;
			buf[pos++] = '/';
			memcpy(buf + pos, comp[i], cl);
			pos += cl;
		}
	}
	if (pos + relen + 2 >= bufsz)
		return -1;
	buf[pos++] = '/';
	memcpy(buf + pos, rel, relen);
	pos += relen;
	buf[pos] = 0;
	memcpy(raw, buf, pos + 1);
	normalize(buf);
	return (ssize_t)used;
}

/* The real path of path (within the environment's root), following a final symlink when
 * follow is set. Returns false when it does not resolve (any more). */
static bool resolve_in_root(const struct watch_entry *w, const char *path, bool follow, char *buf,
			    size_t bufsz)
{
	struct open_how how = {
		.flags = O_PATH | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW),
		.resolve = RESOLVE_IN_ROOT,
	};
	_cleanup_close_ int fd = -1;
	char proc[64], target[PATH_MAX];
	size_t rl = strlen(w->root);
	ssize_t n;

	fd = (int)syscall(SYS_openat2, w->root_fd, path[0] == '/' ? path + 1 : path, &how,
			  sizeof(how));
	if (fd < 0)
		return false;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	n = readlink(proc, target, sizeof(target) - 1);
	if (n <= 0)
		return false;
	target[n] = 0;
	if (strncmp(target, w->root, rl) != 0 || (target[rl] != '/' && target[rl] != 0))
		return false;
	snprintf(buf, bufsz, "%s", target[rl] ? target + rl : "/");
	return true;
}

/* Other names of path: its parent resolved (the object itself when the last component is a
 * symlink the call does not follow) and the path with the final symlink followed. */
static void find_aliases(struct sv_envtrace *et, const struct watch_entry *w, int i)
{
	const char *path = et->path[i];
	char *raw = et->raw[i], *slash;
	size_t rl = strlen(raw);
	char parent[PATH_BUF];

	et->alias[i][0][0] = 0;
	et->alias[i][1][0] = 0;
	if (!w || w->root_fd < 0)
		return;
	while (rl > 1 && raw[rl - 1] == '/')
		raw[--rl] = 0;
	slash = strrchr(raw, '/');
	if (slash && slash > raw && strcmp(slash, "/..") != 0 && strcmp(slash, "/.") != 0) {
		memcpy(parent, raw, (size_t)(slash - raw));
		parent[slash - raw] = 0;
	} else {
		parent[0] = 0;
	}
	if (parent[0] &&
	    resolve_in_root(w, parent, true, et->alias[i][0], sizeof(et->alias[i][0]))) {
		size_t l = strlen(et->alias[i][0]);

		snprintf(et->alias[i][0] + l, sizeof(et->alias[i][0]) - l, "%s%s", l > 1 ? "/" : "",
			 slash + 1);
		if (strcmp(et->alias[i][0], path) == 0)
			et->alias[i][0][0] = 0;
	}
	if (resolve_in_root(w, raw, true, et->alias[i][1], sizeof(et->alias[i][1]))) {
		if (strcmp(et->alias[i][1], path) == 0 ||
		    strcmp(et->alias[i][1], et->alias[i][0]) == 0)
			et->alias[i][1][0] = 0;
	}
}

static int on_sample(void *ctx, void *data, size_t size)
{
	struct sv_envtrace *et = ctx;
	const struct envtrace_event *ev = data;
	const char *payload = (const char *)(ev + 1);
	const struct watch_entry *w = NULL;
	struct envtrace_record rec = {0};
	size_t len, off = 0;

	if (size < sizeof(*ev))
		return 0;
	len = MIN((size_t)ev->data_len, size - sizeof(*ev));
	rec.type = ev->type;
	rec.op = ev->op;
	rec.env_id = ev->env_id;
	rec.pid = (pid_t)ev->pid;
	rec.tid = (pid_t)ev->tid;
	rec.flags = ev->flags;
	rec.ts_ns = ev->ts_ns;
	rec.cgroup_id = ev->cgroup_id;
	rec.ret = ev->ret;
	rec.aux = ev->aux;
	if (ev->env_id < ENVTRACE_MAX_ENVS && et->watches[ev->env_id].root_fd >= 0)
		w = &et->watches[ev->env_id];

	switch (ev->type) {
	case ENVTRACE_EV_FILE:
	case ENVTRACE_EV_FULL_DIFF:
		for (unsigned int i = 0; i < ev->npaths && i < 2; i++) {
			bool relative = false;
			ssize_t used = build_path(payload + off, len - off, et->path[i], et->raw[i],
						  sizeof(et->path[i]), &relative);

			if (used < 0) {
				rec.unresolved = true;
				break;
			}
			off += (size_t)used;
			if ((ev->pflags[i] & ENVTRACE_PATH_TRUNC) ||
			    !(ev->pflags[i] & ENVTRACE_PATH_RESOLVED))
				rec.unresolved = true;
			rec.path[i] = et->path[i];
			rec.npaths = i + 1;
			if (!(ev->pflags[i] & ENVTRACE_PATH_FROM_FD))
				find_aliases(et, w, (int)i);
			else
				et->alias[i][0][0] = et->alias[i][1][0] = 0;
			rec.alias[i][0] = et->alias[i][0][0] ? et->alias[i][0] : NULL;
			rec.alias[i][1] = et->alias[i][1][0] ? et->alias[i][1] : NULL;
		}
		if (ev->type == ENVTRACE_EV_FILE && rec.npaths == 0)
			rec.unresolved = true;
		break;
	case ENVTRACE_EV_EXEC: {
		size_t el = strnlen(payload, len);

		if (el == len) {
			rec.exe = "";
			break;
		}
		rec.exe = payload;
		rec.argv = payload + el + 1;
		rec.argv_len = MIN((size_t)MAX(ev->aux, 0), len - el - 1);
		break;
	}
	default:
		break;
	}
	return et->cb ? et->cb(&rec, et->userdata) : 0;
}

int envtrace_consume(struct sv_envtrace *et, envtrace_record_cb cb, void *userdata)
{
	int r;

	et->cb = cb;
	et->userdata = userdata;
	r = ring_buffer__consume(et->rb);
	et->cb = NULL;
	et->userdata = NULL;
	return r;
}
