/* SPDX-License-Identifier: MIT */
/*
 * belayerctl inject kill|hang|resume PID: fault injection on a worker (SIGKILL, SIGSTOP,
 * SIGCONT), done by the supervisor through the worker's pidfd.
 * belayerctl inject gpu ARGS...: TEST-ONLY. Passes ARGS to the emulated GPU stack's emu-ctl
 * (tests/emu; e.g. "inject gpu xid 0 79"), found through BELAYER_EMU_CTL or PATH. There is no
 * way to inject faults into a real GPU, and this never touches one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "belayerctl.h"
#include "log.h"

static int inject_gpu(const struct ctl_options *o, int argc, char **argv)
{
	const char *ctl = getenv("BELAYER_EMU_CTL");
	char **args;
	int status;
	pid_t pid;

	if (argc < 1) {
		fprintf(stderr,
			"usage: belayerctl inject gpu EMU-CTL-ARGS... (emulated GPU only)\n");
		return -EINVAL;
	}
	args = calloc((size_t)argc + 2, sizeof(*args));
	if (!args)
		return -ENOMEM;
	args[0] = (char *)(ctl && *ctl ? ctl : "emu-ctl");
	for (int i = 0; i < argc; i++)
		args[i + 1] = argv[i];
	pid = fork();
	if (pid < 0) {
		free(args);
		return log_error_errno(negative_errno(), "fork failed: %m");
	}
	if (pid == 0) {
		execvp(args[0], args);
		fprintf(stderr,
			"belayerctl: cannot run %s (%s): GPU fault injection needs the emulated "
			"GPU "
			"stack's emu-ctl (set BELAYER_EMU_CTL).\n",
			args[0], strerror(errno));
		_exit(127);
	}
	free(args);
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return negative_errno();
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return -EIO;
	if (o->json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "injected", json_object_new_string("gpu"));
		json_print(j, false);
	}
	return 0;
}

int cmd_inject(const struct ctl_options *o, int argc, char **argv)
{
	enum ctl_action act;
	unsigned long pid;
	char *end;
	int r;

	if (argc >= 2 && strcmp(argv[1], "gpu") == 0)
		return inject_gpu(o, argc - 2, argv + 2);
	if (argc != 3 || ctl_action_from_string(argv[1], &act) < 0 || act == CTL_ACT_NONE) {
		fprintf(stderr, "usage: belayerctl inject kill|hang|resume PID\n"
				"       belayerctl inject gpu EMU-CTL-ARGS...   (test-only)\n");
		return -EINVAL;
	}
	pid = strtoul(argv[2], &end, 10);
	if (*end || pid == 0 || pid > UINT32_MAX) {
		fprintf(stderr, "belayerctl inject: bad pid %s\n", argv[2]);
		return -EINVAL;
	}
	r = ctl_query(o, CTL_INJECT, (uint32_t)pid, act, -1, 0, NULL, NULL);
	if (r < 0)
		return r;
	if (o->json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "injected", json_object_new_string(argv[1]));
		json_object_object_add(j, "pid", json_u64(pid));
		json_print(j, false);
	} else {
		printf("%s sent to pid %lu\n", argv[1], pid);
	}
	return 0;
}
