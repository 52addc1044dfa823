/* SPDX-License-Identifier: MIT */
/* The checkpoint policy as a subsystem of the core: step events and trajectory listings. */
#include "supervisor-subsystem.h"
#include "supervisor-traj-ctl.h"
#include "supervisor-traj-list.h"
#include "sv-policy.h"

static int on_traj_step(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	return traj_ctl_on_step(s, c, &m->traj_step);
}

static int on_traj_list(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	return ctl_traj_list(s, c, &m->traj_list);
}

static const struct sv_message_handler messages[] = {
	{PROTO_TRAJ_STEP, on_traj_step},
	{PROTO_TRAJ_LIST, on_traj_list},
	{},
};

const struct sv_subsystem policy_subsystem = {
	.name = "policy",
	.messages = messages,
	/* After the offload thread stopped: no checkpoint job holds the policy's state. */
	.finish = traj_ctl_free,
};
