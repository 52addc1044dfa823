/* SPDX-License-Identifier: MIT */
/* The image subsystem's face (issue 20): references, the layer store. */
#pragma once

#include "supervisor-image.h"
#include "supervisor-image-store.h"
