/* SPDX-License-Identifier: MIT */
/*
 * belayerctl traj [TRAJECTORY]: what the checkpoint policy knows (issue 11). Per trajectory its
 * environment, unprotected turns and time, bubble prediction and error, decode rate, the
 * gateway's pending request and the policy's checkpoints; per environment its cost model.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "belayerctl.h"
#include "util.h"

static int collect(const struct ctl_options *o, const char *only, json_object *trajs,
		   json_object *envs)
{
	struct proto_msg m = {.type = PROTO_TRAJ_LIST};
	_cleanup_close_ int sock = ctl_connect(o);
	int r;

	if (sock < 0)
		return sock;
	snprintf(m.traj_list.trajectory, sizeof(m.traj_list.trajectory), "%s", only);
	r = proto_send(sock, &m, 0);
	if (r < 0) {
		fprintf(stderr, "belayerctl: send failed: %s\n", strerror(-r));
		return r;
	}
	for (;;) {
		const struct proto_traj_info *i = &m.traj_info;
		json_object *j;

		r = ctl_recv(sock, o, &m);
		if (r < 0)
			return r;
		if (m.type == PROTO_END)
			return 0;
		if (m.type != PROTO_TRAJ_INFO)
			continue;
		j = json_object_new_object();
		if (i->kind == TRAJ_INFO_ENV) {
			json_object_object_add(j, "env", json_object_new_string(i->env));
			json_object_object_add(j, "cost_fixed_us", json_u64(i->cost_us));
			json_object_object_add(j, "fs_bytes_per_s", json_u64(i->fs_bps));
			json_object_object_add(j, "dump_bytes_per_s", json_u64(i->dump_bps));
			json_object_object_add(
				j, "cost_err",
				json_object_new_double((double)i->cost_err_pm / 1000));
			json_object_object_add(j, "checkpoints_observed", json_u64(i->cost_n));
			json_object_array_add(envs, j);
			continue;
		}
		json_object_object_add(j, "trajectory", json_object_new_string(i->trajectory));
		json_object_object_add(j, "env", json_object_new_string(i->env));
		json_object_object_add(j, "unprotected_turns", json_u64(i->unprotected_turns));
		json_object_object_add(j, "unprotected_s",
				       json_object_new_double((double)i->unprotected_us / 1e6));
		json_object_object_add(j, "bubble_us", json_u64(i->bubble_us));
		json_object_object_add(j, "bubble_err",
				       json_object_new_double((double)i->bubble_err_pm / 1000));
		json_object_object_add(j, "lengths_known", json_u64(i->n_lengths));
		json_object_object_add(j, "decode_tps",
				       json_object_new_double((double)i->decode_mtps / 1000));
		json_object_object_add(j, "pending", json_object_new_boolean(i->pending));
		json_object_object_add(j, "prompt_tokens", json_u64(i->prompt_tokens));
		json_object_object_add(j, "generated_tokens", json_u64(i->generated_tokens));
		json_object_object_add(j, "last_output_tokens", json_u64(i->last_output_tokens));
		json_object_object_add(j, "checkpoints_done", json_u64(i->ckpt_done));
		json_object_object_add(j, "checkpoints_aborted", json_u64(i->ckpt_aborted));
		json_object_array_add(trajs, j);
	}
}

#define GET(o, k) (json_object_object_get_ex((o), (k), &v) ? v : NULL)

static void print_table(json_object *trajs, json_object *envs)
{
	json_object *v;

	printf("%-24s %-16s %-6s %-9s %-10s %-6s %-9s %-16s %s\n", "TRAJECTORY", "ENV", "TURNS",
	       "UNPROT", "BUBBLE", "ERR", "TOK/S", "PENDING", "CKPT/ABORT");
	for (size_t i = 0; i < json_object_array_length(trajs); i++) {
		json_object *t = json_object_array_get_idx(trajs, i);
		char unp[32], bub[32], pend[48];
		uint64_t b = json_object_get_uint64(GET(t, "bubble_us"));

		snprintf(unp, sizeof(unp), "%.1fs",
			 json_object_get_double(GET(t, "unprotected_s")));
		if (b)
			snprintf(bub, sizeof(bub), "%.3fs", (double)b / 1e6);
		else
			snprintf(bub, sizeof(bub), "-");
		if (json_object_get_boolean(GET(t, "pending")))
			snprintf(pend, sizeof(pend), "%" PRIu64 "+%" PRIu64 " tok",
				 json_object_get_uint64(GET(t, "prompt_tokens")),
				 json_object_get_uint64(GET(t, "generated_tokens")));
		else
			snprintf(pend, sizeof(pend), "-");
		printf("%-24s ", json_object_get_string(GET(t, "trajectory")));
		printf("%-16s ", json_object_get_string(GET(t, "env"))[0]
					 ? json_object_get_string(GET(t, "env"))
					 : "-");
		printf("%-6s %-9s %-10s ", json_object_get_string(GET(t, "unprotected_turns")), unp,
		       bub);
		printf("%-6.2f %-9.1f %-16s ", json_object_get_double(GET(t, "bubble_err")),
		       json_object_get_double(GET(t, "decode_tps")), pend);
		printf("%s/%s\n", json_object_get_string(GET(t, "checkpoints_done")),
		       json_object_get_string(GET(t, "checkpoints_aborted")));
	}
	if (!json_object_array_length(envs))
		return;
	printf("\n%-24s %-12s %-12s %-12s %-6s %s\n", "ENV", "FIXED", "FS MB/S", "DUMP MB/S", "ERR",
	       "SEEN");
	for (size_t i = 0; i < json_object_array_length(envs); i++) {
		json_object *e = json_object_array_get_idx(envs, i);

		printf("%-24s %-12.1f %-12.0f %-12.0f %-6.2f %s\n",
		       json_object_get_string(GET(e, "env")),
		       (double)json_object_get_uint64(GET(e, "cost_fixed_us")) / 1000,
		       (double)json_object_get_uint64(GET(e, "fs_bytes_per_s")) / 1e6,
		       (double)json_object_get_uint64(GET(e, "dump_bytes_per_s")) / 1e6,
		       json_object_get_double(GET(e, "cost_err")),
		       json_object_get_string(GET(e, "checkpoints_observed")));
	}
}

#undef GET

int cmd_traj(const struct ctl_options *o, int argc, char **argv)
{
	json_object *trajs = json_object_new_array(), *envs = json_object_new_array(), *all;
	const char *only = argc > 1 ? argv[1] : "";
	int r;

	if (argc > 2 || strlen(only) > PROTO_MAX_STR) {
		fprintf(stderr, "usage: belayerctl traj [TRAJECTORY]\n");
		r = -EINVAL;
		goto out;
	}
	r = collect(o, only, trajs, envs);
	if (r < 0)
		goto out;
	if (!o->json) {
		print_table(trajs, envs);
		goto out;
	}
	all = json_object_new_object();
	json_object_object_add(all, "trajectories", json_object_get(trajs));
	json_object_object_add(all, "environments", json_object_get(envs));
	json_print(all, false);
out:
	json_object_put(trajs);
	json_object_put(envs);
	return r;
}
