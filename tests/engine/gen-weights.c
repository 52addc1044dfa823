/* SPDX-License-Identifier: MIT */
/*
 * gen-weights: writes the engine's model as a safetensors file, deterministically from a
 * seed, sized to --size by the per-layer embedding tables (engine-model.h). The values equal
 * what --load-format dummy --seed N puts on the device.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine-kernels.h"
#include "engine-model.h"
#include "log.h"
#include "util.h"

#define CHUNK (1u << 20) /* floats per write */

static int parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	if (*end == 'K' || *end == 'k')
		shift = 10, end++;
	else if (*end == 'M' || *end == 'm')
		shift = 20, end++;
	else if (*end == 'G' || *end == 'g')
		shift = 30, end++;
	if (*end == 'i' && shift)
		end++;
	if (*end || v > (UINT64_MAX >> shift))
		return -EINVAL;
	*ret = v << shift;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gen-weights --out FILE [--size N[KMG]] [--seed N] [--vocab N]\n"
		"                   [--hidden N] [--layers N] [--heads N] [--ffn N] [--max-pos N]\n"
		"defaults: --size 4M --seed 1 --vocab 512 --hidden 64 --layers 2 --heads 4\n"
		"          --ffn 128 --max-pos 512\n");
}

static int write_all(FILE *f, const void *p, size_t n)
{
	return fwrite(p, 1, n, f) == n ? 0 : -EIO;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"out", required_argument, NULL, 'o'},
		{"size", required_argument, NULL, 's'},
		{"seed", required_argument, NULL, 'S'},
		{"vocab", required_argument, NULL, 'v'},
		{"hidden", required_argument, NULL, 'H'},
		{"layers", required_argument, NULL, 'l'},
		{"heads", required_argument, NULL, 'n'},
		{"ffn", required_argument, NULL, 'f'},
		{"max-pos", required_argument, NULL, 'p'},
		{"help", no_argument, NULL, 'h'},
		{},
	};
	struct model_config c = {
		.vocab = 512, .hidden = 64, .layers = 2, .heads = 4, .ffn = 128, .max_pos = 512};
	uint64_t size = 4u << 20, seed = 1, v, off = 0;
	_cleanup_free_ struct tensor_desc *t = NULL;
	_cleanup_free_ float *buf = NULL;
	_cleanup_fclose_ FILE *f = NULL;
	json_object *hdr, *meta;
	const char *out = NULL, *hs;
	size_t n, hlen, pad;
	uint64_t hlen_le;
	char num[32];
	int opt, r;

	log_setup("gen-weights", LOG_LEVEL_INFO);
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) >= 0) {
		if (opt == 'h') {
			usage(stdout);
			return 0;
		}
		if (opt == 'o') {
			out = optarg;
			continue;
		}
		if (opt == '?' || parse_size(optarg, &v) < 0) {
			usage(stderr);
			return 1;
		}
		switch (opt) {
		case 's':
			size = v;
			break;
		case 'S':
			seed = v;
			break;
		case 'v':
			c.vocab = (uint32_t)MIN(v, UINT32_MAX);
			break;
		case 'H':
			c.hidden = (uint32_t)MIN(v, UINT32_MAX);
			break;
		case 'l':
			c.layers = (uint32_t)MIN(v, UINT32_MAX);
			break;
		case 'n':
			c.heads = (uint32_t)MIN(v, UINT32_MAX);
			break;
		case 'f':
			c.ffn = (uint32_t)MIN(v, UINT32_MAX);
			break;
		case 'p':
			c.max_pos = (uint32_t)MIN(v, UINT32_MAX);
			break;
		default:
			break;
		}
	}
	if (!out || optind < argc) {
		usage(stderr);
		return 1;
	}
	c.ple_rows = model_ple_rows_for_size(&c, size);
	if (model_config_check(&c, 1) < 0 || model_layout(&c, &t, &n) < 0)
		return 1;

	hdr = json_object_new_object();
	meta = json_object_new_object();
#define META(key, val)                                            \
	(snprintf(num, sizeof(num), "%" PRIu64, (uint64_t)(val)), \
	 json_object_object_add(meta, key, json_object_new_string(num)))
	json_object_object_add(meta, "format", json_object_new_string("pt"));
	META("vocab_size", c.vocab);
	META("hidden_size", c.hidden);
	META("num_hidden_layers", c.layers);
	META("num_attention_heads", c.heads);
	META("intermediate_size", c.ffn);
	META("max_position_embeddings", c.max_pos);
	META("per_layer_embed_rows", c.ple_rows);
	META("seed", seed);
#undef META
	json_object_object_add(hdr, "__metadata__", meta);
	for (size_t i = 0; i < n; i++) {
		json_object *e = json_object_new_object(), *shape = json_object_new_array();
		json_object *offs = json_object_new_array();
		uint64_t bytes = t[i].rows * t[i].cols * sizeof(float);

		json_object_object_add(e, "dtype", json_object_new_string("F32"));
		json_object_array_add(shape, json_object_new_int64((int64_t)t[i].rows));
		json_object_array_add(shape, json_object_new_int64((int64_t)t[i].cols));
		json_object_object_add(e, "shape", shape);
		json_object_array_add(offs, json_object_new_int64((int64_t)off));
		json_object_array_add(offs, json_object_new_int64((int64_t)(off + bytes)));
		json_object_object_add(e, "data_offsets", offs);
		json_object_object_add(hdr, t[i].name, e);
		off += bytes;
	}
	hs = json_object_to_json_string_ext(hdr, JSON_C_TO_STRING_PLAIN);
	hlen = strlen(hs);
	pad = (8 - hlen % 8) % 8; /* the data starts 8-byte aligned, padded with spaces */
	hlen_le = htole64(hlen + pad);

	f = fopen(out, "we");
	if (!f)
		return log_error_errno(-errno, "Failed to create %s: %m", out), 1;
	buf = malloc(CHUNK * sizeof(float));
	r = buf ? 0 : -ENOMEM;
	r = r ?: write_all(f, &hlen_le, sizeof(hlen_le));
	r = r ?: write_all(f, hs, hlen);
	r = r ?: write_all(f, "        ", pad);
	json_object_put(hdr);
	for (size_t i = 0; i < n && r == 0; i++) {
		uint64_t total = t[i].rows * t[i].cols, s = model_tensor_seed(seed, i);

		for (uint64_t done = 0; done < total && r == 0;) {
			size_t k = (size_t)MIN((uint64_t)CHUNK, total - done);

			for (size_t j = 0; j < k; j++)
				buf[j] = uniform_at(s, done + j, t[i].scale, t[i].offset);
			r = write_all(f, buf, k * sizeof(float)); /* little-endian hosts only */
			done += k;
		}
	}
	if (r == 0 && fflush(f) != 0)
		r = -errno;
	if (r < 0)
		return log_error_errno(r, "Failed to write %s: %m", out), 1;
	printf("%s: %zu tensors, %" PRIu64 " bytes of weights, per-layer embedding rows %u\n", out,
	       n, off, c.ple_rows);
	return 0;
}
