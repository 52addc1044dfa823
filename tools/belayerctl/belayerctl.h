/* SPDX-License-Identifier: MIT */
/*
 * belayerctl: the operator's view of the supervisor. One file per subcommand (cmd-*.c), each
 * a { name, func } row of belayerctl.c's table; they share the connection helpers here.
 */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include <json-c/json.h>

#include "proto.h"

struct ctl_options {
	const char *socket;
	bool json;
	int timeout_ms; /* per reply; -1: wait forever (events) */
};

/* Connects to the supervisor's socket. Returns the fd or -errno (logged). */
int ctl_connect(const struct ctl_options *o);
/* Sends a control request on sock. */
int ctl_request(int sock, enum ctl_cmd cmd, uint32_t pid, enum ctl_action act, int32_t dev,
		uint64_t arg);
/* Receives the next reply message. -ETIMEDOUT after o->timeout_ms; an ERROR reply is
 * printed and returned as -its code; -ECONNRESET when the supervisor closed. */
int ctl_recv(int sock, const struct ctl_options *o, struct proto_msg *ret);
/* Sends one request and calls cb for each reply until END. */
int ctl_query(const struct ctl_options *o, enum ctl_cmd cmd, uint32_t pid, enum ctl_action act,
	      int32_t dev, uint64_t arg, int (*cb)(const struct proto_msg *m, void *userdata),
	      void *userdata);

/* Formatting shared by the subcommands. */
void format_uuid(const uint8_t uuid[PROTO_UUID_LEN], char buf[37]);
void format_bytes(uint64_t bytes, char *buf, size_t cap);
void format_age(uint64_t ms, char *buf, size_t cap);
/* Prints j to stdout (pretty unless line) and drops it. */
void json_print(json_object *j, bool line);
json_object *json_u64(uint64_t v);
/* Command-line values: a whole uint64 (C notation: 0x.. hex) or -EINVAL; a string that fits cap
 * (with its NUL) or -E2BIG, said on stderr with what names it. */
int parse_u64(const char *s, uint64_t *ret);
int copy_arg(char *dst, size_t cap, const char *src, const char *what);

typedef int (*ctl_command_fn)(const struct ctl_options *o, int argc, char **argv);
int cmd_status(const struct ctl_options *o, int argc, char **argv);
int cmd_workers(const struct ctl_options *o, int argc, char **argv);
int cmd_regions(const struct ctl_options *o, int argc, char **argv);
int cmd_events(const struct ctl_options *o, int argc, char **argv);
int cmd_inject(const struct ctl_options *o, int argc, char **argv);
int cmd_config(const struct ctl_options *o, int argc, char **argv);
int cmd_health(const struct ctl_options *o, int argc, char **argv);
int cmd_promote(const struct ctl_options *o, int argc, char **argv);
int cmd_env(const struct ctl_options *o, int argc, char **argv);
int cmd_env_exec(const struct ctl_options *o, int argc, char **argv); /* exec, read, write */
int cmd_bpf(const struct ctl_options *o, int argc, char **argv);
int cmd_traj(const struct ctl_options *o, int argc, char **argv);
int cmd_step(const struct ctl_options *o, int argc, char **argv);
int cmd_image(const struct ctl_options *o, int argc, char **argv);
/* An image reference for the supervisor: oci:DIR / docker-archive:FILE made absolute. */
int image_arg(char *dst, size_t cap, const char *src);
