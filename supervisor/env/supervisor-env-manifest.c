/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <msgpack.h>

#include "mpbound.h"
#include "mpstr.h"
#include "util.h"
#include "supervisor-env-manifest.h"

bool env_id_valid(const char *id)
{
	size_t n = strlen(id);

	if (n == 0 || n > ENV_ID_MAX || id[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '.' || c == '-'))
			return false;
	}
	return true;
}

bool env_path_valid(const char *path)
{
	size_t n = strlen(path);
	const char *p = path;

	if (n == 0 || n > ENV_PATH_MAX || path[0] == '/')
		return false;
	while (*p) {
		const char *slash = strchr(p, '/');
		size_t len = slash ? (size_t)(slash - p) : strlen(p);

		if (len == 0 || (len == 1 && p[0] == '.') ||
		    (len == 2 && p[0] == '.' && p[1] == '.'))
			return false;
		p += len;
		if (*p == '/') {
			p++;
			if (!*p) /* a trailing slash is an empty last component */
				return false;
		}
	}
	return true;
}

void env_xattrs_free(struct env_xattr *x, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		free(x[i].name);
		free(x[i].value);
	}
	free(x);
}

/* What an entry's own fields own (its copy in a manifest, or a decoder's scratch entry). */
static void entry_free(struct env_entry *e)
{
	free(e->path);
	free(e->target);
	free(e->hardlink);
	env_xattrs_free(e->xattrs, e->n_xattrs);
}

void env_manifest_finish(struct env_manifest *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n_entries; i++)
		entry_free(&m->entries[i]);
	free(m->entries);
	m->entries = NULL;
	m->n_entries = m->cap_entries = 0;
	m->xattr_bytes = 0;
	free(m->by_path);
	m->by_path = NULL;
	free(m->link_targets);
	m->link_targets = NULL;
	m->n_link_targets = 0;
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_entry_path(const void *a, const void *b)
{
	return strcmp((*(const struct env_entry *const *)a)->path,
		      (*(const struct env_entry *const *)b)->path);
}

const struct env_entry **env_manifest_index(struct env_manifest *m)
{
	const struct env_entry **a;

	if (m->by_path)
		return m->by_path;
	a = calloc(m->n_entries + 1, sizeof(*a));
	if (!a)
		return NULL;
	for (size_t i = 0; i < m->n_entries; i++)
		a[i] = &m->entries[i];
	qsort(a, m->n_entries, sizeof(*a), cmp_entry_path);
	free(m->link_targets);
	m->link_targets = NULL;
	m->n_link_targets = 0;
	for (size_t i = 0; i < m->n_entries; i++) {
		if (m->entries[i].kind != ENV_ENTRY_HARDLINK || !m->entries[i].hardlink)
			continue;
		if (!m->link_targets) {
			m->link_targets = calloc(m->n_entries, sizeof(*m->link_targets));
			if (!m->link_targets) {
				free(a);
				return NULL;
			}
		}
		m->link_targets[m->n_link_targets++] = m->entries[i].hardlink;
	}
	if (m->n_link_targets)
		qsort(m->link_targets, m->n_link_targets, sizeof(*m->link_targets), cmp_str_ptr);
	m->by_path = a;
	return a;
}

const struct env_entry **env_manifest_index_like(struct env_manifest *m,
						 const struct env_manifest *like)
{
	const struct env_entry **a;

	if (m->by_path || !like->by_path || like->n_entries != m->n_entries)
		return env_manifest_index(m);
	a = calloc(m->n_entries + 1, sizeof(*a));
	if (!a)
		return NULL;
	for (size_t i = 0; i < m->n_entries; i++) {
		size_t k = (size_t)(like->by_path[i] - like->entries);

		a[i] = &m->entries[k];
		if (strcmp(a[i]->path, like->by_path[i]->path) != 0) {
			free(a); /* not the same entries in the same order */
			return env_manifest_index(m);
		}
	}
	if (like->n_link_targets) {
		free(a); /* hard links: rare, sorted again */
		return env_manifest_index(m);
	}
	m->by_path = a;
	return a;
}

bool env_manifest_link_target(const struct env_manifest *m, const char *path)
{
	return m->n_link_targets && bsearch(&path, m->link_targets, m->n_link_targets,
					    sizeof(*m->link_targets), cmp_str_ptr);
}

const struct env_entry *env_manifest_find(const struct env_manifest *m, const char *path)
{
	struct env_entry key = {.path = (char *)path};
	const struct env_entry *kp = &key, **hit;

	if (!m->by_path)
		return NULL;
	hit = bsearch(&kp, m->by_path, m->n_entries, sizeof(*m->by_path), cmp_entry_path);
	return hit ? *hit : NULL;
}

/* "<namespace>.<name>" in one of the namespaces Linux has (anything else no file system
 * would take back at a restore). */
static bool xattr_name_valid(const char *name)
{
	static const char *const ns[] = {"user.", "trusted.", "security.", "system."};
	size_t n = strlen(name);

	if (n > ENV_XATTR_NAME_MAX)
		return false;
	for (size_t i = 0; i < ARRAY_SIZE(ns); i++) {
		size_t k = strlen(ns[i]);

		if (n > k && strncmp(name, ns[i], k) == 0)
			return true;
	}
	return false;
}

/* The bytes e's xattrs count for (names and values), or -E2BIG / -EINVAL. */
static ssize_t xattrs_check(const struct env_entry *e)
{
	size_t bytes = 0;

	if (e->n_xattrs > ENV_XATTRS_MAX)
		return -E2BIG;
	for (uint32_t i = 0; i < e->n_xattrs; i++) {
		const struct env_xattr *x = &e->xattrs[i];

		if (!x->name || !xattr_name_valid(x->name) || (x->len && !x->value))
			return -EINVAL;
		if (x->len > ENV_XATTR_VALUE_MAX)
			return -E2BIG;
		for (uint32_t j = 0; j < i; j++)
			if (strcmp(e->xattrs[j].name, x->name) == 0)
				return -EINVAL;
		bytes += strlen(x->name) + x->len;
	}
	return bytes > ENV_XATTR_ENTRY_BYTES ? -E2BIG : (ssize_t)bytes;
}

static int xattrs_dup(const struct env_entry *e, struct env_xattr **ret)
{
	struct env_xattr *a;

	*ret = NULL;
	if (!e->n_xattrs)
		return 0;
	a = calloc(e->n_xattrs, sizeof(*a));
	if (!a)
		return -ENOMEM;
	for (uint32_t i = 0; i < e->n_xattrs; i++) {
		a[i].len = e->xattrs[i].len;
		a[i].name = strdup(e->xattrs[i].name);
		a[i].value = malloc(a[i].len ? a[i].len : 1);
		if (!a[i].name || !a[i].value) {
			env_xattrs_free(a, i + 1);
			return -ENOMEM;
		}
		if (a[i].len)
			memcpy(a[i].value, e->xattrs[i].value, a[i].len);
	}
	*ret = a;
	return 0;
}

const struct env_xattr *env_entry_xattr(const struct env_entry *e, const char *name)
{
	for (uint32_t i = 0; i < e->n_xattrs; i++)
		if (strcmp(e->xattrs[i].name, name) == 0)
			return &e->xattrs[i];
	return NULL;
}

int env_manifest_add(struct env_manifest *m, const struct env_entry *e)
{
	struct env_entry *n;
	ssize_t xbytes;

	if (m->n_entries >= ENV_MANIFEST_MAX_ENTRIES)
		return -E2BIG;
	free(m->by_path); /* its pointers may move, and it lacks the new entry */
	m->by_path = NULL;
	free(m->link_targets);
	m->link_targets = NULL;
	m->n_link_targets = 0;
	xbytes = xattrs_check(e);
	if (xbytes < 0)
		return (int)xbytes;
	if (m->xattr_bytes + (size_t)xbytes > ENV_XATTR_TOTAL_BYTES)
		return -E2BIG;
	if (m->n_entries == m->cap_entries) {
		size_t cap = m->cap_entries ? m->cap_entries * 2 : 64;
		struct env_entry *a = reallocarray(m->entries, cap, sizeof(*a));

		if (!a)
			return -ENOMEM;
		m->entries = a;
		m->cap_entries = cap;
	}
	n = &m->entries[m->n_entries];
	*n = *e;
	n->path = strdup(e->path);
	n->target = e->target ? strdup(e->target) : NULL;
	n->hardlink = e->hardlink ? strdup(e->hardlink) : NULL;
	n->xattrs = NULL;
	n->n_xattrs = 0;
	if (!n->path || (e->target && !n->target) || (e->hardlink && !n->hardlink) ||
	    xattrs_dup(e, &n->xattrs) < 0) {
		entry_free(n);
		return -ENOMEM;
	}
	n->n_xattrs = e->n_xattrs;
	m->xattr_bytes += (size_t)xbytes;
	m->n_entries++;
	return 0;
}

/* --- encoding ------------------------------------------------------------------------ */

static void pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static void pack_kstr(msgpack_packer *pk, const char *k, const char *v)
{
	pack_str(pk, k);
	pack_str(pk, v);
}

static void pack_ku64(msgpack_packer *pk, const char *k, uint64_t v)
{
	pack_str(pk, k);
	msgpack_pack_uint64(pk, v);
}

static void pack_kbool(msgpack_packer *pk, const char *k, bool v)
{
	pack_str(pk, k);
	if (v)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

static void pack_entry(msgpack_packer *pk, const struct env_entry *e)
{
	msgpack_pack_map(pk, e->n_xattrs ? 15 : 14);
	pack_kstr(pk, "p", e->path);
	pack_ku64(pk, "k", e->kind);
	pack_ku64(pk, "m", e->mode);
	pack_ku64(pk, "u", e->uid);
	pack_ku64(pk, "g", e->gid);
	pack_ku64(pk, "s", e->size);
	pack_ku64(pk, "mt", e->mtime_ns);
	pack_ku64(pk, "ct", e->ctime_ns);
	pack_ku64(pk, "ino", e->ino);
	pack_kstr(pk, "tgt", e->target ? e->target : "");
	pack_kstr(pk, "hl", e->hardlink ? e->hardlink : "");
	pack_kstr(pk, "src", e->src);
	pack_ku64(pk, "dk", e->data_key);
	pack_kbool(pk, "opq", e->opaque);
	if (!e->n_xattrs)
		return;
	pack_str(pk, "xa");
	msgpack_pack_map(pk, e->n_xattrs);
	for (uint32_t i = 0; i < e->n_xattrs; i++) {
		pack_str(pk, e->xattrs[i].name);
		msgpack_pack_bin(pk, e->xattrs[i].len);
		msgpack_pack_bin_body(pk, e->xattrs[i].value, e->xattrs[i].len);
	}
}

int env_manifest_encode(const struct env_manifest *m, char **ret_buf, size_t *ret_len)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 22 + (m->from[0] ? 1 : 0) + (m->delta_path[0] ? 1 : 0) +
				      (m->kind[0] ? 1 : 0) + (m->images[0] ? 1 : 0) +
				      (m->precopy_rounds ? 3 : 0));
	pack_ku64(&pk, "v", ENV_MANIFEST_VERSION);
	pack_kstr(&pk, "id", m->id);
	pack_kstr(&pk, "parent", m->parent);
	pack_kstr(&pk, "env", m->env);
	pack_str(&pk, "uuid");
	msgpack_pack_bin(&pk, 16);
	msgpack_pack_bin_body(&pk, m->uuid, 16);
	pack_kstr(&pk, "traj", m->trajectory);
	pack_ku64(&pk, "turn", m->turn);
	pack_ku64(&pk, "plen", m->prefix_tokens);
	pack_ku64(&pk, "phash", m->prefix_hash);
	pack_ku64(&pk, "ts", m->ts_us);
	pack_kbool(&pk, "full", m->full_diff);
	pack_kstr(&pk, "why", m->full_diff_reason);
	pack_ku64(&pk, "fsb", m->fs_bytes);
	pack_ku64(&pk, "fsn", m->fs_files);
	pack_ku64(&pk, "fsrm", m->fs_removed);
	pack_ku64(&pk, "criub", m->criu_bytes);
	pack_ku64(&pk, "nproc", m->nproc);
	pack_ku64(&pk, "frz", m->freeze_us);
	pack_ku64(&pk, "dump", m->dump_us);
	pack_ku64(&pk, "fs", m->fs_us);
	pack_ku64(&pk, "commit", m->commit_us);
	if (m->from[0])
		pack_kstr(&pk, "from", m->from);
	if (m->delta_path[0])
		pack_kstr(&pk, "path", m->delta_path);
	if (m->kind[0])
		pack_kstr(&pk, "kind", m->kind);
	if (m->images[0])
		pack_kstr(&pk, "img", m->images);
	if (m->precopy_rounds) {
		pack_ku64(&pk, "pcr", m->precopy_rounds);
		pack_ku64(&pk, "pcb", m->precopy_bytes);
		pack_ku64(&pk, "pcfb", m->precopy_frozen_bytes);
	}
	pack_str(&pk, "fs_index");
	msgpack_pack_array(&pk, m->n_entries);
	for (size_t i = 0; i < m->n_entries; i++)
		pack_entry(&pk, &m->entries[i]);
	if (!sb.data || sb.size > ENV_MANIFEST_MAX_BYTES) {
		msgpack_sbuffer_destroy(&sb);
		return sb.data ? -EMSGSIZE : -ENOMEM;
	}
	*ret_buf = sb.data;
	*ret_len = sb.size;
	return 0;
}

/* --- decoding ------------------------------------------------------------------------ */

static bool key_is(const msgpack_object *k, const char *s)
{
	size_t n = strlen(s);

	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
	       memcmp(k->via.str.ptr, s, n) == 0;
}

static int get_u64(const msgpack_object *o, uint64_t max, uint64_t *ret)
{
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max)
		return -EBADMSG;
	*ret = o->via.u64;
	return 0;
}

static int get_u32(const msgpack_object *o, uint32_t *ret)
{
	uint64_t v = 0;
	int r = get_u64(o, UINT32_MAX, &v);

	if (r == 0)
		*ret = (uint32_t)v;
	return r;
}

static int get_bool(const msgpack_object *o, bool *ret)
{
	if (o->type != MSGPACK_OBJECT_BOOLEAN)
		return -EBADMSG;
	*ret = o->via.boolean;
	return 0;
}

/* Copies a str without NUL bytes of at most max bytes into buf (max + 1 bytes). */
static int get_str(const msgpack_object *o, char *buf, size_t max)
{
	if (!mpstr_ok(o, max))
		return -EBADMSG;
	mpstr_copy(buf, o);
	return 0;
}

static int get_strdup(const msgpack_object *o, size_t max, char **ret)
{
	char *s;

	if (!mpstr_ok(o, max))
		return -EBADMSG;
	s = malloc(o->via.str.size + 1);
	if (!s)
		return -ENOMEM;
	mpstr_copy(s, o);
	free(*ret);
	*ret = s;
	return 0;
}

enum {
	E_P = 1 << 0,
	E_K = 1 << 1,
	E_M = 1 << 2,
	E_XA = 1 << 3,
};

/* "xa": a map of at most ENV_XATTRS_MAX names (strs) to values (bins); what else bounds them
 * (names' namespaces, duplicates, bytes per entry and in all) env_manifest_add checks. */
static int decode_xattrs(const msgpack_object *o, struct env_entry *e)
{
	if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size > ENV_XATTRS_MAX)
		return -EBADMSG;
	e->xattrs = calloc(o->via.map.size + 1, sizeof(*e->xattrs));
	if (!e->xattrs)
		return -ENOMEM;
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
		struct env_xattr *x = &e->xattrs[i];
		int r;

		if (v->type != MSGPACK_OBJECT_BIN || v->via.bin.size > ENV_XATTR_VALUE_MAX)
			return -EBADMSG;
		r = get_strdup(k, ENV_XATTR_NAME_MAX, &x->name);
		if (r < 0)
			return r;
		e->n_xattrs++;
		x->len = v->via.bin.size;
		x->value = malloc(x->len ? x->len : 1);
		if (!x->value)
			return -ENOMEM;
		if (x->len)
			memcpy(x->value, v->via.bin.ptr, x->len);
	}
	return 0;
}

/* An older writer's opaque directory has "opq" only: its xattr, as the scan would record it. */
static int opaque_as_xattr(struct env_entry *e)
{
	static const char name[] = "trusted.overlay.opaque";
	struct env_xattr *a;

	if (e->kind != ENV_ENTRY_DIR || !e->opaque || env_entry_xattr(e, name))
		return 0;
	a = reallocarray(e->xattrs, e->n_xattrs + 1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	e->xattrs = a;
	a[e->n_xattrs] = (struct env_xattr){.name = strdup(name), .value = strdup("y"), .len = 1};
	if (!a[e->n_xattrs].name || !a[e->n_xattrs].value) {
		free(a[e->n_xattrs].name);
		free(a[e->n_xattrs].value);
		return -ENOMEM;
	}
	e->n_xattrs++;
	return 0;
}

static int decode_entry(const msgpack_object *o, struct env_entry *e)
{
	unsigned seen = 0;
	uint64_t v = 0;
	int r = 0;

	if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size > 32)
		return -EBADMSG;
	for (uint32_t i = 0; i < o->via.map.size && r >= 0; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key, *val = &o->via.map.ptr[i].val;

		if (key_is(k, "p")) {
			if (seen & E_P)
				return -EBADMSG;
			seen |= E_P;
			r = get_strdup(val, ENV_PATH_MAX, &e->path);
		} else if (key_is(k, "k")) {
			seen |= E_K;
			r = get_u64(val, _ENV_ENTRY_KIND_MAX - 1, &v);
			e->kind = (enum env_entry_kind)v;
		} else if (key_is(k, "m")) {
			seen |= E_M;
			r = get_u32(val, &e->mode);
		} else if (key_is(k, "u"))
			r = get_u32(val, &e->uid);
		else if (key_is(k, "g"))
			r = get_u32(val, &e->gid);
		else if (key_is(k, "s"))
			r = get_u64(val, INT64_MAX, &e->size);
		else if (key_is(k, "mt"))
			r = get_u64(val, UINT64_MAX, &e->mtime_ns);
		else if (key_is(k, "ct"))
			r = get_u64(val, UINT64_MAX, &e->ctime_ns);
		else if (key_is(k, "ino"))
			r = get_u64(val, UINT64_MAX, &e->ino);
		else if (key_is(k, "tgt"))
			r = get_strdup(val, ENV_PATH_MAX, &e->target);
		else if (key_is(k, "hl"))
			r = get_strdup(val, ENV_PATH_MAX, &e->hardlink);
		else if (key_is(k, "src"))
			r = get_str(val, e->src, ENV_ID_MAX);
		else if (key_is(k, "dk"))
			r = get_u64(val, UINT64_MAX, &e->data_key);
		else if (key_is(k, "opq"))
			r = get_bool(val, &e->opaque);
		else if (key_is(k, "xa")) {
			if (seen & E_XA)
				return -EBADMSG;
			seen |= E_XA;
			r = decode_xattrs(val, e);
		}
		/* other keys: ignored (a newer writer's optional fields) */
	}
	if (r < 0)
		return r;
	if ((seen & ~E_XA) != (E_P | E_K | E_M) || !env_path_valid(e->path))
		return -EBADMSG;
	if (e->kind == ENV_ENTRY_HARDLINK && e->n_xattrs)
		return -EBADMSG; /* the inode's are on its first name */
	if ((e->mode & ~07777u) != 0)
		return -EBADMSG;
	/* Empty strings mean absent. */
	if (e->target && !*e->target) {
		free(e->target);
		e->target = NULL;
	}
	if (e->hardlink && !*e->hardlink) {
		free(e->hardlink);
		e->hardlink = NULL;
	}
	switch (e->kind) {
	case ENV_ENTRY_SYMLINK:
		if (!e->target)
			return -EBADMSG;
		break;
	case ENV_ENTRY_HARDLINK:
		if (!e->hardlink || !env_path_valid(e->hardlink))
			return -EBADMSG;
		break;
	case ENV_ENTRY_REG:
		if (!env_id_valid(e->src))
			return -EBADMSG;
		break;
	default:
		break;
	}
	return opaque_as_xattr(e);
}

enum {
	M_V = 1 << 0,
	M_ID = 1 << 1,
	M_PARENT = 1 << 2,
	M_ENV = 1 << 3,
	M_UUID = 1 << 4,
	M_TURN = 1 << 5,
	M_INDEX = 1 << 6,
	M_REQUIRED = (1 << 7) - 1,
};

static int decode_index(const msgpack_object *o, struct env_manifest *m)
{
	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > ENV_MANIFEST_MAX_ENTRIES)
		return -EBADMSG;
	for (uint32_t i = 0; i < o->via.array.size; i++) {
		struct env_entry e = {0};
		int r = decode_entry(&o->via.array.ptr[i], &e);

		if (r >= 0)
			r = env_manifest_add(m, &e);
		entry_free(&e);
		if (r == -EINVAL || r == -E2BIG)
			r = -EBADMSG; /* xattrs out of bounds, names no file system takes */
		if (r < 0)
			return r;
	}
	/* A hard link names an earlier entry; a directory holds what follows it. */
	for (size_t i = 0; i < m->n_entries; i++) {
		const struct env_entry *e = &m->entries[i];
		bool found = false;

		if (e->kind != ENV_ENTRY_HARDLINK)
			continue;
		for (size_t j = 0; j < i && !found; j++)
			found = m->entries[j].kind == ENV_ENTRY_REG &&
				strcmp(m->entries[j].path, e->hardlink) == 0;
		if (!found)
			return -EBADMSG;
	}
	return 0;
}

static int decode_map(const msgpack_object *o, struct env_manifest *m, bool header)
{
	unsigned seen = 0;
	uint64_t v = 0;
	int r = 0;

	if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size > 64)
		return -EBADMSG;
	for (uint32_t i = 0; i < o->via.map.size && r >= 0; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key, *val = &o->via.map.ptr[i].val;
		unsigned bit = 0;

		if (key_is(k, "v")) {
			bit = M_V;
			r = get_u64(val, UINT32_MAX, &v);
			if (r >= 0 && v != ENV_MANIFEST_VERSION)
				r = -EPROTONOSUPPORT;
		} else if (key_is(k, "id")) {
			bit = M_ID;
			r = get_str(val, m->id, ENV_ID_MAX);
		} else if (key_is(k, "parent")) {
			bit = M_PARENT;
			r = get_str(val, m->parent, ENV_ID_MAX);
		} else if (key_is(k, "env")) {
			bit = M_ENV;
			r = get_str(val, m->env, ENV_ID_MAX);
		} else if (key_is(k, "uuid")) {
			bit = M_UUID;
			if (val->type != MSGPACK_OBJECT_BIN || val->via.bin.size != 16)
				r = -EBADMSG;
			else
				memcpy(m->uuid, val->via.bin.ptr, 16);
		} else if (key_is(k, "traj"))
			r = get_str(val, m->trajectory, ENV_STR_MAX);
		else if (key_is(k, "turn")) {
			bit = M_TURN;
			r = get_u64(val, UINT64_MAX, &m->turn);
		} else if (key_is(k, "plen"))
			r = get_u64(val, UINT64_MAX, &m->prefix_tokens);
		else if (key_is(k, "phash"))
			r = get_u64(val, UINT64_MAX, &m->prefix_hash);
		else if (key_is(k, "ts"))
			r = get_u64(val, UINT64_MAX, &m->ts_us);
		else if (key_is(k, "full"))
			r = get_bool(val, &m->full_diff);
		else if (key_is(k, "why"))
			r = get_str(val, m->full_diff_reason, ENV_STR_MAX);
		else if (key_is(k, "fsb"))
			r = get_u64(val, UINT64_MAX, &m->fs_bytes);
		else if (key_is(k, "fsn"))
			r = get_u64(val, UINT64_MAX, &m->fs_files);
		else if (key_is(k, "fsrm"))
			r = get_u64(val, UINT64_MAX, &m->fs_removed);
		else if (key_is(k, "criub"))
			r = get_u64(val, UINT64_MAX, &m->criu_bytes);
		else if (key_is(k, "nproc"))
			r = get_u64(val, UINT32_MAX, &m->nproc);
		else if (key_is(k, "frz"))
			r = get_u64(val, UINT64_MAX, &m->freeze_us);
		else if (key_is(k, "dump"))
			r = get_u64(val, UINT64_MAX, &m->dump_us);
		else if (key_is(k, "fs"))
			r = get_u64(val, UINT64_MAX, &m->fs_us);
		else if (key_is(k, "commit"))
			r = get_u64(val, UINT64_MAX, &m->commit_us);
		else if (key_is(k, "from"))
			r = get_str(val, m->from, ENV_STR_MAX);
		else if (key_is(k, "path"))
			r = get_str(val, m->delta_path, ENV_DELTA_PATH_MAX);
		else if (key_is(k, "kind")) {
			r = get_str(val, m->kind, ENV_KIND_MAX);
			if (r >= 0 && strcmp(m->kind, ENV_KIND_FULL) != 0 &&
			    strcmp(m->kind, ENV_KIND_FS_ONLY) != 0)
				r = -EBADMSG;
		} else if (key_is(k, "img")) {
			r = get_str(val, m->images, ENV_ID_MAX);
			if (r >= 0 && !env_id_valid(m->images))
				r = -EBADMSG;
		} else if (key_is(k, "pcr"))
			r = get_u64(val, ENV_PRECOPY_ROUNDS_MAX, &m->precopy_rounds);
		else if (key_is(k, "pcb"))
			r = get_u64(val, UINT64_MAX, &m->precopy_bytes);
		else if (key_is(k, "pcfb"))
			r = get_u64(val, UINT64_MAX, &m->precopy_frozen_bytes);
		else if (key_is(k, "fs_index")) {
			bit = M_INDEX;
			if (!(seen & M_INDEX))
				r = decode_index(val, m);
		}
		if (bit && (seen & bit))
			r = -EBADMSG;
		seen |= bit;
	}
	if (r < 0)
		return r;
	if (header)
		seen |= M_INDEX; /* taken out by env_manifest_load_header */
	if (seen != M_REQUIRED || !env_id_valid(m->id) || !env_id_valid(m->env) ||
	    (m->parent[0] && !env_id_valid(m->parent)) || strcmp(m->id, m->parent) == 0)
		return -EBADMSG;
	return 0;
}

/* msgpack-c allocates an array's or a map's slots when it reads the header: the raw bytes are
 * walked first (common/mpbound.h) and must hold exactly one object within their length. */
static int preflight(const uint8_t *p, size_t len)
{
	return mpbound_object_size(p, len, len) == (ssize_t)len ? 0 : -EBADMSG;
}

static int decode(const void *buf, size_t len, bool header, struct env_manifest *ret)
{
	msgpack_unpacked u;
	size_t off = 0;
	int r;

	memset(ret, 0, sizeof(*ret));
	if (!buf || len > ENV_MANIFEST_MAX_BYTES || preflight(buf, len) < 0)
		return -EBADMSG;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS)
		r = -EBADMSG;
	else if (off != len)
		r = -EBADMSG; /* nothing after the map */
	else
		r = decode_map(&u.data, ret, header);
	msgpack_unpacked_destroy(&u);
	if (r < 0) {
		env_manifest_finish(ret);
		memset(ret, 0, sizeof(*ret));
	}
	return r;
}

int env_manifest_decode(const void *buf, size_t len, struct env_manifest *ret)
{
	return decode(buf, len, false, ret);
}

/* The top-level map of buf without its "fs_index" pair, into out (len bytes at most): the
 * raw bytes walked (bounded, common/mpbound.h), nothing of the index unpacked. */
static int strip_index(const uint8_t *p, size_t len, uint8_t *out, size_t *ret_len)
{
	static const uint8_t key[] = {0xa8, 'f', 's', '_', 'i', 'n', 'd', 'e', 'x'};
	size_t off, o = 5, n;
	uint32_t kept = 0;

	if (len < 1)
		return -EBADMSG;
	if ((p[0] & 0xf0) == 0x80) {
		n = p[0] & 0x0f;
		off = 1;
	} else if (p[0] == 0xde && len >= 3) {
		n = (size_t)p[1] << 8 | p[2];
		off = 3;
	} else if (p[0] == 0xdf && len >= 5) {
		n = (size_t)p[1] << 24 | (size_t)p[2] << 16 | (size_t)p[3] << 8 | p[4];
		off = 5;
	} else {
		return -EBADMSG;
	}
	if (n > 64)
		return -EBADMSG;
	for (size_t i = 0; i < n; i++) {
		ssize_t kl = mpbound_object_size(p + off, len - off, len - off), vl;

		if (kl <= 0)
			return -EBADMSG;
		vl = mpbound_object_size(p + off + kl, len - off - (size_t)kl,
					 len - off - (size_t)kl);
		if (vl <= 0)
			return -EBADMSG;
		if ((size_t)kl != sizeof(key) || memcmp(p + off, key, sizeof(key)) != 0) {
			memcpy(out + o, p + off, (size_t)(kl + vl));
			o += (size_t)(kl + vl);
			kept++;
		}
		off += (size_t)(kl + vl);
	}
	if (off != len)
		return -EBADMSG;
	out[0] = 0xdf; /* map32: whatever the original used */
	out[1] = (uint8_t)(kept >> 24);
	out[2] = (uint8_t)(kept >> 16);
	out[3] = (uint8_t)(kept >> 8);
	out[4] = (uint8_t)kept;
	*ret_len = o;
	return 0;
}

int env_manifest_decode_header(const void *buf, size_t len, struct env_manifest *ret)
{
	_cleanup_free_ uint8_t *hdr = NULL;
	size_t hl;
	int r;

	memset(ret, 0, sizeof(*ret));
	if (!buf || len > ENV_MANIFEST_MAX_BYTES || preflight(buf, len) < 0)
		return -EBADMSG;
	hdr = malloc(len + 5);
	if (!hdr)
		return -ENOMEM;
	r = strip_index(buf, len, hdr, &hl);
	return r < 0 ? r : decode(hdr, hl, true, ret);
}

static int load(int dirfd, const char *name, bool header, struct env_manifest *ret);

int env_manifest_load(int dirfd, const char *name, struct env_manifest *ret)
{
	return load(dirfd, name, false, ret);
}

int env_manifest_load_header(int dirfd, const char *name, struct env_manifest *ret)
{
	return load(dirfd, name, true, ret);
}

static int load(int dirfd, const char *name, bool header, struct env_manifest *ret)
{
	_cleanup_close_ int fd = -1;
	_cleanup_free_ char *buf = NULL;
	struct stat st;
	size_t got = 0;

	memset(ret, 0, sizeof(*ret));
	fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size > ENV_MANIFEST_MAX_BYTES)
		return -EBADMSG;
	buf = malloc((size_t)st.st_size);
	if (!buf)
		return -ENOMEM;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EBADMSG;
		got += (size_t)n;
	}
	return header ? env_manifest_decode_header(buf, got, ret)
		      : env_manifest_decode(buf, got, ret);
}

int env_manifest_store(int dirfd, const char *name, const struct env_manifest *m)
{
	_cleanup_close_ int fd = -1;
	_cleanup_free_ char *buf = NULL;
	size_t len, off = 0;
	int r;

	r = env_manifest_encode(m, &buf, &len);
	if (r < 0)
		return r;
	fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	while (off < len) {
		ssize_t n = write(fd, buf + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		off += (size_t)n;
	}
	if (fsync(fd) < 0)
		return -errno;
	return 0;
}
