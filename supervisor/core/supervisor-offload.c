/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-offload.h"

#define ENV_WORKERS_MAX 64

struct lane {
	struct sv_job *todo, **todo_tail;
	pthread_cond_t cond;
	pthread_t threads[ENV_WORKERS_MAX];
	unsigned n; /* threads started */
};

struct sv_offload {
	pthread_mutex_t lock;
	struct lane lanes[_OFFLOAD_LANES];
	struct sv_job *done, **done_tail;
	bool stop;
	int efd;
};

struct worker {
	struct supervisor *s;
	struct lane *lane;
};

static void *offload_main(void *arg)
{
	struct worker w = *(struct worker *)arg;
	struct sv_offload *o = w.s->offload;
	struct lane *l = w.lane;

	free(arg);
	pthread_mutex_lock(&o->lock);
	for (;;) {
		struct sv_job *j;
		uint64_t one = 1;

		while (!l->todo && !o->stop)
			pthread_cond_wait(&l->cond, &o->lock);
		if (o->stop)
			break;
		j = l->todo;
		l->todo = j->next;
		if (!l->todo)
			l->todo_tail = &l->todo;
		pthread_mutex_unlock(&o->lock);

		if (j->run)
			j->run(w.s, j);

		pthread_mutex_lock(&o->lock);
		j->next = NULL;
		*o->done_tail = j;
		o->done_tail = &j->next;
		(void)!write(o->efd, &one, sizeof(one));
	}
	pthread_mutex_unlock(&o->lock);
	return NULL;
}

static int lane_start(struct supervisor *s, struct lane *l, unsigned n, const char *name)
{
	sigset_t all, old;
	int r = 0;

	/* Signals belong to the loop thread (signalfd-like handling through libevent). */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (; l->n < n && r >= 0; l->n++) {
		struct worker *w = malloc(sizeof(*w));

		if (!w) {
			r = -ENOMEM;
			break;
		}
		*w = (struct worker){.s = s, .lane = l};
		r = -pthread_create(&l->threads[l->n], NULL, offload_main, w);
		if (r < 0) {
			free(w);
			break;
		}
		(void)pthread_setname_np(l->threads[l->n], name);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return r;
}

static void stop_threads(struct sv_offload *o)
{
	pthread_mutex_lock(&o->lock);
	o->stop = true;
	for (unsigned i = 0; i < _OFFLOAD_LANES; i++)
		pthread_cond_broadcast(&o->lanes[i].cond);
	pthread_mutex_unlock(&o->lock);
	for (unsigned i = 0; i < _OFFLOAD_LANES; i++)
		for (unsigned t = 0; t < o->lanes[i].n; t++)
			pthread_join(o->lanes[i].threads[t], NULL);
}

static void free_list(struct sv_job *j)
{
	while (j) {
		struct sv_job *next = j->next;

		j->free(j);
		j = next;
	}
}

static void offload_free(struct sv_offload *o)
{
	for (unsigned i = 0; i < _OFFLOAD_LANES; i++) {
		free_list(o->lanes[i].todo);
		pthread_cond_destroy(&o->lanes[i].cond);
	}
	free_list(o->done);
	(void)safe_close(o->efd);
	pthread_mutex_destroy(&o->lock);
	free(o);
}

int offload_start(struct supervisor *s)
{
	struct sv_offload *o = calloc(1, sizeof(*o));
	unsigned env_workers = s->config.env_workers;
	int r;

	if (!o)
		return -ENOMEM;
	o->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (o->efd < 0) {
		r = negative_errno();
		free(o);
		return r;
	}
	pthread_mutex_init(&o->lock, NULL);
	for (unsigned i = 0; i < _OFFLOAD_LANES; i++) {
		o->lanes[i].todo_tail = &o->lanes[i].todo;
		pthread_cond_init(&o->lanes[i].cond, NULL);
	}
	o->done_tail = &o->done;
	s->offload = o;
	if (env_workers == 0 || env_workers > ENV_WORKERS_MAX)
		env_workers = env_workers ? ENV_WORKERS_MAX : 1;
	r = lane_start(s, &o->lanes[OFFLOAD_SERIAL], 1, "sv-offload");
	if (r >= 0)
		r = lane_start(s, &o->lanes[OFFLOAD_ENV], env_workers, "sv-env");
	if (r >= 0)
		r = lane_start(s, &o->lanes[OFFLOAD_CANARY], 1, "sv-canary");
	if (r < 0) {
		stop_threads(o);
		offload_free(o);
		s->offload = NULL;
		return log_error_errno(r, "Failed to start the offload threads: %m");
	}
	return 0;
}

void offload_stop(struct supervisor *s)
{
	struct sv_offload *o = s->offload;

	if (!o)
		return;
	stop_threads(o);
	offload_free(o);
	s->offload = NULL;
}

int offload_fd(struct supervisor *s)
{
	return s->offload ? s->offload->efd : -1;
}

void offload_complete(struct supervisor *s)
{
	struct sv_offload *o = s->offload;
	struct sv_job *list;
	uint64_t n;

	if (!o)
		return;
	(void)!read(o->efd, &n, sizeof(n));
	pthread_mutex_lock(&o->lock);
	list = o->done;
	o->done = NULL;
	o->done_tail = &o->done;
	pthread_mutex_unlock(&o->lock);
	while (list) {
		struct sv_job *next = list->next;

		if (list->done)
			list->done(s, list);
		list->free(list);
		list = next;
	}
}

void offload_submit(struct supervisor *s, struct sv_job *j)
{
	struct sv_offload *o = s->offload;
	struct lane *l;

	s->metrics.offload_jobs++;
	j->next = NULL;
	if (!o) {
		if (j->run)
			j->run(s, j);
		if (j->done)
			j->done(s, j);
		j->free(j);
		return;
	}
	l = &o->lanes[(unsigned)j->lane < _OFFLOAD_LANES ? j->lane : OFFLOAD_SERIAL];
	pthread_mutex_lock(&o->lock);
	*l->todo_tail = j;
	l->todo_tail = &j->next;
	pthread_cond_signal(&l->cond);
	pthread_mutex_unlock(&o->lock);
}
