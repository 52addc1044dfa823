/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "proto-samples.h"
#include "util.h"

static void fill_uuid(uint8_t *u, uint8_t seed)
{
	for (size_t i = 0; i < PROTO_UUID_LEN; i++)
		u[i] = (uint8_t)(seed * 31 + i * 7);
}

static void sample_hello(struct proto_msg *m)
{
	m->type = PROTO_HELLO;
	m->hello.pid = 4242;
	(void)snprintf(m->hello.engine_id, sizeof(m->hello.engine_id), "vllm-engine-0");
	m->hello.role = ROLE_PRIMARY;
	m->hello.rank = 3;
	m->hello.n_devices = 2;
	fill_uuid(m->hello.device_uuid[0], 1);
	fill_uuid(m->hello.device_uuid[1], 2);
}

/* Every bound at its limit: the longest string, the most devices, the extreme integers. */
static void sample_hello_max(struct proto_msg *m)
{
	m->type = PROTO_HELLO;
	m->hello.pid = UINT32_MAX;
	memset(m->hello.engine_id, 'e', PROTO_MAX_STR);
	m->hello.role = ROLE_SHADOW;
	m->hello.rank = INT32_MAX;
	m->hello.n_devices = PROTO_MAX_DEVICES;
	for (size_t i = 0; i < PROTO_MAX_DEVICES; i++)
		fill_uuid(m->hello.device_uuid[i], (uint8_t)(i + 10));
}

static void sample_hello_min(struct proto_msg *m)
{
	m->type = PROTO_HELLO;
	m->hello.pid = 1;
	m->hello.role = ROLE_PRIMARY;
	m->hello.rank = -1;
	m->hello.n_devices = 0;
}

static void sample_region(struct proto_msg *m, int fd)
{
	m->type = PROTO_REGION_ANNOUNCE;
	m->region.id = 17;
	fill_uuid(m->region.device_uuid, 1);
	m->region.va = 0x7f0000200000;
	m->region.size = 2u << 20;
	m->region.cls = REGION_KV;
	m->region.order = 5;
	m->region.weights_version = 2;
	m->region.fd = fd;
}

static void sample_region_max(struct proto_msg *m, int fd)
{
	m->type = PROTO_REGION_ANNOUNCE;
	m->region.id = UINT64_MAX;
	fill_uuid(m->region.device_uuid, 9);
	m->region.va = UINT64_MAX;
	m->region.size = UINT64_MAX;
	m->region.cls = REGION_OTHER;
	m->region.order = UINT64_MAX;
	m->region.weights_version = UINT64_MAX;
	m->region.fd = fd;
}

static void sample_release(struct proto_msg *m)
{
	m->type = PROTO_REGION_RELEASE;
	m->release.id = 17;
}

static void sample_error(struct proto_msg *m)
{
	m->type = PROTO_ERROR;
	m->error.code = EPERM;
	m->error.in_reply_to = PROTO_REGION_ANNOUNCE;
	(void)snprintf(m->error.message, sizeof(m->error.message), "region 17: not yours");
}

static void sample_error_max(struct proto_msg *m)
{
	m->type = PROTO_ERROR;
	m->error.code = INT32_MAX;
	m->error.in_reply_to = UINT32_MAX;
	memset(m->error.message, 'm', PROTO_MAX_STR);
}

static const struct {
	const char *name;
	void (*fill)(struct proto_msg *m);
	void (*fill_fd)(struct proto_msg *m, int fd);
} samples[] = {
	{"hello", sample_hello, NULL},
	{"hello-max", sample_hello_max, NULL},
	{"hello-min", sample_hello_min, NULL},
	{"region-announce", NULL, sample_region},
	{"region-announce-max", NULL, sample_region_max},
	{"region-release", sample_release, NULL},
	{"error", sample_error, NULL},
	{"error-max", sample_error_max, NULL},
};

size_t proto_sample_count(void)
{
	return ARRAY_SIZE(samples);
}

const char *proto_sample(size_t i, int fd, struct proto_msg *ret)
{
	if (i >= ARRAY_SIZE(samples))
		return NULL;
	/* Zeroed first, so two samples compare equal with memcmp. */
	memset(ret, 0, sizeof(*ret));
	if (samples[i].fill)
		samples[i].fill(ret);
	else
		samples[i].fill_fd(ret, fd);
	return samples[i].name;
}

struct out_buf {
	char *data;
	size_t cap, len;
};

static int out_write(void *data, const char *buf, size_t len)
{
	struct out_buf *b = data;

	if (len > b->cap - b->len)
		return -1;
	memcpy(b->data + b->len, buf, len);
	b->len += len;
	return 0;
}

static bool key_is(const msgpack_object *k, const char *s)
{
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(s) &&
	       memcmp(k->via.str.ptr, s, k->via.str.size) == 0;
}

static int pack_key(msgpack_packer *pk, const char *key)
{
	return msgpack_pack_str(pk, strlen(key)) ?: msgpack_pack_str_body(pk, key, strlen(key));
}

ssize_t proto_mutate(const void *in, size_t len, const char *key, enum proto_mutation op,
		     const msgpack_object *val, void *out, size_t cap)
{
	struct out_buf ob = {.data = out, .cap = cap};
	const msgpack_object_map *map;
	msgpack_unpacked u;
	msgpack_packer pk;
	size_t off = 0, n;
	bool found = false;
	ssize_t r = 0;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, in, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP) {
		r = -EBADMSG;
		goto out;
	}
	map = &u.data.via.map;
	for (uint32_t i = 0; i < map->size; i++)
		found = found || key_is(&map->ptr[i].key, key);
	if (!found && op != MUT_ADD) {
		r = -ENOENT;
		goto out;
	}

	n = map->size + (op == MUT_REMOVE ? -1 : op == MUT_REPLACE ? 0 : 1);
	msgpack_packer_init(&pk, &ob, out_write);
	if (msgpack_pack_map(&pk, n) != 0)
		r = -ENOBUFS;
	for (uint32_t i = 0; r == 0 && i < map->size; i++) {
		const msgpack_object_kv *kv = &map->ptr[i];
		bool hit = key_is(&kv->key, key);

		if (hit && op == MUT_REMOVE)
			continue;
		if (msgpack_pack_object(&pk, kv->key) != 0 ||
		    msgpack_pack_object(&pk, hit && op == MUT_REPLACE ? *val : kv->val) != 0)
			r = -ENOBUFS;
		if (r == 0 && hit && op == MUT_DUPLICATE &&
		    (msgpack_pack_object(&pk, kv->key) != 0 ||
		     msgpack_pack_object(&pk, kv->val) != 0))
			r = -ENOBUFS;
	}
	if (r == 0 && op == MUT_ADD &&
	    (pack_key(&pk, key) != 0 || msgpack_pack_object(&pk, *val) != 0))
		r = -ENOBUFS;
	if (r == 0)
		r = (ssize_t)ob.len;
out:
	msgpack_unpacked_destroy(&u);
	return r;
}

int proto_keys(const void *in, size_t len, char keys[][16], size_t max)
{
	msgpack_unpacked u;
	size_t off = 0;
	int r = 0;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, in, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_MAP) {
		r = -EBADMSG;
		goto out;
	}
	for (uint32_t i = 0; i < u.data.via.map.size; i++) {
		const msgpack_object *k = &u.data.via.map.ptr[i].key;

		if (i >= max) {
			r = -ENOBUFS;
			goto out;
		}
		if (k->type != MSGPACK_OBJECT_STR || k->via.str.size >= 16) {
			r = -EBADMSG;
			goto out;
		}
		memcpy(keys[i], k->via.str.ptr, k->via.str.size);
		keys[i][k->via.str.size] = '\0';
		r++;
	}
out:
	msgpack_unpacked_destroy(&u);
	return r;
}
