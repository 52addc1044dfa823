/* SPDX-License-Identifier: MIT */
/*
 * gpu-va-hint: when a process asks cuMemAddressReserve for the address a dead process had,
 * how often does it get it? The documentation makes the address "a hint"; a restarted
 * worker that gets its predecessor's addresses back could map retained memory where its
 * pointers expect it. Informational: the rate is printed, the check fails only when the
 * calls themselves fail.
 *
 * Each try: a fresh process initializes CUDA, reserves SIZE bytes anywhere, reports the VA
 * and is SIGKILLed; another fresh process initializes CUDA and reserves SIZE bytes with that
 * VA as the hint. Both are new executions of this program (not forks), so each gets its own
 * address-space layout as a restarted worker would. The coordinator never touches CUDA.
 *
 * Usage: gpu-va-hint [--tries N] [--max-seconds S] [--size N[KMG]] [--device N]
 * --max-seconds stops starting tries after S seconds (the rate is over the tries done).
 * Internal: gpu-va-hint --reserve SIZE HINT DEVICE (socket on fd 3)
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu-check.h"

#define STEP_TIMEOUT_MS 60000
#define CHILD_SOCK	3

extern char **environ;

struct opts {
	unsigned tries;
	double max_s;
	uint64_t size;
	int dev;
};

/* The child: reserves size bytes at hint (0: anywhere) and sends the VA, or 0 on failure,
 * over fd CHILD_SOCK; without a hint it then holds the reservation until it is killed. */
static int reserver(uint64_t size, CUdeviceptr hint, int dev)
{
	CUdeviceptr va = 0;
	CUresult r;

	if (gpu_cu_open(dev) < 0) {
		(void)gpu_send(CHILD_SOCK, -1, 0);
		return 1;
	}
	r = cu.cuMemAddressReserve(&va, size, 0, hint, 0);
	if (r != CUDA_SUCCESS) {
		printf("cuMemAddressReserve(size %" PRIu64 ", hint 0x%llx): %s\n", size,
		       (unsigned long long)hint, gpu_cu_name(r));
		(void)gpu_send(CHILD_SOCK, -1, 0);
		return 1;
	}
	(void)gpu_send(CHILD_SOCK, -1, va);
	if (!hint) {
		uint64_t v;

		(void)gpu_recv(CHILD_SOCK, -1, NULL, &v);
	}
	return 0;
}

/* Runs one reserver as a new execution of this program and returns the VA it reported (0 on
 * failure). With kill_it, the child is SIGKILLed once it reported, else it is waited for. */
static CUdeviceptr run_reserver(const struct opts *o, CUdeviceptr hint, bool kill_it)
{
	char size_s[32], hint_s[32], dev_s[16];
	char *args[] = {(char *)"/proc/self/exe", (char *)"--reserve", size_s, hint_s, dev_s, NULL};
	posix_spawn_file_actions_t fa;
	uint64_t va = 0;
	int sv[2], st;
	pid_t pid = -1;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return 0;
	snprintf(size_s, sizeof(size_s), "%" PRIu64, o->size);
	snprintf(hint_s, sizeof(hint_s), "%llu", (unsigned long long)hint);
	snprintf(dev_s, sizeof(dev_s), "%d", o->dev);
	fflush(NULL);
	if (posix_spawn_file_actions_init(&fa) == 0) {
		/* dup2 clears FD_CLOEXEC on the copy */
		if (posix_spawn_file_actions_adddup2(&fa, sv[1], CHILD_SOCK) != 0 ||
		    posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ) != 0)
			pid = -1;
		posix_spawn_file_actions_destroy(&fa);
	}
	(void)close(sv[1]);
	if (pid < 0 || gpu_recv(sv[0], STEP_TIMEOUT_MS, NULL, &va) < 0)
		va = 0;
	if (pid > 0) {
		if (kill_it)
			(void)kill(pid, SIGKILL);
		st = gpu_wait(pid, STEP_TIMEOUT_MS);
		if (kill_it && (st < 0 || !WIFSIGNALED(st)))
			va = 0;
	}
	(void)close(sv[0]);
	return (CUdeviceptr)va;
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{"tries", required_argument, NULL, 'n'},
		{"max-seconds", required_argument, NULL, 't'},
		{"size", required_argument, NULL, 's'},
		{"device", required_argument, NULL, 'd'},
		{},
	};
	struct opts o = {.tries = 10, .size = 1ull << 30};
	unsigned same = 0, done = 0;
	double t0 = gpu_now();
	int c;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && strcmp(argv[1], "--reserve") == 0)
		return reserver(strtoull(argv[2], NULL, 10),
				(CUdeviceptr)strtoull(argv[3], NULL, 10), atoi(argv[4]));
	while ((c = getopt_long(argc, argv, "", options, NULL)) >= 0) {
		switch (c) {
		case 'n':
			o.tries = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 't':
			o.max_s = strtod(optarg, NULL);
			break;
		case 's':
			if (gpu_parse_size(optarg, &o.size) < 0 || !o.size)
				goto usage;
			break;
		case 'd':
			o.dev = atoi(optarg);
			break;
		default:
			goto usage;
		}
	}
	if (optind != argc || !o.tries)
		goto usage;

	for (unsigned i = 0; i < o.tries; i++) {
		CUdeviceptr dead, got;

		if (o.max_s > 0 && done && gpu_now() - t0 > o.max_s) {
			printf("stopping after %u tries: --max-seconds %.0f reached\n", done,
			       o.max_s);
			break;
		}
		dead = run_reserver(&o, 0, true);

		if (!dead) {
			printf("summary: try %u: the first process could not reserve %" PRIu64
			       " bytes\n",
			       i + 1, o.size);
			return 1;
		}
		got = run_reserver(&o, dead, false);
		if (!got) {
			printf("summary: try %u: reserving with the dead process's address as hint "
			       "failed\n",
			       i + 1);
			return 1;
		}
		done++;
		same += got == dead;
		printf("try %u: dead process had 0x%llx, hint returned 0x%llx (%s)\n", i + 1,
		       (unsigned long long)dead, (unsigned long long)got,
		       got == dead ? "same" : "different");
	}
	printf("summary: hint honored %u of %u times (%.0f%%), %" PRIu64 "-byte reservations\n",
	       same, done, 100.0 * same / done, o.size);
	return 0;
usage:
	fprintf(stderr, "usage: gpu-va-hint [--tries N] [--max-seconds S] [--size N[KMG]] "
			"[--device N]\n");
	return 2;
}
