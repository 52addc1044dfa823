/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <systemd/sd-daemon.h>

#include "log.h"
#include "supervisor-fdstore.h"

static bool enabled(const struct supervisor *s)
{
	const char *e = getenv("NOTIFY_SOCKET");

	return s->config.fd_store && e && *e;
}

/* pid, start time and id name a region across pid reuse; systemd allows [!-9;-~] in names. */
static void region_name(const struct sv_region *rg, char *buf, size_t cap)
{
	snprintf(buf, cap, "r-%d-%" PRIu64 "-%" PRIu64, rg->owner->pid, rg->owner->starttime,
		 rg->id);
}

void fdstore_put(struct supervisor *s, const struct sv_region *rg)
{
	char name[96], msg[160];
	int r;

	if (!enabled(s) || rg->fd < 0)
		return;
	region_name(rg, name, sizeof(name));
	/* Names need not be unique in the store: an update removes the old fd first. */
	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
	(void)sd_notify(0, msg);
	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
	r = sd_pid_notify_with_fds(0, 0, msg, &rg->fd, 1);
	if (r < 0)
		log_warning_errno(r, "Failed to store region %s in the fd store: %m, ignoring.",
				  name);
}

void fdstore_remove(struct supervisor *s, const struct sv_region *rg)
{
	char name[96], msg[160];

	if (!enabled(s))
		return;
	region_name(rg, name, sizeof(name));
	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
	(void)sd_notify(0, msg);
}

static void drop(int fd, const char *name)
{
	char msg[300];

	(void)safe_close(fd);
	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
	(void)sd_notify(0, msg);
}

int fdstore_restore(struct supervisor *s)
{
	char **names = NULL;
	int n, attached = 0;

	n = sd_listen_fds_with_names(1, &names);
	if (n <= 0)
		return n;
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		unsigned long long start, id;
		struct sv_region *rg = NULL;
		int pid, end = 0;

		if (!names || !names[i] ||
		    sscanf(names[i], "r-%d-%llu-%llu%n", &pid, &start, &id, &end) != 3 ||
		    names[i][end] != '\0') {
			log_warning("fd store: unexpected fd \"%s\", dropping.",
				    names && names[i] ? names[i] : "?");
			drop(fd, names && names[i] ? names[i] : "");
			continue;
		}
		for (struct sv_worker *w = s->reg.workers; w && !rg; w = w->next)
			if (w->pid == pid && w->starttime == start)
				rg = registry_region_find(w, id);
		if (!rg || rg->fd >= 0 || !enabled(s)) {
			drop(fd, names[i]);
			continue;
		}
		rg->fd = fd;
		s->reg.n_fds++;
		rg->state = rg->owner->state == WORKER_DEAD ? REGION_RETAINED : REGION_OWNED;
		attached++;
	}
	for (int i = 0; names && names[i]; i++)
		free(names[i]);
	free(names);
	log_info("fd store: %d of %d region fds restored.", attached, n);
	return attached;
}
