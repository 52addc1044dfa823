/* SPDX-License-Identifier: MIT */
/*
 * The canary's reader of an engine's HTTP reply (supervisor/recovery/supervisor-canary.c):
 * whatever the engine on the canary's port answers, the token-id array is extracted within
 * bounds or refused.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor-canary.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char answer[CANARY_ANSWER_MAX];
	/* The reader gets what recv() left in its buffer: NUL-terminated, as here. */
	char *reply = malloc(size + 1);

	if (!reply)
		return 0;
	memcpy(reply, data, size);
	reply[size] = '\0';
	if (canary_parse_reply(reply, size, answer, sizeof(answer)) == 0 &&
	    (answer[0] != '[' || strlen(answer) >= sizeof(answer)))
		abort();
	free(reply);
	return 0;
}
