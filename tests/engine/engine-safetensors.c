/* SPDX-License-Identifier: MIT */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine-safetensors.h"
#include "log.h"
#include "util.h"

static int dtype_size(const char *dtype)
{
	if (strcmp(dtype, "F32") == 0 || strcmp(dtype, "I32") == 0 || strcmp(dtype, "U32") == 0)
		return 4;
	if (strcmp(dtype, "F16") == 0 || strcmp(dtype, "BF16") == 0)
		return 2;
	return -EINVAL;
}

static int parse_tensor(const char *path, const char *name, json_object *o, uint64_t data_off,
			uint64_t data_len, struct st_tensor *t)
{
	json_object *dtype, *shape, *offs;
	uint64_t elems = 1, b, e;
	int esz;

	if (!json_object_is_type(o, json_type_object) ||
	    !json_object_object_get_ex(o, "dtype", &dtype) ||
	    !json_object_object_get_ex(o, "shape", &shape) ||
	    !json_object_object_get_ex(o, "data_offsets", &offs) ||
	    !json_object_is_type(dtype, json_type_string) ||
	    !json_object_is_type(shape, json_type_array) ||
	    !json_object_is_type(offs, json_type_array) || json_object_array_length(offs) != 2 ||
	    json_object_array_length(shape) > ST_MAX_DIMS)
		return log_error_errno(-EBADMSG, "%s: tensor \"%s\": malformed entry", path, name);
	esz = dtype_size(json_object_get_string(dtype));
	if (esz < 0)
		return log_error_errno(-EBADMSG, "%s: tensor \"%s\": unsupported dtype %s", path,
				       name, json_object_get_string(dtype));
	snprintf(t->dtype, sizeof(t->dtype), "%s", json_object_get_string(dtype));
	t->ndim = (uint32_t)json_object_array_length(shape);
	for (uint32_t i = 0; i < t->ndim; i++) {
		json_object *d = json_object_array_get_idx(shape, i);
		int64_t v;

		if (!json_object_is_type(d, json_type_int))
			return log_error_errno(-EBADMSG, "%s: \"%s\": bad shape", path, name);
		v = json_object_get_int64(d);
		if (v < 0 || (uint64_t)v > (1ull << 40) ||
		    (v && elems > (1ull << 40) / (uint64_t)v))
			return log_error_errno(-EBADMSG, "%s: \"%s\": bad shape", path, name);
		t->shape[i] = (uint64_t)v;
		elems *= (uint64_t)v;
	}
	if (!json_object_is_type(json_object_array_get_idx(offs, 0), json_type_int) ||
	    !json_object_is_type(json_object_array_get_idx(offs, 1), json_type_int))
		return log_error_errno(-EBADMSG, "%s: \"%s\": bad data_offsets", path, name);
	b = (uint64_t)json_object_get_int64(json_object_array_get_idx(offs, 0));
	e = (uint64_t)json_object_get_int64(json_object_array_get_idx(offs, 1));
	if (b > e || e > data_len || e - b != elems * (uint64_t)esz)
		return log_error_errno(-EBADMSG, "%s: \"%s\": data_offsets [%llu, %llu) do not fit",
				       path, name, (unsigned long long)b, (unsigned long long)e);
	t->begin = data_off + b;
	t->end = data_off + e;
	t->name = strdup(name);
	return t->name ? 0 : -ENOMEM;
}

int st_open(const char *path, struct st_file *ret)
{
	struct st_file f = {.fd = -1};
	_cleanup_free_ char *hdr = NULL;
	json_object *root = NULL;
	uint64_t len_le, len;
	struct stat st;
	ssize_t n;
	int r;

	f.fd = open(path, O_RDONLY | O_CLOEXEC);
	if (f.fd < 0)
		return log_error_errno(-errno, "Failed to open %s: %m", path);
	if (fstat(f.fd, &st) < 0) {
		r = log_error_errno(-errno, "Failed to stat %s: %m", path);
		goto fail;
	}
	f.size = (uint64_t)st.st_size;
	n = pread(f.fd, &len_le, sizeof(len_le), 0);
	len = le64toh(len_le);
	if (n != (ssize_t)sizeof(len_le) || len == 0 || len > ST_HEADER_MAX || 8 + len > f.size) {
		r = log_error_errno(-EBADMSG, "%s: not a safetensors file (header length)", path);
		goto fail;
	}
	hdr = malloc(len + 1);
	if (!hdr) {
		r = -ENOMEM;
		goto fail;
	}
	if (pread(f.fd, hdr, len, 8) != (ssize_t)len) {
		r = log_error_errno(-EIO, "%s: short read of the header", path);
		goto fail;
	}
	hdr[len] = '\0';
	root = json_tokener_parse(hdr);
	if (!root || !json_object_is_type(root, json_type_object)) {
		r = log_error_errno(-EBADMSG, "%s: header is not a JSON object", path);
		goto fail;
	}
	f.t = calloc((size_t)json_object_object_length(root), sizeof(*f.t));
	if (!f.t) {
		r = -ENOMEM;
		goto fail;
	}
	json_object_object_foreach(root, key, val)
	{
		if (strcmp(key, "__metadata__") == 0) {
			if (!json_object_is_type(val, json_type_object)) {
				r = log_error_errno(-EBADMSG, "%s: bad __metadata__", path);
				goto fail;
			}
			f.meta = json_object_get(val);
			continue;
		}
		r = parse_tensor(path, key, val, 8 + len, f.size - 8 - len, &f.t[f.n]);
		if (r < 0)
			goto fail;
		f.n++;
	}
	json_object_put(root);
	*ret = f;
	return 0;
fail:
	json_object_put(root);
	st_close(&f);
	return r;
}

void st_close(struct st_file *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n; i++)
		free(f->t[i].name);
	free(f->t);
	json_object_put(f->meta);
	safe_close(f->fd);
	*f = (struct st_file){.fd = -1};
}

const struct st_tensor *st_find(const struct st_file *f, const char *name)
{
	for (size_t i = 0; i < f->n; i++)
		if (strcmp(f->t[i].name, name) == 0)
			return &f->t[i];
	return NULL;
}

const char *st_meta(const struct st_file *f, const char *key)
{
	json_object *v;

	if (!f->meta || !json_object_object_get_ex(f->meta, key, &v) ||
	    !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}
