/* SPDX-License-Identifier: MIT */
/* Agent environments as a subsystem of the core: PROTO_ENV_REQUEST, the tracer on the loop,
 * and the environments' side of the checkpoint policy (struct traj_env_ops). */
#include <errno.h>

#include "log.h"
#include "supervisor-criu.h"
#include "supervisor-env-ctl.h"
#include "supervisor-env-exec.h"
#include "supervisor-env-slots.h"
#include "supervisor-envtrace.h"
#include "supervisor-subsystem.h"
#include "sv-env.h"
#include "sv-policy.h"
#include "supervisor.h"

static const struct traj_env_ops env_ops = {
	.view = envs_view,
	.checkpoint = envs_policy_checkpoint,
};

static int on_env_request(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	return envs_dispatch(s, c, &m->env_request);
}

static int on_image_request(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	return images_dispatch(s, c, &m->image_request);
}

static const struct sv_message_handler messages[] = {
	{PROTO_ENV_REQUEST, on_env_request},	  {PROTO_ENV_EXEC, env_exec_dispatch},
	{PROTO_ENV_FILE_READ, env_file_dispatch}, {PROTO_ENV_FILE_WRITE, env_file_dispatch},
	{PROTO_IMAGE_REQUEST, on_image_request},  {},
};

static void env_init(struct supervisor *s)
{
	(void)s;
	traj_ctl_set_env_ops(&env_ops);
	/* Issue 23 item 3: said once, at start (CRIU's own probe, supervisor-env-activity.h). */
	log_info("Environment memory checkpoints: %s (%s).", env_mem_mode(),
		 env_mem_dirty_track() ? "soft-dirty tracking: memory pre-dumped while running"
				       : "no soft-dirty tracking in this kernel");
}

void env_process_setup(const struct supervisor *s)
{
	if (sv_criu_config_init(s->config.state_dir) < 0)
		log_warning("Environments' checkpoints may fail: no CRIU configuration, ignoring.");
}

/* The tracer's ring buffer on the loop (once loaded: at start or at the first environment),
 * drained on wakeups and every ENVTRACE_DRAIN_INTERVAL_MS (records below the wakeup threshold
 * wake nobody). */
static int watch_tracer(struct supervisor *s, int fd)
{
	if (!s->hooks || !s->hooks->watch_fd || !s->hooks->every ||
	    s->hooks->watch_fd(s, fd, envs_drain) < 0 ||
	    s->hooks->every(s, ENVTRACE_DRAIN_INTERVAL_MS * 1000, envs_drain) < 0)
		return -ENOMEM;
	return 0;
}

static int env_start(struct supervisor *s, struct event_base *base)
{
	env_exec_start(base);
	return envs_start(s, watch_tracer);
}

const struct sv_subsystem env_subsystem = {
	.name = "env",
	.messages = messages,
	.init = env_init,
	.start = env_start,
	.stop = envs_stop,
	.collect_metrics = envs_collect_metrics,
};
