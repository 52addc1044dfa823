/* SPDX-License-Identifier: MIT */
/*
 * The wire protocol between the shim, the supervisor and belayerctl (DESIGN §4).
 *
 * Every message is one SOCK_SEQPACKET packet holding one msgpack map:
 *   "v": protocol version (uint), "t": message type (uint), then the type's fields.
 * Fds travel beside the packet with SCM_RIGHTS; each type says how many it carries.
 *
 * Fields per type (key: msgpack type, range -> struct member):
 *   PROTO_HELLO (1), no fd:
 *     "pid": uint 1..UINT32_MAX -> pid      "eng": str -> engine_id
 *     "role": uint enum worker_role -> role  "rank": int -1..INT32_MAX -> rank
 *     "devs": array (<= PROTO_MAX_DEVICES) of bin[16] -> device_uuid[], n_devices
 *   PROTO_REGION_ANNOUNCE (2), 1 fd -> fd:
 *     "id": uint64 -> id    "dev": bin[16] -> device_uuid   "va": uint64 -> va
 *     "size": uint64 -> size  "cls": uint enum region_class -> cls
 *     "ord": uint64 -> order  "wver": uint64 -> weights_version
 *   PROTO_REGION_RELEASE (3), no fd:
 *     "id": uint64 -> id
 *   PROTO_ERROR (4), no fd:
 *     "code": int 1..INT32_MAX -> code  "re": uint32 -> in_reply_to  "msg": str -> message
 * Strings are msgpack str of at most PROTO_MAX_STR bytes without NUL; the encoder writes the
 * keys in the order above, integers in their shortest form.
 *
 * Decoders are bounded: at most PROTO_MAX_MSG bytes, at most PROTO_MAX_KEYS keys, strings at
 * most PROTO_MAX_STR bytes, arrays at most PROTO_MAX_DEVICES entries, every field type- and
 * range-checked, every required field present, no key twice, nothing after the map, the fd
 * count exact. Anything else is -EBADMSG (-EPROTONOSUPPORT for a version we do not speak);
 * the decoder never crashes and never leaks. Unknown keys (of any value type) are ignored so
 * a newer peer of the same version can add optional fields.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROTO_VERSION	  1
#define PROTO_MAX_MSG	  65536
#define PROTO_MAX_STR	  255
#define PROTO_MAX_DEVICES 16
#define PROTO_MAX_FDS	  1
#define PROTO_UUID_LEN	  16
#define PROTO_MAX_KEYS	  32

enum proto_type {
	PROTO_HELLO = 1,	   /* shim -> supervisor: who is speaking */
	PROTO_REGION_ANNOUNCE = 2, /* shim -> supervisor: one tracked region, with its fd */
	PROTO_REGION_RELEASE = 3,  /* shim -> supervisor: the region was freed */
	PROTO_ERROR = 4,	   /* either way: a request was refused, and why */
	_PROTO_TYPE_MAX,
};

enum region_class {
	REGION_WEIGHTS = 0,
	REGION_KV = 1,
	REGION_NCCL = 2,
	REGION_OTHER = 3,
	_REGION_CLASS_MAX,
};

enum worker_role {
	ROLE_PRIMARY = 0,
	ROLE_SHADOW = 1,
	_ROLE_MAX,
};

struct proto_hello {
	uint32_t pid;
	char engine_id[PROTO_MAX_STR + 1];
	enum worker_role role;
	int32_t rank; /* -1 while unknown */
	uint32_t n_devices;
	uint8_t device_uuid[PROTO_MAX_DEVICES][PROTO_UUID_LEN];
};

struct proto_region {
	uint64_t id; /* unique within the announcing process */
	uint8_t device_uuid[PROTO_UUID_LEN];
	uint64_t va;
	uint64_t size;
	enum region_class cls;
	uint64_t order; /* creation order within the process */
	uint64_t weights_version;
	int fd; /* the exported POSIX fd; owned by the message after decode */
};

struct proto_region_release {
	uint64_t id;
};

struct proto_error {
	int32_t code;	      /* a positive errno value */
	uint32_t in_reply_to; /* the refused message's type, 0 if none */
	char message[PROTO_MAX_STR + 1];
};

struct proto_msg {
	enum proto_type type;
	union {
		struct proto_hello hello;
		struct proto_region region;
		struct proto_region_release release;
		struct proto_error error;
	};
};

/* How many fds a message of this type carries (0 or 1); -EINVAL for an unknown type. */
int proto_type_nfds(enum proto_type type);
/* The *_to_string functions return NULL for a value outside the enum. */
const char *proto_type_to_string(enum proto_type type);

const char *region_class_to_string(enum region_class cls);
int region_class_from_string(const char *s, enum region_class *ret);
const char *worker_role_to_string(enum worker_role role);
int worker_role_from_string(const char *s, enum worker_role *ret);

/* Encodes m into buf. The fds to send beside it (m's fd fields, not duplicated) are put in
 * ret_fds[0..*ret_nfds); both may be NULL for a type that carries no fd. Returns 0, -ENOBUFS
 * when cap is too small, -EMSGSIZE when the message would exceed PROTO_MAX_MSG, -EINVAL for
 * an invalid message (unknown type, string too long, value out of range, missing fd): the
 * encoder refuses exactly what the decoder would reject. */
int proto_encode(const struct proto_msg *m, void *buf, size_t cap, size_t *ret_len,
		 int ret_fds[PROTO_MAX_FDS], size_t *ret_nfds);

/* Decodes one packet and the fds that came with it. On success the fds belong to *ret.
 * On failure returns -EBADMSG or -EPROTONOSUPPORT, *ret is zeroed (proto_msg_finish() on it
 * is a no-op) and the fds are left to the caller. */
int proto_decode(const void *buf, size_t len, const int *fds, size_t nfds, struct proto_msg *ret);

/* Closes the fds a decoded message owns. Accepts NULL. */
void proto_msg_finish(struct proto_msg *m);

/* Encode + fdpass_send. flags as for send(2) (MSG_DONTWAIT for the shim). */
int proto_send(int sock, const struct proto_msg *m, int flags);
/* fdpass_recv + decode. Returns 0, -ECONNRESET when the peer closed, or -errno; fds that
 * arrived with a packet that fails to decode are closed. */
int proto_recv(int sock, struct proto_msg *ret, int flags);

/* Convenience for replies. code may be given as -errno or errno (not 0). Sent with
 * MSG_DONTWAIT, so a reply never stalls an event loop: -EAGAIN when it does not fit now. */
int proto_send_error(int sock, int code, enum proto_type in_reply_to, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
