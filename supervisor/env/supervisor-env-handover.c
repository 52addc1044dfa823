/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-env-handover.h"
#include "supervisor-env-slots.h"
#include "supervisor.h"

/* One per daemon: the jobs waiting for the loop (at most one per environment). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t answered = PTHREAD_COND_INITIALIZER;
static struct env_job *pending;
static int efd = -1;
static bool watched;

/* Loop thread: every waiting job gets what came since its snapshot. Under the lock, so that a
 * job that gave up waiting is either still pending (and taken out by itself) or answered. */
static void serve(struct supervisor *s)
{
	uint64_t v;

	(void)read(efd, &v, sizeof(v));
	pthread_mutex_lock(&lock);
	while (pending) {
		struct env_job *j = pending;

		pending = j->ho_next;
		j->ho_next = NULL;
		env_job_take_late(s, j);
		j->ho_done = true;
	}
	pthread_cond_broadcast(&answered);
	pthread_mutex_unlock(&lock);
}

int env_handover_start(struct supervisor *s)
{
	if (!s->hooks || !s->hooks->watch_fd)
		return 0;
	efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (efd < 0)
		return -errno;
	if (s->hooks->watch_fd(s, efd, serve) < 0) {
		(void)close(efd);
		efd = -1;
		return -ENOMEM;
	}
	watched = true;
	return 0;
}

void env_handover_stop(struct supervisor *s)
{
	(void)s;
	/* the loop's watch goes with the loop; the fd stays open until then (a late wait times
	 * out rather than write to a reused fd) */
	watched = false;
}

int env_handover_wait(struct supervisor *s, struct env_job *j)
{
	struct timespec until;
	uint64_t one = 1;
	int r = 0;

	if (!s->offload) {
		/* inline: this is the loop thread */
		env_job_take_late(s, j);
		return 0;
	}
	if (!watched || efd < 0)
		return -ENOTCONN;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ENV_HANDOVER_WAIT_MS / 1000;
	until.tv_nsec += (long)(ENV_HANDOVER_WAIT_MS % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&lock);
	j->ho_done = false;
	j->ho_next = pending;
	pending = j;
	if (write(efd, &one, sizeof(one)) != sizeof(one))
		r = -EIO;
	while (r == 0 && !j->ho_done)
		r = -pthread_cond_timedwait(&answered, &lock, &until);
	if (!j->ho_done) {
		/* not answered: out of the list, the loop never sees it */
		for (struct env_job **pp = &pending; *pp; pp = &(*pp)->ho_next)
			if (*pp == j) {
				*pp = j->ho_next;
				break;
			}
		r = r < 0 ? r : -ETIMEDOUT;
	} else {
		r = 0;
	}
	pthread_mutex_unlock(&lock);
	return r;
}
