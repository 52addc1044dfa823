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
 *
 * fuzz-journal takes a mode byte (0: one record's payload for journal_decode, 1: a whole journal
 * file for journal_open) and then the bytes; fuzz-sidelog takes a side-effect log file as is.
 * Their "valid-" seeds decode (a journal file replays at least one record), "bad-" ones do not.
 *
 * fuzz-manifest takes a checkpoint's manifest.mpk as is: "valid-" seeds decode, "bad-" do not.
 *
 * fuzz-frame takes a split byte (its low 3 bits: how many split lengths follow), the split
 * lengths, then a client's bytes: "valid-" seeds are not refused by the gateway's request
 * framing scanner (with fuzz-frame's limits), "bad-" ones are, with the status they name.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "proto-samples.h"
#include "proto.h"
#include "supervisor-env-manifest.h"
#include "supervisor-gateway-frame.h"
#include "supervisor-journal.h"
#include "supervisor-sidelog.h"
#include "util.h"

#define MAX_SEEDS 96
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
	/* Two empty keys ahead of "v": msgpack-c gives them NULL bodies (found by fuzz-proto). */
	seed_bytes("bad-duplicate-empty-key", 0, "\x83\xa0\x64\xa0\x00\xa1v\x01", 8);

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
	/* Exec and file messages: a required field missing after argv and envv were decoded
	 * (their copies must be freed: fuzz-proto found them leaked), an empty output chunk, an
	 * argv string with a NUL inside. */
	mutated("bad-exec-missing-field", sample_index("env-exec"), "fl", MUT_REMOVE, NULL);
	msgpack_object empty_bin = {.type = MSGPACK_OBJECT_BIN, .via.bin = {.size = 0}};
	mutated("bad-exec-out-empty", sample_index("env-exec-out"), "data", MUT_REPLACE,
		&empty_bin);
	msgpack_object nul_str = {.type = MSGPACK_OBJECT_STR,
				  .via.str = {.size = 3, .ptr = "a\0b"}};
	msgpack_object nul_argv = {.type = MSGPACK_OBJECT_ARRAY,
				   .via.array = {.size = 1, .ptr = &nul_str}};
	mutated("bad-exec-argv-nul", sample_index("env-exec"), "argv", MUT_REPLACE, &nul_argv);
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

/* ---- fuzz-journal and fuzz-sidelog ------------------------------------------------------- */

static struct seed journal_seeds[MAX_SEEDS], sidelog_seeds[MAX_SEEDS];
static size_t n_journal_seeds, n_sidelog_seeds;

static struct seed *seed_in(struct seed *set, size_t *n, const char *name)
{
	struct seed *s = &set[(*n)++];

	(void)snprintf(s->name, sizeof(s->name), "%s", name);
	s->len = 0;
	return s;
}

static void seed_append(struct seed *s, const void *p, size_t len)
{
	if (len > sizeof(s->data) - s->len) {
		fprintf(stderr, "gen-seeds: seed %s too long\n", s->name);
		exit(EXIT_FAILURE);
	}
	memcpy(s->data + s->len, p, len);
	s->len += len;
}

static void journal_samples(struct journal_record *recs)
{
	memset(recs, 0, 6 * sizeof(*recs));
	recs[0].op = JOURNAL_WORKER;
	recs[0].pid = 4242;
	recs[0].uid = 1000;
	recs[0].gid = 100;
	recs[0].starttime = 123456789;
	(void)snprintf(recs[0].engine_id, sizeof(recs[0].engine_id), "vllm-0");
	recs[0].role = ROLE_PRIMARY;
	recs[0].rank = -1;
	recs[1].op = JOURNAL_ENGINE;
	recs[1].pid = 4240;
	recs[1].starttime = 123456700;
	(void)snprintf(recs[1].engine_id, sizeof(recs[1].engine_id), "vllm-0");
	recs[1].port = 8000;
	recs[2].op = JOURNAL_REGION;
	recs[2].pid = 4242;
	recs[2].region.id = 7;
	recs[2].region.va = 0x7f0000000000;
	recs[2].region.size = 8 << 20;
	recs[2].region.cls = REGION_KV;
	recs[2].region.order = 1;
	recs[2].region.weights_version = 3;
	memset(recs[2].region.device_uuid, 0xab, PROTO_UUID_LEN);
	recs[2].checksum = 0xdeadbeef;
	recs[2].checksum_version = 4;
	recs[3].op = JOURNAL_REGION_GONE;
	recs[3].pid = 4242;
	recs[3].region.id = 7;
	recs[4].op = JOURNAL_DEAD;
	recs[4].pid = 4242;
	recs[5].op = JOURNAL_WORKER_GONE;
	recs[5].pid = 4242;
	for (int i = 0; i < 6; i++)
		recs[i].region.fd = -1;
}

static size_t journal_frame(const struct journal_record *rec, uint8_t *buf)
{
	ssize_t n = journal_encode(rec, buf, JOURNAL_MAX_RECORD + 8);

	if (n < 0) {
		fprintf(stderr, "gen-seeds: journal_encode op %c: %s\n", rec->op,
			strerror((int)-n));
		exit(EXIT_FAILURE);
	}
	return (size_t)n;
}

/* A decode seed: mode byte 0, then one record's payload (without its frame). */
static void journal_payload(const char *name, const void *p, size_t len)
{
	struct seed *s = seed_in(journal_seeds, &n_journal_seeds, name);

	seed_append(s, "\0", 1);
	seed_append(s, p, len);
}

static void build_journal_seeds(void)
{
	static const char *const names[] = {"valid-worker", "valid-engine",
					    "valid-region", "valid-region-gone",
					    "valid-dead",   "valid-worker-gone"};
	struct journal_record recs[6];
	uint8_t buf[JOURNAL_MAX_RECORD + 8];
	struct seed *s;
	size_t len;

	journal_samples(recs);
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		len = journal_frame(&recs[i], buf);
		journal_payload(names[i], buf + 8, len - 8);
	}
	/* An empty engine id: msgpack-c gives the empty str a NULL body. */
	recs[0].engine_id[0] = '\0';
	len = journal_frame(&recs[0], buf);
	journal_payload("valid-worker-empty-engine", buf + 8, len - 8);
	journal_samples(recs);

	/* {"op": 'd', "pid": ...}: map header, "op", then the op's fixint at payload[4]. */
	len = journal_frame(&recs[4], buf);
	if (buf[8 + 4] != JOURNAL_DEAD) {
		fprintf(stderr, "gen-seeds: journal op not where expected\n");
		exit(EXIT_FAILURE);
	}
	buf[8 + 4] = 'q';
	journal_payload("bad-unknown-op", buf + 8, len - 8);
	len = journal_frame(&recs[2], buf);
	journal_payload("bad-truncated-region", buf + 8, len - 8 - 3);
	buf[len] = 0xc0;
	journal_payload("bad-trailing-byte", buf + 8, len - 8 + 1);
	journal_payload("bad-not-a-map", "\x92\x01\x01", 3);
	journal_payload("bad-huge-array", "\xdd\xff\xff\xff\xff", 5);
	journal_payload("bad-huge-map", "\xdf\xff\xff\xff\xff", 5);
	/* A map of 2^20 pairs in a 9-byte record: msgpack-c would allocate 32 MiB before noticing
	 * that the record ends (the decoder now walks the headers first). */
	journal_payload("bad-forged-map-size", "\xdf\x00\x10\x00\x00\xa2op\x64", 9);
	journal_samples(recs);
	{
		/* A primary rank's cuMemGetInfo answer, an engine's answers forgotten; free above
		 * total is refused (the decoder bounds free by total). */
		struct journal_record m = {.op = JOURNAL_MEM_INFO, .rank = 1};

		(void)snprintf(m.engine_id, sizeof(m.engine_id), "vllm-0");
		m.mem_info.seq = 2;
		m.mem_info.free = 70ull << 30;
		m.mem_info.total = 80ull << 30;
		memset(m.mem_info.device_uuid, 0xcd, PROTO_UUID_LEN);
		len = journal_frame(&m, buf);
		journal_payload("valid-mem-info", buf + 8, len - 8);
		m.mem_info.free = m.mem_info.total + 1;
		len = journal_frame(&m, buf);
		journal_payload("bad-mem-info-free-above-total", buf + 8, len - 8);
		m.op = JOURNAL_MEM_INFO_GONE;
		len = journal_frame(&m, buf);
		journal_payload("valid-mem-info-gone", buf + 8, len - 8);
	}

	/* Whole journals (mode byte 1): every op in order, then the same with a torn tail. */
	s = seed_in(journal_seeds, &n_journal_seeds, "valid-journal");
	seed_append(s, "\1", 1);
	for (size_t i = 0; i < ARRAY_SIZE(recs); i++) {
		len = journal_frame(&recs[i], buf);
		seed_append(s, buf, len);
	}
	s = seed_in(journal_seeds, &n_journal_seeds, "valid-journal-torn-tail");
	seed_append(s, "\1", 1);
	for (size_t i = 0; i < 3; i++) {
		len = journal_frame(&recs[i], buf);
		seed_append(s, buf, len);
	}
	len = journal_frame(&recs[3], buf);
	seed_append(s, buf, len / 2);
	s = seed_in(journal_seeds, &n_journal_seeds, "valid-journal-bad-crc-tail");
	seed_append(s, "\1", 1);
	len = journal_frame(&recs[0], buf);
	seed_append(s, buf, len);
	len = journal_frame(&recs[4], buf);
	buf[4] ^= 0x01;
	seed_append(s, buf, len);
	s = seed_in(journal_seeds, &n_journal_seeds, "bad-journal-huge-length");
	seed_append(s, "\1", 1);
	len = journal_frame(&recs[4], buf);
	buf[3] = 0x80;
	seed_append(s, buf, len);
}

static void sidelog_add(struct sv_sidelog *l, const struct envtrace_record *rec)
{
	int r = sidelog_append(l, rec);

	if (r < 0) {
		fprintf(stderr, "gen-seeds: sidelog_append: %s\n", strerror(-r));
		exit(EXIT_FAILURE);
	}
}

/* The side-effect log of a short session, through the real writer. */
static void sidelog_session(struct seed *s, bool empty_strings)
{
	char path[] = "/tmp/gen-seeds-sidelog-XXXXXX";
	static const char argv[] = "python3\0-c\0open('out', 'w')\0";
	struct envtrace_record rec = {.env_id = 3, .pid = 100, .ts_ns = 1000};
	struct sv_sidelog *l;
	uint8_t buf[4096];
	ssize_t n;
	int fd = mkstemp(path);

	if (fd < 0 || sidelog_open(path, &l) < 0) {
		fprintf(stderr, "gen-seeds: %s: %m\n", path);
		exit(EXIT_FAILURE);
	}
	rec.type = ENVTRACE_EV_FORK;
	rec.aux = 101;
	sidelog_add(l, &rec);
	rec.type = ENVTRACE_EV_EXEC;
	rec.pid = 101;
	rec.ts_ns += 10;
	rec.exe = empty_strings ? "" : "/usr/bin/python3";
	rec.argv = empty_strings ? "\0" : argv;
	rec.argv_len = empty_strings ? 2 : sizeof(argv) - 1;
	sidelog_add(l, &rec);
	rec.type = ENVTRACE_EV_FILE;
	rec.op = ENVTRACE_OP_OPEN;
	rec.npaths = 1;
	rec.path[0] = empty_strings ? "" : "/work/out";
	sidelog_add(l, &rec);
	rec.op = ENVTRACE_OP_RENAME;
	rec.npaths = 2;
	rec.path[1] = "/work/out.1";
	sidelog_add(l, &rec);
	rec.type = ENVTRACE_EV_FULL_DIFF;
	rec.op = ENVTRACE_FULL_MMAP_SHARED;
	rec.npaths = 0;
	sidelog_add(l, &rec);
	rec.type = ENVTRACE_EV_EXIT;
	rec.aux = -1;
	sidelog_add(l, &rec);
	sidelog_close(l);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		seed_append(s, buf, (size_t)n);
	(void)close(fd);
	(void)unlink(path);
}

/* A seed of a string literal's bytes (without its NUL). */
#define SIDELOG_SEED(name, lit) \
	seed_append(seed_in(sidelog_seeds, &n_sidelog_seeds, name), lit, sizeof(lit) - 1)

static void build_sidelog_seeds(void)
{
	struct seed *s, *full;

	full = seed_in(sidelog_seeds, &n_sidelog_seeds, "valid-session");
	sidelog_session(full, false);
	s = seed_in(sidelog_seeds, &n_sidelog_seeds, "valid-empty-strings");
	sidelog_session(s, true);
	/* A live writer's last record, cut: not reported, not an error. */
	s = seed_in(sidelog_seeds, &n_sidelog_seeds, "valid-torn-tail");
	seed_append(s, full->data, full->len - 3);

	SIDELOG_SEED("bad-not-a-map", "\x92\x01\x01");
	SIDELOG_SEED("bad-no-kind", "\x81\xa3pid\x01");
	/* Octal escapes: a hex one would run on into "exec". */
	SIDELOG_SEED("bad-argv-not-array", "\202\241t\244exec\244argv\005");
	SIDELOG_SEED("bad-argv-not-strings", "\202\241t\244exec\244argv\221\005");
	/* Five bytes asking msgpack-c for 2^32 elements (128 GiB; ASan gave up): found when
	 * fuzz-sidelog was added; the reader now walks the headers first and refuses what cannot
	 * fit in a record. */
	SIDELOG_SEED("bad-huge-array", "\xdd\xff\xff\xff\xff");
	SIDELOG_SEED("bad-huge-map", "\xdf\xff\xff\xff\xff");
	/* A str longer than a record may be. */
	SIDELOG_SEED("bad-record-too-big", "\xdb\x00\x01\x00\x01");
}

static int count_journal(void *userdata, const struct journal_record *rec)
{
	(void)rec;
	(*(size_t *)userdata)++;
	return 0;
}

static int count_sidelog(const struct sidelog_entry *e, void *userdata)
{
	(void)e;
	(*(size_t *)userdata)++;
	return 0;
}

/* "valid-" journal seeds decode (a file replays at least one record), "bad-" ones do not. */
static int verify_journal_seed(const struct seed *s)
{
	bool want_ok = strncmp(s->name, "valid-", 6) == 0;
	struct journal_record rec;
	size_t n = 0;
	bool ok;

	if (s->len < 1)
		return -EINVAL;
	if (s->data[0] == 0) {
		ok = journal_decode(s->data + 1, s->len - 1, &rec) == 0;
	} else {
		char dir[] = "/tmp/gen-seeds-journal-XXXXXX", path[sizeof(dir) + 16];
		struct sv_journal *j;
		FILE *f;

		if (!mkdtemp(dir))
			return negative_errno();
		(void)snprintf(path, sizeof(path), "%s/journal", dir);
		f = fopen(path, "we");
		if (!f || fwrite(s->data + 1, 1, s->len - 1, f) != s->len - 1 || fclose(f) != 0)
			return -EIO;
		if (journal_open(dir, count_journal, &n, &j) < 0)
			return -EIO;
		journal_close(j);
		(void)unlink(path);
		(void)rmdir(dir);
		ok = n > 0;
	}
	if (ok != want_ok) {
		fprintf(stderr, "gen-seeds: fuzz-journal seed %s %s\n", s->name,
			ok ? "decodes" : "does not decode");
		return -EINVAL;
	}
	return 0;
}

/* "valid-" side-effect logs read with at least one entry, "bad-" ones fail with EBADMSG. */
static int verify_sidelog_seed(const struct seed *s)
{
	bool want_ok = strncmp(s->name, "valid-", 6) == 0;
	char path[] = "/tmp/gen-seeds-sidelog-XXXXXX";
	size_t n = 0;
	int fd = mkstemp(path), r;

	if (fd < 0)
		return negative_errno();
	if (write(fd, s->data, s->len) != (ssize_t)s->len) {
		(void)close(fd);
		return -EIO;
	}
	(void)close(fd);
	r = sidelog_read(path, count_sidelog, &n);
	(void)unlink(path);
	if (want_ok ? r < 0 || n == 0 : r != -EBADMSG) {
		fprintf(stderr, "gen-seeds: fuzz-sidelog seed %s: %zu entries, %s\n", s->name, n,
			r < 0 ? strerror(-r) : "no error");
		return -EINVAL;
	}
	return 0;
}

static struct seed manifest_seeds[MAX_SEEDS];
static size_t n_manifest_seeds;

static void manifest_seed(const char *name, const struct env_manifest *m, size_t cut)
{
	struct seed *s = seed_in(manifest_seeds, &n_manifest_seeds, name);
	char *buf;
	size_t len;

	if (env_manifest_encode(m, &buf, &len) < 0) {
		fprintf(stderr, "gen-seeds: env_manifest_encode %s failed\n", name);
		exit(EXIT_FAILURE);
	}
	seed_append(s, buf, len - cut);
	free(buf);
}

static void manifest_add(struct env_manifest *m, const struct env_entry *e)
{
	if (env_manifest_add(m, e) < 0) {
		fprintf(stderr, "gen-seeds: env_manifest_add %s failed\n", e->path);
		exit(EXIT_FAILURE);
	}
}

static void manifest_header(struct env_manifest *m, const char *id, const char *parent)
{
	memset(m, 0, sizeof(*m));
	(void)snprintf(m->id, sizeof(m->id), "%s", id);
	(void)snprintf(m->parent, sizeof(m->parent), "%s", parent);
	(void)snprintf(m->env, sizeof(m->env), "env-1");
	(void)snprintf(m->trajectory, sizeof(m->trajectory), "traj");
	memset(m->uuid, 0x5a, sizeof(m->uuid));
	m->turn = 7;
	m->prefix_tokens = 4096;
	m->prefix_hash = 0xdeadbeef;
}

/* Every kind of entry, and xattrs of every namespace (overlay's own, a file capability, an
 * empty value). */
static void manifest_chain(struct env_manifest *m)
{
	static const uint8_t cap[20] = {0x00, 0x00, 0x00, 0x02, 0x00, 0x20}; /* cap_net_raw=p */
	static const uint8_t origin[] = {0x00, 0xfb, 0x15, 0x01, 0x81};	     /* a file handle */
	struct env_xattr dir_x[] = {
		{.name = "trusted.overlay.opaque", .value = "y", .len = 1},
		{.name = "trusted.overlay.redirect", .value = "/old", .len = 4},
		{.name = "user.empty", .value = "", .len = 0},
	};
	struct env_xattr file_x[] = {
		{.name = "user.x", .value = "new-x", .len = 5},
		{.name = "security.capability", .value = (void *)cap, .len = sizeof(cap)},
		{.name = "trusted.overlay.origin", .value = (void *)origin, .len = sizeof(origin)},
	};
	struct env_entry e = {.path = "work",
			      .kind = ENV_ENTRY_DIR,
			      .mode = 0755,
			      .opaque = true,
			      .xattrs = dir_x,
			      .n_xattrs = ARRAY_SIZE(dir_x)};

	manifest_header(m, "c00000002", "c00000001");
	manifest_add(m, &e);
	e = (struct env_entry){.path = "work/a",
			       .kind = ENV_ENTRY_REG,
			       .mode = 0644,
			       .size = 12,
			       .data_key = 3,
			       .xattrs = file_x,
			       .n_xattrs = ARRAY_SIZE(file_x)};
	(void)snprintf(e.src, sizeof(e.src), "c00000001");
	manifest_add(m, &e);
	e = (struct env_entry){
		.path = "work/b", .kind = ENV_ENTRY_HARDLINK, .mode = 0644, .hardlink = "work/a"};
	manifest_add(m, &e);
	e = (struct env_entry){
		.path = "work/l", .kind = ENV_ENTRY_SYMLINK, .mode = 0777, .target = "/etc/passwd"};
	manifest_add(m, &e);
	e = (struct env_entry){.path = "gone", .kind = ENV_ENTRY_WHITEOUT};
	manifest_add(m, &e);
	e = (struct env_entry){.path = "work/fifo", .kind = ENV_ENTRY_FIFO, .mode = 0644};
	manifest_add(m, &e);
	e = (struct env_entry){.path = "work/stale.sock", .kind = ENV_ENTRY_SOCKET, .mode = 0755};
	manifest_add(m, &e);
}

static void build_manifest_seeds(void)
{
	struct env_xattr many[ENV_XATTRS_MAX + 1];
	char names[ENV_XATTRS_MAX + 1][16];
	struct env_manifest m;

	manifest_header(&m, "c00000001", "");
	manifest_seed("valid-root-empty", &m, 0);
	manifest_chain(&m);
	manifest_seed("valid-chain", &m, 0);
	manifest_seed("bad-truncated", &m, 1);
	/* The delta's path (issue 23), the tracer's. */
	(void)snprintf(m.delta_path, sizeof(m.delta_path), "%s", ENV_DELTA_PATH_DIRTY_SET);
	manifest_seed("valid-chain-dirty-set", &m, 0);
	/* Its kind and its images' checkpoint (issue 23 item 3). */
	(void)snprintf(m.kind, sizeof(m.kind), "%s", ENV_KIND_FS_ONLY);
	(void)snprintf(m.images, sizeof(m.images), "%s", "c00000001");
	manifest_seed("valid-chain-fs-only", &m, 0);
	/* A pre-copied delta (issue 23 item 2): its rounds and bytes; rounds past the bound. */
	m.precopy_rounds = 2;
	m.precopy_bytes = 1600000;
	m.precopy_frozen_bytes = 4096;
	manifest_seed("valid-chain-precopy", &m, 0);
	m.precopy_rounds = ENV_PRECOPY_ROUNDS_MAX + 1;
	manifest_seed("bad-precopy-rounds", &m, 0);
	env_manifest_finish(&m);

	/* Past the decoder's bounds: one xattr more than an entry may hold, a name of no
	 * namespace. Built past env_manifest_add, which refuses them too. */
	manifest_chain(&m);
	for (size_t i = 0; i < ARRAY_SIZE(many); i++) {
		(void)snprintf(names[i], sizeof(names[i]), "user.%zu", i);
		many[i] = (struct env_xattr){.name = names[i], .value = "v", .len = 1};
	}
	{
		struct env_xattr *saved = m.entries[1].xattrs;
		uint32_t n_saved = m.entries[1].n_xattrs;

		m.entries[1].xattrs = many;
		m.entries[1].n_xattrs = ARRAY_SIZE(many);
		manifest_seed("bad-xattrs-too-many", &m, 0);
		many[0].name = "nonamespace";
		m.entries[1].n_xattrs = 1;
		manifest_seed("bad-xattr-no-namespace", &m, 0);
		m.entries[1].xattrs = saved;
		m.entries[1].n_xattrs = n_saved;
	}
	env_manifest_finish(&m);
}

static int verify_manifest_seed(const struct seed *s)
{
	bool want_ok = strncmp(s->name, "valid-", 6) == 0;
	struct env_manifest m;
	int r = env_manifest_decode(s->data, s->len, &m);

	if (r >= 0)
		env_manifest_finish(&m);
	if (want_ok ? r < 0 : r != -EBADMSG) {
		fprintf(stderr, "gen-seeds: fuzz-manifest seed %s: %s\n", s->name,
			r < 0 ? strerror(-r) : "decodes");
		return -EINVAL;
	}
	return 0;
}

/* ---- fuzz-frame -------------------------------------------------------------------------- */

/* fuzz-frame's limits */
#define FRAME_MAX_HEADER 256
#define FRAME_MAX_BODY	 1024

static struct seed frame_seeds[MAX_SEEDS];
static size_t n_frame_seeds;
static int frame_codes[MAX_SEEDS]; /* 0: not refused */

static void frame_seed(const char *name, int code, const char *req)
{
	/* split at 1, 7 and 30 bytes, in turn: a line and a chunk cut in the middle */
	static const uint8_t split[] = {3, 1, 7, 30};
	struct seed *s;

	frame_codes[n_frame_seeds] = code;
	s = seed_in(frame_seeds, &n_frame_seeds, name);
	seed_append(s, split, sizeof(split));
	seed_append(s, req, strlen(req));
}

static void build_frame_seeds(void)
{
	char big[512];

	frame_seed("valid-get", 0, "GET /health HTTP/1.1\r\nHost: gw\r\n\r\n");
	frame_seed("valid-post-content-length", 0,
		   "POST /generate HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
		   "Content-Length: 16\r\n\r\n{\"text\": \"hi\"}\n");
	frame_seed("valid-post-chunked", 0,
		   "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
		   "5\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\n\r\n");
	frame_seed("valid-chunked-trailer", 0,
		   "POST /generate HTTP/1.1\r\ntransfer-encoding:  Chunked \r\n\r\n"
		   "A\r\n0123456789\r\n0\r\nX-Checksum: 1\r\n\r\n");
	frame_seed("valid-pipelined", 0,
		   "GET /health HTTP/1.1\r\n\r\nPOST /generate HTTP/1.1\r\nContent-Length: 2\r\n"
		   "\r\n{}");
	frame_seed("valid-leading-empty-lines", 0, "\r\n\nHEAD / HTTP/1.0\n\n");
	frame_seed("valid-partial-body", 0,
		   "PUT /x HTTP/1.1\r\nContent-Length: 100\r\n\r\nonly part");
	frame_seed("bad-400-chunk-extension", 400,
		   "POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
		   "5;name=value\r\nhello\r\n0\r\n\r\n");
	frame_seed("bad-400-chunk-hex", 400,
		   "POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
		   "0x5\r\nhello\r\n0\r\n\r\n");
	frame_seed("bad-400-chunk-no-crlf", 400,
		   "POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
		   "2\r\nhello\r\n0\r\n\r\n");
	frame_seed("bad-400-content-length-and-chunked", 400,
		   "POST /generate HTTP/1.1\r\nContent-Length: 5\r\n"
		   "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
	frame_seed("bad-400-content-length-differs", 400,
		   "POST /generate HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}");
	frame_seed("bad-400-request-line", 400, "GET /\r\n\r\n");
	frame_seed("bad-501-method", 501, "TRACE / HTTP/1.1\r\n\r\n");
	frame_seed("bad-501-transfer-encoding", 501,
		   "POST /generate HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
	frame_seed("bad-413-content-length", 413,
		   "POST /generate HTTP/1.1\r\nContent-Length: 1025\r\n\r\n");
	frame_seed("bad-413-chunked", 413,
		   "POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
		   "401\r\n{\"text\": ");
	(void)snprintf(big, sizeof(big), "GET / HTTP/1.1\r\nX-Long: %0300d\r\n\r\n", 0);
	frame_seed("bad-431-header", 431, big);
	frame_seed("bad-431-trailer", 431,
		   "POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
		   "X-Trailer: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n");
}

/* Fed whole, the request is refused with the status its name says, or not at all. */
static int verify_frame_seed(size_t i)
{
	const struct seed *s = &frame_seeds[i];
	size_t skip = 1 + (s->data[0] & 7), used;
	struct gw_frame_refusal ret = {0};
	struct gw_frame f;
	bool refused;

	gw_frame_init(&f, FRAME_MAX_HEADER, FRAME_MAX_BODY);
	refused = gw_frame_feed(&f, (const char *)s->data + skip, s->len - skip, &used, &ret);
	gw_frame_finish(&f);
	if (refused != (frame_codes[i] != 0) || (refused && ret.code != frame_codes[i])) {
		fprintf(stderr, "gen-seeds: fuzz-frame seed %s: %s %d\n", s->name,
			refused ? "refused" : "not refused", refused ? ret.code : 0);
		return -EINVAL;
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

	log_set_level(LOG_LEVEL_ERROR); /* journal_open warns of the torn tails it truncates */
	build_seeds();
	build_sessions();
	build_journal_seeds();
	build_sidelog_seeds();
	build_manifest_seeds();
	build_frame_seeds();
	for (size_t i = 0; i < n_seeds; i++)
		if (verify_seed(&seeds[i]) < 0)
			failed++;
	for (size_t i = 0; i < n_sessions; i++)
		if (verify_session(&sessions[i]) < 0)
			failed++;
	for (size_t i = 0; i < n_journal_seeds; i++)
		if (verify_journal_seed(&journal_seeds[i]) < 0)
			failed++;
	for (size_t i = 0; i < n_sidelog_seeds; i++)
		if (verify_sidelog_seed(&sidelog_seeds[i]) < 0)
			failed++;
	for (size_t i = 0; i < n_manifest_seeds; i++)
		if (verify_manifest_seed(&manifest_seeds[i]) < 0)
			failed++;
	for (size_t i = 0; i < n_frame_seeds; i++)
		if (verify_frame_seed(i) < 0)
			failed++;
	if (failed)
		return EXIT_FAILURE;

	for (size_t t = 0; t < ARRAY_SIZE(targets); t++)
		failed += corpus(dir, targets[t], seeds, n_seeds, check);
	failed += corpus(dir, "fuzz-supervisor", sessions, n_sessions, check);
	failed += corpus(dir, "fuzz-journal", journal_seeds, n_journal_seeds, check);
	failed += corpus(dir, "fuzz-sidelog", sidelog_seeds, n_sidelog_seeds, check);
	failed += corpus(dir, "fuzz-manifest", manifest_seeds, n_manifest_seeds, check);
	failed += corpus(dir, "fuzz-frame", frame_seeds, n_frame_seeds, check);
	if (failed && check)
		fprintf(stderr, "gen-seeds: regenerate with: gen-seeds %s\n", dir);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
