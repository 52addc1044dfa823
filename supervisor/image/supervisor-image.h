/* SPDX-License-Identifier: MIT */
/*
 * Container images as environment roots (issue 20 item 1): what the container tools write
 * without a registry, an OCI image layout directory (`oci:DIR[:TAG]`: skopeo copy … oci:,
 * podman save --format oci-dir) and a docker-archive tarball (`docker-archive:FILE[:REF]`:
 * docker save, podman save), imported into a layer store under the state directory:
 *
 *   <state_dir>/images/lock                  flock: exclusive for rm/gc, shared else
 *   <state_dir>/images/layers/<hex>/         a layer, unpacked (read-only to everything:
 *                                            environments get it as an overlay lower dir);
 *                                            <hex> is its diff_id (sha256 of the uncompressed
 *                                            tar), so a layer is one directory whichever
 *                                            compression or format brought it
 *   <state_dir>/images/layers/.tmp-*         a layer being unpacked (removed by gc)
 *   <state_dir>/images/by-id/<hex>/          an image, by its config's digest (Docker's
 *                                            "image id"): config.json (the verified config
 *                                            blob) and record (names, layers bottom first)
 *
 * Every input is untrusted: JSON documents are bounded (IMAGE_JSON_MAX) and every field is
 * type-checked; digests must be sha256:<64 lowercase hex> and every blob is verified against
 * its digest while it streams; a layer's entries are created beneath the layer directory
 * only (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS for every parent), and a layer with a
 * device node, an absolute or `..` path, or a hard link out of itself is refused with the
 * layer and entry named, leaving nothing in the store.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define IMAGE_DIGEST_LEN 71 /* "sha256:" + 64 hex */
#define IMAGE_HEX_LEN	 64
#define IMAGE_LAYERS_MAX 127	    /* overlay's own limit on lower layers is 500 */
#define IMAGE_JSON_MAX	 (4u << 20) /* index, manifest, config, manifest.json */
#define IMAGE_NAME_MAX	 255
#define IMAGE_ERROR_MAX	 512
#define IMAGE_ARGS_MAX	 256  /* Entrypoint + Cmd, and Env, entries each */
#define IMAGE_ARG_MAX	 4096 /* bytes of one of them */
#define IMAGE_DIR_PREFIX "images"

enum image_format {
	IMAGE_FORMAT_OCI = 0,	 /* oci:DIR[:TAG] */
	IMAGE_FORMAT_DOCKER = 1, /* docker-archive:FILE[:REF] */
};

struct image_ref {
	enum image_format format;
	char path[4096];
	char tag[IMAGE_NAME_MAX + 1]; /* "" when none was given */
};

/* Parses REF; -EINVAL on anything else (a registry reference included: no registry here). */
int image_ref_parse(const char *text, struct image_ref *ret);

/* One layer as the manifest lists it. For a docker-archive, blob is the member's path in the
 * archive and digest is empty (the archive has none; diff_id verifies it). */
struct image_layer {
	char digest[IMAGE_DIGEST_LEN + 1];  /* the blob's (compressed) digest, "" if none */
	char diff_id[IMAGE_DIGEST_LEN + 1]; /* the uncompressed tar's, from the config */
	char blob[4096];		    /* docker-archive: the member's name */
	uint64_t size;			    /* the blob's size as the manifest says (0: unknown) */
};

/* What the image config says about running it (Docker's and OCI's config.config). */
struct image_config {
	char **env; /* "KEY=VALUE" */
	size_t n_env;
	char **argv; /* Entrypoint then Cmd */
	size_t n_argv;
	char user[IMAGE_NAME_MAX + 1];
	char workdir[4096];
	char diff_ids[IMAGE_LAYERS_MAX][IMAGE_DIGEST_LEN + 1]; /* bottom first */
	size_t n_diff_ids;
};

struct image_manifest {
	char config_digest[IMAGE_DIGEST_LEN + 1];
	char config_blob[4096]; /* docker-archive: the config's member name */
	uint64_t config_size;
	struct image_layer layers[IMAGE_LAYERS_MAX];
	size_t n_layers;
	char name[IMAGE_NAME_MAX + 1]; /* a tag the source gives it, "" if none */
};

bool image_digest_valid(const char *digest);
void image_config_finish(struct image_config *c);
/* Parsers of the JSON documents (bounded input; fuzzed): an OCI image index (picks the
 * manifest named tag, or the only one, or linux/amd64 of several; ret_digest: its digest and
 * ret_index whether it is itself an index), an OCI/Docker v2 image manifest, an image config,
 * a docker-archive manifest.json (picks RepoTags tag, or the only entry). why: a sentence. */
int image_parse_index(const char *buf, size_t len, const char *tag, char *ret_digest,
		      bool *ret_index, char *ret_name, char *why, size_t cap);
int image_parse_manifest(const char *buf, size_t len, struct image_manifest *ret, char *why,
			 size_t cap);
int image_parse_config(const char *buf, size_t len, struct image_config *ret, char *why,
		       size_t cap);
int image_parse_docker_manifest(const char *buf, size_t len, const char *tag,
				struct image_manifest *ret, char *why, size_t cap);
