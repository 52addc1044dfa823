/* SPDX-License-Identifier: MIT */
#include "log.h"
