/* SPDX-License-Identifier: MIT */
#include "supervisor-subsystem.h"
#include "supervisor.h"

void subsystems_init(struct supervisor *s, const struct sv_subsystem *const *list)
{
	s->subsystems = list;
	SUBSYSTEMS_FOREACH (s, it)
		if ((*it)->init)
			(*it)->init(s);
}
