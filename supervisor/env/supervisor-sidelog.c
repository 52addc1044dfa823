/* SPDX-License-Identifier: MIT */
/* Append-only msgpack side-effect log (see supervisor-sidelog.h). */
#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpbound.h"
#include "mpstr.h"
#include "supervisor-sidelog.h"
#include "util.h"

#define RECORD_MAX (64 * 1024) /* a reader refuses bigger records */

struct sv_sidelog {
	int fd;
	msgpack_sbuffer buf;
};

int sidelog_open(const char *path, struct sv_sidelog **ret)
{
	struct sv_sidelog *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	l->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (l->fd < 0) {
		int r = negative_errno();

		free(l);
		return r;
	}
	msgpack_sbuffer_init(&l->buf);
	*ret = l;
	return 0;
}

void sidelog_close(struct sv_sidelog *l)
{
	if (!l)
		return;
	safe_close(l->fd);
	msgpack_sbuffer_destroy(&l->buf);
	free(l);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static void pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
	pack_str(pk, k);
	pack_str(pk, v);
}

static void pack_kv_int(msgpack_packer *pk, const char *k, int64_t v)
{
	pack_str(pk, k);
	msgpack_pack_int64(pk, v);
}

static void pack_argv(msgpack_packer *pk, const char *argv, size_t len)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i += strnlen(argv + i, len - i) + 1)
		n++;
	msgpack_pack_array(pk, n);
	for (size_t i = 0; i < len;) {
		size_t al = strnlen(argv + i, len - i);

		msgpack_pack_str(pk, al);
		msgpack_pack_str_body(pk, argv + i, al);
		i += al + 1;
	}
}

int sidelog_append(struct sv_sidelog *l, const struct envtrace_record *rec)
{
	msgpack_packer pk;
	const char *kind;
	size_t nkeys = 4;
	ssize_t n;

	switch (rec->type) {
	case ENVTRACE_EV_EXEC:
		kind = "exec";
		nkeys += 2;
		break;
	case ENVTRACE_EV_FILE:
		kind = "file";
		nkeys += 1 + (rec->npaths > 0) + (rec->npaths > 1);
		break;
	case ENVTRACE_EV_FULL_DIFF:
		kind = "full_diff";
		nkeys += 1;
		break;
	case ENVTRACE_EV_FORK:
		kind = "fork";
		nkeys += 1;
		break;
	case ENVTRACE_EV_EXIT:
		kind = "exit";
		nkeys += 1;
		break;
	default:
		return 0;
	}
	msgpack_sbuffer_clear(&l->buf);
	msgpack_packer_init(&pk, &l->buf, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, nkeys);
	pack_kv_str(&pk, "t", kind);
	pack_kv_int(&pk, "ts", (int64_t)rec->ts_ns);
	pack_kv_int(&pk, "pid", rec->pid);
	pack_kv_int(&pk, "env", rec->env_id);
	switch (rec->type) {
	case ENVTRACE_EV_EXEC:
		pack_kv_str(&pk, "exe", rec->exe ? rec->exe : "");
		pack_str(&pk, "argv");
		pack_argv(&pk, rec->argv ? rec->argv : "", rec->argv ? rec->argv_len : 0);
		break;
	case ENVTRACE_EV_FILE:
		pack_kv_str(&pk, "op", envtrace_op_to_string(rec->op));
		if (rec->npaths > 0)
			pack_kv_str(&pk, "path", rec->path[0]);
		if (rec->npaths > 1)
			pack_kv_str(&pk, "path2", rec->path[1]);
		break;
	case ENVTRACE_EV_FULL_DIFF:
		pack_kv_str(&pk, "reason", envtrace_full_diff_reason_to_string(rec->op));
		break;
	case ENVTRACE_EV_FORK:
		pack_kv_int(&pk, "child", rec->aux);
		break;
	case ENVTRACE_EV_EXIT:
		pack_kv_int(&pk, "code", rec->aux);
		break;
	default:
		break;
	}
	if (l->buf.size > RECORD_MAX)
		return -E2BIG;
	n = write(l->fd, l->buf.data, l->buf.size);
	if (n < 0)
		return negative_errno();
	if ((size_t)n != l->buf.size)
		return -EIO;
	return 0;
}

static bool key_is(const msgpack_object *k, const char *name)
{
	size_t n = strlen(name);

	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
	       memcmp(k->via.str.ptr, name, n) == 0;
}

/* Strings in the object are not NUL-terminated: copy them into the zone. */
static const char *zstr(msgpack_zone *z, const msgpack_object *o)
{
	char *s;

	if (o->type != MSGPACK_OBJECT_STR)
		return NULL;
	s = msgpack_zone_malloc(z, o->via.str.size + 1);
	if (!s)
		return NULL;
	mpstr_copy(s, o);
	return s;
}

static bool get_int(const msgpack_object *o, int64_t *ret)
{
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
		*ret = (int64_t)o->via.u64;
	else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		*ret = o->via.i64;
	else
		return false;
	return true;
}

static int decode(const msgpack_object *o, msgpack_zone *z, struct sidelog_entry *e)
{
	const char *kind = NULL;

	if (o->type != MSGPACK_OBJECT_MAP)
		return -EBADMSG;
	memset(e, 0, sizeof(*e));
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
		int64_t x;

		if (key_is(k, "t"))
			kind = zstr(z, v);
		else if (key_is(k, "ts") && get_int(v, &x))
			e->ts_ns = (uint64_t)x;
		else if (key_is(k, "pid") && get_int(v, &x))
			e->pid = x;
		else if (key_is(k, "env") && get_int(v, &x))
			e->env_id = (uint32_t)x;
		else if (key_is(k, "op"))
			e->op = zstr(z, v);
		else if (key_is(k, "path"))
			e->path = zstr(z, v);
		else if (key_is(k, "path2"))
			e->path2 = zstr(z, v);
		else if (key_is(k, "reason"))
			e->reason = zstr(z, v);
		else if (key_is(k, "exe"))
			e->exe = zstr(z, v);
		else if (key_is(k, "child") && get_int(v, &x))
			e->child = x;
		else if (key_is(k, "code") && get_int(v, &x))
			e->code = x;
		else if (key_is(k, "argv")) {
			if (v->type != MSGPACK_OBJECT_ARRAY)
				return -EBADMSG;
			for (uint32_t a = 0; a < v->via.array.size && a < SIDELOG_ARGV_MAX; a++) {
				e->argv[a] = zstr(z, &v->via.array.ptr[a]);
				if (!e->argv[a])
					return -EBADMSG;
				e->argc = a + 1;
			}
		}
	}
	if (!kind || strlen(kind) >= sizeof(e->kind))
		return -EBADMSG;
	strcpy(e->kind, kind);
	return 0;
}

int sidelog_read(const char *path, sidelog_entry_cb cb, void *userdata)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	msgpack_unpacker up;
	msgpack_unpacked res;
	int r = 0;

	if (fd < 0)
		return negative_errno();
	if (!msgpack_unpacker_init(&up, 4096))
		return -ENOMEM;
	msgpack_unpacked_init(&res);
	for (;;) {
		ssize_t n;

		if (!msgpack_unpacker_reserve_buffer(&up, 4096)) {
			r = -ENOMEM;
			break;
		}
		n = read(fd, msgpack_unpacker_buffer(&up), msgpack_unpacker_buffer_capacity(&up));
		if (n < 0) {
			r = negative_errno();
			break;
		}
		msgpack_unpacker_buffer_consumed(&up, (size_t)n);
		/* Only a complete record within RECORD_MAX reaches msgpack-c, which allocates an
		 * array's elements as soon as it reads the header (a forged count asks for GBs). */
		for (;;) {
			struct sidelog_entry e;
			ssize_t size = mpbound_object_size((const uint8_t *)up.buffer + up.off,
							   up.used - up.off, RECORD_MAX);

			if (size < 0) {
				r = -EBADMSG;
				goto out;
			}
			if (size == 0)
				break; /* cut short: the rest may still come (or is a torn end) */
			if (msgpack_unpacker_next(&up, &res) != MSGPACK_UNPACK_SUCCESS) {
				r = -EBADMSG;
				goto out;
			}
			r = decode(&res.data, res.zone, &e);
			if (r < 0)
				goto out;
			r = cb(&e, userdata);
			if (r < 0)
				goto out;
		}
		if (n == 0)
			break;
	}
out:
	msgpack_unpacked_destroy(&res);
	msgpack_unpacker_destroy(&up);
	return r < 0 ? r : 0;
}
