/* SPDX-License-Identifier: MIT */
/*
 * The dirty set at the freeze (issue 23 item 1). A checkpoint's job snapshots the tracer's
 * dirty set on the loop thread when it is queued, but the environment is frozen later, on an
 * offload thread (behind other environments' jobs, after a policy's wait): what it changes in
 * between is in the loop's set, not the job's. Once frozen, the job asks the loop (an eventfd
 * it watches) to drain the tracer and hand over what came since the snapshot, and waits for
 * it, bounded: the loop thread alone touches the registry and the ring buffer.
 */
#pragma once

struct supervisor;
struct env_job;

/* Watches the handover's eventfd on the loop (0 without a loop: jobs run inline). */
int env_handover_start(struct supervisor *s);
void env_handover_stop(struct supervisor *s);
/* Offload thread (or inline on the loop): env_job_take_late(s, j) run on the loop thread.
 * -ETIMEDOUT when the loop did not answer within ENV_HANDOVER_WAIT_MS (the caller walks). */
#define ENV_HANDOVER_WAIT_MS 2000
int env_handover_wait(struct supervisor *s, struct env_job *j);
