/* SPDX-License-Identifier: MIT */
#include "fdpass.h"
