/* SPDX-License-Identifier: MIT */
/*
 * The image's JSON documents (OCI image-spec index/manifest/config, Docker image manifest v2
 * and a docker-archive's manifest.json), parsed with json-c from bounded buffers. Every field
 * read is type-checked and length-bounded; anything unexpected refuses the image with a
 * sentence saying which field.
 */
#include <errno.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "supervisor-image.h"

#define MT_OCI_INDEX	   "application/vnd.oci.image.index.v1+json"
#define MT_OCI_MANIFEST	   "application/vnd.oci.image.manifest.v1+json"
#define MT_OCI_CONFIG	   "application/vnd.oci.image.config.v1+json"
#define MT_DOCKER_LIST	   "application/vnd.docker.distribution.manifest.list.v2+json"
#define MT_DOCKER_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define MT_DOCKER_CONFIG   "application/vnd.docker.container.image.v1+json"
#define REF_NAME	   "org.opencontainers.image.ref.name"

_printf_(3, 4) static int fail(char *why, size_t cap, const char *fmt, ...)
{
	va_list ap;

	if (why && cap) {
		va_start(ap, fmt);
		vsnprintf(why, cap, fmt, ap);
		va_end(ap);
	}
	return -EBADMSG;
}

bool image_digest_valid(const char *d)
{
	if (!d || strncmp(d, "sha256:", 7) != 0 || strlen(d) != IMAGE_DIGEST_LEN)
		return false;
	for (const char *p = d + 7; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

void image_config_finish(struct image_config *c)
{
	for (size_t i = 0; i < c->n_env; i++)
		free(c->env[i]);
	for (size_t i = 0; i < c->n_argv; i++)
		free(c->argv[i]);
	free(c->env);
	free(c->argv);
	c->env = c->argv = NULL;
	c->n_env = c->n_argv = 0;
}

static struct json_object *parse(const char *buf, size_t len, char *why, size_t cap)
{
	struct json_tokener *tok;
	struct json_object *o;

	if (len > IMAGE_JSON_MAX) {
		fail(why, cap, "document of %zu bytes (at most %u)", len, IMAGE_JSON_MAX);
		return NULL;
	}
	tok = json_tokener_new_ex(16);
	if (!tok)
		return NULL;
	o = json_tokener_parse_ex(tok, buf, (int)len);
	if (!o || json_tokener_get_error(tok) != json_tokener_success ||
	    json_tokener_get_parse_end(tok) != len) {
		/* trailing whitespace is fine; anything else after the document is not */
		size_t end = json_tokener_get_parse_end(tok);

		while (o && end < len && strchr(" \t\r\n", buf[end]))
			end++;
		if (!o || end != len) {
			json_object_put(o);
			o = NULL;
			fail(why, cap, "not a JSON document");
		}
	}
	json_tokener_free(tok);
	if (o && !json_object_is_type(o, json_type_object) &&
	    !json_object_is_type(o, json_type_array)) {
		json_object_put(o);
		o = NULL;
		fail(why, cap, "not a JSON object");
	}
	return o;
}

/* A string member (optional: "" and 0 when absent), at most cap - 1 bytes, no NUL. */
static int get_str(struct json_object *o, const char *key, char *buf, size_t cap, bool required,
		   char *why, size_t wcap)
{
	struct json_object *v;
	const char *s;
	int n;

	buf[0] = '\0';
	if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
		return required ? fail(why, wcap, "\"%s\" missing", key) : 0;
	if (!json_object_is_type(v, json_type_string))
		return fail(why, wcap, "\"%s\" is not a string", key);
	s = json_object_get_string(v);
	n = json_object_get_string_len(v);
	if (n < 0 || (size_t)n >= cap || strlen(s) != (size_t)n)
		return fail(why, wcap, "\"%s\" too long or holds a NUL", key);
	memcpy(buf, s, (size_t)n + 1);
	return 0;
}

static int get_digest(struct json_object *o, const char *key, char *buf, char *why, size_t cap)
{
	int r = get_str(o, key, buf, IMAGE_DIGEST_LEN + 1, true, why, cap);

	if (r < 0)
		return r;
	if (!image_digest_valid(buf))
		return fail(why, cap, "\"%s\" is not a sha256:<64 hex> digest", key);
	return 0;
}

static int get_size(struct json_object *o, uint64_t *ret, char *why, size_t cap)
{
	struct json_object *v;
	int64_t n;

	if (!json_object_object_get_ex(o, "size", &v) || !json_object_is_type(v, json_type_int))
		return fail(why, cap, "\"size\" missing or not an integer");
	n = json_object_get_int64(v);
	if (n < 0 || n == INT64_MAX)
		return fail(why, cap, "\"size\" out of range");
	*ret = (uint64_t)n;
	return 0;
}

static struct json_object *get_array(struct json_object *o, const char *key, size_t max,
				     bool required, char *why, size_t cap)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) {
		if (required)
			fail(why, cap, "\"%s\" missing", key);
		return NULL;
	}
	if (!json_object_is_type(v, json_type_array)) {
		fail(why, cap, "\"%s\" is not an array", key);
		return NULL;
	}
	if (json_object_array_length(v) > max) {
		fail(why, cap, "\"%s\" has more than %zu entries", key, max);
		return NULL;
	}
	return v;
}

static int get_schema2(struct json_object *o, char *why, size_t cap)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, "schemaVersion", &v) ||
	    !json_object_is_type(v, json_type_int) || json_object_get_int64(v) != 2)
		return fail(why, cap, "\"schemaVersion\" is not 2");
	return 0;
}

int image_parse_index(const char *buf, size_t len, const char *tag, char *ret_digest,
		      bool *ret_index, char *ret_name, char *why, size_t cap)
{
	struct json_object *o = parse(buf, len, why, cap), *ms;
	char mt[128], name[IMAGE_NAME_MAX + 1], digest[IMAGE_DIGEST_LEN + 1];
	int r = -EBADMSG, found = 0;
	size_t n;

	if (!o)
		return -EBADMSG;
	if (!json_object_is_type(o, json_type_object) || get_schema2(o, why, cap) < 0)
		goto out;
	ms = get_array(o, "manifests", 1024, true, why, cap);
	if (!ms)
		goto out;
	n = json_object_array_length(ms);
	for (size_t i = 0; i < n; i++) {
		struct json_object *m = json_object_array_get_idx(ms, i), *ann, *plat, *v;
		bool matches;

		if (!json_object_is_type(m, json_type_object)) {
			r = fail(why, cap, "manifests[%zu] is not an object", i);
			goto out;
		}
		if (get_str(m, "mediaType", mt, sizeof(mt), true, why, cap) < 0 ||
		    get_digest(m, "digest", digest, why, cap) < 0)
			goto out;
		if (strcmp(mt, MT_OCI_MANIFEST) != 0 && strcmp(mt, MT_DOCKER_MANIFEST) != 0 &&
		    strcmp(mt, MT_OCI_INDEX) != 0 && strcmp(mt, MT_DOCKER_LIST) != 0)
			continue; /* an artifact, a signature: not an image */
		name[0] = '\0';
		if (json_object_object_get_ex(m, "annotations", &ann) &&
		    json_object_is_type(ann, json_type_object) &&
		    get_str(ann, REF_NAME, name, sizeof(name), false, why, cap) < 0)
			goto out;
		if (tag && tag[0])
			matches = strcmp(name, tag) == 0;
		else if (n == 1)
			matches = true;
		else {
			char os[32] = "", arch[32] = "";

			/* several images, no tag: this machine's platform */
			matches = json_object_object_get_ex(m, "platform", &plat) &&
				  json_object_is_type(plat, json_type_object) &&
				  get_str(plat, "os", os, sizeof(os), false, NULL, 0) == 0 &&
				  get_str(plat, "architecture", arch, sizeof(arch), false, NULL,
					  0) == 0 &&
				  strcmp(os, "linux") == 0 && strcmp(arch, "amd64") == 0;
			(void)v;
		}
		if (!matches)
			continue;
		if (found++)
			break;
		memcpy(ret_digest, digest, sizeof(digest));
		*ret_index = strcmp(mt, MT_OCI_INDEX) == 0 || strcmp(mt, MT_DOCKER_LIST) == 0;
		if (ret_name)
			memcpy(ret_name, name, sizeof(name));
	}
	if (found == 1)
		r = 0;
	else if (found == 0)
		r = tag && tag[0]
			    ? (fail(why, cap, "no image tagged \"%s\" in the index", tag), -ENOENT)
			    : (fail(why, cap, "no image for linux/amd64 in the index"), -ENOENT);
	else
		r = fail(why, cap, "several images match: name one with :TAG");
out:
	json_object_put(o);
	return r;
}

int image_parse_manifest(const char *buf, size_t len, struct image_manifest *ret, char *why,
			 size_t cap)
{
	struct json_object *o = parse(buf, len, why, cap), *cfg, *layers;
	char mt[128];
	int r = -EBADMSG;

	memset(ret, 0, sizeof(*ret));
	if (!o)
		return -EBADMSG;
	if (!json_object_is_type(o, json_type_object) || get_schema2(o, why, cap) < 0 ||
	    get_str(o, "mediaType", mt, sizeof(mt), false, why, cap) < 0)
		goto out;
	if (mt[0] && strcmp(mt, MT_OCI_MANIFEST) != 0 && strcmp(mt, MT_DOCKER_MANIFEST) != 0) {
		r = fail(why, cap, "manifest media type \"%s\" is not an image manifest", mt);
		goto out;
	}
	if (!json_object_object_get_ex(o, "config", &cfg) ||
	    !json_object_is_type(cfg, json_type_object)) {
		r = fail(why, cap, "\"config\" missing");
		goto out;
	}
	if (get_str(cfg, "mediaType", mt, sizeof(mt), true, why, cap) < 0 ||
	    get_digest(cfg, "digest", ret->config_digest, why, cap) < 0 ||
	    get_size(cfg, &ret->config_size, why, cap) < 0)
		goto out;
	if (strcmp(mt, MT_OCI_CONFIG) != 0 && strcmp(mt, MT_DOCKER_CONFIG) != 0) {
		r = fail(why, cap, "config media type \"%s\" is not an image config", mt);
		goto out;
	}
	layers = get_array(o, "layers", IMAGE_LAYERS_MAX, true, why, cap);
	if (!layers)
		goto out;
	ret->n_layers = json_object_array_length(layers);
	for (size_t i = 0; i < ret->n_layers; i++) {
		struct json_object *l = json_object_array_get_idx(layers, i);
		struct image_layer *d = &ret->layers[i];

		if (!json_object_is_type(l, json_type_object)) {
			r = fail(why, cap, "layers[%zu] is not an object", i);
			goto out;
		}
		if (get_str(l, "mediaType", mt, sizeof(mt), true, why, cap) < 0 ||
		    get_digest(l, "digest", d->digest, why, cap) < 0 ||
		    get_size(l, &d->size, why, cap) < 0)
			goto out;
		/* tar, tar+gzip, tar+zstd (OCI) and Docker's rootfs diff tar.gzip; libarchive
		 * detects the compression from the bytes: the type only has to be a layer */
		if (!strstr(mt, "layer") || strstr(mt, "nondistributable")) {
			r = fail(why, cap, "layers[%zu] media type \"%s\" is not a layer", i, mt);
			goto out;
		}
	}
	r = 0;
out:
	json_object_put(o);
	return r;
}

static int get_strings(struct json_object *o, const char *key, char ***arr, size_t *n, char *why,
		       size_t cap)
{
	struct json_object *a = get_array(o, key, IMAGE_ARGS_MAX, false, why, cap);
	struct json_object *v;
	size_t k;

	if (!a)
		return json_object_object_get_ex(o, key, &v) &&
				       !json_object_is_type(v, json_type_null)
			       ? -EBADMSG
			       : 0;
	k = json_object_array_length(a);
	if (*n + k > IMAGE_ARGS_MAX)
		return fail(why, cap, "\"%s\" too long", key);
	if (k) {
		char **grown = realloc(*arr, (*n + k + 1) * sizeof(char *));

		if (!grown)
			return -ENOMEM;
		*arr = grown;
	}
	for (size_t i = 0; i < k; i++) {
		struct json_object *s = json_object_array_get_idx(a, i);
		int len;

		if (!json_object_is_type(s, json_type_string))
			return fail(why, cap, "%s[%zu] is not a string", key, i);
		len = json_object_get_string_len(s);
		if (len < 0 || len >= IMAGE_ARG_MAX ||
		    strlen(json_object_get_string(s)) != (size_t)len)
			return fail(why, cap, "%s[%zu] too long or holds a NUL", key, i);
		(*arr)[*n] = strdup(json_object_get_string(s));
		if (!(*arr)[*n])
			return -ENOMEM;
		(*arr)[++*n] = NULL;
	}
	return 0;
}

int image_parse_config(const char *buf, size_t len, struct image_config *ret, char *why, size_t cap)
{
	struct json_object *o = parse(buf, len, why, cap), *c, *rootfs, *ids;
	char type[32];
	int r = -EBADMSG;

	memset(ret, 0, sizeof(*ret));
	if (!o)
		return -EBADMSG;
	if (!json_object_is_type(o, json_type_object))
		goto out;
	if (get_str(o, "architecture", type, sizeof(type), false, why, cap) < 0)
		goto out;
	if (type[0] && strcmp(type, "amd64") != 0) {
		r = fail(why, cap, "an image for %s, not amd64", type);
		goto out;
	}
	if (json_object_object_get_ex(o, "config", &c) &&
	    json_object_is_type(c, json_type_object)) {
		r = get_strings(c, "Env", &ret->env, &ret->n_env, why, cap);
		if (r >= 0)
			r = get_strings(c, "Entrypoint", &ret->argv, &ret->n_argv, why, cap);
		if (r >= 0)
			r = get_strings(c, "Cmd", &ret->argv, &ret->n_argv, why, cap);
		if (r >= 0)
			r = get_str(c, "User", ret->user, sizeof(ret->user), false, why, cap);
		if (r >= 0)
			r = get_str(c, "WorkingDir", ret->workdir, sizeof(ret->workdir), false, why,
				    cap);
		if (r < 0) {
			if (r == -EBADMSG && why && !why[0])
				fail(why, cap, "config.config has a field of the wrong type");
			goto out;
		}
		for (size_t i = 0; i < ret->n_env; i++)
			if (!strchr(ret->env[i], '=') || ret->env[i][0] == '=') {
				r = fail(why, cap, "Env[%zu] is not KEY=VALUE", i);
				goto out;
			}
		r = -EBADMSG;
	}
	if (!json_object_object_get_ex(o, "rootfs", &rootfs) ||
	    !json_object_is_type(rootfs, json_type_object) ||
	    get_str(rootfs, "type", type, sizeof(type), true, why, cap) < 0 ||
	    strcmp(type, "layers") != 0) {
		r = fail(why, cap, "\"rootfs\" missing or not of type layers");
		goto out;
	}
	ids = get_array(rootfs, "diff_ids", IMAGE_LAYERS_MAX, true, why, cap);
	if (!ids)
		goto out;
	ret->n_diff_ids = json_object_array_length(ids);
	for (size_t i = 0; i < ret->n_diff_ids; i++) {
		struct json_object *s = json_object_array_get_idx(ids, i);

		if (!json_object_is_type(s, json_type_string) ||
		    !image_digest_valid(json_object_get_string(s))) {
			r = fail(why, cap, "rootfs.diff_ids[%zu] is not a sha256 digest", i);
			goto out;
		}
		snprintf(ret->diff_ids[i], sizeof(ret->diff_ids[i]), "%s",
			 json_object_get_string(s));
	}
	r = 0;
out:
	json_object_put(o);
	if (r < 0)
		image_config_finish(ret);
	return r;
}

/* A member name of the archive: relative, no "..", bounded. */
static bool member_valid(const char *p)
{
	if (!p[0] || p[0] == '/' || strlen(p) >= 4096)
		return false;
	for (const char *c = p; c; c = strchr(c, '/')) {
		if (*c == '/')
			c++;
		if (strncmp(c, "..", 2) == 0 && (c[2] == '/' || c[2] == '\0'))
			return false;
	}
	return true;
}

int image_parse_docker_manifest(const char *buf, size_t len, const char *tag,
				struct image_manifest *ret, char *why, size_t cap)
{
	struct json_object *o = parse(buf, len, why, cap), *pick = NULL;
	size_t n;
	int r = -EBADMSG;

	memset(ret, 0, sizeof(*ret));
	if (!o)
		return -EBADMSG;
	if (!json_object_is_type(o, json_type_array)) {
		r = fail(why, cap, "manifest.json is not an array");
		goto out;
	}
	n = json_object_array_length(o);
	if (n > 1024) {
		r = fail(why, cap, "manifest.json has more than 1024 images");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct json_object *m = json_object_array_get_idx(o, i), *tags = NULL;

		if (!json_object_is_type(m, json_type_object)) {
			r = fail(why, cap, "manifest.json[%zu] is not an object", i);
			goto out;
		}
		tags = get_array(m, "RepoTags", 1024, false, why, cap);
		if (tag && tag[0]) {
			for (size_t k = 0; tags && k < json_object_array_length(tags); k++) {
				struct json_object *t = json_object_array_get_idx(tags, k);

				if (json_object_is_type(t, json_type_string) &&
				    strcmp(json_object_get_string(t), tag) == 0 && !pick)
					pick = m;
			}
		} else if (n == 1)
			pick = m;
		if (pick == m) {
			struct json_object *t = tags && json_object_array_length(tags)
							? json_object_array_get_idx(tags, 0)
							: NULL;

			if (tag && tag[0])
				snprintf(ret->name, sizeof(ret->name), "%s", tag);
			else if (t && json_object_is_type(t, json_type_string) &&
				 strlen(json_object_get_string(t)) < sizeof(ret->name))
				snprintf(ret->name, sizeof(ret->name), "%s",
					 json_object_get_string(t));
		}
	}
	if (!pick) {
		r = tag && tag[0]
			    ? (fail(why, cap, "no image tagged \"%s\" in the archive", tag),
			       -ENOENT)
			    : fail(why, cap, "several images in the archive: name one with :REF");
		goto out;
	}
	{
		struct json_object *layers;

		if (get_str(pick, "Config", ret->config_blob, sizeof(ret->config_blob), true, why,
			    cap) < 0)
			goto out;
		if (!member_valid(ret->config_blob)) {
			r = fail(why, cap, "\"Config\" is not a relative path in the archive");
			goto out;
		}
		layers = get_array(pick, "Layers", IMAGE_LAYERS_MAX, true, why, cap);
		if (!layers)
			goto out;
		ret->n_layers = json_object_array_length(layers);
		for (size_t i = 0; i < ret->n_layers; i++) {
			struct json_object *l = json_object_array_get_idx(layers, i);

			if (!json_object_is_type(l, json_type_string) ||
			    strlen(json_object_get_string(l)) >= sizeof(ret->layers[i].blob) ||
			    !member_valid(json_object_get_string(l))) {
				r = fail(why, cap, "Layers[%zu] is not a relative path", i);
				goto out;
			}
			snprintf(ret->layers[i].blob, sizeof(ret->layers[i].blob), "%s",
				 json_object_get_string(l));
		}
	}
	r = 0;
out:
	json_object_put(o);
	return r;
}
