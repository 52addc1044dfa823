/* SPDX-License-Identifier: MIT */
#include "proto.h"
