/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-env-precopy.h"
#include "supervisor-env.h"

static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

void env_precopy_finish(struct env_precopy *pc)
{
	env_manifest_finish(&pc->delta);
	env_fs_gone_finish(&pc->gone);
	*pc = (struct env_precopy){0};
}

struct gone_ref {
	const char *path;
	bool below;
};

static int cmp_gone_ref(const void *a, const void *b)
{
	return strcmp(((const struct gone_ref *)a)->path, ((const struct gone_ref *)b)->path);
}

/* path is one g names: itself, or below one that takes what is below. */
static bool covered(const struct gone_ref *g, size_t n, const char *path)
{
	char buf[ENV_PATH_MAX + 2];
	bool self = true;

	if (!n)
		return false;
	snprintf(buf, sizeof(buf), "%s", path);
	for (;;) {
		struct gone_ref key = {.path = buf};
		const struct gone_ref *hit = bsearch(&key, g, n, sizeof(*g), cmp_gone_ref);
		char *slash;

		if (hit && (self || hit->below))
			return true;
		slash = strrchr(buf, '/');
		if (!slash)
			return false;
		*slash = '\0';
		self = false;
	}
}

static bool copied_here(const struct env_manifest *m, const struct env_entry *e)
{
	return e->kind == ENV_ENTRY_REG && !e->hardlink && strcmp(e->src, m->id) == 0;
}

int env_precopy_merge(struct env_precopy *pc, struct env_manifest *late,
		      struct env_fs_gone *late_gone, int data_fd)
{
	_cleanup_free_ struct gone_ref *g = calloc(late_gone->n + 1, sizeof(*g));
	size_t n_g = late_gone->n;
	int r = 0;

	if (!g)
		return -ENOMEM;
	for (size_t i = 0; i < n_g; i++)
		g[i] = (struct gone_ref){late_gone->paths[i], late_gone->below[i]};
	qsort(g, n_g, sizeof(*g), cmp_gone_ref);
	for (size_t i = 0; i < pc->delta.n_entries && r >= 0; i++) {
		const struct env_entry *e = &pc->delta.entries[i];

		if (!covered(g, n_g, e->path)) {
			r = env_manifest_add(late, e);
			continue;
		}
		/* looked at again: the later copy is the one (the earlier one's bytes stay
		 * counted: they were written) */
		if (copied_here(&pc->delta, e)) {
			char key[32];

			snprintf(key, sizeof(key), "%" PRIu64, e->data_key);
			(void)unlinkat(data_fd, key, 0);
		}
	}
	for (size_t i = 0; i < pc->gone.n && r >= 0; i++) {
		if (late_gone->n == late_gone->cap) {
			size_t cap = late_gone->cap ? late_gone->cap * 2 : 16;
			char **p = reallocarray(late_gone->paths, cap, sizeof(*p));
			bool *b;

			if (!p)
				return -ENOMEM;
			late_gone->paths = p;
			b = reallocarray(late_gone->below, cap, sizeof(*b));
			if (!b)
				return -ENOMEM;
			late_gone->below = b;
			late_gone->cap = cap;
		}
		late_gone->paths[late_gone->n] = pc->gone.paths[i];
		late_gone->below[late_gone->n++] = pc->gone.below[i];
		pc->gone.paths[i] = NULL;
	}
	env_precopy_finish(pc);
	return r;
}

/* The next free data key after what delta copied. */
static uint64_t next_key_of(const struct env_manifest *delta, uint64_t from)
{
	uint64_t k = from;

	for (size_t i = 0; i < delta->n_entries; i++)
		if (copied_here(delta, &delta->entries[i]) && delta->entries[i].data_key >= k)
			k = delta->entries[i].data_key + 1;
	return k;
}

/* One round: set copied into a fresh delta numbered from pc->next_key, merged over pc's. */
static int round_of(const struct env_manifest *base, int upper_fd, int data_fd, const char *id,
		    const struct env_fs_dirty *set, size_t n, const atomic_bool *cancel,
		    struct env_precopy *pc)
{
	_cleanup_free_ struct env_fs_dirty *all = calloc(n + 1, sizeof(*all));
	struct env_manifest d = {0};
	struct env_fs_gone g = {0};
	struct env_fs_stats st = {0};
	int r;

	if (!all)
		return -ENOMEM;
	if (n)
		memcpy(all, set, n * sizeof(*all));
	/* the parent's dump touched /tmp untraced (supervisor-env-ckpt.c fs_phase) */
	all[n++] = (struct env_fs_dirty){.path = "/tmp", .subtree = false};
	snprintf(d.id, sizeof(d.id), "%s", id);
	r = env_fs_scan_dirty_keyed(upper_fd, base, all, n, cancel, data_fd, pc->next_key, true, &d,
				    &g, &st);
	/* what this round looked at (a path dirty with its subtree stands for all below it) */
	size_t looked = d.n_entries;

	if (r >= 0 && pc->done) {
		struct env_precopy prev = *pc; /* the counts (merge empties pc) */

		r = env_precopy_merge(pc, &d, &g, data_fd);
		st.bytes += prev.st.bytes;
		st.files += prev.st.files;
		pc->next_key = prev.next_key;
		pc->rounds = prev.rounds;
	}
	if (r < 0) {
		env_manifest_finish(&d);
		env_fs_gone_finish(&g);
		return r;
	}
	pc->next_key = next_key_of(&d, pc->next_key);
	pc->delta = d;
	pc->gone = g;
	pc->st = st;
	pc->done = true;
	pc->last_files = looked;
	return 0;
}

int env_precopy_run(const struct env_ckpt_params *p, const struct env_manifest *base, int upper_fd,
		    int data_fd, const char *id, struct env_precopy *pc)
{
	uint64_t t0 = mono_us();
	int r = 0;

	*pc = (struct env_precopy){0};
	if (!base || !p->precopy || !p->late || !p->frozen)
		return 0;
	for (unsigned round = 0; round < ENV_PRECOPY_ROUNDS; round++) {
		const struct env_fs_dirty *set = NULL;
		const char *why = NULL;
		size_t n = 0;

		if (p->cancel && atomic_load_explicit(p->cancel, memory_order_relaxed)) {
			r = -ECANCELED;
			break;
		}
		if (p->precopy(p->userdata, round, &set, &n, &why) != 0) {
			/* the tracer cannot vouch: what was copied cannot be trusted to be
			 * re-copied where it changed; the frozen phase decides alone */
			log_debug("No pre-copy (round %u): %s.", round, why ? why : "tracer");
			r = -ENOTRECOVERABLE;
			break;
		}
		/* round 0 always (the turn's delta); later ones while the re-dirtied set
		 * shrinks (fewer paths than the entries the previous round looked at) and is
		 * worth a round */
		if (round > 0 && (n >= pc->last_files || n <= ENV_PRECOPY_SMALL)) {
			pc->last_n = n;
			break;
		}
		r = round_of(base, upper_fd, data_fd, id, set, n, p->cancel, pc);
		if (r < 0)
			break;
		pc->rounds++;
		pc->last_n = n;
	}
	pc->us = mono_us() - t0;
	if (r == -ECANCELED)
		return r;
	if (r < 0) {
		if (r != -EMLINK && r != -ENOTRECOVERABLE)
			log_debug_errno(r, "Pre-copy failed, copying frozen: %m");
		env_precopy_finish(pc);
		pc->us = mono_us() - t0;
		r = env_fs_wipe(data_fd);
		return r < 0 ? r : 0;
	}
	return 0;
}
