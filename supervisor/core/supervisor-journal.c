/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <msgpack.h>
#include <zlib.h>

#include "log.h"
#include "mpbound.h"
#include "mpstr.h"
#include "supervisor-journal.h"
#include "util.h"

struct sv_journal {
	int fd;
	int dir_fd;
	uint64_t size;
};

struct fixed_buf {
	char *data;
	size_t cap, len;
};

static int fixed_write(void *data, const char *buf, size_t len)
{
	struct fixed_buf *b = data;

	if (len > b->cap - b->len)
		return -1;
	memcpy(b->data + b->len, buf, len);
	b->len += len;
	return 0;
}

static int pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	return msgpack_pack_str(pk, n) ?: msgpack_pack_str_body(pk, s, n);
}

#define KV_U64(pk, k, v) (pack_str(pk, k) ?: msgpack_pack_uint64(pk, v))
#define KV_I64(pk, k, v) (pack_str(pk, k) ?: msgpack_pack_int64(pk, v))

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

ssize_t journal_encode(const struct journal_record *rec, void *buf, size_t cap)
{
	struct fixed_buf out = {.data = (char *)buf + 8,
				.cap = cap > 8 ? MIN(cap - 8, (size_t)JOURNAL_MAX_RECORD) : 0};
	msgpack_packer pk;
	const struct proto_region *r = &rec->region;
	int e;

	msgpack_packer_init(&pk, &out, fixed_write);
	switch (rec->op) {
	case JOURNAL_WORKER:
		e = msgpack_pack_map(&pk, 8) ?: KV_U64(&pk, "op", rec->op)
			?: KV_U64(&pk, "pid", rec->pid) ?: KV_U64(&pk, "uid", rec->uid)
			?: KV_U64(&pk, "gid", rec->gid) ?: KV_U64(&pk, "st", rec->starttime)
			?: pack_str(&pk, "eng") ?: pack_str(&pk, rec->engine_id)
			?: KV_U64(&pk, "role", (uint64_t)rec->role)
			?: KV_I64(&pk, "rank", rec->rank);
		break;
	case JOURNAL_ENGINE:
		e = msgpack_pack_map(&pk, 6) ?: KV_U64(&pk, "op", rec->op)
			?: KV_U64(&pk, "pid", rec->pid) ?: KV_U64(&pk, "st", rec->starttime)
			?: pack_str(&pk, "eng") ?: pack_str(&pk, rec->engine_id)
			?: KV_U64(&pk, "role", (uint64_t)rec->role)
			?: KV_U64(&pk, "port", rec->port);
		break;
	case JOURNAL_REGION:
		e = msgpack_pack_map(&pk, 11) ?: KV_U64(&pk, "op", rec->op)
			?: KV_U64(&pk, "pid", rec->pid) ?: KV_U64(&pk, "id", r->id)
			?: pack_str(&pk, "dev") ?: msgpack_pack_bin(&pk, PROTO_UUID_LEN)
			?: msgpack_pack_bin_body(&pk, r->device_uuid, PROTO_UUID_LEN)
			?: KV_U64(&pk, "va", r->va) ?: KV_U64(&pk, "size", r->size)
			?: KV_U64(&pk, "cls", (uint64_t)r->cls) ?: KV_U64(&pk, "ord", r->order)
			?: KV_U64(&pk, "wver", r->weights_version)
			?: KV_U64(&pk, "sum", rec->checksum)
			?: KV_U64(&pk, "sumv", rec->checksum_version);
		break;
	case JOURNAL_REGION_GONE:
		e = msgpack_pack_map(&pk, 3) ?: KV_U64(&pk, "op", rec->op)
			?: KV_U64(&pk, "pid", rec->pid) ?: KV_U64(&pk, "id", r->id);
		break;
	case JOURNAL_MEM_INFO:
		e = msgpack_pack_map(&pk, 8) ?: KV_U64(&pk, "op", rec->op)
			?: KV_U64(&pk, "pid", rec->pid) ?: pack_str(&pk, "eng")
			?: pack_str(&pk, rec->engine_id)
			?: KV_U64(&pk, "rank", (uint64_t)(rec->rank < 0 ? 0 : rec->rank))
			?: pack_str(&pk, "dev") ?: msgpack_pack_bin(&pk, PROTO_UUID_LEN)
			?: msgpack_pack_bin_body(&pk, rec->mem_info.device_uuid, PROTO_UUID_LEN)
			?: KV_U64(&pk, "seq", rec->mem_info.seq)
			?: KV_U64(&pk, "free", rec->mem_info.free)
			?: KV_U64(&pk, "total", rec->mem_info.total);
		break;
	case JOURNAL_MEM_INFO_GONE:
		e = msgpack_pack_map(&pk, 3) ?: KV_U64(&pk, "op", rec->op)
			?: KV_U64(&pk, "pid", rec->pid) ?: pack_str(&pk, "eng")
			?: pack_str(&pk, rec->engine_id);
		break;
	case JOURNAL_DEAD:
	case JOURNAL_WORKER_GONE:
		e = msgpack_pack_map(&pk, 2) ?: KV_U64(&pk, "op", rec->op)
			?: KV_U64(&pk, "pid", rec->pid);
		break;
	default:
		return -EINVAL;
	}
	if (e != 0)
		return -ENOBUFS;
	put_le32(buf, (uint32_t)out.len);
	put_le32((uint8_t *)buf + 4, (uint32_t)crc32(0, (const Bytef *)out.data, (uInt)out.len));
	return (ssize_t)(out.len + 8);
}

static const msgpack_object *get(const msgpack_object_map *m, const char *key)
{
	size_t n = strlen(key);

	for (uint32_t i = 0; i < m->size; i++) {
		const msgpack_object *k = &m->ptr[i].key;

		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
		    memcmp(k->via.str.ptr, key, n) == 0)
			return &m->ptr[i].val;
	}
	return NULL;
}

static int get_u64(const msgpack_object_map *m, const char *key, uint64_t max, uint64_t *ret)
{
	const msgpack_object *o = get(m, key);

	if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max)
		return -EBADMSG;
	*ret = o->via.u64;
	return 0;
}

static int get_uuid(const msgpack_object_map *m, const char *key, uint8_t ret[PROTO_UUID_LEN])
{
	const msgpack_object *o = get(m, key);

	if (!o || o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != PROTO_UUID_LEN)
		return -EBADMSG;
	memcpy(ret, o->via.bin.ptr, PROTO_UUID_LEN);
	return 0;
}

static int get_engine(const msgpack_object_map *m, char ret[PROTO_MAX_STR + 1])
{
	const msgpack_object *o = get(m, "eng");

	if (!o || !mpstr_ok(o, PROTO_MAX_STR))
		return -EBADMSG;
	mpstr_copy(ret, o);
	return 0;
}

int journal_decode(const void *buf, size_t len, struct journal_record *rec)
{
	msgpack_unpacked u;
	const msgpack_object_map *m;
	const msgpack_object *o;
	uint64_t v;
	size_t off = 0;
	int r = -EBADMSG;

	memset(rec, 0, sizeof(*rec));
	/* Bounded before msgpack-c allocates anything for the headers it reads. */
	if (!buf || len == 0 || len > JOURNAL_MAX_RECORD ||
	    mpbound_object_size(buf, len, len) != (ssize_t)len)
		return -EBADMSG;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len ||
	    u.data.type != MSGPACK_OBJECT_MAP)
		goto out;
	m = &u.data.via.map;
	if (get_u64(m, "op", 0xff, &v) < 0 || get_u64(m, "pid", UINT32_MAX, &v) < 0)
		goto out;
	(void)get_u64(m, "op", 0xff, &v);
	rec->op = (enum journal_op)v;
	(void)get_u64(m, "pid", UINT32_MAX, &v);
	rec->pid = (uint32_t)v;

	switch (rec->op) {
	case JOURNAL_WORKER:
		if (get_u64(m, "uid", UINT32_MAX, &v) < 0)
			goto out;
		rec->uid = (uint32_t)v;
		if (get_u64(m, "gid", UINT32_MAX, &v) < 0)
			goto out;
		rec->gid = (uint32_t)v;
		if (get_u64(m, "st", UINT64_MAX, &rec->starttime) < 0 ||
		    get_u64(m, "role", _ROLE_MAX - 1, &v) < 0)
			goto out;
		rec->role = (enum worker_role)v;
		o = get(m, "rank");
		if (!o)
			goto out;
		if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT32_MAX)
			rec->rank = (int32_t)o->via.u64;
		else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= -1)
			rec->rank = (int32_t)o->via.i64;
		else
			goto out;
		if (get_engine(m, rec->engine_id) < 0)
			goto out;
		break;
	case JOURNAL_ENGINE:
		if (get_u64(m, "st", UINT64_MAX, &rec->starttime) < 0 ||
		    get_u64(m, "role", _ROLE_MAX - 1, &v) < 0)
			goto out;
		rec->role = (enum worker_role)v;
		if (get_u64(m, "port", 65535, &v) < 0)
			goto out;
		rec->port = (uint32_t)v;
		if (get_engine(m, rec->engine_id) < 0)
			goto out;
		break;
	case JOURNAL_REGION:
		if (get_uuid(m, "dev", rec->region.device_uuid) < 0 ||
		    get_u64(m, "id", UINT64_MAX, &rec->region.id) < 0 ||
		    get_u64(m, "va", UINT64_MAX, &rec->region.va) < 0 ||
		    get_u64(m, "size", UINT64_MAX, &rec->region.size) < 0 ||
		    get_u64(m, "cls", _REGION_CLASS_MAX - 1, &v) < 0 ||
		    get_u64(m, "ord", UINT64_MAX, &rec->region.order) < 0 ||
		    get_u64(m, "wver", UINT64_MAX, &rec->region.weights_version) < 0 ||
		    get_u64(m, "sum", UINT64_MAX, &rec->checksum) < 0 ||
		    get_u64(m, "sumv", UINT64_MAX, &rec->checksum_version) < 0)
			goto out;
		rec->region.cls = (enum region_class)v;
		break;
	case JOURNAL_REGION_GONE:
		if (get_u64(m, "id", UINT64_MAX, &rec->region.id) < 0)
			goto out;
		break;
	case JOURNAL_MEM_INFO:
		/* the bounds the shim's report had (proto.c's mem-info fields) */
		if (get_uuid(m, "dev", rec->mem_info.device_uuid) < 0 ||
		    get_u64(m, "rank", INT32_MAX, &v) < 0)
			goto out;
		rec->rank = (int32_t)v;
		if (get_u64(m, "seq", PROTO_MAX_MEM_INFO - 1, &v) < 0 ||
		    get_u64(m, "total", UINT64_MAX, &rec->mem_info.total) < 0 ||
		    get_u64(m, "free", rec->mem_info.total, &rec->mem_info.free) < 0)
			goto out;
		rec->mem_info.seq = (uint32_t)v;
		if (get_engine(m, rec->engine_id) < 0)
			goto out;
		break;
	case JOURNAL_MEM_INFO_GONE:
		if (get_engine(m, rec->engine_id) < 0)
			goto out;
		break;
	case JOURNAL_DEAD:
	case JOURNAL_WORKER_GONE:
		break;
	default:
		goto out;
	}
	rec->region.fd = -1;
	r = 0;
out:
	msgpack_unpacked_destroy(&u);
	if (r < 0)
		memset(rec, 0, sizeof(*rec)); /* nothing half-filled escapes */
	return r;
}

static int replay(struct sv_journal *j, int (*cb)(void *, const struct journal_record *),
		  void *userdata)
{
	_cleanup_free_ uint8_t *data = NULL;
	struct stat st;
	uint64_t good = 0;
	size_t len;
	int r;

	if (fstat(j->fd, &st) < 0)
		return negative_errno();
	if ((uint64_t)st.st_size > (uint64_t)1 << 30)
		return -EFBIG;
	len = (size_t)st.st_size;
	data = malloc(len ? len : 1);
	if (!data)
		return -ENOMEM;
	for (size_t off = 0; off < len;) {
		ssize_t n = pread(j->fd, data + off, len - off, (off_t)off);

		if (n < 0)
			return negative_errno();
		if (n == 0) {
			len = off;
			break;
		}
		off += (size_t)n;
	}

	while (good + 8 <= len) {
		const uint8_t *p = data + good;
		uint32_t plen = get_le32(p), crc = get_le32(p + 4);
		struct journal_record rec;

		if (plen == 0 || plen > JOURNAL_MAX_RECORD || plen > len - good - 8 ||
		    crc32(0, p + 8, plen) != crc || journal_decode(p + 8, plen, &rec) < 0)
			break;
		if (cb) {
			r = cb(userdata, &rec);
			if (r < 0)
				return r;
		}
		good += 8 + plen;
	}
	if (good != len) {
		log_warning("Journal: %" PRIu64
			    " bytes of torn or corrupt tail after offset %" PRIu64 ", truncating.",
			    (uint64_t)len - good, good);
		if (ftruncate(j->fd, (off_t)good) < 0)
			return log_error_errno(negative_errno(),
					       "Failed to truncate the journal: %m");
	}
	j->size = good;
	return 0;
}

int journal_open(const char *dir, int (*cb)(void *userdata, const struct journal_record *rec),
		 void *userdata, struct sv_journal **ret)
{
	struct sv_journal *j;
	int r;

	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return log_error_errno(negative_errno(), "Failed to create %s: %m", dir);
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->fd = j->dir_fd = -1;
	j->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (j->dir_fd < 0) {
		r = log_error_errno(negative_errno(), "Failed to open %s: %m", dir);
		goto fail;
	}
	j->fd = openat(j->dir_fd, "journal", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (j->fd < 0) {
		r = log_error_errno(negative_errno(), "Failed to open %s/journal: %m", dir);
		goto fail;
	}
	r = replay(j, cb, userdata);
	if (r < 0)
		goto fail;
	*ret = j;
	return 0;
fail:
	journal_close(j);
	return r;
}

void journal_close(struct sv_journal *j)
{
	if (!j)
		return;
	(void)safe_close(j->fd);
	(void)safe_close(j->dir_fd);
	free(j);
}

static int write_all(int fd, const void *p, size_t len, off_t off)
{
	while (len > 0) {
		ssize_t n = pwrite(fd, p, len, off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return negative_errno();
		}
		p = (const char *)p + n;
		len -= (size_t)n;
		off += n;
	}
	return 0;
}

int journal_append(struct sv_journal *j, const struct journal_record *rec)
{
	uint8_t buf[JOURNAL_MAX_RECORD + 8];
	ssize_t n;
	int r;

	if (!j)
		return 0;
	n = journal_encode(rec, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	/* At our own offset, not O_APPEND: a failed write leaves a tail the next one overwrites. */
	r = write_all(j->fd, buf, (size_t)n, (off_t)j->size);
	if (r < 0)
		return log_warning_errno(r, "Failed to write the journal: %m");
	j->size += (uint64_t)n;
	return 0;
}

uint64_t journal_size(const struct sv_journal *j)
{
	return j ? j->size : 0;
}

int journal_rewrite(struct sv_journal *j, const struct journal_record *recs, size_t n)
{
	uint8_t buf[JOURNAL_MAX_RECORD + 8];
	_cleanup_close_ int fd = -1;
	uint64_t size = 0;
	int r;

	if (!j)
		return 0;
	fd = openat(j->dir_fd, "journal.new", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return log_warning_errno(negative_errno(), "Failed to create journal.new: %m");
	for (size_t i = 0; i < n; i++) {
		ssize_t len = journal_encode(&recs[i], buf, sizeof(buf));

		if (len < 0)
			return (int)len;
		r = write_all(fd, buf, (size_t)len, (off_t)size);
		if (r < 0)
			return log_warning_errno(r, "Failed to write journal.new: %m");
		size += (uint64_t)len;
	}
	if (fsync(fd) < 0 || renameat(j->dir_fd, "journal.new", j->dir_fd, "journal") < 0 ||
	    fsync(j->dir_fd) < 0)
		return log_warning_errno(negative_errno(), "Failed to replace the journal: %m");
	(void)safe_close(j->fd);
	j->fd = TAKE_FD(fd);
	j->size = size;
	return 0;
}
