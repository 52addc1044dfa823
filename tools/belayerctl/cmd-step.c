/* SPDX-License-Identifier: MIT */
/*
 * belayerctl step end|begin TRAJECTORY ENV: an RL framework's step event from the shell
 * (PROTO_TRAJ_STEP), and the checkpoint policy's answer (PROTO_TRAJ_DECISION). A step-begin's
 * answer may be held while the environment's checkpoint runs (at most [policy] max_delay;
 * every-turn: until it is done, so give --timeout).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "belayerctl.h"
#include "util.h"

static const char usage[] =
	"usage: belayerctl step end|begin TRAJECTORY ENV [--turn N] [--prompt-tokens N]\n"
	"       [--generated-tokens N] [--tps TOKENS_PER_S] [--output-tokens N]\n";

static int parse_step(int argc, char **argv, struct proto_traj_step *q)
{
	static const struct option opts[] = {
		{"turn", required_argument, NULL, 'n'},
		{"prompt-tokens", required_argument, NULL, 'p'},
		{"generated-tokens", required_argument, NULL, 'g'},
		{"tps", required_argument, NULL, 'r'},
		{"output-tokens", required_argument, NULL, 'o'},
		{},
	};
	char *end;
	double tps;
	int c, r;

	if (argc < 4)
		return -EINVAL;
	if (strcmp(argv[1], "end") == 0)
		q->ev = TRAJ_STEP_END;
	else if (strcmp(argv[1], "begin") == 0)
		q->ev = TRAJ_STEP_BEGIN;
	else
		return -EINVAL;
	r = copy_arg(q->trajectory, sizeof(q->trajectory), argv[2], "TRAJECTORY");
	if (r >= 0)
		r = copy_arg(q->env, sizeof(q->env), argv[3], "ENV");
	optind = 4;
	while (r >= 0 && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			r = parse_u64(optarg, &q->turn);
			break;
		case 'p':
			r = parse_u64(optarg, &q->prompt_tokens);
			break;
		case 'g':
			r = parse_u64(optarg, &q->generated_tokens);
			break;
		case 'r':
			tps = strtod(optarg, &end);
			if (!*optarg || *end || !(tps >= 0 && tps < 1e12))
				return -EINVAL;
			q->decode_mtps = (uint64_t)(tps * 1000 + 0.5);
			break;
		case 'o':
			r = parse_u64(optarg, &q->output_tokens);
			break;
		default:
			return -EINVAL;
		}
	}
	return r < 0 ? r : optind == argc ? 0 : -EINVAL;
}

static void print_decision(const struct proto_traj_decision *d)
{
	printf("%s %s (%s)", traj_action_to_string(d->act), d->env, d->why);
	if (d->ev == TRAJ_STEP_END) {
		if (d->bubble_us)
			printf("  bubble %.3fs (err %.2f)", (double)d->bubble_us / 1e6,
			       (double)d->bubble_err_pm / 1000);
		printf("  cost %.3fs (err %.2f)\n", (double)d->cost_us / 1e6,
		       (double)d->cost_err_pm / 1000);
		return;
	}
	printf("  held %.1f ms", (double)d->held_us / 1000);
	if (d->ckpt_us)
		printf("  checkpoint %s ran %.1f ms%s", d->ckpt[0] ? d->ckpt : "(committing)",
		       (double)d->ckpt_us / 1000, d->aborted ? ", aborted" : "");
	printf("\n");
}

static json_object *decision_json(const struct proto_traj_decision *d)
{
	json_object *j = json_object_new_object();

	json_object_object_add(j, "event", json_object_new_string(traj_event_to_string(d->ev)));
	json_object_object_add(j, "trajectory", json_object_new_string(d->trajectory));
	json_object_object_add(j, "env", json_object_new_string(d->env));
	json_object_object_add(j, "action", json_object_new_string(traj_action_to_string(d->act)));
	json_object_object_add(j, "why", json_object_new_string(d->why));
	json_object_object_add(j, "bubble_us", json_u64(d->bubble_us));
	json_object_object_add(j, "bubble_err", json_object_new_double(d->bubble_err_pm / 1000.0));
	json_object_object_add(j, "cost_us", json_u64(d->cost_us));
	json_object_object_add(j, "cost_err", json_object_new_double(d->cost_err_pm / 1000.0));
	json_object_object_add(j, "held_us", json_u64(d->held_us));
	json_object_object_add(j, "checkpoint", json_object_new_string(d->ckpt));
	json_object_object_add(j, "checkpoint_us", json_u64(d->ckpt_us));
	json_object_object_add(j, "aborted", json_object_new_boolean(d->aborted));
	return j;
}

int cmd_step(const struct ctl_options *o, int argc, char **argv)
{
	struct proto_msg m = {.type = PROTO_TRAJ_STEP};
	_cleanup_close_ int sock = -1;
	int r = parse_step(argc, argv, &m.traj_step);

	if (r < 0) {
		fputs(usage, stderr);
		return r;
	}
	sock = ctl_connect(o);
	if (sock < 0)
		return sock;
	r = proto_send(sock, &m, 0);
	if (r < 0) {
		fprintf(stderr, "belayerctl: send failed: %s\n", strerror(-r));
		return r;
	}
	do {
		r = ctl_recv(sock, o, &m);
		if (r < 0)
			return r;
	} while (m.type != PROTO_TRAJ_DECISION);
	if (o->json)
		json_print(decision_json(&m.traj_decision), false);
	else
		print_decision(&m.traj_decision);
	return 0;
}
