/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench recovery: the shadow-promotion path, driven through the supervisor's
 * [engine.NAME] configuration, belayerctl and the engine stand-in's HTTP API.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-recovery.h"
#include "log.h"
#include "util.h"

bool rec_shadow_supported(const struct rec_paths *p)
{
	(void)p;
	return false;
}

int rec_run_shadow(const struct rec_paths *p, const char *wfile, const char *ufile,
		   const char *verify, struct rec_case *c)
{
	(void)p, (void)wfile, (void)ufile, (void)verify;
	snprintf(c->note, sizeof(c->note), "n/a: supervisor without shadow promotion");
	return -EOPNOTSUPP;
}
