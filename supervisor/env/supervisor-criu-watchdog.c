/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-criu-watchdog.h"
#include "util.h"

#define WATCH_MS   50
#define GONE_TICKS 4 /* unpopulated this many looks in a row: the environment is dying */

struct sv_criu_watchdog {
	pthread_t thread;
	pid_t pid;
	char events[PATH_MAX];
	atomic_bool done;
	bool killed;
};

/* "populated 0" in cgroup.events (unreadable: not known to be gone). */
static bool unpopulated(const char *events)
{
	_cleanup_close_ int fd = open(events, O_RDONLY | O_CLOEXEC);
	char buf[256];
	ssize_t n = fd >= 0 ? pread(fd, buf, sizeof(buf) - 1, 0) : -1;

	if (n <= 0)
		return false;
	buf[n] = '\0';
	return strstr(buf, "populated 0") != NULL;
}

/* A field of /proc/pid/status as an int (-1: none). */
static int status_int(pid_t pid, const char *field)
{
	char path[64], line[256];
	size_t n = strlen(field);
	int v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, n) == 0 && line[n] == ':') {
			v = atoi(line + n + 1);
			break;
		}
	fclose(f);
	return v;
}

static void *watch(void *arg)
{
	struct sv_criu_watchdog *w = arg;
	unsigned gone = 0;

	while (!atomic_load(&w->done)) {
		(void)poll(NULL, 0, WATCH_MS);
		gone = unpopulated(w->events) ? gone + 1 : 0;
		if (gone < GONE_TICKS)
			continue;
		{
			int tracer = status_int(w->pid, "TracerPid");

			/* our CRIU: libcriu's child, tracing the dumped pid */
			if (tracer > 0 && status_int(tracer, "PPid") == (int)getpid() &&
			    kill(tracer, SIGKILL) == 0) {
				w->killed = true;
				log_warning(
					"The environment of pid %d died during its CRIU dump: "
					"CRIU (pid %d) killed, as it would wait for it forever.",
					(int)w->pid, tracer);
			}
		}
		break;
	}
	return NULL;
}

struct sv_criu_watchdog *sv_criu_watchdog_start(pid_t pid, const char *cgroup)
{
	struct sv_criu_watchdog *w = calloc(1, sizeof(*w));
	int r;

	if (!w) {
		log_warning("No watchdog for the CRIU dump of pid %d: out of memory, ignoring.",
			    (int)pid);
		return NULL;
	}
	w->pid = pid;
	snprintf(w->events, sizeof(w->events), "%s/cgroup.events", cgroup);
	r = pthread_create(&w->thread, NULL, watch, w);
	if (r != 0) {
		log_warning_errno(-r, "No watchdog for the CRIU dump of pid %d: %m, ignoring.",
				  (int)pid);
		free(w);
		return NULL;
	}
	return w;
}

bool sv_criu_watchdog_stop(struct sv_criu_watchdog *w)
{
	bool killed;

	if (!w)
		return false;
	atomic_store(&w->done, true);
	(void)pthread_join(w->thread, NULL);
	killed = w->killed;
	free(w);
	return killed;
}
