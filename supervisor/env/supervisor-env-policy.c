/* SPDX-License-Identifier: MIT */
/* The checkpoint policy's side of environments (struct traj_env_ops of sv-policy.h): the view
 * of an environment at a step end, and the policy's checkpoints run as environment jobs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "supervisor-dirty.h"
#include "supervisor-env-ctl.h"
#include "supervisor-env-slots.h"
#include "supervisor-offload.h"

/* As in supervisor-env-ctl.c: paths are built into PATH_MAX buffers from cgroup paths that
 * env_prepare() and the adopt checks bound. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* Entries a view walks at most below dirty directories: the view is taken on the loop thread
 * at every step end, and the byte count is a cost estimate, not a copy. */
#define VIEW_WALK_MAX 4096

/* Bytes of regular files at path (and below it when subtree) in the upper layer. */
static uint64_t upper_bytes(int at, const char *name, bool subtree, unsigned *budget)
{
	struct stat st;
	uint64_t sum = 0;
	struct dirent *de;
	DIR *d;
	int fd;

	if (*budget == 0 || fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	(*budget)--;
	if (S_ISREG(st.st_mode))
		return (uint64_t)st.st_size;
	if (!S_ISDIR(st.st_mode) || !subtree)
		return 0;
	fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			(void)close(fd);
		return 0;
	}
	while (*budget > 0 && (de = readdir(d)))
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			sum += upper_bytes(dirfd(d), de->d_name, true, budget);
	closedir(d);
	return sum;
}

/* The processes' anonymous and shared memory (RssAnon + RssShmem), in the cgroup and below. */
static uint64_t procs_mem_bytes(const char *cgroup, unsigned depth)
{
	char path[PATH_MAX], line[256];
	unsigned long long kb, sum = 0;
	struct dirent *de;
	FILE *procs, *st;
	DIR *d;
	int pid;

	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup);
	procs = fopen(path, "re");
	while (procs && fscanf(procs, "%d", &pid) == 1) {
		snprintf(path, sizeof(path), "/proc/%d/status", pid);
		st = fopen(path, "re");
		while (st && fgets(line, sizeof(line), st))
			if (sscanf(line, "RssAnon: %llu kB", &kb) == 1 ||
			    sscanf(line, "RssShmem: %llu kB", &kb) == 1)
				sum += kb * 1024;
		if (st)
			fclose(st);
	}
	if (procs)
		fclose(procs);
	d = depth < 8 ? opendir(cgroup) : NULL;
	while (d && (de = readdir(d)))
		if (de->d_type == DT_DIR && de->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/%s", cgroup, de->d_name);
			sum += procs_mem_bytes(path, depth + 1);
		}
	if (d)
		closedir(d);
	return sum;
}

/* What CRIU dumps of the environment's memory: anonymous and shared memory. The cgroup's
 * memory.stat where the memory controller is on (memory.current would count the page cache
 * of the files the environment wrote too, which the FS delta copies, not the dump); else (a
 * hybrid hierarchy, its memory controller v1's) the processes' own counts. */
static uint64_t cgroup_mem_bytes(const char *cgroup)
{
	char path[PATH_MAX], key[64];
	unsigned long long v, sum = 0;
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), "%s/memory.stat", cgroup);
	f = fopen(path, "re");
	if (f) {
		while (fscanf(f, "%63s %llu", key, &v) == 2)
			if (strcmp(key, "anon") == 0 || strcmp(key, "shmem") == 0) {
				sum += v;
				found = true;
			}
		fclose(f);
		if (found)
			return sum;
	}
	return procs_mem_bytes(cgroup, 0);
}

int envs_view(struct supervisor *s, const char *id, struct traj_env_view *ret)
{
	struct env_slot *sl = env_slot_find(s->envs, id);
	struct dirty_item *items = NULL;
	unsigned budget = VIEW_WALK_MAX;
	size_t n = 0;
	int upper;

	if (!sl || !sl->env)
		return -ENOENT;
	*ret = (struct traj_env_view){.mem_bytes = cgroup_mem_bytes(sl->cgroup)};
	envs_drain(s);
	/* sl->env->head is the offload thread's while a job runs (a checkpoint it commits, or one
	 * that fails and puts its dirty paths back): the dirty set alone says it then. */
	if (!sl->dirty || !s->envs->et || (!sl->busy && !sl->env->head[0])) {
		/* No tracer: nothing says it is clean. Never checkpointed: all of it is new. */
		ret->dirty = true;
		return 0;
	}
	if (dirty_list(sl->dirty, &items, &n) < 0) {
		ret->dirty = true;
		return 0;
	}
	/* A full diff with nothing named since the dump: the dump's own (see full_diff_of_dump);
	 * any other (io_uring, lost records, a mapping made since) may hide a change. */
	ret->dirty = n > 0 || (dirty_needs_full_diff(sl->dirty, NULL) && !sl->full_diff_of_dump);
	/* Issue 23 item 3: processes that ran since the head's dump are a change too (a clean
	 * file system does not make the turn skippable); ones that did not are not dumped (an
	 * fs-only checkpoint: no memory to copy). While a job runs, act is its thread's. */
	if (!sl->busy) {
		if (envs_processes_unchanged(s, sl))
			ret->mem_bytes = 0;
		else
			ret->dirty = true;
	}
	upper = open(sl->env->upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	for (size_t i = 0; upper >= 0 && i < n; i++) {
		const char *rel = items[i].path + strspn(items[i].path, "/");

		ret->dirty_bytes +=
			upper_bytes(upper, rel[0] ? rel : ".", items[i].subtree, &budget);
	}
	if (upper >= 0)
		(void)close(upper);
	free(items);
	return 0;
}

int envs_policy_checkpoint(struct supervisor *s, const char *id, const char *trajectory,
			   uint64_t turn, uint64_t prefix_tokens, uint64_t prefix_hash,
			   struct envs_policy_ckpt *pc)
{
	struct proto_env_request q = {.op = ENV_OP_CHECKPOINT,
				      .turn = turn,
				      .prefix_tokens = prefix_tokens,
				      .prefix_hash = prefix_hash};
	struct env_slot *sl = env_slot_find(s->envs, id);
	struct env_job *j;

	if (!sl || !sl->env)
		return -ENOENT;
	if (sl->busy || sl->execs) /* an exec's command and pipes are the supervisor's */
		return -EBUSY;
	snprintf(q.env, sizeof(q.env), "%s", id);
	snprintf(q.trajectory, sizeof(q.trajectory), "%s", trajectory);
	j = env_job_new(s, NULL, sl, &q);
	if (!j)
		return -ENOMEM;
	j->policy = pc;
	if (env_job_snapshot_dirty(s, sl, j) < 0)
		j->traced = false; /* metadata comparison alone still catches every change */
	offload_submit(s, &j->job);
	return 0;
}
