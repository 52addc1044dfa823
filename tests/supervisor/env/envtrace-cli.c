/* SPDX-License-Identifier: MIT */
/*
 * envtrace-cli: the envtrace library on its own, until the supervisor integrates it
 * (belayerctl env watch/dirty/log). Watches a cgroup, prints the dirty set and writes the
 * side-effect log.
 *
 *   envtrace-cli [OPTIONS] watch CGROUP       until SIGINT/SIGTERM, then print
 *   envtrace-cli [OPTIONS] run CGROUP -- CMD  run CMD in CGROUP, wait for it, then print
 *   envtrace-cli [--json] log FILE            print a side-effect log
 *
 * Options: --json, --log FILE (side-effect log to append to), --root DIR (the environment's
 * root), --pin-dir DIR (pins the maps and programs there, a directory no running tracer
 * holds; default: pins nothing),
 * --ringbuf BYTES.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bpf/libbpf.h>

#include "log.h"
#include "supervisor-dirty.h"
#include "supervisor-envtrace.h"
#include "supervisor-sidelog.h"
#include "util.h"

#define ENV_ID 1

struct cli {
	bool json;
	const char *log_path, *root, *pin_dir;
	size_t ringbuf;
	struct sv_envtrace *et;
	struct sv_dirty *dirty;
	struct sv_sidelog *log;
	uint64_t records;
	pid_t child;
	bool child_exited;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	stop = 1;
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

static int on_record(const struct envtrace_record *rec, void *userdata)
{
	struct cli *c = userdata;
	int r;

	c->records++;
	r = dirty_apply(c->dirty, rec);
	if (r < 0)
		log_warning_errno(r, "Failed to record a change: %m, ignoring.");
	if (c->log) {
		r = sidelog_append(c->log, rec);
		if (r < 0)
			log_warning_errno(r,
					  "Failed to append to the side-effect log: %m, ignoring.");
	}
	if (rec->type == ENVTRACE_EV_EXIT && rec->pid == c->child)
		c->child_exited = true;
	return 0;
}

static int drain(struct cli *c)
{
	int r;

	do
		r = envtrace_consume(c->et, on_record, c);
	while (r > 0);
	return r;
}

static int print_result(struct cli *c)
{
	struct envtrace_env_stats st = {0};
	struct dirty_item *items = NULL;
	const char *reason = NULL;
	uint64_t drops = 0;
	size_t n = 0;
	int r;

	r = envtrace_env_stats(c->et, ENV_ID, &st);
	if (r < 0)
		return log_error_errno(r, "Failed to read the counters: %m");
	(void)envtrace_drops(c->et, NULL, 0, &drops);
	dirty_note_drops(c->dirty, st.drops);
	r = dirty_list(c->dirty, &items, &n);
	if (r < 0)
		return r;
	dirty_needs_full_diff(c->dirty, &reason);
	if (c->json) {
		printf("{\"full_diff\":%s,\"reason\":", reason ? "true" : "false");
		json_str(stdout, reason ? reason : "");
		printf(",\"records\":%" PRIu64
		       ",\"events\":%llu,\"drops\":%llu,\"drops_all\":%" PRIu64
		       ",\"execs\":%llu,\"dirty\":[",
		       c->records, st.events, st.drops, drops, st.execs);
		for (size_t i = 0; i < n; i++) {
			printf("%s{\"path\":", i ? "," : "");
			json_str(stdout, items[i].path);
			printf(",\"subtree\":%s}", items[i].subtree ? "true" : "false");
		}
		printf("]}\n");
	} else {
		for (size_t i = 0; i < n; i++)
			printf("%s%s\n", items[i].path, items[i].subtree ? "" : " (itself)");
		printf("# %zu dirty, %" PRIu64 " records, %llu drops%s%s\n", n, c->records,
		       st.drops, reason ? ", needs full diff: " : "", reason ? reason : "");
	}
	free(items);
	return 0;
}

static int move_to_cgroup(const char *cgroup)
{
	char path[PATH_MAX];
	_cleanup_close_ int fd = -1;

	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "0", 1) != 1)
		return negative_errno();
	return 0;
}

static int loop(struct cli *c, bool until_child)
{
	int status = 0;
	bool reaped = false;

	while (!stop) {
		struct pollfd p = {.fd = envtrace_fd(c->et), .events = POLLIN};

		if (poll(&p, 1, 100) < 0 && errno != EINTR)
			return negative_errno();
		if (drain(c) < 0)
			return -EIO;
		if (until_child && !reaped && waitpid(c->child, &status, WNOHANG) == c->child)
			reaped = true;
		/* The exit record comes after every record of the child's own calls. */
		if (until_child && reaped && c->child_exited)
			break;
	}
	(void)drain(c);
	return until_child ? (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) : 0;
}

static int print_entry(const struct sidelog_entry *e, void *userdata)
{
	const struct cli *c = userdata;

	if (c->json) {
		printf("{\"t\":");
		json_str(stdout, e->kind);
		printf(",\"ts\":%" PRIu64 ",\"pid\":%" PRId64, e->ts_ns, e->pid);
		if (e->op) {
			printf(",\"op\":");
			json_str(stdout, e->op);
		}
		if (e->path) {
			printf(",\"path\":");
			json_str(stdout, e->path);
		}
		if (e->path2) {
			printf(",\"path2\":");
			json_str(stdout, e->path2);
		}
		if (e->reason) {
			printf(",\"reason\":");
			json_str(stdout, e->reason);
		}
		if (e->exe) {
			printf(",\"exe\":");
			json_str(stdout, e->exe);
			printf(",\"argv\":[");
			for (size_t i = 0; i < e->argc; i++) {
				if (i)
					putchar(',');
				json_str(stdout, e->argv[i]);
			}
			putchar(']');
		}
		printf("}\n");
		return 0;
	}
	printf("%" PRIu64 ".%09" PRIu64 " pid %" PRId64 " %-9s", e->ts_ns / 1000000000,
	       e->ts_ns % 1000000000, e->pid, e->kind);
	if (e->op)
		printf(" %s", e->op);
	if (e->path)
		printf(" %s", e->path);
	if (e->path2)
		printf(" -> %s", e->path2);
	if (e->reason)
		printf(" %s", e->reason);
	if (e->exe) {
		printf(" %s:", e->exe);
		for (size_t i = 0; i < e->argc; i++)
			printf(" [%s]", e->argv[i]);
	}
	if (strcmp(e->kind, "exit") == 0)
		printf(" code %" PRId64, e->code);
	if (strcmp(e->kind, "fork") == 0)
		printf(" child %" PRId64, e->child);
	putchar('\n');
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: envtrace-cli [--json] [--log FILE] [--root DIR] [--pin-dir DIR] "
		   "[--ringbuf BYTES]\n"
		   "         watch CGROUP | run CGROUP -- CMD [ARG...] | log FILE\n");
}

static int silent_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	return level == LIBBPF_DEBUG ? 0 : vfprintf(stderr, fmt, ap);
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{"json", no_argument, NULL, 'j'},
		{"log", required_argument, NULL, 'l'},
		{"root", required_argument, NULL, 'r'},
		{"pin-dir", required_argument, NULL, 'p'},
		{"ringbuf", required_argument, NULL, 'b'},
		{"help", no_argument, NULL, 'h'},
		{},
	};
	struct cli c = {0};
	struct envtrace_options opts = {0};
	const char *cmd, *cgroup;
	int o, r;

	log_setup("envtrace-cli", LOG_LEVEL_INFO);
	while ((o = getopt_long(argc, argv, "+h", options, NULL)) >= 0) {
		switch (o) {
		case 'j':
			c.json = true;
			break;
		case 'l':
			c.log_path = optarg;
			break;
		case 'r':
			c.root = optarg;
			break;
		case 'p':
			c.pin_dir = optarg;
			break;
		case 'b':
			c.ringbuf = strtoull(optarg, NULL, 0);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (argc - optind < 2) {
		usage(stderr);
		return 2;
	}
	cmd = argv[optind];
	if (strcmp(cmd, "log") == 0) {
		r = sidelog_read(argv[optind + 1], print_entry, &c);
		if (r < 0)
			return log_error_errno(r, "Failed to read %s: %m", argv[optind + 1]), 1;
		return 0;
	}
	if (strcmp(cmd, "watch") != 0 && strcmp(cmd, "run") != 0) {
		usage(stderr);
		return 2;
	}
	cgroup = argv[optind + 1];
	if (strcmp(cmd, "run") == 0 && (argc - optind < 4 || strcmp(argv[optind + 2], "--") != 0)) {
		usage(stderr);
		return 2;
	}

	libbpf_set_print(silent_print);
	opts.pin_dir = c.pin_dir;
	opts.ringbuf_bytes = c.ringbuf;
	r = envtrace_create(&opts, &c.et);
	if (r < 0)
		return log_error_errno(r, "BPF tracing unavailable: %m"), 1;
	r = envtrace_watch_add(c.et, cgroup, c.root, ENV_ID);
	if (r < 0)
		return log_error_errno(r, "Failed to watch %s: %m", cgroup), 1;
	if (dirty_create(&c.dirty) < 0)
		return 1;
	if (c.log_path) {
		r = sidelog_open(c.log_path, &c.log);
		if (r < 0)
			return log_error_errno(r, "Failed to open %s: %m", c.log_path), 1;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);

	if (strcmp(cmd, "run") == 0) {
		char **child_argv = argv + optind + 3;

		c.child = fork();
		if (c.child < 0)
			return log_error_errno(negative_errno(), "Failed to fork: %m"), 1;
		if (c.child == 0) {
			if (move_to_cgroup(cgroup) < 0)
				_exit(126);
			execvp(child_argv[0], child_argv);
			_exit(127);
		}
		r = loop(&c, true);
	} else {
		/* Ready: a caller may start the environment's work now. */
		fprintf(stderr, "envtrace-cli: watching %s\n", cgroup);
		r = loop(&c, false);
	}
	if (print_result(&c) < 0)
		r = 1;
	sidelog_close(c.log);
	dirty_destroy(c.dirty);
	envtrace_destroy(c.et);
	return r;
}
