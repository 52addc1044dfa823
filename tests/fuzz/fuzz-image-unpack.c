/* SPDX-License-Identifier: MIT */
/*
 * A layer blob (supervisor/image/supervisor-image-unpack.c) on arbitrary bytes, unpacked
 * into a scratch store as root: it never crashes, never writes outside the layer directory
 * (the scratch directory holds nothing but layers/ afterwards), and leaves either nothing or
 * exactly the layer named by the tar's diff_id. The diff_id given is the input's own sha256 (an
 * uncompressed tar's diff_id), so that well-formed tars get all the way through.
 */
#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "supervisor-image.h"
#include "supervisor-image-unpack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct src {
	const uint8_t *data;
	size_t size, off;
};

static ssize_t rd(void *userdata, void *buf, size_t cap)
{
	struct src *s = userdata;
	size_t n = s->size - s->off < cap ? s->size - s->off : cap;

	memcpy(buf, s->data + s->off, n);
	s->off += n;
	return (ssize_t)n;
}

static int count_entries(int dir_fd, char *only, size_t cap)
{
	int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), n = 0;
	struct dirent *de;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

	if (!d)
		abort();
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
			if (only)
				snprintf(only, cap, "%s", de->d_name);
			n++;
		}
	closedir(d);
	return n;
}

static char scratch[] = "/tmp/fuzz-image-unpack.XXXXXX";

static void remove_scratch(void)
{
	(void)image_remove_tree(AT_FDCWD, scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int scratch_fd = -1, layers_fd = -1;
	char diff_id[IMAGE_DIGEST_LEN + 1] = "sha256:", why[IMAGE_ERROR_MAX], name[256] = "";
	unsigned char md[32];
	unsigned n = 0;
	struct src s = {data, size, 0};
	int r;

	if (scratch_fd < 0) {
		if (!mkdtemp(scratch))
			abort();
		atexit(remove_scratch);
		scratch_fd = open(scratch, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (mkdirat(scratch_fd, "layers", 0700) < 0)
			abort();
		layers_fd = openat(scratch_fd, "layers", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (layers_fd < 0)
			abort();
	}
	if (EVP_Digest(data, size, md, &n, EVP_sha256(), NULL) != 1)
		abort();
	for (unsigned i = 0; i < n; i++)
		sprintf(diff_id + 7 + 2 * i, "%02x", md[i]);
	r = image_unpack_layer(layers_fd, rd, &s, "", 0, diff_id, "layer 1", NULL, why,
			       sizeof(why));
	if (count_entries(scratch_fd, NULL, 0) != 1)
		abort(); /* something besides layers/ */
	switch (count_entries(layers_fd, name, sizeof(name))) {
	case 0:
		if (r == 0)
			abort();
		break;
	case 1:
		if (r < 0 || strcmp(name, diff_id + 7) != 0)
			abort();
		(void)image_remove_tree(layers_fd, name);
		break;
	default:
		abort();
	}
	return 0;
}
