/* SPDX-License-Identifier: MIT */
/*
 * Writes the fuzz seed corpora: a valid encoding of every sample message and a few malformed
 * ones, each as one file whose first byte tells the fuzz target how many fds to pass.
 *
 *   gen-seeds DIR          (re)writes DIR/<target>/ for every proto fuzz target
 *   gen-seeds --check DIR  fails when DIR's corpora differ from what would be written
 *
 * Every seed is decoded before it is written: "valid-*" must decode, "bad-*" must not, so a
 * protocol change that breaks a seed's meaning fails here rather than quietly weakening fuzzing.
 *
 * fuzz-supervisor takes sessions: a sequence of packets, each framed as
 *   fd count (1 byte) | length (2 bytes, big-endian) | packet
 * Its seeds are conversations a shim, a shadow and belayerctl have with the supervisor.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "proto-samples.h"
#include "proto.h"
#include "util.h"

#define MAX_SEEDS 64
#define SEED_MAX  (PROTO_MAX_MSG + 1)

struct seed {
	char name[64];
	size_t len;
	uint8_t data[SEED_MAX]; /* data[0]: fd count for the target, then the packet */
};

static struct seed seeds[MAX_SEEDS];
static size_t n_seeds;
static const char *const targets[] = {"fuzz-proto", "fuzz-proto-recv"};

static struct seed *seed_new(const char *name, uint8_t nfds)
{
	struct seed *s;

	if (n_seeds >= MAX_SEEDS) {
		fprintf(stderr, "gen-seeds: more than %d seeds\n", MAX_SEEDS);
		exit(EXIT_FAILURE);
	}
	s = &seeds[n_seeds++];
	(void)snprintf(s->name, sizeof(s->name), "%s", name);
	s->data[0] = nfds;
	s->len = 1;
	return s;
}

static void seed_bytes(const char *name, uint8_t nfds, const void *p, size_t len)
{
	struct seed *s = seed_new(name, nfds);

	memcpy(s->data + 1, p, len);
	s->len = 1 + len;
}

static size_t encode_sample(size_t i, uint8_t *buf, size_t cap, uint8_t *ret_nfds,
			    const char **ret_name)
{
	struct proto_msg m;
	int fds[PROTO_MAX_FDS];
	size_t len, nfds;
	int r;

	*ret_name = proto_sample(i, 0, &m);
	r = proto_encode(&m, buf, cap, &len, fds, &nfds);
	if (r < 0) {
		fprintf(stderr, "gen-seeds: encoding %s: %s\n", *ret_name, strerror(-r));
		exit(EXIT_FAILURE);
	}
	*ret_nfds = (uint8_t)nfds;
	return len;
}

static void mutated(const char *name, size_t sample, const char *key, enum proto_mutation op,
		    const msgpack_object *val)
{
	uint8_t buf[PROTO_MAX_MSG], nfds;
	struct seed *s;
	const char *sname;
	size_t len = encode_sample(sample, buf, sizeof(buf), &nfds, &sname);
	ssize_t n;

	s = seed_new(name, nfds);
	n = proto_mutate(buf, len, key, op, val, s->data + 1, sizeof(s->data) - 1);
	if (n < 0) {
		fprintf(stderr, "gen-seeds: mutating %s for %s: %s\n", sname, name,
			strerror((int)-n));
		exit(EXIT_FAILURE);
	}
	s->len = 1 + (size_t)n;
}

static size_t sample_index(const char *name)
{
	struct proto_msg m;

	for (size_t i = 0; i < proto_sample_count(); i++)
		if (strcmp(proto_sample(i, 0, &m), name) == 0)
			return i;
	fprintf(stderr, "gen-seeds: no sample %s\n", name);
	exit(EXIT_FAILURE);
}

static void build_seeds(void)
{
	static char long_str[PROTO_MAX_STR + 1];
	uint8_t buf[PROTO_MAX_MSG], nfds;
	const char *name;
	char seed_name[64];
	size_t len;

	for (size_t i = 0; i < proto_sample_count(); i++) {
		len = encode_sample(i, buf, sizeof(buf), &nfds, &name);
		(void)snprintf(seed_name, sizeof(seed_name), "valid-%s", name);
		seed_bytes(seed_name, nfds, buf, len);
	}

	msgpack_object extra_elems[2] = {
		{.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = 1},
		{.type = MSGPACK_OBJECT_STR, .via.str = {.size = 1, .ptr = "x"}},
	};
	msgpack_object extra = {.type = MSGPACK_OBJECT_ARRAY,
				.via.array = {.size = 2, .ptr = extra_elems}};
	mutated("valid-hello-unknown-key", sample_index("hello"), "zz", MUT_ADD, &extra);

	/* Malformed: one per class of rejection the decoder makes. */
	len = encode_sample(sample_index("hello"), buf, sizeof(buf), &nfds, &name);
	seed_bytes("bad-truncated-hello", nfds, buf, len - 3);
	len = encode_sample(sample_index("region-release"), buf, sizeof(buf), &nfds, &name);
	buf[len] = 0xc0;
	seed_bytes("bad-trailing-byte", nfds, buf, len + 1);
	len = encode_sample(sample_index("region-announce"), buf, sizeof(buf), &nfds, &name);
	seed_bytes("bad-fd-count-announce", 0, buf, len);
	seed_bytes("bad-not-a-map", 0, "\x92\x01\x01", 3);
	seed_bytes("bad-huge-array", 0, "\xdd\xff\xff\xff\xff", 5);
	seed_bytes("bad-huge-map", 0, "\xdf\xff\xff\xff\xff", 5);

	msgpack_object v2 = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = 2};
	mutated("bad-version-2", sample_index("hello"), "v", MUT_REPLACE, &v2);
	mutated("bad-duplicate-id", sample_index("region-release"), "id", MUT_DUPLICATE, NULL);
	mutated("bad-missing-type", sample_index("error"), "t", MUT_REMOVE, NULL);
	msgpack_object five = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = 5};
	mutated("bad-wrong-type-eng", sample_index("hello"), "eng", MUT_REPLACE, &five);
	mutated("bad-enum-cls", sample_index("region-announce"), "cls", MUT_REPLACE, &five);
	memset(long_str, 's', PROTO_MAX_STR + 1);
	msgpack_object too_long = {.type = MSGPACK_OBJECT_STR,
				   .via.str = {.size = PROTO_MAX_STR + 1, .ptr = long_str}};
	mutated("bad-long-msg", sample_index("error"), "msg", MUT_REPLACE, &too_long);
	msgpack_object short_uuid = {.type = MSGPACK_OBJECT_BIN,
				     .via.bin = {.size = PROTO_UUID_LEN - 1, .ptr = long_str}};
	mutated("bad-short-uuid", sample_index("region-announce"), "dev", MUT_REPLACE, &short_uuid);
}

/* The meaning each seed claims must hold, or the corpus lies about what it covers. */
static int verify_seed(const struct seed *s)
{
	bool want_ok = strncmp(s->name, "valid-", 6) == 0;
	int fds[PROTO_MAX_FDS + 1] = {-1, -1};
	struct proto_msg m;
	size_t nfds = s->data[0];
	int r;

	for (size_t i = 0; i < nfds; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	r = proto_decode(s->data + 1, s->len - 1, fds, nfds, &m);
	if (r == 0)
		proto_msg_finish(&m);
	else
		for (size_t i = 0; i < nfds; i++)
			(void)safe_close(fds[i]);
	if ((r == 0) != want_ok) {
		fprintf(stderr, "gen-seeds: seed %s decodes with %s\n", s->name,
			r == 0 ? "success" : strerror(-r));
		return -EINVAL;
	}
	return 0;
}

static int write_file(const char *path, const void *p, size_t len)
{
	FILE *f = fopen(path, "we");

	if (!f)
		return negative_errno();
	if (fwrite(p, 1, len, f) != len) {
		(void)fclose(f);
		return -EIO;
	}
	return fclose(f) == 0 ? 0 : negative_errno();
}

static int check_file(const char *path, const struct seed *s)
{
	static uint8_t have[SEED_MAX + 1];
	_cleanup_fclose_ FILE *f = fopen(path, "re");
	size_t n;

	if (!f)
		return negative_errno();
	n = fread(have, 1, sizeof(have), f);
	return n == s->len && memcmp(have, s->data, n) == 0 ? 0 : -ESTALE;
}

/* ---- fuzz-supervisor sessions ----------------------------------------------------------- */

static struct seed sessions[MAX_SEEDS];
static size_t n_sessions;

static void session_add(struct seed *s, const struct proto_msg *m)
{
	uint8_t buf[PROTO_MAX_MSG];
	int fds[PROTO_MAX_FDS] = {-1};
	size_t len, nfds;

	if (proto_encode(m, buf, sizeof(buf), &len, fds, &nfds) < 0 ||
	    s->len + 3 + len > sizeof(s->data)) {
		fprintf(stderr, "gen-seeds: session %s: cannot add %s\n", s->name,
			proto_type_to_string(m->type));
		exit(EXIT_FAILURE);
	}
	s->data[s->len++] = (uint8_t)nfds;
	s->data[s->len++] = (uint8_t)(len >> 8);
	s->data[s->len++] = (uint8_t)len;
	memcpy(s->data + s->len, buf, len);
	s->len += len;
}

static struct seed *session_new(const char *name)
{
	struct seed *s = &sessions[n_sessions++];

	(void)snprintf(s->name, sizeof(s->name), "%s", name);
	s->len = 0;
	return s;
}

static void ctl(struct proto_msg *m, enum ctl_cmd cmd, uint32_t pid, enum ctl_action act)
{
	memset(m, 0, sizeof(*m));
	m->type = PROTO_CTL;
	m->ctl.cmd = cmd;
	m->ctl.pid = pid;
	m->ctl.act = act;
	m->ctl.dev = -1;
	m->ctl.arg = 8;
}

static void build_sessions(void)
{
	struct proto_msg m;
	struct seed *s;

	/* A shim: hello, regions, a version update, a release. */
	s = session_new("valid-shim");
	(void)proto_sample(sample_index("hello"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("region-announce"), 0, &m);
	session_add(s, &m);
	m.region.id = 18;
	m.region.cls = REGION_WEIGHTS;
	session_add(s, &m);
	m.region.weights_version = 3;
	session_add(s, &m);
	(void)proto_sample(sample_index("region-release"), 0, &m);
	session_add(s, &m);

	/* A shadow: hello, then fetches (its own region and an unknown one). */
	s = session_new("valid-fetch");
	(void)proto_sample(sample_index("hello"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("region-announce"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("region-fetch"), 0, &m);
	m.fetch.pid = 0; /* the target replaces pid 0 by its own */
	session_add(s, &m);
	m.fetch.id = 17;
	session_add(s, &m);

	/* belayerctl: every query, and a health check of a worker. */
	s = session_new("valid-ctl");
	for (int c = 0; c < _CTL_CMD_MAX; c++) {
		ctl(&m, (enum ctl_cmd)c, 0, CTL_ACT_NONE);
		session_add(s, &m);
	}
	s = session_new("valid-ctl-health-worker");
	(void)proto_sample(sample_index("hello"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("region-fd"), 0, &m);
	session_add(s, &m); /* a reply sent as a request */
	(void)proto_sample(sample_index("region-announce"), 0, &m);
	m.region.cls = REGION_WEIGHTS;
	session_add(s, &m);
	ctl(&m, CTL_HEALTH, 0, CTL_ACT_NONE);
	session_add(s, &m);
	ctl(&m, CTL_INJECT, 0, CTL_ACT_HANG);
	session_add(s, &m);

	/* A framework's step events, then belayerctl traj: all, and one trajectory. */
	s = session_new("valid-traj");
	(void)proto_sample(sample_index("traj-step-end"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("traj-step-begin"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("traj-step-end"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("traj-list"), 0, &m);
	m.traj_list.trajectory[0] = 0;
	session_add(s, &m);
	(void)proto_sample(sample_index("traj-list"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("traj-info"), 0, &m);
	session_add(s, &m); /* a reply sent as a request */

	/* Requests before hello, and hello twice. */
	s = session_new("valid-out-of-order");
	(void)proto_sample(sample_index("region-release"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("region-announce"), 0, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("hello"), 0, &m);
	session_add(s, &m);
	session_add(s, &m);
	(void)proto_sample(sample_index("error"), 0, &m);
	session_add(s, &m);
}

/* Every packet of a "valid-" session decodes. */
static int verify_session(const struct seed *s)
{
	for (size_t off = 0; off < s->len;) {
		int fds[PROTO_MAX_FDS + 1] = {-1, -1};
		struct proto_msg m;
		size_t nfds, len;
		int r;

		if (s->len - off < 3)
			return -EINVAL;
		nfds = s->data[off];
		len = (size_t)s->data[off + 1] << 8 | s->data[off + 2];
		off += 3;
		if (len > s->len - off || nfds > PROTO_MAX_FDS)
			return -EINVAL;
		for (size_t i = 0; i < nfds; i++)
			fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		r = proto_decode(s->data + off, len, fds, nfds, &m);
		if (r == 0)
			proto_msg_finish(&m);
		else
			for (size_t i = 0; i < nfds; i++)
				(void)safe_close(fds[i]);
		if (r < 0) {
			fprintf(stderr, "gen-seeds: session %s: packet at %zu: %s\n", s->name, off,
				strerror(-r));
			return r;
		}
		off += len;
	}
	return 0;
}

static bool in_set(const struct seed *set, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(set[i].name, name) == 0)
			return true;
	return false;
}

/* Writes (or checks) one target's corpus: exactly the seeds of set, nothing else. */
static int corpus(const char *dir, const char *target, const struct seed *set, size_t n, bool check)
{
	char path[4096];
	struct dirent *de;
	int failed = 0, r;
	DIR *d;

	(void)snprintf(path, sizeof(path), "%s/%s", dir, target);
	if (!check && mkdir(path, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "gen-seeds: mkdir %s: %m\n", path);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		(void)snprintf(path, sizeof(path), "%s/%s/%s", dir, target, set[i].name);
		r = check ? check_file(path, &set[i]) : write_file(path, set[i].data, set[i].len);
		if (r < 0) {
			fprintf(stderr, "gen-seeds: %s: %s\n", path,
				r == -ESTALE ? "differs from the generated seed" : strerror(-r));
			failed++;
		}
	}
	(void)snprintf(path, sizeof(path), "%s/%s", dir, target);
	d = opendir(path);
	if (!d) {
		fprintf(stderr, "gen-seeds: %s: %m\n", path);
		return failed + 1;
	}
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' && !in_set(set, n, de->d_name)) {
			fprintf(stderr, "gen-seeds: %s/%s is not a generated seed%s\n", path,
				de->d_name, check ? "" : "; remove it");
			failed++;
		}
	(void)closedir(d);
	return failed;
}

int main(int argc, char **argv)
{
	bool check = argc == 3 && strcmp(argv[1], "--check") == 0;
	const char *dir = check ? argv[2] : argc == 2 ? argv[1] : NULL;
	int failed = 0;

	if (!dir) {
		fprintf(stderr, "usage: gen-seeds [--check] CORPUS_DIR\n");
		return EXIT_FAILURE;
	}

	build_seeds();
	build_sessions();
	for (size_t i = 0; i < n_seeds; i++)
		if (verify_seed(&seeds[i]) < 0)
			failed++;
	for (size_t i = 0; i < n_sessions; i++)
		if (verify_session(&sessions[i]) < 0)
			failed++;
	if (failed)
		return EXIT_FAILURE;

	for (size_t t = 0; t < ARRAY_SIZE(targets); t++)
		failed += corpus(dir, targets[t], seeds, n_seeds, check);
	failed += corpus(dir, "fuzz-supervisor", sessions, n_sessions, check);
	if (failed && check)
		fprintf(stderr, "gen-seeds: regenerate with: gen-seeds %s\n", dir);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
