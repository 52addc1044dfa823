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

struct sv_offload {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct sv_job *todo, **todo_tail;
	struct sv_job *done, **done_tail;
	bool stop;
	int efd;
};

static void *offload_main(void *arg)
{
	struct supervisor *s = arg;
	struct sv_offload *o = s->offload;

	pthread_mutex_lock(&o->lock);
	for (;;) {
		struct sv_job *j;
		uint64_t one = 1;

		while (!o->todo && !o->stop)
			pthread_cond_wait(&o->cond, &o->lock);
		if (o->stop)
			break;
		j = o->todo;
		o->todo = j->next;
		if (!o->todo)
			o->todo_tail = &o->todo;
		pthread_mutex_unlock(&o->lock);

		if (j->run)
			j->run(s, j);

		pthread_mutex_lock(&o->lock);
		j->next = NULL;
		*o->done_tail = j;
		o->done_tail = &j->next;
		(void)!write(o->efd, &one, sizeof(one));
	}
	pthread_mutex_unlock(&o->lock);
	return NULL;
}

int offload_start(struct supervisor *s)
{
	struct sv_offload *o = calloc(1, sizeof(*o));
	sigset_t all, old;
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
	pthread_cond_init(&o->cond, NULL);
	o->todo_tail = &o->todo;
	o->done_tail = &o->done;
	s->offload = o;
	/* Signals belong to the loop thread (signalfd-like handling through libevent). */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	r = -pthread_create(&o->thread, NULL, offload_main, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0) {
		(void)safe_close(o->efd);
		free(o);
		s->offload = NULL;
		return log_error_errno(r, "Failed to start the offload thread: %m");
	}
	(void)pthread_setname_np(o->thread, "sv-offload");
	return 0;
}

static void free_list(struct sv_job *j)
{
	while (j) {
		struct sv_job *next = j->next;

		j->free(j);
		j = next;
	}
}

void offload_stop(struct supervisor *s)
{
	struct sv_offload *o = s->offload;

	if (!o)
		return;
	pthread_mutex_lock(&o->lock);
	o->stop = true;
	pthread_cond_signal(&o->cond);
	pthread_mutex_unlock(&o->lock);
	pthread_join(o->thread, NULL);
	free_list(o->todo);
	free_list(o->done);
	(void)safe_close(o->efd);
	pthread_mutex_destroy(&o->lock);
	pthread_cond_destroy(&o->cond);
	free(o);
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
	pthread_mutex_lock(&o->lock);
	*o->todo_tail = j;
	o->todo_tail = &j->next;
	pthread_cond_signal(&o->cond);
	pthread_mutex_unlock(&o->lock);
}
