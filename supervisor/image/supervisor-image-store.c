/* SPDX-License-Identifier: MIT */
/*
 * The layer store (supervisor-image-store.h): imports from an OCI layout or a docker-archive,
 * records, lookup, removal and garbage collection.
 */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-image-store.h"
#include "supervisor-image-unpack.h"

struct image_store {
	int dir_fd, layers_fd, byid_fd, lock_fd;
	char dir[PATH_MAX], envs[PATH_MAX];
};

static int mkdir_open(int at, const char *name, mode_t mode)
{
	int fd;

	if (mkdirat(at, name, mode) < 0 && errno != EEXIST)
		return -errno;
	fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

int image_store_open(const char *state_dir, const char *envs_dir, struct image_store **ret)
{
	_cleanup_free_ struct image_store *s = calloc(1, sizeof(*s));
	_cleanup_close_ int state = -1;

	if (!s)
		return -ENOMEM;
	s->dir_fd = s->layers_fd = s->byid_fd = s->lock_fd = -1;
	if (strlen(state_dir) > PATH_MAX - 200 || strlen(envs_dir) > PATH_MAX - 200)
		return -ENAMETOOLONG;
	snprintf(s->dir, sizeof(s->dir), "%s/" IMAGE_DIR_PREFIX, state_dir);
	snprintf(s->envs, sizeof(s->envs), "%s", envs_dir);
	state = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (state < 0)
		return -errno;
	s->dir_fd = mkdir_open(state, IMAGE_DIR_PREFIX, 0700);
	if (s->dir_fd < 0)
		return s->dir_fd;
	s->layers_fd = mkdir_open(s->dir_fd, "layers", 0700);
	s->byid_fd = mkdir_open(s->dir_fd, "by-id", 0700);
	s->lock_fd = openat(s->dir_fd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (s->layers_fd < 0 || s->byid_fd < 0 || s->lock_fd < 0) {
		int r = s->layers_fd < 0 ? s->layers_fd : s->byid_fd < 0 ? s->byid_fd : -errno;

		image_store_close(TAKE_PTR(s));
		return r;
	}
	*ret = TAKE_PTR(s);
	return 0;
}

void image_store_close(struct image_store *s)
{
	if (!s)
		return;
	safe_close(s->dir_fd);
	safe_close(s->layers_fd);
	safe_close(s->byid_fd);
	safe_close(s->lock_fd);
	free(s);
}

/* flock on a private open file description: threads of one process exclude each other too */
static int lock(struct image_store *s, int how)
{
	char path[32];
	int fd;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", s->lock_fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (flock(fd, how) < 0) {
		if (errno != EINTR) {
			int r = -errno;

			(void)close(fd);
			return r;
		}
	}
	return fd;
}

/* Reads at most max bytes of the file at (dir_fd, path) beneath dir_fd; NUL-terminated. */
static int read_beneath(int dir_fd, const char *path, size_t max, char **ret, size_t *ret_len)
{
	struct open_how how = {.flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW,
			       .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
					  RESOLVE_NO_MAGICLINKS};
	_cleanup_close_ int fd = (int)syscall(SYS_openat2, dir_fd, path, &how, sizeof(how));
	_cleanup_free_ char *buf = NULL;
	size_t len = 0;
	ssize_t n;

	if (fd < 0)
		return -errno;
	buf = malloc(max + 1);
	if (!buf)
		return -ENOMEM;
	while ((n = read(fd, buf + len, max + 1 - len)) > 0) {
		len += (size_t)n;
		if (len > max)
			return -EFBIG;
	}
	if (n < 0)
		return -errno;
	buf[len] = '\0';
	*ret = TAKE_PTR(buf);
	*ret_len = len;
	return 0;
}

static int sha256_hex(const void *buf, size_t len, char *out)
{
	unsigned char d[32];
	unsigned n = 0;

	if (EVP_Digest(buf, len, d, &n, EVP_sha256(), NULL) != 1 || n != 32)
		return -EIO;
	strcpy(out, "sha256:");
	for (unsigned i = 0; i < 32; i++)
		sprintf(out + 7 + 2 * i, "%02x", d[i]);
	return 0;
}

/* An OCI layout's blob, read whole (bounded) and verified. */
static int oci_blob(int oci_fd, const char *digest, size_t max, char **ret, size_t *ret_len,
		    char *why, size_t cap)
{
	char path[96], got[IMAGE_DIGEST_LEN + 1];
	_cleanup_free_ char *buf = NULL;
	size_t len;
	int r;

	snprintf(path, sizeof(path), "blobs/sha256/%s", digest + 7);
	r = read_beneath(oci_fd, path, max, &buf, &len);
	if (r < 0) {
		snprintf(why, cap, "blob %s: %s", digest, strerror(-r));
		return r;
	}
	r = sha256_hex(buf, len, got);
	if (r < 0)
		return r;
	if (strcmp(got, digest) != 0) {
		snprintf(why, cap, "blob %s: digest mismatch (it is %s)", digest, got);
		return -EBADMSG;
	}
	*ret = TAKE_PTR(buf);
	*ret_len = len;
	return 0;
}

static int oci_read(int oci_fd, const struct image_ref *ref, struct image_manifest *m,
		    char **ret_config, size_t *ret_len, char *why, size_t cap)
{
	_cleanup_free_ char *index = NULL, *manifest = NULL, *layout = NULL;
	char digest[IMAGE_DIGEST_LEN + 1], name[IMAGE_NAME_MAX + 1];
	bool nested = false;
	size_t len;
	int r;

	r = read_beneath(oci_fd, "oci-layout", 4096, &layout, &len);
	if (r < 0 || !strstr(layout, "\"imageLayoutVersion\"")) {
		snprintf(why, cap, "%s is not an OCI image layout (no oci-layout file)", ref->path);
		return r < 0 ? r : -EBADMSG;
	}
	r = read_beneath(oci_fd, "index.json", IMAGE_JSON_MAX, &index, &len);
	if (r < 0) {
		snprintf(why, cap, "index.json: %s", strerror(-r));
		return r;
	}
	r = image_parse_index(index, len, ref->tag, digest, &nested, name, why, cap);
	if (r < 0)
		return r;
	if (nested) {
		/* a multi-platform image: its own index picks linux/amd64 */
		_cleanup_free_ char *sub = NULL;

		r = oci_blob(oci_fd, digest, IMAGE_JSON_MAX, &sub, &len, why, cap);
		if (r >= 0)
			r = image_parse_index(sub, len, NULL, digest, &nested, NULL, why, cap);
		if (r >= 0 && nested) {
			snprintf(why, cap, "an index of indexes");
			r = -EBADMSG;
		}
		if (r < 0)
			return r;
	}
	r = oci_blob(oci_fd, digest, IMAGE_JSON_MAX, &manifest, &len, why, cap);
	if (r >= 0)
		r = image_parse_manifest(manifest, len, m, why, cap);
	if (r < 0)
		return r;
	snprintf(m->name, sizeof(m->name), "%s", ref->tag[0] ? ref->tag : name);
	if (m->config_size > IMAGE_JSON_MAX) {
		snprintf(why, cap, "config of %" PRIu64 " bytes", m->config_size);
		return -EFBIG;
	}
	r = oci_blob(oci_fd, m->config_digest, IMAGE_JSON_MAX, ret_config, ret_len, why, cap);
	if (r >= 0 && *ret_len != m->config_size) {
		snprintf(why, cap, "config is %zu bytes, the manifest says %" PRIu64, *ret_len,
			 m->config_size);
		free(*ret_config);
		*ret_config = NULL;
		return -EBADMSG;
	}
	return r;
}

/* --- docker-archive ------------------------------------------------------------------ */

static struct archive *docker_open(const char *path, char *why, size_t cap)
{
	struct archive *a = archive_read_new();

	if (!a)
		return NULL;
	archive_read_support_filter_gzip(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_format_tar(a);
	if (archive_read_open_filename(a, path, 1 << 16) != ARCHIVE_OK) {
		snprintf(why, cap, "%s: %s", path, archive_error_string(a) ?: "cannot open");
		archive_read_free(a);
		return NULL;
	}
	return a;
}

static const char *member_name(struct archive_entry *ent)
{
	const char *p = archive_entry_pathname(ent);

	while (p && strncmp(p, "./", 2) == 0)
		p += 2;
	return p ?: "";
}

/* The member named name, read whole (bounded). */
static int docker_member(const char *path, const char *name, char **ret, size_t *ret_len, char *why,
			 size_t cap)
{
	struct archive *a = docker_open(path, why, cap);
	struct archive_entry *ent;
	int r = -ENOENT;

	if (!a)
		return -EIO;
	while ((r = archive_read_next_header(a, &ent)) == ARCHIVE_OK || r == ARCHIVE_WARN) {
		la_int64_t size = archive_entry_size(ent);
		_cleanup_free_ char *buf = NULL;
		la_ssize_t n;

		if (strcmp(member_name(ent), name) != 0 || archive_entry_filetype(ent) != AE_IFREG)
			continue;
		if (size < 0 || size > IMAGE_JSON_MAX) {
			snprintf(why, cap, "%s: %" PRId64 " bytes", name, (int64_t)size);
			r = -EFBIG;
			goto out;
		}
		buf = malloc((size_t)size + 1);
		if (!buf) {
			r = -ENOMEM;
			goto out;
		}
		n = archive_read_data(a, buf, (size_t)size);
		if (n != size) {
			snprintf(why, cap, "%s: truncated", name);
			r = -EBADMSG;
			goto out;
		}
		buf[size] = '\0';
		*ret = TAKE_PTR(buf);
		*ret_len = (size_t)size;
		r = 0;
		goto out;
	}
	snprintf(why, cap, r == ARCHIVE_EOF ? "no %s in the archive" : "%s: %s", name,
		 archive_error_string(a) ?: "malformed archive");
	r = r == ARCHIVE_EOF ? -ENOENT : -EBADMSG;
out:
	archive_read_free(a);
	return r;
}

static int docker_read(const struct image_ref *ref, struct image_manifest *m, char **ret_config,
		       size_t *ret_len, char *why, size_t cap)
{
	_cleanup_free_ char *manifest = NULL;
	size_t len;
	int r;

	r = docker_member(ref->path, "manifest.json", &manifest, &len, why, cap);
	if (r >= 0)
		r = image_parse_docker_manifest(manifest, len, ref->tag, m, why, cap);
	if (r >= 0)
		r = docker_member(ref->path, m->config_blob, ret_config, ret_len, why, cap);
	/* the archive names no digest: the image's id is its config's */
	if (r >= 0)
		r = sha256_hex(*ret_config, *ret_len, m->config_digest);
	return r;
}

static ssize_t read_fd(void *userdata, void *buf, size_t cap)
{
	ssize_t n;

	do
		n = read(*(int *)userdata, buf, cap);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

static ssize_t read_member(void *userdata, void *buf, size_t cap)
{
	la_ssize_t n = archive_read_data(userdata, buf, cap);

	return n < 0 ? -EIO : n;
}

static bool layer_present(struct image_store *s, const char *diff_id)
{
	struct stat st;

	return fstatat(s->layers_fd, diff_id + 7, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	       S_ISDIR(st.st_mode);
}

static void layer_label(const struct image_manifest *m, size_t i, char *buf, size_t cap)
{
	snprintf(buf, cap, "layer %zu (%s)", i + 1,
		 m->layers[i].digest[0] ? m->layers[i].digest : m->layers[i].blob);
}

static int unpack_oci(struct image_store *s, int oci_fd, const struct image_manifest *m,
		      struct image_import_stats *stats, char *why, size_t cap)
{
	for (size_t i = 0; i < m->n_layers; i++) {
		const struct image_layer *l = &m->layers[i];
		struct open_how how = {.flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW,
				       .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS};
		struct image_unpack_stats us = {0};
		char path[96], label[IMAGE_ERROR_MAX];
		_cleanup_close_ int fd = -1;
		int r;

		if (layer_present(s, l->diff_id)) {
			stats->layers_cached++;
			continue;
		}
		layer_label(m, i, label, sizeof(label));
		snprintf(path, sizeof(path), "blobs/sha256/%s", l->digest + 7);
		fd = (int)syscall(SYS_openat2, oci_fd, path, &how, sizeof(how));
		if (fd < 0) {
			snprintf(why, cap, "%s: blob missing: %m", label);
			return -errno;
		}
		r = image_unpack_layer(s->layers_fd, read_fd, &fd, l->digest, l->size, l->diff_id,
				       label, &us, why, cap);
		if (r < 0)
			return r;
		stats->layers_unpacked++;
		stats->entries += us.entries;
		stats->bytes += us.bytes;
	}
	return 0;
}

static int unpack_docker(struct image_store *s, const char *path, const struct image_manifest *m,
			 struct image_import_stats *stats, char *why, size_t cap)
{
	struct archive *a;
	struct archive_entry *ent;
	size_t missing = 0;
	int r;

	for (size_t i = 0; i < m->n_layers; i++)
		if (layer_present(s, m->layers[i].diff_id))
			stats->layers_cached++;
		else
			missing++;
	if (!missing)
		return 0;
	a = docker_open(path, why, cap);
	if (!a)
		return -EIO;
	while (missing &&
	       ((r = archive_read_next_header(a, &ent)) == ARCHIVE_OK || r == ARCHIVE_WARN)) {
		const char *name = member_name(ent);

		for (size_t i = 0; i < m->n_layers; i++) {
			struct image_unpack_stats us = {0};
			char label[IMAGE_ERROR_MAX];

			if (strcmp(m->layers[i].blob, name) != 0 ||
			    layer_present(s, m->layers[i].diff_id))
				continue;
			layer_label(m, i, label, sizeof(label));
			r = image_unpack_layer(s->layers_fd, read_member, a, "", 0,
					       m->layers[i].diff_id, label, &us, why, cap);
			if (r < 0)
				goto out;
			stats->layers_unpacked++;
			stats->entries += us.entries;
			stats->bytes += us.bytes;
			missing--;
			break;
		}
	}
	r = 0;
	for (size_t i = 0; i < m->n_layers && r == 0; i++)
		if (!layer_present(s, m->layers[i].diff_id)) {
			snprintf(why, cap, "layer %zu (%s) is not in the archive", i + 1,
				 m->layers[i].blob);
			r = -ENOENT;
		}
out:
	archive_read_free(a);
	return r;
}

/* --- records ------------------------------------------------------------------------- */

static int record_load(struct image_store *s, const char *hex, struct image_info *ret)
{
	_cleanup_free_ char *buf = NULL;
	char path[IMAGE_HEX_LEN + 16];
	size_t len;
	int r;

	memset(ret, 0, sizeof(*ret));
	snprintf(path, sizeof(path), "%s/record", hex);
	r = read_beneath(s->byid_fd, path, 64 << 10, &buf, &len);
	if (r < 0)
		return r;
	snprintf(ret->id, sizeof(ret->id), "sha256:%s", hex);
	for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "name ", 5) == 0)
			snprintf(ret->name, sizeof(ret->name), "%s", line + 5);
		else if (strncmp(line, "layer ", 6) == 0 && image_digest_valid(line + 6) &&
			 ret->n_layers < IMAGE_LAYERS_MAX)
			snprintf(ret->layers[ret->n_layers++], IMAGE_DIGEST_LEN + 1, "%s",
				 line + 6);
	}
	return image_digest_valid(ret->id) ? 0 : -EBADMSG;
}

static int write_at(int dir_fd, const char *name, const char *buf, size_t len)
{
	_cleanup_close_ int fd =
		openat(dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0)
		return -errno;
	if (write(fd, buf, len) != (ssize_t)len || fsync(fd) < 0)
		return -errno ?: -EIO;
	return 0;
}

static int record_store(struct image_store *s, const struct image_info *info, const char *config,
			size_t config_len)
{
	char tmp[IMAGE_HEX_LEN + 48], text[IMAGE_NAME_MAX + 16 + IMAGE_LAYERS_MAX * 80];
	_cleanup_close_ int fd = -1;
	size_t o = 0;
	int r;

	snprintf(tmp, sizeof(tmp), ".tmp-%.12s-%d-%d", info->id + 7, (int)getpid(), (int)gettid());
	(void)image_remove_tree(s->byid_fd, tmp);
	fd = mkdir_open(s->byid_fd, tmp, 0700);
	if (fd < 0)
		return fd;
	if (info->name[0])
		o += (size_t)snprintf(text + o, sizeof(text) - o, "name %s\n", info->name);
	for (size_t i = 0; i < info->n_layers; i++)
		o += (size_t)snprintf(text + o, sizeof(text) - o, "layer %s\n", info->layers[i]);
	r = write_at(fd, "config.json", config, config_len);
	if (r >= 0)
		r = write_at(fd, "record", text, o);
	if (r >= 0) {
		/* replaces an older record of the same image (a new name) at once */
		if (renameat2(s->byid_fd, tmp, s->byid_fd, info->id + 7, RENAME_EXCHANGE) == 0)
			r = image_remove_tree(s->byid_fd, tmp);
		else if (errno == ENOENT)
			r = renameat(s->byid_fd, tmp, s->byid_fd, info->id + 7) < 0 ? -errno : 0;
		else
			r = -errno;
	}
	if (r < 0)
		(void)image_remove_tree(s->byid_fd, tmp);
	return r;
}

/* Calls fn for every stored image; stops at its first non-zero return. */
static int each_image(struct image_store *s, int (*fn)(struct image_info *, void *), void *ud)
{
	_cleanup_close_ int fd = openat(s->byid_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct image_info *info = malloc(sizeof(*info));
	struct dirent *de;
	DIR *d;
	int r = 0;

	if (fd < 0 || !info) {
		free(info);
		return fd < 0 ? -errno : -ENOMEM;
	}
	d = fdopendir(fd);
	if (!d) {
		free(info);
		return -errno;
	}
	fd = -1;
	while (r == 0 && (de = readdir(d)))
		if (strlen(de->d_name) == IMAGE_HEX_LEN && record_load(s, de->d_name, info) == 0)
			r = fn(info, ud);
	closedir(d);
	free(info);
	return r;
}

/* A name moves from the image that held it to the new one (as a tag does in Docker). */
struct unname {
	struct image_store *s;
	const char *name, *keep;
};

static int unname_one(struct image_info *info, void *ud)
{
	struct unname *u = ud;
	_cleanup_free_ char *config = NULL;
	char path[IMAGE_HEX_LEN + 16];
	size_t len;

	if (strcmp(info->name, u->name) != 0 || strcmp(info->id, u->keep) == 0)
		return 0;
	snprintf(path, sizeof(path), "%s/config.json", info->id + 7);
	if (read_beneath(u->s->byid_fd, path, IMAGE_JSON_MAX, &config, &len) < 0)
		return 0;
	info->name[0] = '\0';
	(void)record_store(u->s, info, config, len);
	return 0;
}

/* A name as a record holds it (one line): what image references are made of. */
static bool name_valid(const char *name)
{
	if (strlen(name) > IMAGE_NAME_MAX)
		return false;
	for (const char *c = name; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
		      (*c >= '0' && *c <= '9') || strchr("._-:/@+", *c)))
			return false;
	return true;
}

int image_store_import(struct image_store *s, const struct image_ref *ref, const char *name,
		       struct image_info *ret, struct image_import_stats *stats, char *why,
		       size_t cap)
{
	_cleanup_free_ struct image_manifest *m = calloc(1, sizeof(*m));
	_cleanup_free_ struct image_info *info = calloc(1, sizeof(*info));
	_cleanup_close_ int lk = -1, oci_fd = -1;
	_cleanup_free_ char *config = NULL;
	struct image_import_stats local = {0};
	struct image_config c = {0};
	struct timespec t0, t1;
	size_t len;
	int r;

	if (!stats)
		stats = &local;
	why[0] = '\0';
	if (!m || !info)
		return -ENOMEM;
	if (name && !name_valid(name)) {
		snprintf(why, cap, "a name is at most %d of [A-Za-z0-9._-:/@+]", IMAGE_NAME_MAX);
		return -EINVAL;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* shared: imports run side by side (their temporary directories are their threads'; a
	 * layer both unpack is renamed into place by the first, the other's copy dropped), and
	 * environments keep starting meanwhile; rm and gc wait */
	lk = lock(s, LOCK_SH);
	if (lk < 0)
		return lk;
	if (ref->format == IMAGE_FORMAT_OCI) {
		oci_fd = open(ref->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (oci_fd < 0) {
			snprintf(why, cap, "%s: %m", ref->path);
			return -errno;
		}
		r = oci_read(oci_fd, ref, m, &config, &len, why, cap);
	} else
		r = docker_read(ref, m, &config, &len, why, cap);
	if (r < 0)
		return r;
	r = image_parse_config(config, len, &c, why, cap);
	if (r < 0)
		return r;
	if (c.n_diff_ids != m->n_layers) {
		snprintf(why, cap, "the manifest lists %zu layers, the config %zu diff_ids",
			 m->n_layers, c.n_diff_ids);
		image_config_finish(&c);
		return -EBADMSG;
	}
	for (size_t i = 0; i < m->n_layers; i++)
		memcpy(m->layers[i].diff_id, c.diff_ids[i], sizeof(c.diff_ids[i]));
	image_config_finish(&c);
	r = ref->format == IMAGE_FORMAT_OCI ? unpack_oci(s, oci_fd, m, stats, why, cap)
					    : unpack_docker(s, ref->path, m, stats, why, cap);
	if (r < 0)
		return r;
	snprintf(info->id, sizeof(info->id), "%s", m->config_digest);
	snprintf(info->name, sizeof(info->name), "%s", name && name[0] ? name : m->name);
	if (!name_valid(info->name)) {
		snprintf(why, cap, "the image's tag is not a name: give one");
		return -EINVAL;
	}
	info->n_layers = m->n_layers;
	for (size_t i = 0; i < m->n_layers; i++)
		memcpy(info->layers[i], m->layers[i].diff_id, sizeof(info->layers[i]));
	if (!info->name[0]) {
		/* an import without a name keeps the one the image has */
		struct image_info old;

		if (record_load(s, info->id + 7, &old) == 0)
			memcpy(info->name, old.name, sizeof(info->name));
	}
	r = record_store(s, info, config, len);
	if (r < 0) {
		snprintf(why, cap, "writing the image's record: %s", strerror(-r));
		return r;
	}
	if (info->name[0]) {
		struct unname u = {.s = s, .name = info->name, .keep = info->id};

		(void)each_image(s, unname_one, &u);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	stats->usec = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000 +
		      (uint64_t)(t1.tv_nsec - t0.tv_nsec) / 1000;
	if (ret)
		*ret = *info;
	return 0;
}

struct find {
	const char *what;
	struct image_info *ret;
	int found;
};

static int find_one(struct image_info *info, void *ud)
{
	struct find *f = ud;
	size_t n = strlen(f->what);
	const char *hex = strncmp(f->what, "sha256:", 7) == 0 ? f->what + 7 : f->what;
	bool hit = strcmp(info->name, f->what) == 0 || strcmp(info->id, f->what) == 0;

	if (!hit && n >= 12 && strspn(hex, "0123456789abcdef") == strlen(hex))
		hit = strncmp(info->id + 7, hex, strlen(hex)) == 0;
	if (hit) {
		if (f->found++ == 0)
			*f->ret = *info;
		/* an exact id or name wins over a prefix that also matches another */
		if (strcmp(info->name, f->what) == 0 || strcmp(info->id, f->what) == 0) {
			*f->ret = *info;
			f->found = 1;
			return 1;
		}
	}
	return 0;
}

static int lookup_locked(struct image_store *s, const char *what, struct image_info *ret)
{
	struct find f = {.what = what, .ret = ret};
	int r = each_image(s, find_one, &f);

	if (r < 0)
		return r;
	return f.found == 1 ? 0 : f.found ? -ENOTUNIQ : -ENOENT;
}

int image_store_lookup(struct image_store *s, const char *what, struct image_info *ret)
{
	_cleanup_close_ int lk = lock(s, LOCK_SH);

	if (lk < 0)
		return lk;
	return lookup_locked(s, what, ret);
}

struct list {
	struct image_info *v;
	size_t n;
};

static int list_one(struct image_info *info, void *ud)
{
	struct list *l = ud;
	struct image_info *grown = realloc(l->v, (l->n + 1) * sizeof(*grown));

	if (!grown)
		return -ENOMEM;
	l->v = grown;
	l->v[l->n++] = *info;
	return 0;
}

int image_store_list(struct image_store *s, struct image_info **ret, size_t *ret_n)
{
	_cleanup_close_ int lk = lock(s, LOCK_SH);
	struct list l = {0};
	int r;

	if (lk < 0)
		return lk;
	r = each_image(s, list_one, &l);
	if (r < 0) {
		free(l.v);
		return r;
	}
	*ret = l.v;
	*ret_n = l.n;
	return 0;
}

/* The first environment whose <envs>/<id>/image is id, or -ENOENT. */
static int image_user(struct image_store *s, const char *id, char *env, size_t cap)
{
	DIR *d = opendir(s->envs);
	struct dirent *de;
	int r = -ENOENT;

	if (!d)
		return -ENOENT;
	while (r == -ENOENT && (de = readdir(d))) {
		char path[PATH_MAX], buf[IMAGE_DIGEST_LEN + 2] = "";
		_cleanup_close_ int fd = -1;
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s/image", s->envs, de->d_name);
		fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		if (n >= IMAGE_DIGEST_LEN && strncmp(buf, id, IMAGE_DIGEST_LEN) == 0) {
			snprintf(env, cap, "%s", de->d_name);
			r = 0;
		}
	}
	closedir(d);
	return r;
}

static int gc_locked(struct image_store *s, uint64_t *ret_layers);

int image_store_remove(struct image_store *s, const char *what, char *why, size_t cap)
{
	_cleanup_close_ int lk = lock(s, LOCK_EX);
	struct image_info *info = malloc(sizeof(*info));
	char env[256];
	int r;

	why[0] = '\0';
	if (lk < 0 || !info) {
		free(info);
		return lk < 0 ? lk : -ENOMEM;
	}
	r = lookup_locked(s, what, info);
	if (r < 0) {
		snprintf(why, cap,
			 r == -ENOTUNIQ ? "\"%s\" names several images" : "no image \"%s\"", what);
		goto out;
	}
	if (image_user(s, info->id, env, sizeof(env)) == 0) {
		snprintf(why, cap, "image %.19s is used by environment %s", info->id, env);
		r = -EBUSY;
		goto out;
	}
	r = image_remove_tree(s->byid_fd, info->id + 7);
	if (r >= 0)
		r = gc_locked(s, NULL);
out:
	free(info);
	return r;
}

static int mark(struct image_info *info, void *ud)
{
	struct list *l = ud;

	return list_one(info, l);
}

static bool referenced(const struct list *l, const char *hex)
{
	for (size_t i = 0; i < l->n; i++)
		for (size_t k = 0; k < l->v[i].n_layers; k++)
			if (strcmp(l->v[i].layers[k] + 7, hex) == 0)
				return true;
	return false;
}

/* by-id/.tmp-*: records an interrupted import was writing */
static void gc_records(struct image_store *s)
{
	_cleanup_close_ int fd = openat(s->byid_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	DIR *d;

	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d)
		return;
	fd = -1;
	while ((de = readdir(d)))
		if (strncmp(de->d_name, ".tmp-", 5) == 0)
			(void)image_remove_tree(dirfd(d), de->d_name);
	closedir(d);
}

static int gc_locked(struct image_store *s, uint64_t *ret_layers)
{
	_cleanup_close_ int fd = openat(s->layers_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct list l = {0};
	struct dirent *de;
	uint64_t removed = 0;
	DIR *d;
	int r;

	if (fd < 0)
		return -errno;
	gc_records(s);
	r = each_image(s, mark, &l);
	if (r < 0) {
		free(l.v);
		return r;
	}
	d = fdopendir(fd);
	if (!d) {
		free(l.v);
		return -errno;
	}
	fd = -1;
	/* under the exclusive lock no import runs: every .tmp-* is an interrupted one's */
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.' && strncmp(de->d_name, ".tmp-", 5) != 0)
			continue;
		if (de->d_name[0] != '.' && referenced(&l, de->d_name))
			continue;
		if (image_remove_tree(dirfd(d), de->d_name) >= 0 && de->d_name[0] != '.')
			removed++;
	}
	closedir(d);
	free(l.v);
	if (ret_layers)
		*ret_layers = removed;
	return 0;
}

int image_store_gc(struct image_store *s, uint64_t *ret_layers)
{
	_cleanup_close_ int lk = lock(s, LOCK_EX);

	if (lk < 0)
		return lk;
	return gc_locked(s, ret_layers);
}

int image_store_use(struct image_store *s, const char *what, const char *env_dir,
		    struct image_info *ret, char *why, size_t cap)
{
	struct image_ref ref;
	_cleanup_close_ int lk = -1, fd = -1;
	char path[PATH_MAX], line[IMAGE_DIGEST_LEN + 2];
	const char *key = what;
	int r;

	why[0] = '\0';
	if (image_ref_parse(what, &ref) == 0) {
		r = image_store_import(s, &ref, NULL, ret, NULL, why, cap);
		if (r < 0)
			return r;
		key = ret->id;
	}
	lk = lock(s, LOCK_SH);
	if (lk < 0)
		return lk;
	r = lookup_locked(s, key, ret);
	if (r < 0) {
		snprintf(why, cap,
			 "no image \"%s\" in the store (import it, or give oci:DIR or "
			 "docker-archive:FILE)",
			 what);
		return r;
	}
	for (size_t i = 0; i < ret->n_layers; i++)
		if (!layer_present(s, ret->layers[i])) {
			snprintf(why, cap, "layer %s of image %.19s is missing from the store",
				 ret->layers[i], ret->id);
			return -ENOENT;
		}
	snprintf(path, sizeof(path), "%s/image", env_dir);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	snprintf(line, sizeof(line), "%s\n", ret->id);
	if (fd < 0 || write(fd, line, strlen(line)) != (ssize_t)strlen(line)) {
		r = -errno;
		snprintf(why, cap, "%s: %m", path);
		return r;
	}
	return 0;
}

int image_store_config(struct image_store *s, const char *id, struct image_config *ret)
{
	_cleanup_free_ char *buf = NULL;
	char path[IMAGE_HEX_LEN + 16], why[IMAGE_ERROR_MAX];
	size_t len;
	int r;

	if (!image_digest_valid(id))
		return -EINVAL;
	snprintf(path, sizeof(path), "%s/config.json", id + 7);
	r = read_beneath(s->byid_fd, path, IMAGE_JSON_MAX, &buf, &len);
	if (r < 0)
		return r;
	return image_parse_config(buf, len, ret, why, sizeof(why));
}

int image_store_layer_path(struct image_store *s, const char *diff_id, char *buf, size_t cap)
{
	if (!image_digest_valid(diff_id))
		return -EINVAL;
	if ((size_t)snprintf(buf, cap, "%s/layers/%s", s->dir, diff_id + 7) >= cap)
		return -ENAMETOOLONG;
	return 0;
}
