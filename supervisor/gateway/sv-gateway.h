/* SPDX-License-Identifier: MIT */
/*
 * The gateway's face (supervisor/gateway/): evhttp reverse proxies in front of the configured
 * engines that journal token-in/token-out requests and resume them on a recovered worker. It
 * serves HTTP clients, not the supervisor's socket: the core only starts and stops it.
 */
#pragma once

struct sv_subsystem;

extern const struct sv_subsystem gateway_subsystem;
