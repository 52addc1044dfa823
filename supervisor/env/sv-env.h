/* SPDX-License-Identifier: MIT */
/*
 * Agent environments' face (supervisor/env/): launch, file-system delta, manifest,
 * checkpoint/restore through CRIU, the eBPF tracer, served as PROTO_ENV_REQUEST. The other
 * subsystems reach environments only through the checkpoint policy's struct traj_env_ops,
 * which this subsystem implements (sv-policy.h).
 */
#pragma once

struct supervisor;
struct sv_subsystem;

extern const struct sv_subsystem env_subsystem;

/* What environments need of the daemon's process, before any thread starts (main, not the
 * fuzz target: it writes STATE_DIR/criu.conf and sets CRIU_CONFIG_FILE; see supervisor-criu.h). */
void env_process_setup(const struct supervisor *s);
