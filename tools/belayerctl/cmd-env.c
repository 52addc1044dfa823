/* SPDX-License-Identifier: MIT */
/*
 * belayerctl env: agent environments (issue 9 item 3, issue 10).
 *   env create ID --root BASE [--cmd CMD] [--pids N|max] [--memory SIZE|max] [--cpus X|max]
 *                 [--net none|slirp|host] [--disk SIZE|max]
 *                                             start one (sandboxed: own namespaces, cgroups,
 *                                             overlay root; limits and network other than
 *                                             [env]'s)
 *   env create ID --image IMAGE [--cmd CMD] ...   the same on a container image's layers
 *                                             (a stored image, oci:DIR[:TAG] or
 *                                             docker-archive:FILE[:REF]; see image)
 *   env adopt ID --root ROOT --cgroup CG --pid PID   register another runtime's environment
 *   env checkpoint ID --turn N [--prefix-tokens LEN --prefix-hash H] [--trajectory T] [--new]
 *                                             its kind: full, fs-only (no process ran since
 *                                             the last dump) or skipped (nothing changed: the
 *                                             head's manifest; --new: a new one even then)
 *   env restore ID [--checkpoint C]           full restore; prints the manifest (turn, prefix)
 *   env fork SRC [--checkpoint C] --as NEW [--count K]
 *                                             K environments (NEW, or NEW-1..NEW-K) from
 *                                             SRC's checkpoint C (default: its latest)
 *   env rebuild ID                            rebuild from the base (the replay baseline)
 *   env list [ID]                             environments, or ID's checkpoints
 *   env destroy ID
 *   env watch CGROUP_PATH [--name ID]         trace a cgroup made by someone else
 *   env dirty ID                              paths changed since the last checkpoint
 *   env log ID [--follow]                     what it ran and changed (side-effect log)
 *   env exec|read|write ...                   cmd-env-exec.c
 */
#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "belayerctl.h"
#include "util.h"

#define ENV_TIMEOUT_MS 300000 /* checkpoints and restores of big environments take a while */

static void print_info(const struct ctl_options *o, const struct proto_env_info *i)
{
	if (o->json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "env", json_object_new_string(i->env));
		json_object_object_add(j, "checkpoint", json_object_new_string(i->ckpt));
		json_object_object_add(j, "parent", json_object_new_string(i->parent));
		json_object_object_add(j, "trajectory", json_object_new_string(i->trajectory));
		json_object_object_add(j, "turn", json_u64(i->turn));
		json_object_object_add(j, "prefix_tokens", json_u64(i->prefix_tokens));
		json_object_object_add(j, "prefix_hash", json_u64(i->prefix_hash));
		json_object_object_add(j, "pid", json_u64(i->pid));
		json_object_object_add(j, "processes", json_u64(i->nproc));
		json_object_object_add(j, "fs_bytes", json_u64(i->fs_bytes));
		json_object_object_add(j, "fs_files", json_u64(i->fs_files));
		json_object_object_add(j, "criu_bytes", json_u64(i->criu_bytes));
		json_object_object_add(j, "frozen_us", json_u64(i->freeze_us));
		json_object_object_add(j, "dump_us", json_u64(i->dump_us));
		json_object_object_add(j, "fs_us", json_u64(i->fs_us));
		json_object_object_add(j, "total_us", json_u64(i->total_us));
		json_object_object_add(j, "root", json_object_new_string(i->root));
		json_object_object_add(j, "cgroup", json_object_new_string(i->cgroup));
		json_object_object_add(j, "full_diff", json_object_new_boolean(i->full_diff));
		if (i->net)
			json_object_object_add(
				j, "net", json_object_new_string(env_net_to_string(i->net) ?: "?"));
		if (i->mem[0]) {
			json_object_object_add(j, "memory_mode", json_object_new_string(i->mem));
			json_object_object_add(j, "soft_dirty",
					       json_object_new_boolean(i->soft_dirty));
		}
		if (i->ckpt[0] && !i->root[0] && !i->cgroup[0]) {
			json_object_object_add(j, "commit_us", json_u64(i->commit_us));
			if (i->path[0])
				json_object_object_add(j, "path", json_object_new_string(i->path));
			if (i->kind[0])
				json_object_object_add(j, "kind", json_object_new_string(i->kind));
			if (i->why[0])
				json_object_object_add(j, "why", json_object_new_string(i->why));
			json_object_object_add(j, "precopy_rounds", json_u64(i->precopy_rounds));
			json_object_object_add(j, "precopy_bytes", json_u64(i->precopy_bytes));
			json_object_object_add(j, "precopy_frozen_bytes",
					       json_u64(i->precopy_frozen_bytes));
		}
		json_print(j, true);
		return;
	}
	if (i->root[0] || i->cgroup[0]) {
		printf("%-16s pid %-8u procs %-4u head %-10s net %-5s root %s cgroup %s%s%s\n",
		       i->env, i->pid, i->nproc, i->ckpt[0] ? i->ckpt : "-",
		       i->net ? env_net_to_string(i->net) ?: "?" : "-", i->root[0] ? i->root : "-",
		       i->cgroup, i->mem[0] ? " memory " : "", i->mem);
		return;
	}
	printf("%s %s%s%s (parent %s) turn %" PRIu64 " prefix %" PRIu64 " tokens hash %016" PRIx64
	       " traj \"%s\": %u procs, FS delta %" PRIu64 " files %" PRIu64
	       " bytes%s%s%s%s%s, CRIU %" PRIu64 " bytes; frozen %.1f ms (dump %.1f, fs %.1f), "
	       "commit %.1f ms, total %.1f ms",
	       i->env, i->ckpt, i->kind[0] ? " " : "", i->kind, i->parent[0] ? i->parent : "-",
	       i->turn, i->prefix_tokens, i->prefix_hash, i->trajectory, i->nproc, i->fs_files,
	       i->fs_bytes, i->full_diff ? " (full diff)" : "", i->path[0] ? " by " : "", i->path,
	       i->why[0] ? ": " : "", i->why, i->criu_bytes, (double)i->freeze_us / 1e3,
	       (double)i->dump_us / 1e3, (double)i->fs_us / 1e3, (double)i->commit_us / 1e3,
	       (double)i->total_us / 1e3);
	if (i->precopy_rounds)
		printf("; pre-copied in %" PRIu64 " round%s (%" PRIu64
		       " bytes before the freeze, %" PRIu64 " frozen)",
		       i->precopy_rounds, i->precopy_rounds == 1 ? "" : "s", i->precopy_bytes,
		       i->precopy_frozen_bytes);
	printf("\n");
}

static void print_item(const struct ctl_options *o, const struct proto_env_item *i)
{
	if (o->json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "kind", json_object_new_string(i->kind));
		if (i->pid)
			json_object_object_add(j, "pid", json_u64(i->pid));
		if (i->ts_ns)
			json_object_object_add(j, "ts_ns", json_u64(i->ts_ns));
		if (i->path[0])
			json_object_object_add(j, "path", json_object_new_string(i->path));
		if (i->path2[0])
			json_object_object_add(j, "path2", json_object_new_string(i->path2));
		if (i->text[0])
			json_object_object_add(j, "text", json_object_new_string(i->text));
		json_print(j, true);
		return;
	}
	if (strcmp(i->kind, "dirty") == 0 || strcmp(i->kind, "dirty_self") == 0)
		printf("%s%s\n", i->path, strcmp(i->kind, "dirty") == 0 ? "" : " (entries)");
	else if (strcmp(i->kind, "full_diff") == 0)
		printf("needs a full diff: %s\n", i->text);
	else
		printf("%-9s pid %-7u %s%s%s%s%s\n", i->kind, i->pid, i->path,
		       i->path2[0] ? " -> " : "", i->path2, i->text[0] ? "  " : "", i->text);
}

/* Sends q and prints replies until END (then, with follow, keeps printing items). */
static int request(const struct ctl_options *o, const struct proto_env_request *q, bool follow)
{
	struct ctl_options ro = *o;
	struct proto_msg m = {.type = PROTO_ENV_REQUEST};
	_cleanup_close_ int sock = -1;
	bool ended = false;
	int r;

	ro.timeout_ms = ENV_TIMEOUT_MS;
	sock = ctl_connect(&ro);
	if (sock < 0)
		return sock;
	m.env_request = *q;
	r = proto_send(sock, &m, 0);
	if (r < 0) {
		fprintf(stderr, "belayerctl: send failed: %s\n", strerror(-r));
		return r;
	}
	for (;;) {
		if (ended)
			ro.timeout_ms = -1;
		r = ctl_recv(sock, &ro, &m);
		if (r < 0)
			return r; /* belayerctl exits 1 */
		if (m.type == PROTO_ENV_INFO)
			print_info(o, &m.env_info);
		else if (m.type == PROTO_ENV_ITEM)
			print_item(o, &m.env_item);
		else if (m.type == PROTO_END) {
			if (!follow)
				return 0;
			ended = true;
		}
		fflush(stdout);
	}
}

/* A create's limit: "max" (none), or a number (with one of suffixes, powers of 1024, for a
 * size; with up to three decimals for CPUs: scale 1000). 0 is refused: it would mean "the
 * configured one", which leaving the option out already says. */
static int parse_limit(const char *s, const char *suffixes, uint64_t scale, uint64_t *ret)
{
	uint64_t v, frac = 0, mul = 1;
	const char *sfx;
	char *end;

	if (strcmp(s, "max") == 0) {
		*ret = ENV_LIMIT_NONE;
		return 0;
	}
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	if (scale == 1000 && *end == '.') {
		uint64_t d = 100;

		for (end++; *end >= '0' && *end <= '9' && d; end++, d /= 10)
			frac += (uint64_t)(*end - '0') * d;
	}
	if (*end && suffixes[0] && (sfx = strchr(suffixes, *end | 0x20))) {
		for (ptrdiff_t i = 0; i <= sfx - suffixes; i++)
			mul *= 1024;
		end++;
	}
	if (*end || v > UINT64_MAX / scale / mul)
		return -EINVAL;
	*ret = (v * scale + frac) * mul;
	return *ret ? 0 : -EINVAL;
}

int cmd_env(const struct ctl_options *o, int argc, char **argv)
{
	static const struct option options[] = {
		{"root", required_argument, NULL, 'r'},
		{"cmd", required_argument, NULL, 'c'},
		{"cgroup", required_argument, NULL, 'g'},
		{"pid", required_argument, NULL, 'p'},
		{"turn", required_argument, NULL, 't'},
		{"prefix-tokens", required_argument, NULL, 'l'},
		{"prefix-hash", required_argument, NULL, 'H'},
		{"trajectory", required_argument, NULL, 'T'},
		{"checkpoint", required_argument, NULL, 'C'},
		{"name", required_argument, NULL, 'n'},
		{"follow", no_argument, NULL, 'f'},
		{"json", no_argument, NULL, 'j'},
		{"pids", required_argument, NULL, 'P'},
		{"memory", required_argument, NULL, 'M'},
		{"cpus", required_argument, NULL, 'U'},
		{"net", required_argument, NULL, 'N'},
		{"as", required_argument, NULL, 'A'},
		{"count", required_argument, NULL, 'K'},
		{"disk", required_argument, NULL, 'D'},
		{"image", required_argument, NULL, 'i'},
		{"new", no_argument, NULL, 'W'},
		{},
	};
	struct proto_env_request q = {0};
	bool follow = false, have_turn = false;
	const char *sub;
	uint64_t v;
	int c, r = 0;

	if (argc < 2) {
		fprintf(stderr,
			"Usage: belayerctl env create|adopt|checkpoint|restore|fork|rebuild|list|"
			"destroy|watch|dirty|log|exec|read|write ...\n");
		return 2;
	}
	sub = argv[1];
	if (strcmp(sub, "exec") == 0 || strcmp(sub, "read") == 0 || strcmp(sub, "write") == 0)
		return cmd_env_exec(o, argc - 1, argv + 1);
	if (env_op_from_string(sub, &q.op) < 0) {
		fprintf(stderr, "belayerctl: unknown env command %s\n", sub);
		return 2;
	}
	/* optind 0: a full reset (belayerctl.c parsed its own options in REQUIRE_ORDER mode);
	 * from the subcommand on, so options may follow the positional argument. */
	argc--;
	argv++;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", options, NULL)) >= 0) {
		switch (c) {
		case 'r':
			r = copy_arg(q.root, sizeof(q.root), optarg, "--root");
			break;
		case 'c':
			r = copy_arg(q.cmd, sizeof(q.cmd), optarg, "--cmd");
			break;
		case 'g':
			r = copy_arg(q.cgroup, sizeof(q.cgroup), optarg, "--cgroup");
			break;
		case 'p':
			r = parse_u64(optarg, &v);
			q.pid = (uint32_t)v;
			break;
		case 't':
			r = parse_u64(optarg, &q.turn);
			have_turn = true;
			break;
		case 'l':
			r = parse_u64(optarg, &q.prefix_tokens);
			break;
		case 'H':
			r = parse_u64(optarg, &q.prefix_hash);
			break;
		case 'T':
			r = copy_arg(q.trajectory, sizeof(q.trajectory), optarg, "--trajectory");
			break;
		case 'C':
			r = copy_arg(q.ckpt, sizeof(q.ckpt), optarg, "--checkpoint");
			break;
		case 'n':
			r = copy_arg(q.env, sizeof(q.env), optarg, "--name");
			break;
		case 'f':
			follow = true;
			q.flags |= ENV_FLAG_FOLLOW;
			break;
		case 'j':
			break; /* belayerctl.c took it */
		case 'W':
			q.flags |= ENV_FLAG_NEW_CKPT;
			break;
		case 'P':
			r = parse_limit(optarg, "", 1, &q.pids);
			break;
		case 'M':
			r = parse_limit(optarg, "kmgt", 1, &q.memory);
			break;
		case 'U':
			r = parse_limit(optarg, "", 1000, &q.cpu_millis);
			break;
		case 'D':
			r = parse_limit(optarg, "kmgt", 1, &q.disk);
			break;
		case 'N': {
			enum env_net net;

			r = env_net_from_string(optarg, &net);
			if (r >= 0 && net == ENV_NET_DEFAULT)
				r = -EINVAL;
			q.net = (uint32_t)net;
			if (r < 0)
				fprintf(stderr, "belayerctl: --net: none, slirp or host\n");
			break;
		}
		case 'A':
			r = copy_arg(q.dst, sizeof(q.dst), optarg, "--as");
			break;
		case 'K':
			r = parse_u64(optarg, &v);
			if (r >= 0 && (v < 1 || v > ENV_FORK_MAX))
				r = -ERANGE;
			q.count = (uint32_t)v;
			break;
		case 'i':
			r = image_arg(q.image, sizeof(q.image), optarg);
			break;
		default:
			return 2;
		}
		if (r < 0) {
			fprintf(stderr, "belayerctl: bad value for an option of env %s\n", sub);
			return 2;
		}
	}
	/* The positional argument: the environment, or the cgroup to watch. */
	if (optind < argc) {
		if (q.op == ENV_OP_WATCH)
			r = copy_arg(q.root, sizeof(q.root), argv[optind], "CGROUP_PATH");
		else
			r = copy_arg(q.env, sizeof(q.env), argv[optind], "ID");
		if (r < 0)
			return 2;
	}
	if ((q.op != ENV_OP_LIST && q.op != ENV_OP_WATCH && !q.env[0]) ||
	    (q.op == ENV_OP_WATCH && !q.root[0]) || (q.op == ENV_OP_CHECKPOINT && !have_turn) ||
	    (q.op == ENV_OP_FORK && !q.dst[0])) {
		fprintf(stderr, "belayerctl: env %s: missing %s\n", sub,
			!q.env[0] && q.op != ENV_OP_WATCH ? "ID"
			: q.op == ENV_OP_WATCH		  ? "CGROUP_PATH"
			: q.op == ENV_OP_CHECKPOINT	  ? "--turn N"
							  : "--as NEW");
		return 2;
	}
	return request(o, &q, follow && q.op == ENV_OP_LOG);
}
