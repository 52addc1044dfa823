/* SPDX-License-Identifier: MIT */
/*
 * belayerctl image: the supervisor's store of container images (issue 20).
 *   image list                       stored images: id, name, layers
 *   image import REF [--name NAME]   oci:DIR[:TAG] or docker-archive:FILE[:REF]
 *   image rm NAME|ID                 refused while an environment uses it; unused layers go
 *   image gc                         remove layers no image lists
 * The supervisor resolves a path from its own working directory, so a relative oci:DIR or
 * docker-archive:FILE is made absolute here (image_arg, env create --image too).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "belayerctl.h"
#include "util.h"

/* An import of a several-GiB image takes minutes. */
#define IMAGE_TIMEOUT_MS 3600000

int image_arg(char *dst, size_t cap, const char *src)
{
	static const char *const transports[] = {"oci:", "docker-archive:"};
	char cwd[PATH_MAX], buf[PROTO_MAX_STR + 1];

	for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++) {
		size_t n = strlen(transports[i]);

		if (strncmp(src, transports[i], n) != 0 || src[n] == '/' || !src[n])
			continue;
		if (!getcwd(cwd, sizeof(cwd)))
			return -errno;
		if ((size_t)snprintf(buf, sizeof(buf), "%s%s/%s", transports[i], cwd, src + n) >=
		    sizeof(buf))
			return -E2BIG;
		return copy_arg(dst, cap, buf, "IMAGE");
	}
	return copy_arg(dst, cap, src, "IMAGE");
}

static void print_image(const struct ctl_options *o, enum image_op op,
			const struct proto_image_info *i)
{
	if (o->json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "id", json_object_new_string(i->id));
		json_object_object_add(j, "name", json_object_new_string(i->name));
		json_object_object_add(j, "layers", json_u64(i->n_layers));
		if (op == IMAGE_OP_IMPORT) {
			json_object_object_add(j, "unpacked", json_u64(i->unpacked));
			json_object_object_add(j, "cached", json_u64(i->cached));
			json_object_object_add(j, "entries", json_u64(i->entries));
			json_object_object_add(j, "bytes", json_u64(i->bytes));
			json_object_object_add(j, "us", json_u64(i->us));
		}
		json_print(j, true);
		return;
	}
	printf("%.19s  %-40s %u layers", i->id, i->name[0] ? i->name : "-", i->n_layers);
	if (op == IMAGE_OP_IMPORT)
		printf(": %" PRIu64 " unpacked (%" PRIu64 " entries, %" PRIu64 " bytes), %" PRIu64
		       " in the store already, %.1f s",
		       i->unpacked, i->entries, i->bytes, i->cached, (double)i->us / 1e6);
	printf("\n");
}

int cmd_image(const struct ctl_options *o, int argc, char **argv)
{
	static const struct option options[] = {
		{"name", required_argument, NULL, 'n'},
		{"json", no_argument, NULL, 'j'},
		{},
	};
	struct ctl_options ro = *o;
	struct proto_msg m = {.type = PROTO_IMAGE_REQUEST};
	struct proto_image_request *q = &m.image_request;
	_cleanup_close_ int sock = -1;
	int c, r;

	if (argc < 2 || image_op_from_string(argv[1], &q->op) < 0) {
		fprintf(stderr, "Usage: belayerctl image list | import REF [--name NAME] | "
				"rm NAME|ID | gc\n");
		return 2;
	}
	argc--;
	argv++;
	optind = 0;
	while ((c = getopt_long(argc, argv, "", options, NULL)) >= 0) {
		if (c == 'n')
			r = copy_arg(q->name, sizeof(q->name), optarg, "--name");
		else if (c == 'j')
			r = 0; /* belayerctl.c took it */
		else
			return 2;
		if (r < 0)
			return 2;
	}
	if (q->op == IMAGE_OP_IMPORT || q->op == IMAGE_OP_RM) {
		if (optind >= argc) {
			fprintf(stderr, "belayerctl: image %s: which image?\n", argv[0]);
			return 2;
		}
		r = q->op == IMAGE_OP_IMPORT
			    ? image_arg(q->ref, sizeof(q->ref), argv[optind])
			    : copy_arg(q->ref, sizeof(q->ref), argv[optind], "IMAGE");
		if (r < 0)
			return 2;
	}
	ro.timeout_ms = IMAGE_TIMEOUT_MS;
	sock = ctl_connect(&ro);
	if (sock < 0)
		return sock;
	r = proto_send(sock, &m, 0);
	if (r < 0) {
		fprintf(stderr, "belayerctl: send failed: %s\n", strerror(-r));
		return r;
	}
	for (;;) {
		struct proto_msg reply;

		r = ctl_recv(sock, &ro, &reply);
		if (r < 0)
			return r;
		if (reply.type == PROTO_IMAGE_INFO)
			print_image(o, q->op, &reply.image_info);
		else if (reply.type == PROTO_END) {
			if (q->op == IMAGE_OP_GC && !o->json)
				printf("%u layers removed\n", reply.end.count);
			return 0;
		}
	}
}
