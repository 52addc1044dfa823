/* SPDX-License-Identifier: MIT */
/*
 * belayerctl bpf: the bpftool commands that show the environment tracer's pinned maps and
 * programs, and, when bpftool is installed, their output now. The directory is the
 * supervisor's own (supervisor-envtrace.h): its [env] pin_dir, else the one derived from its
 * state_dir (common/pin-dir.h), asked from the supervisor unless --pin-dir names it.
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
#include "pin-dir.h"
#include "util.h"

struct pin_query {
	char pin_dir[256]; /* as long as the configuration's */
	char state_dir[256];
};

static int on_config(const struct proto_msg *m, void *userdata)
{
	struct pin_query *q = userdata;

	if (m->type != PROTO_CONFIG_ENTRY)
		return 0;
	if (strcmp(m->config_entry.key, "env.pin_dir") == 0)
		snprintf(q->pin_dir, sizeof(q->pin_dir), "%s", m->config_entry.value);
	else if (strcmp(m->config_entry.key, "supervisor.state_dir") == 0)
		snprintf(q->state_dir, sizeof(q->state_dir), "%s", m->config_entry.value);
	return 0;
}

/* The running supervisor's pin directory into buf. */
static int supervisor_pin_dir(const struct ctl_options *o, char *buf, size_t cap)
{
	struct pin_query q = {0};
	int r;

	r = ctl_query(o, CTL_CONFIG, 0, CTL_ACT_NONE, -1, 0, on_config, &q);
	if (r < 0) {
		fprintf(stderr,
			"belayerctl: cannot ask the supervisor for its pin directory (%s); name it "
			"with --pin-dir DIR\n",
			strerror(-r));
		return r;
	}
	if (q.pin_dir[0]) {
		snprintf(buf, cap, "%s", q.pin_dir);
		return 0;
	}
	r = pin_dir_for_state(q.state_dir, buf, cap);
	if (r < 0)
		fprintf(stderr,
			"belayerctl: no pin directory from the supervisor's state_dir \"%s\" (%s); "
			"name it with --pin-dir DIR\n",
			q.state_dir, strerror(-r));
	return r;
}

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
	const char *dir = NULL;
	char cmd[PATH_MAX + 64], progs[PATH_MAX], own[512];
	bool run;
	struct dirent *de;
	DIR *d;
	int c;

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
	if (!dir) {
		int r = supervisor_pin_dir(o, own, sizeof(own));

		if (r < 0)
			return r;
		dir = own;
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
