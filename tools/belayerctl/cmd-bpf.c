/* SPDX-License-Identifier: MIT */
/*
 * belayerctl bpf: the bpftool commands that show the environment tracer's pinned maps and
 * programs (supervisor-envtrace.h: pinned under /sys/fs/bpf/belayer/envtrace), and, when
 * bpftool is installed, their output now.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <limits.h>
#include <unistd.h>

#include "belayerctl.h"
#include "util.h"

#define PIN_DIR "/sys/fs/bpf/belayer/envtrace"

static bool have_bpftool(void)
{
	return system("command -v bpftool >/dev/null 2>&1") == 0;
}

static int show(const char *cmd, bool run)
{
	printf("$ %s\n", cmd);
	fflush(stdout);
	if (run && system(cmd) != 0)
		printf("(failed)\n");
	return 0;
}

int cmd_bpf(const struct ctl_options *o, int argc, char **argv)
{
	static const struct option options[] = {
		{"pin-dir", required_argument, NULL, 'd'},
		{"no-run", no_argument, NULL, 'n'},
		{},
	};
	const char *dir = PIN_DIR;
	char cmd[PATH_MAX + 64], progs[PATH_MAX];
	bool run;
	struct dirent *de;
	DIR *d;
	int c;

	(void)o;
	run = have_bpftool();
	optind = 1;
	while ((c = getopt_long(argc, argv, "", options, NULL)) >= 0) {
		if (c == 'd')
			dir = optarg;
		else if (c == 'n')
			run = false;
		else
			return 2;
	}
	d = opendir(dir);
	if (!d) {
		fprintf(stderr,
			"belayerctl: nothing pinned at %s (is the supervisor running with [env] "
			"trace=yes and BPF available?)\n",
			dir);
		return -ENOENT;
	}
	if (!run)
		printf("# bpftool not found (apt install bpftool): the commands only\n");
	snprintf(progs, sizeof(progs), "%s/progs", dir);
	while ((de = readdir(d))) {
		char path[PATH_MAX];
		struct stat st;

		if (de->d_name[0] == '.' || strcmp(de->d_name, "progs") == 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (stat(path, &st) < 0 || S_ISDIR(st.st_mode))
			continue;
		snprintf(cmd, sizeof(cmd), "bpftool map show pinned %s", path);
		show(cmd, run);
		snprintf(cmd, sizeof(cmd), "bpftool map dump pinned %s", path);
		show(cmd, run && strstr(de->d_name, "ring") == NULL);
	}
	closedir(d);
	d = opendir(progs);
	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(cmd, sizeof(cmd), "bpftool prog show pinned %.2000s/%.255s", progs,
			 de->d_name);
		show(cmd, run);
	}
	if (d)
		closedir(d);
	return 0;
}
