/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "fdpass.h"
#include "proto-samples.h"
#include "proto.h"
#include "test-util.h"
#include "util.h"

static uint8_t buf[PROTO_MAX_MSG + 1024];
static uint8_t mut[PROTO_MAX_MSG + 1024];

static size_t count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	size_t n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	(void)closedir(d);
	return n - 1;
}

static bool fd_is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static int new_memfd(void)
{
	int fd = memfd_create("proto-test", MFD_CLOEXEC);

	assert_true(fd >= 0);
	return fd;
}

static size_t encode(const struct proto_msg *m, uint8_t *out, size_t cap)
{
	int fds[PROTO_MAX_FDS];
	size_t len = 0, nfds = 0;

	assert_int_equal(proto_encode(m, out, cap, &len, fds, &nfds), 0);
	assert_int_equal(nfds, proto_type_nfds(m->type));
	return len;
}

/* Decodes with nfds fresh fds; checks the fd contract whatever the result. */
static int decode_with_fds(const void *p, size_t len, size_t nfds)
{
	int fds[4];
	struct proto_msg m;
	int r;

	assert_true(nfds <= ARRAY_SIZE(fds));
	for (size_t i = 0; i < nfds; i++)
		fds[i] = new_memfd();
	r = proto_decode(p, len, fds, nfds, &m);
	if (r == 0) {
		proto_msg_finish(&m);
		for (size_t i = 0; i < nfds; i++)
			assert_false(fd_is_open(fds[i]));
	} else {
		const uint8_t zero[sizeof(m)] = {0};

		assert_memory_equal(&m, zero, sizeof(m));
		for (size_t i = 0; i < nfds; i++) {
			assert_true(fd_is_open(fds[i])); /* the caller's on failure */
			(void)safe_close(fds[i]);
		}
	}
	return r;
}

/* Encodes sample i, so that tests can mutate it. */
static size_t sample_bytes(size_t i, uint8_t *out, size_t cap, size_t *ret_nfds,
			   struct proto_msg *ret_msg)
{
	struct proto_msg m;
	size_t len;

	assert_non_null(proto_sample(i, 0, &m));
	len = encode(&m, out, cap);
	*ret_nfds = (size_t)proto_type_nfds(m.type);
	if (ret_msg)
		*ret_msg = m;
	return len;
}

static size_t sample_named(const char *name, uint8_t *out, size_t cap, size_t *ret_nfds)
{
	struct proto_msg m;

	for (size_t i = 0; i < proto_sample_count(); i++)
		if (strcmp(proto_sample(i, 0, &m), name) == 0)
			return sample_bytes(i, out, cap, ret_nfds, NULL);
	fail_msg("no sample %s", name);
	return 0;
}

static void every_type_round_trips(void **state)
{
	bool type_seen[_PROTO_TYPE_MAX] = {false};

	for (size_t i = 0; i < proto_sample_count(); i++) {
		int fd = new_memfd();
		struct proto_msg m, got;
		int fds[PROTO_MAX_FDS];
		size_t len, nfds;
		const char *name = proto_sample(i, fd, &m);

		assert_int_equal(proto_encode(&m, buf, sizeof(buf), &len, fds, &nfds), 0);
		assert_int_equal(nfds, proto_type_nfds(m.type));
		if (nfds)
			assert_int_equal(fds[0], fd);
		assert_int_equal(proto_decode(buf, len, fds, nfds, &got), 0);
		if (!proto_msg_same(&m, &got))
			fail_msg("sample %s does not round-trip", name);
		type_seen[m.type] = true;
		proto_msg_finish(&got);
		if (nfds)
			assert_false(fd_is_open(fd));
		else
			(void)safe_close(fd);
	}
	for (int t = 1; t < _PROTO_TYPE_MAX; t++)
		if (proto_type_to_string(t) && !type_seen[t])
			fail_msg("no sample of type %s", proto_type_to_string(t));
}

static void wire_format_is_as_documented(void **state)
{
	/* Pinned bytes: a change here breaks every deployed peer, so it must be deliberate. */
	static const uint8_t want[] = {
		0x83, 0xa1, 'v', 0x01, 0xa1, 't', 0x03, 0xa2, 'i', 'd', 0x11,
	};
	struct proto_msg m = {.type = PROTO_REGION_RELEASE, .release.id = 17};
	char keys[PROTO_MAX_KEYS][16];
	size_t len, nfds;
	int n;

	len = encode(&m, buf, sizeof(buf));
	assert_int_equal(len, sizeof(want));
	assert_memory_equal(buf, want, sizeof(want));

	static const struct {
		const char *sample;
		const char *keys;
	} layouts[] = {
		{"hello", "v t pid eng role rank devs"},
		{"region-announce", "v t id dev va size cls ord wver"},
		{"region-release", "v t id"},
		{"error", "v t code re msg"},
	};
	for (size_t i = 0; i < ARRAY_SIZE(layouts); i++) {
		char joined[128] = "";

		len = sample_named(layouts[i].sample, buf, sizeof(buf), &nfds);
		n = proto_keys(buf, len, keys, ARRAY_SIZE(keys));
		assert_true(n > 0);
		for (int k = 0; k < n; k++) {
			if (k)
				strcat(joined, " ");
			strcat(joined, keys[k]);
		}
		assert_string_equal(joined, layouts[i].keys);
	}
}

static void send_and_recv_over_a_socket(void **state)
{
	int sv[2], fd = new_memfd();
	struct proto_msg m, got;
	size_t before;

	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(ftruncate(fd, 4096), 0);

	for (size_t i = 0; i < proto_sample_count(); i++) {
		(void)proto_sample(i, fd, &m);
		assert_int_equal(proto_send(sv[0], &m, 0), 0);
		assert_int_equal(proto_recv(sv[1], &got, 0), 0);
		if (proto_type_nfds(m.type) == 1) {
			int *got_fd =
				m.type == PROTO_REGION_FD     ? &got.region_fd.region.fd
				: m.type == PROTO_PROMOTE_MAP ? &got.promote_map.fd
				: m.type == PROTO_NCCL_COMM   ? &got.nccl_comm.fd
				: m.type == PROTO_ENV_EXEC    ? &got.env_exec.fd
				: m.type == PROTO_ENV_FILE_WRITE || m.type == PROTO_ENV_FILE_DATA
					? &got.env_file.fd
					: &got.region.fd;
			struct stat a, b;

			/* A new fd for the same memory. */
			assert_int_not_equal(*got_fd, fd);
			assert_int_equal(fstat(fd, &a), 0);
			assert_int_equal(fstat(*got_fd, &b), 0);
			assert_int_equal(a.st_ino, b.st_ino);
			assert_int_equal(b.st_size, 4096);
			*got_fd = safe_close(*got_fd);
			*got_fd = fd;
		}
		assert_true(proto_msg_same(&m, &got));
		/* The decoded blobs are got's own; its fd is the sample's, closed at the end. */
		if (m.type == PROTO_ENV_EXEC || m.type == PROTO_ENV_EXEC_OUT) {
			if (m.type == PROTO_ENV_EXEC)
				got.env_exec.fd = -1;
			proto_msg_finish(&got);
		}
	}

	/* A packet that fails to decode: its fd is closed, nothing leaks. */
	(void)proto_sample(0, -1, &m);
	size_t len = encode(&m, buf, sizeof(buf));
	assert_int_equal(fdpass_send(sv[0], buf, len, &fd, 1, 0), (ssize_t)len);
	before = count_open_fds();
	assert_int_equal(proto_recv(sv[1], &got, 0), -EBADMSG);
	assert_int_equal(count_open_fds(), before);

	/* Bigger than any message may be. */
	memset(buf, 0xc0, PROTO_MAX_MSG + 1);
	assert_int_equal(fdpass_send(sv[0], buf, PROTO_MAX_MSG + 1, NULL, 0, 0), PROTO_MAX_MSG + 1);
	assert_int_equal(proto_recv(sv[1], &got, 0), -EMSGSIZE);

	assert_int_equal(proto_recv(sv[1], &got, MSG_DONTWAIT), -EAGAIN);
	(void)safe_close(sv[0]);
	assert_int_equal(proto_recv(sv[1], &got, 0), -ECONNRESET);
	(void)safe_close(sv[1]);
	(void)safe_close(fd);
}

static void send_error_formats_a_reply(void **state)
{
	int sv[2];
	struct proto_msg got;

	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(proto_send_error(sv[0], -EPERM, PROTO_REGION_ANNOUNCE, "region %d: %s", 7,
					  "not yours"),
			 0);
	assert_int_equal(proto_recv(sv[1], &got, 0), 0);
	assert_int_equal(got.type, PROTO_ERROR);
	assert_int_equal(got.error.code, EPERM);
	assert_int_equal(got.error.in_reply_to, PROTO_REGION_ANNOUNCE);
	assert_string_equal(got.error.message, "region 7: not yours");

	/* A long message is cut to fit, never refused. */
	char long_text[600];
	memset(long_text, 'q', sizeof(long_text) - 1);
	long_text[sizeof(long_text) - 1] = '\0';
	assert_int_equal(proto_send_error(sv[0], ENOSPC, 0, "%s", long_text), 0);
	assert_int_equal(proto_recv(sv[1], &got, 0), 0);
	assert_int_equal(strlen(got.error.message), PROTO_MAX_STR);

	assert_int_equal(proto_send_error(sv[0], 0, 0, "no code"), -EINVAL);
	(void)safe_close(sv[0]);
	(void)safe_close(sv[1]);
}

static void encode_rejects_invalid_messages(void **state)
{
	struct proto_msg m;
	int fds[PROTO_MAX_FDS];
	size_t len, nfds;

#define EXPECT_EINVAL(sample, mutate)                                                            \
	do {                                                                                     \
		for (size_t i_ = 0; i_ < proto_sample_count(); i_++)                             \
			if (strcmp(proto_sample(i_, 3, &m), sample) == 0)                        \
				break;                                                           \
		mutate;                                                                          \
		assert_int_equal(proto_encode(&m, buf, sizeof(buf), &len, fds, &nfds), -EINVAL); \
	} while (0)

	EXPECT_EINVAL("hello", m.type = 0);
	EXPECT_EINVAL("hello", m.type = _PROTO_TYPE_MAX);
	EXPECT_EINVAL("hello", m.hello.pid = 0);
	EXPECT_EINVAL("hello", m.hello.rank = -2);
	EXPECT_EINVAL("hello", m.hello.role = _ROLE_MAX);
	EXPECT_EINVAL("hello", m.hello.role = (enum worker_role) - 1);
	EXPECT_EINVAL("hello", m.hello.n_devices = PROTO_MAX_DEVICES + 1);
	EXPECT_EINVAL("hello", memset(m.hello.engine_id, 'a', sizeof(m.hello.engine_id)));
	EXPECT_EINVAL("region-announce", m.region.fd = -1);
	EXPECT_EINVAL("region-announce", m.region.cls = _REGION_CLASS_MAX);
	EXPECT_EINVAL("error", m.error.code = 0);
	EXPECT_EINVAL("error", m.error.code = -EPERM);
	EXPECT_EINVAL("error", memset(m.error.message, 'a', sizeof(m.error.message)));
#undef EXPECT_EINVAL

	/* An fd-carrying type needs somewhere to put the fd. */
	(void)proto_sample(3, 3, &m);
	assert_int_equal(m.type, PROTO_REGION_ANNOUNCE);
	assert_int_equal(proto_encode(&m, buf, sizeof(buf), &len, NULL, NULL), -EINVAL);
}

static void encode_reports_short_buffers(void **state)
{
	for (size_t i = 0; i < proto_sample_count(); i++) {
		struct proto_msg m;
		int fds[PROTO_MAX_FDS];
		size_t len, nfds, full;

		(void)proto_sample(i, 3, &m);
		full = encode(&m, buf, sizeof(buf));
		for (size_t cap = 0; cap < full; cap++)
			assert_int_equal(proto_encode(&m, buf, cap, &len, fds, &nfds), -ENOBUFS);
		assert_int_equal(proto_encode(&m, buf, full, &len, fds, &nfds), 0);
		assert_int_equal(len, full);
	}
}

static void truncation_at_every_offset_is_rejected(void **state)
{
	for (size_t i = 0; i < proto_sample_count(); i++) {
		size_t nfds, len = sample_bytes(i, buf, sizeof(buf), &nfds, NULL);

		for (size_t cut = 0; cut < len; cut++)
			if (decode_with_fds(buf, cut, nfds) != -EBADMSG)
				fail_msg("sample %zu cut at %zu of %zu bytes decoded", i, cut, len);
		assert_int_equal(decode_with_fds(buf, len, nfds), 0);
	}
}

static void trailing_bytes_are_rejected(void **state)
{
	size_t nfds, len = sample_named("region-release", buf, sizeof(buf), &nfds);

	buf[len] = 0xc0;
	assert_int_equal(decode_with_fds(buf, len + 1, nfds), -EBADMSG);
	/* A second whole message in the same packet. */
	memcpy(buf + len, buf, len);
	assert_int_equal(decode_with_fds(buf, 2 * len, nfds), -EBADMSG);
}

static void oversized_packets_are_rejected(void **state)
{
	static char big[PROTO_MAX_MSG];
	msgpack_object blob = {.type = MSGPACK_OBJECT_BIN, .via.bin = {.ptr = big}};
	size_t nfds, len = sample_named("region-release", buf, sizeof(buf), &nfds);
	ssize_t n;

	/* An unknown key is ignored, as long as the packet stays within PROTO_MAX_MSG... */
	blob.via.bin.size = PROTO_MAX_MSG - len - 16;
	n = proto_mutate(buf, len, "pad", MUT_ADD, &blob, mut, sizeof(mut));
	assert_true(n > 0 && n <= PROTO_MAX_MSG);
	assert_int_equal(decode_with_fds(mut, (size_t)n, nfds), 0);

	/* ...and one byte more is too much. */
	blob.via.bin.size = PROTO_MAX_MSG - (size_t)n + blob.via.bin.size + 1;
	n = proto_mutate(buf, len, "pad", MUT_ADD, &blob, mut, sizeof(mut));
	assert_int_equal(n, PROTO_MAX_MSG + 1);
	assert_int_equal(decode_with_fds(mut, (size_t)n, nfds), -EBADMSG);
}

static void non_maps_are_rejected(void **state)
{
	static const struct {
		const char *bytes;
		size_t len;
	} cases[] = {
		{"\x92\x01\x01", 3}, /* array */
		{"\x01", 1},	     /* int */
		{"\xa1v", 2},	     /* str */
		{"\xc0", 1},	     /* nil */
		{"\xc3", 1},	     /* true */
		{"\xc4\x01v", 3},    /* bin */
		{"\xc1", 1},	     /* never-used byte */
		{"\x80", 1},	     /* empty map: no version */
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
		assert_int_equal(decode_with_fds(cases[i].bytes, cases[i].len, 0), -EBADMSG);
	assert_int_equal(decode_with_fds("", 0, 0), -EBADMSG);
}

static void huge_declared_sizes_are_rejected_cheaply(void **state)
{
	/* Headers promising more entries or bytes than the packet holds: rejected before
	 * msgpack-c would allocate room for them. */
	static const struct {
		const char *bytes;
		size_t len;
	} cases[] = {
		{"\xdd\xff\xff\xff\xff", 5},
		{"\xdf\xff\xff\xff\xff", 5},
		{"\xdc\xff\xff", 3},
		{"\xde\xff\xff", 3},
		{"\x81\xa1v\xdd\x7f\xff\xff\xff", 8},
		{"\x81\xa1v\xdb\xff\xff\xff\xff", 8},
		{"\x81\xa1v\xc6\xff\xff\xff\xff", 8},
		{"\x81\xa1v\xc9\xff\xff\xff\xff\x01", 9},
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
		assert_int_equal(decode_with_fds(cases[i].bytes, cases[i].len, 0), -EBADMSG);
}

static void deep_nesting_is_rejected(void **state)
{
	size_t nfds, len = sample_named("region-release", buf, sizeof(buf), &nfds);
	static uint8_t deep[4096];
	msgpack_object leaf = {.type = MSGPACK_OBJECT_NIL};
	ssize_t n;

	/* 1000 nested one-element arrays under an unknown key. */
	memset(deep, 0x91, 1000);
	deep[1000] = 0xc0;
	n = proto_mutate(buf, len, "deep", MUT_ADD, &leaf, mut, sizeof(mut));
	assert_true(n > 0);
	/* Replace the trailing nil by the nested arrays. */
	memcpy(mut + n - 1, deep, 1001);
	assert_int_equal(decode_with_fds(mut, (size_t)n - 1 + 1001, nfds), -EBADMSG);
}

static void version_mismatch_is_eprotonosupport(void **state)
{
	static const uint64_t versions[] = {0, PROTO_VERSION + 1, UINT32_MAX, UINT64_MAX};

	for (size_t s = 0; s < proto_sample_count(); s++) {
		size_t nfds, len = sample_bytes(s, buf, sizeof(buf), &nfds, NULL);

		for (size_t i = 0; i < ARRAY_SIZE(versions); i++) {
			msgpack_object v = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER,
					    .via.u64 = versions[i]};
			ssize_t n = proto_mutate(buf, len, "v", MUT_REPLACE, &v, mut, sizeof(mut));

			assert_true(n > 0);
			assert_int_equal(decode_with_fds(mut, (size_t)n, nfds), -EPROTONOSUPPORT);
		}
	}
	/* Another version's message need not look like ours at all. */
	assert_int_equal(decode_with_fds("\x81\xa1v\x02", 4, 0), -EPROTONOSUPPORT);
	assert_int_equal(decode_with_fds("\x81\xa1v\x01", 4, 0), -EBADMSG);
}

/* Values of every msgpack kind; a field gets each one whose kind differs from its own. */
static const msgpack_object_kv empty_kv[1];
static const msgpack_object wrong_values[] = {
	{.type = MSGPACK_OBJECT_NIL},
	{.type = MSGPACK_OBJECT_BOOLEAN, .via.boolean = true},
	{.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = 1},
	{.type = MSGPACK_OBJECT_NEGATIVE_INTEGER, .via.i64 = -1000},
	{.type = MSGPACK_OBJECT_FLOAT64, .via.f64 = 1.0},
	{.type = MSGPACK_OBJECT_STR, .via.str = {.size = 1, .ptr = "1"}},
	{.type = MSGPACK_OBJECT_BIN, .via.bin = {.size = 16, .ptr = "0123456789abcdef"}},
	{.type = MSGPACK_OBJECT_ARRAY, .via.array = {.size = 0}},
	{.type = MSGPACK_OBJECT_MAP, .via.map = {.size = 0, .ptr = (msgpack_object_kv *)empty_kv}},
};

static msgpack_object_type value_type(const uint8_t *p, size_t len, const char *key)
{
	msgpack_unpacked u;
	msgpack_object_type t = MSGPACK_OBJECT_NIL;
	size_t off = 0;

	msgpack_unpacked_init(&u);
	assert_int_equal(msgpack_unpack_next(&u, (const char *)p, len, &off),
			 MSGPACK_UNPACK_SUCCESS);
	for (uint32_t i = 0; i < u.data.via.map.size; i++) {
		const msgpack_object *k = &u.data.via.map.ptr[i].key;

		if (k->via.str.size == strlen(key) &&
		    memcmp(k->via.str.ptr, key, k->via.str.size) == 0)
			t = u.data.via.map.ptr[i].val.type;
	}
	msgpack_unpacked_destroy(&u);
	return t;
}

static bool same_kind(msgpack_object_type a, msgpack_object_type b)
{
	/* Both float widths are floats, and an integer's sign is a range question (covered by
	 * out_of_range_values_are_rejected), not a type one. */
	static const msgpack_object_type kinds[][2] = {
		{MSGPACK_OBJECT_FLOAT32, MSGPACK_OBJECT_FLOAT64},
		{MSGPACK_OBJECT_POSITIVE_INTEGER, MSGPACK_OBJECT_NEGATIVE_INTEGER},
	};

	for (size_t i = 0; i < ARRAY_SIZE(kinds); i++)
		if ((a == kinds[i][0] || a == kinds[i][1]) &&
		    (b == kinds[i][0] || b == kinds[i][1]))
			return true;
	return a == b;
}

/* Fields added to a type after its first version (proto.h: "optional"). */
static bool key_is_optional(enum proto_type type, const char *key)
{
	static const struct {
		enum proto_type type;
		const char *key;
	} optional[] = {
		{PROTO_CTL, "eng"},
		{PROTO_WORKER_INFO, "lay"},
		{PROTO_WORKER_INFO, "nlay"},
		{PROTO_WORKER_INFO, "park"},
		{PROTO_WORKER_INFO, "port"},
		{PROTO_WORKER_INFO, "rdy"},
		/* An environment request carries only what its op needs. */
		{PROTO_ENV_REQUEST, "root"},
		{PROTO_ENV_REQUEST, "cmd"},
		{PROTO_ENV_REQUEST, "cg"},
		{PROTO_ENV_REQUEST, "pid"},
		{PROTO_ENV_REQUEST, "turn"},
		{PROTO_ENV_REQUEST, "plen"},
		{PROTO_ENV_REQUEST, "phash"},
		{PROTO_ENV_REQUEST, "ckpt"},
		{PROTO_ENV_REQUEST, "traj"},
		{PROTO_ENV_REQUEST, "fl"},
		/* A create's limits (issue 19). */
		{PROTO_ENV_REQUEST, "pids"},
		{PROTO_ENV_REQUEST, "mem"},
		{PROTO_ENV_REQUEST, "cpu"},
		/* A create's network and an environment's (issue 19). */
		{PROTO_ENV_REQUEST, "net"},
		{PROTO_ENV_INFO, "net"},
		/* A checkpoint's commit time and delta path (issue 23). */
		{PROTO_ENV_INFO, "commit"},
		{PROTO_ENV_INFO, "path"},
		/* A checkpoint's kind, an environment's memory mode (issue 23 item 3). */
		{PROTO_ENV_INFO, "kind"},
		{PROTO_ENV_INFO, "mem"},
		{PROTO_ENV_INFO, "sdirty"},
		{PROTO_ENV_INFO, "why"},
		/* A pre-copied checkpoint's rounds and bytes (issue 23 item 2). */
		{PROTO_ENV_INFO, "pcr"},
		{PROTO_ENV_INFO, "pcb"},
		{PROTO_ENV_INFO, "pcfb"},
		/* A fork's new environment and count (issue 20 item 4). */
		{PROTO_ENV_REQUEST, "dst"},
		{PROTO_ENV_REQUEST, "n"},
		/* A step end's context prefix, for the policy's checkpoint (issue 21). */
		{PROTO_TRAJ_STEP, "pfx"},
		{PROTO_TRAJ_STEP, "phash"},
		/* A create's disk limit (issue 19). */
		{PROTO_ENV_REQUEST, "disk"},
		/* A create's image (issue 20), an image request's reference and name. */
		{PROTO_ENV_REQUEST, "img"},
		{PROTO_IMAGE_REQUEST, "ref"},
		{PROTO_IMAGE_REQUEST, "name"},
		/* A step event carries what the framework knows of the pending request. */
		{PROTO_TRAJ_STEP, "turn"},
		{PROTO_TRAJ_STEP, "plen"},
		{PROTO_TRAJ_STEP, "gen"},
		{PROTO_TRAJ_STEP, "mtps"},
		{PROTO_TRAJ_STEP, "out"},
		/* A step-begin answer's checkpoint (added with the daemon running them). */
		{PROTO_TRAJ_DECISION, "ckpt"},
		{PROTO_TRAJ_DECISION, "ckus"},
		{PROTO_TRAJ_DECISION, "abrt"},
		/* A metric's scale (issue 18: durations in seconds, kept in microseconds). */
		{PROTO_METRIC, "scale"},
		/* What a worker holds and its engine's canary record (issue 22 items 3, 4). */
		{PROTO_WORKER_INFO, "dmem"},
		{PROTO_WORKER_INFO, "rss"},
		{PROTO_WORKER_INFO, "pss"},
		{PROTO_WORKER_INFO, "pshm"},
		{PROTO_WORKER_INFO, "cnv"},
	};

	for (size_t i = 0; i < ARRAY_SIZE(optional); i++)
		if (optional[i].type == type && strcmp(optional[i].key, key) == 0)
			return true;
	return false;
}

static void every_field_checked(void **state)
{
	size_t cases = 0;

	for (size_t s = 0; s < proto_sample_count(); s++) {
		struct proto_msg m;
		size_t nfds, len = sample_bytes(s, buf, sizeof(buf), &nfds, &m);
		char keys[PROTO_MAX_KEYS][16];
		int nkeys = proto_keys(buf, len, keys, ARRAY_SIZE(keys));
		ssize_t n;

		assert_true(nkeys >= 3);
		for (int k = 0; k < nkeys; k++) {
			msgpack_object_type own = value_type(buf, len, keys[k]);

			/* Missing: refused, unless the field is optional (then it decodes). */
			n = proto_mutate(buf, len, keys[k], MUT_REMOVE, NULL, mut, sizeof(mut));
			assert_true(n > 0);
			if (decode_with_fds(mut, (size_t)n, nfds) !=
			    (key_is_optional(m.type, keys[k]) ? 0 : -EBADMSG))
				fail_msg("sample %zu without %s: wrong verdict", s, keys[k]);

			/* Twice, even with the same value. */
			n = proto_mutate(buf, len, keys[k], MUT_DUPLICATE, NULL, mut, sizeof(mut));
			assert_true(n > 0);
			if (decode_with_fds(mut, (size_t)n, nfds) != -EBADMSG)
				fail_msg("sample %zu with %s twice decoded", s, keys[k]);

			/* Every wrong type. */
			for (size_t w = 0; w < ARRAY_SIZE(wrong_values); w++) {
				if (same_kind(wrong_values[w].type, own))
					continue;
				n = proto_mutate(buf, len, keys[k], MUT_REPLACE, &wrong_values[w],
						 mut, sizeof(mut));
				assert_true(n > 0);
				if (decode_with_fds(mut, (size_t)n, nfds) != -EBADMSG)
					fail_msg("sample %zu with %s of msgpack type %d decoded", s,
						 keys[k], wrong_values[w].type);
				cases++;
			}
		}

		/* An unknown key of any type is ignored. */
		for (size_t w = 0; w < ARRAY_SIZE(wrong_values); w++) {
			n = proto_mutate(buf, len, "x-future", MUT_ADD, &wrong_values[w], mut,
					 sizeof(mut));
			assert_true(n > 0);
			assert_int_equal(decode_with_fds(mut, (size_t)n, nfds), 0);
		}
	}
	assert_true(cases > 100);
}

struct bad_value {
	const char *sample, *key;
	msgpack_object val;
};

#define UINT(x)                                                         \
	{                                                               \
		.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = (x) \
	}
#define NINT(x)                                                         \
	{                                                               \
		.type = MSGPACK_OBJECT_NEGATIVE_INTEGER, .via.i64 = (x) \
	}
#define BIN(n)                                                                       \
	{                                                                            \
		.type = MSGPACK_OBJECT_BIN, .via.bin = {.size = (n), .ptr = filler } \
	}
#define STR(n)                                                                       \
	{                                                                            \
		.type = MSGPACK_OBJECT_STR, .via.str = {.size = (n), .ptr = filler } \
	}

static char filler[PROTO_EXEC_CHUNK_MAX + 16];
#define STR_LIT(s)                                                                          \
	{                                                                                   \
		.type = MSGPACK_OBJECT_STR, .via.str = {.size = sizeof(s) - 1, .ptr = (s) } \
	}

static void out_of_range_values_are_rejected(void **state)
{
	static msgpack_object str_uuid = STR(16);
	static msgpack_object devs_17[PROTO_MAX_DEVICES + 1];
	static msgpack_object devs_short[1] = {BIN(15)};
	static msgpack_object devs_str[1] = {STR(16)};
	const struct bad_value cases[] = {
		{"hello", "t", UINT(0)},
		{"hello", "t", UINT(_PROTO_TYPE_MAX)},
		{"hello", "t", UINT(1ull << 40)},
		{"hello", "pid", UINT(0)},
		{"hello", "pid", UINT(1ull << 32)},
		{"hello", "pid", NINT(-1)},
		{"hello", "role", UINT(_ROLE_MAX)},
		{"hello", "role", UINT(UINT64_MAX)},
		{"hello", "rank", NINT(-2)},
		{"hello", "rank", NINT(INT64_MIN)},
		{"hello", "rank", UINT(1ull << 31)},
		{"hello", "eng", STR(PROTO_MAX_STR + 1)},
		{"hello",
		 "devs",
		 {.type = MSGPACK_OBJECT_ARRAY,
		  .via.array = {.size = PROTO_MAX_DEVICES + 1, .ptr = devs_17}}},
		{"hello",
		 "devs",
		 {.type = MSGPACK_OBJECT_ARRAY, .via.array = {.size = 1, .ptr = devs_short}}},
		{"hello",
		 "devs",
		 {.type = MSGPACK_OBJECT_ARRAY, .via.array = {.size = 1, .ptr = devs_str}}},
		{"region-announce", "dev", BIN(15)},
		{"region-announce", "dev", BIN(17)},
		{"region-announce", "dev", BIN(0)},
		{"region-announce", "dev", str_uuid},
		{"region-announce", "cls", UINT(_REGION_CLASS_MAX)},
		{"region-announce", "cls", NINT(-1)},
		{"region-announce", "size", NINT(-1)},
		{"error", "code", UINT(0)},
		{"error", "code", NINT(-1)},
		{"error", "code", UINT(1ull << 31)},
		{"error", "re", UINT(1ull << 32)},
		{"error", "msg", STR(PROTO_MAX_STR + 1)},
		{"hello", "t", UINT(15)}, /* unassigned types between the ranges */
		{"hello", "t", UINT(19)},
		{"hello", "t", UINT(59)},
		{"hello", "t", UINT(64)},
		{"traj-list", "traj", STR(PROTO_MAX_STR + 1)},
		{"traj-info", "kind", UINT(_TRAJ_INFO_KIND_MAX)},
		{"traj-info", "env", STR(64)},
		{"traj-info", "gw", UINT(2)},
		{"traj-info", "turns", UINT(1ull << 32)},
		{"traj-info-env", "cost", NINT(-1)},
		{"traj-step-end", "ev", UINT(_TRAJ_EVENT_MAX)},
		{"traj-step-end", "traj", STR(PROTO_MAX_STR + 1)},
		{"traj-step-end", "env", STR(64)},
		{"traj-step-end", "mtps", NINT(-1)},
		{"traj-decision", "act", UINT(_TRAJ_ACT_MAX)},
		{"traj-decision", "berr", UINT(1ull << 32)},
		{"traj-decision", "why", STR(32)},
		{"traj-decision-begin", "ckpt", STR(64)},
		{"traj-decision-begin", "abrt", UINT(2)},
		{"traj-decision-begin", "ckus", NINT(-1)},
		{"shadow-region", "cls", UINT(_REGION_CLASS_MAX)},
		{"shadow-region", "dev", BIN(15)},
		{"shadow-region", "va", NINT(-1)},
		{"shadow-parked", "n", UINT(1ull << 32)},
		{"shadow-parked", "hash", STR(8)},
		{"promote-map", "pid", UINT(1ull << 32)},
		{"promote-map", "sid", NINT(-1)},
		{"promote-commit", "n", NINT(-1)},
		{"promote-done", "code", NINT(-1)},
		{"promote-done", "code", UINT(1ull << 31)},
		{"promote-done", "msg", STR(PROTO_MAX_STR + 1)},
	};

	memset(filler, 'f', sizeof(filler));
	for (size_t i = 0; i < ARRAY_SIZE(devs_17); i++)
		devs_17[i] = (msgpack_object)BIN(16);

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		size_t nfds, len = sample_named(cases[i].sample, buf, sizeof(buf), &nfds);
		ssize_t n = proto_mutate(buf, len, cases[i].key, MUT_REPLACE, &cases[i].val, mut,
					 sizeof(mut));

		assert_true(n > 0);
		if (decode_with_fds(mut, (size_t)n, nfds) != -EBADMSG)
			fail_msg("case %zu (%s.%s) decoded", i, cases[i].sample, cases[i].key);
	}
}

static void in_range_edges_are_accepted(void **state)
{
	static msgpack_object devs_16[PROTO_MAX_DEVICES];
	const struct bad_value cases[] = {
		{"hello", "pid", UINT(UINT32_MAX)},
		{"hello", "rank", NINT(-1)},
		{"hello", "rank", UINT(INT32_MAX)},
		{"hello", "eng", STR(PROTO_MAX_STR)},
		{"hello", "eng", STR(0)},
		{"hello",
		 "devs",
		 {.type = MSGPACK_OBJECT_ARRAY,
		  .via.array = {.size = PROTO_MAX_DEVICES, .ptr = devs_16}}},
		{"hello", "devs", {.type = MSGPACK_OBJECT_ARRAY, .via.array = {.size = 0}}},
		{"region-announce", "cls", UINT(_REGION_CLASS_MAX - 1)},
		{"error", "code", UINT(INT32_MAX)},
		{"error", "re", UINT(UINT32_MAX)},
		{"promote-done", "code", UINT(0)},
		{"promote-done", "code", UINT(INT32_MAX)},
		{"promote-done", "msg", STR(PROTO_MAX_STR)},
		{"shadow-parked", "n", UINT(UINT32_MAX)},
		{"promote-map", "pid", UINT(0)},
		{"traj-step-end", "env", STR(63)},
		{"traj-step-end", "traj", STR(PROTO_MAX_STR)},
		{"traj-decision", "why", STR(31)},
		{"traj-decision", "cerr", UINT(UINT32_MAX)},
		{"traj-decision-begin", "ckpt", STR(63)},
		{"traj-decision-begin", "abrt", UINT(0)},
		{"traj-list", "traj", STR(0)},
		{"traj-info", "gw", UINT(0)},
		{"traj-info", "env", STR(63)},
		{"traj-info-env", "dmbps", UINT(UINT64_MAX)},
	};

	memset(filler, 'f', sizeof(filler));
	for (size_t i = 0; i < ARRAY_SIZE(devs_16); i++)
		devs_16[i] = (msgpack_object)BIN(16);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		size_t nfds, len = sample_named(cases[i].sample, buf, sizeof(buf), &nfds);
		ssize_t n = proto_mutate(buf, len, cases[i].key, MUT_REPLACE, &cases[i].val, mut,
					 sizeof(mut));

		assert_true(n > 0);
		if (decode_with_fds(mut, (size_t)n, nfds) != 0)
			fail_msg("case %zu (%s.%s) rejected", i, cases[i].sample, cases[i].key);
	}
}

static void strings_with_nul_are_rejected(void **state)
{
	msgpack_object s = {.type = MSGPACK_OBJECT_STR, .via.str = {.size = 3, .ptr = "a\0b"}};
	size_t nfds, len = sample_named("error", buf, sizeof(buf), &nfds);
	ssize_t n = proto_mutate(buf, len, "msg", MUT_REPLACE, &s, mut, sizeof(mut));

	assert_true(n > 0);
	assert_int_equal(decode_with_fds(mut, (size_t)n, nfds), -EBADMSG);
}

static void odd_keys_are_rejected(void **state)
{
	size_t nfds, len = sample_named("region-release", buf, sizeof(buf), &nfds);
	msgpack_object nil = {.type = MSGPACK_OBJECT_NIL};
	char name[8];
	ssize_t n;

	/* A non-string key. */
	memcpy(mut, buf, len);
	mut[0]++; /* fixmap count + 1 */
	mut[len] = 0x01;
	mut[len + 1] = 0xc0;
	assert_int_equal(decode_with_fds(mut, len + 2, nfds), -EBADMSG);

	/* More keys than any message needs, even unknown ones. */
	memcpy(mut, buf, len);
	n = (ssize_t)len;
	for (int i = 0; i < PROTO_MAX_KEYS; i++) {
		uint8_t tmp[PROTO_MAX_MSG];

		(void)snprintf(name, sizeof(name), "k%d", i);
		memcpy(tmp, mut, (size_t)n);
		n = proto_mutate(tmp, (size_t)n, name, MUT_ADD, &nil, mut, sizeof(mut));
		assert_true(n > 0);
	}
	assert_int_equal(decode_with_fds(mut, (size_t)n, nfds), -EBADMSG);
}

static void fd_count_must_match_the_type(void **state)
{
	for (size_t s = 0; s < proto_sample_count(); s++) {
		size_t nfds, len = sample_bytes(s, buf, sizeof(buf), &nfds, NULL);

		for (size_t k = 0; k <= 3; k++)
			assert_int_equal(decode_with_fds(buf, len, k), k == nfds ? 0 : -EBADMSG);
	}

	/* A negative fd is not an fd. */
	size_t nfds, len = sample_named("region-announce", buf, sizeof(buf), &nfds);
	struct proto_msg m;
	int bad = -1;
	assert_int_equal(proto_decode(buf, len, &bad, 1, &m), -EBADMSG);
}

static void finish_closes_owned_fds_once(void **state)
{
	int fd = new_memfd();
	struct proto_msg m;
	size_t len;

	(void)proto_sample(3, fd, &m);
	assert_int_equal(m.type, PROTO_REGION_ANNOUNCE);
	len = encode(&m, buf, sizeof(buf));
	assert_int_equal(proto_decode(buf, len, &fd, 1, &m), 0);
	assert_int_equal(m.region.fd, fd);
	proto_msg_finish(&m);
	assert_int_equal(m.region.fd, -1);
	assert_false(fd_is_open(fd));
	proto_msg_finish(&m); /* second call harmless */
	proto_msg_finish(NULL);
}

static void promote_map_owns_its_fd(void **state)
{
	int fd = new_memfd();
	struct proto_msg m;
	size_t len;

	for (size_t i = 0; i < proto_sample_count(); i++)
		if (strcmp(proto_sample(i, fd, &m), "promote-map") == 0)
			break;
	assert_int_equal(m.type, PROTO_PROMOTE_MAP);
	len = encode(&m, buf, sizeof(buf));
	assert_int_equal(proto_decode(buf, len, NULL, 0, &m), -EBADMSG);
	assert_int_equal(proto_decode(buf, len, &fd, 1, &m), 0);
	assert_int_equal(m.promote_map.fd, fd);
	assert_int_equal(m.promote_map.shadow_id, 3);
	proto_msg_finish(&m);
	assert_int_equal(m.promote_map.fd, -1);
	assert_false(fd_is_open(fd));
}

static void names_round_trip(void **state)
{
	enum region_class cls;
	enum worker_role role;

	for (int i = 0; i < _REGION_CLASS_MAX; i++) {
		assert_non_null(region_class_to_string(i));
		assert_int_equal(region_class_from_string(region_class_to_string(i), &cls), 0);
		assert_int_equal(cls, i);
	}
	for (int i = 0; i < _ROLE_MAX; i++) {
		assert_int_equal(worker_role_from_string(worker_role_to_string(i), &role), 0);
		assert_int_equal(role, i);
	}
	for (int t = 1; t <= PROTO_END; t++)
		assert_non_null(proto_type_to_string(t));
	for (int t = PROTO_END + 1; t < PROTO_SHADOW_REGION; t++) {
		assert_null(proto_type_to_string(t));
		assert_int_equal(proto_type_nfds(t), -EINVAL);
	}
	for (int t = PROTO_SHADOW_REGION; t <= PROTO_MEM_INFO; t++)
		assert_non_null(proto_type_to_string(t));
	assert_string_equal(proto_type_to_string(PROTO_PROMOTE_COMMIT), "promote-commit");
	assert_int_equal(proto_type_nfds(PROTO_PROMOTE_MAP), 1);
	assert_int_equal(proto_type_nfds(PROTO_PROMOTE_COMMIT), 0);
	assert_string_equal(region_class_to_string(REGION_KV), "kv");
	assert_string_equal(worker_role_to_string(ROLE_SHADOW), "shadow");
	assert_null(region_class_to_string(_REGION_CLASS_MAX));
	assert_null(worker_role_to_string(_ROLE_MAX));
	assert_null(proto_type_to_string(0));
	assert_null(proto_type_to_string(_PROTO_TYPE_MAX));
	assert_int_equal(region_class_from_string("gpu", &cls), -EINVAL);
	assert_int_equal(worker_role_from_string(NULL, &role), -EINVAL);
	assert_int_equal(proto_type_nfds(PROTO_REGION_ANNOUNCE), 1);
	assert_int_equal(proto_type_nfds(PROTO_HELLO), 0);
	assert_int_equal(proto_type_nfds(0), -EINVAL);
	assert_int_equal(proto_type_nfds(_PROTO_TYPE_MAX), -EINVAL);
}

/* Agent-environment messages (30-32): optional request fields may be absent; an id longer
 * than 63 bytes and an unknown op are refused; names of every op round-trip. */
static void env_messages(void **state)
{
	struct proto_msg m = {.type = PROTO_ENV_REQUEST}, d;
	uint8_t out[PROTO_MAX_MSG];
	enum env_op op;
	size_t len;

	(void)state;
	m.env_request.op = ENV_OP_RESTORE;
	snprintf(m.env_request.env, sizeof(m.env_request.env), "e1");
	snprintf(m.env_request.ckpt, sizeof(m.env_request.ckpt), "c00000003");
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), 0);
	assert_int_equal(proto_decode(out, len, NULL, 0, &d), 0);
	assert_int_equal(d.type, PROTO_ENV_REQUEST);
	assert_int_equal(d.env_request.op, ENV_OP_RESTORE);
	assert_string_equal(d.env_request.ckpt, "c00000003");
	assert_string_equal(d.env_request.root, "");
	assert_true(d.env_request.pids == 0 && d.env_request.memory == 0 &&
		    d.env_request.cpu_millis == 0 && d.env_request.disk == 0);
	/* a create's limits, "no limit" included */
	m.env_request.op = ENV_OP_CREATE;
	m.env_request.pids = 256;
	m.env_request.memory = ENV_LIMIT_NONE;
	m.env_request.cpu_millis = 1500;
	m.env_request.disk = 8 << 20;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), 0);
	assert_int_equal(proto_decode(out, len, NULL, 0, &d), 0);
	assert_true(d.env_request.pids == 256 && d.env_request.memory == ENV_LIMIT_NONE &&
		    d.env_request.cpu_millis == 1500 && d.env_request.disk == 8 << 20);
	m.env_request.disk = ENV_LIMIT_NONE;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), 0);
	assert_int_equal(proto_decode(out, len, NULL, 0, &d), 0);
	assert_true(d.env_request.disk == ENV_LIMIT_NONE);
	m.env_request.pids = m.env_request.memory = m.env_request.cpu_millis = 0;
	m.env_request.disk = 0;
	/* A minimal request: "v", "t", "op", "env" only. */
	{
		static const uint8_t minimal[] = {0x84, 0xa1, 'v',  0x01, 0xa1, 't', 30,  0xa2,
						  'o',	'p',  0x04, 0xa3, 'e',	'n', 'v', 0xa0};

		assert_int_equal(proto_decode(minimal, sizeof(minimal), NULL, 0, &d), 0);
		assert_int_equal(d.env_request.op, ENV_OP_LIST);
	}
	m.env_request.op = _ENV_OP_MAX;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), -EINVAL);
	for (int i = 0; i < _ENV_OP_MAX; i++) {
		assert_non_null(env_op_to_string(i));
		assert_int_equal(env_op_from_string(env_op_to_string(i), &op), 0);
		assert_int_equal(op, i);
	}
	assert_null(env_op_to_string(_ENV_OP_MAX));
	assert_int_equal(env_op_from_string("reboot", &op), -EINVAL);
	for (int t = PROTO_ENV_REQUEST; t <= PROTO_ENV_ITEM; t++) {
		assert_non_null(proto_type_to_string(t));
		assert_int_equal(proto_type_nfds(t), 0);
	}
}

/* Exec and file messages (33-38): argv, envv and output chunks are bounded in count and bytes,
 * strings carry no NUL, ranges hold; the boundaries themselves decode; exec and write carry
 * exactly one fd; the encoder refuses an argv whose count and bytes disagree. */
static void exec_messages(void **state)
{
	static msgpack_object one[257], big[2], mixed[2];
	static char huge[PROTO_EXEC_ARGV_MAX];
	static const msgpack_object nul = STR_LIT("a\0b"), num = UINT(1);
	const struct bad_value bad[] = {
		{"env-exec", "argv", {.type = MSGPACK_OBJECT_ARRAY, .via.array = {.size = 0}}},
		{"env-exec", "argv", {.type = MSGPACK_OBJECT_ARRAY, .via.array = {257, one}}},
		{"env-exec", "argv", {.type = MSGPACK_OBJECT_ARRAY, .via.array = {2, big}}},
		{"env-exec",
		 "argv",
		 {.type = MSGPACK_OBJECT_ARRAY, .via.array = {1, (msgpack_object *)&nul}}},
		{"env-exec", "argv", {.type = MSGPACK_OBJECT_ARRAY, .via.array = {2, mixed}}},
		{"env-exec", "envv", {.type = MSGPACK_OBJECT_ARRAY, .via.array = {257, one}}},
		{"env-exec", "cwd", STR(PROTO_PATH_MAX)},
		{"env-exec", "user", STR(64)},
		{"env-exec-out", "data", BIN(0)},
		{"env-exec-out", "data", BIN(PROTO_EXEC_CHUNK_MAX + 1)},
		{"env-exec-out", "data", STR(4)},
		{"env-exec-out", "fd", UINT(0)},
		{"env-exec-out", "fd", UINT(3)},
		{"env-exec-done", "code", UINT(256)},
		{"env-exec-done", "code", NINT(-2)},
		{"env-exec-done", "sig", UINT(65)},
		{"env-exec-done", "tmo", UINT(2)},
		{"env-exec-done", "trunc", UINT(4)},
		{"env-file-write", "mode", UINT(010000)},
		{"env-file-read", "path", STR(PROTO_PATH_MAX)},
		{"env-file-data", "uid", NINT(-1)},
	};
	const struct bad_value good[] = {
		{"env-exec", "argv", {.type = MSGPACK_OBJECT_ARRAY, .via.array = {256, one}}},
		{"env-exec", "argv", {.type = MSGPACK_OBJECT_ARRAY, .via.array = {1, big}}},
		{"env-exec", "envv", {.type = MSGPACK_OBJECT_ARRAY, .via.array = {.size = 0}}},
		{"env-exec-out", "data", BIN(PROTO_EXEC_CHUNK_MAX)},
		{"env-exec-done", "code", UINT(255)},
		{"env-exec-done", "code", NINT(-1)},
		{"env-file-write", "mode", UINT(07777)},
	};
	struct proto_msg m;
	size_t len, nfds;
	int fds[PROTO_MAX_FDS];
	ssize_t n;

	(void)state;
	memset(filler, 'f', sizeof(filler));
	memset(huge, 'h', sizeof(huge));
	for (size_t i = 0; i < ARRAY_SIZE(one); i++)
		one[i] = (msgpack_object)STR(1);
	/* 8191 bytes and a NUL fill PROTO_EXEC_ARGV_MAX: one fits, two do not. */
	for (size_t i = 0; i < ARRAY_SIZE(big); i++)
		big[i] =
			(msgpack_object){.type = MSGPACK_OBJECT_STR,
					 .via.str = {.size = PROTO_EXEC_ARGV_MAX - 1, .ptr = huge}};
	mixed[0] = (msgpack_object)STR(1);
	mixed[1] = num;
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		size_t len0 = sample_named(bad[i].sample, buf, sizeof(buf), &nfds);
		n = proto_mutate(buf, len0, bad[i].key, MUT_REPLACE, &bad[i].val, mut, sizeof(mut));

		assert_true(n > 0);
		if (decode_with_fds(mut, (size_t)n, nfds) != -EBADMSG)
			fail_msg("%s with a bad %s (case %zu) decoded", bad[i].sample, bad[i].key,
				 i);
	}
	for (size_t i = 0; i < ARRAY_SIZE(good); i++) {
		size_t len0 = sample_named(good[i].sample, buf, sizeof(buf), &nfds);
		n = proto_mutate(buf, len0, good[i].key, MUT_REPLACE, &good[i].val, mut,
				 sizeof(mut));

		assert_true(n > 0);
		if (decode_with_fds(mut, (size_t)n, nfds) != 0)
			fail_msg("%s with %s at its bound (case %zu) refused", good[i].sample,
				 good[i].key, i);
	}
	/* A required field missing after the blobs were decoded (fuzz-proto found them leaked). */
	len = sample_named("env-exec", buf, sizeof(buf), &nfds);
	n = proto_mutate(buf, len, "fl", MUT_REMOVE, NULL, mut, sizeof(mut));
	assert_true(n > 0);
	assert_int_equal(decode_with_fds(mut, (size_t)n, nfds), -EBADMSG);
	/* The fd is part of the type: an exec or a write without one is refused. */
	len = sample_named("env-exec", buf, sizeof(buf), &nfds);
	assert_int_equal(nfds, 1);
	assert_int_equal(decode_with_fds(buf, len, 0), -EBADMSG);
	len = sample_named("env-file-write", buf, sizeof(buf), &nfds);
	assert_int_equal(decode_with_fds(buf, len, 0), -EBADMSG);
	assert_int_equal(proto_type_nfds(PROTO_ENV_FILE_READ), 0);
	/* The encoder refuses what the decoder would. */
	for (size_t i = 0; i < proto_sample_count(); i++)
		if (strcmp(proto_sample(i, 3, &m), "env-exec") == 0)
			break;
	m.env_exec.argv.count++;
	assert_int_equal(proto_encode(&m, buf, sizeof(buf), &len, fds, &nfds), -EINVAL);
	m.env_exec.argv.count--;
	m.env_exec.argv.len--; /* the last string loses its NUL */
	assert_int_equal(proto_encode(&m, buf, sizeof(buf), &len, fds, &nfds), -EINVAL);
	for (size_t i = 0; i < proto_sample_count(); i++)
		if (strcmp(proto_sample(i, 3, &m), "env-exec-out") == 0)
			break;
	m.exec_out.data.len = PROTO_EXEC_CHUNK_MAX + 1;
	assert_int_equal(proto_encode(&m, buf, sizeof(buf), &len, fds, &nfds), -EINVAL);
	m.exec_out.data.len = 0;
	assert_int_equal(proto_encode(&m, buf, sizeof(buf), &len, fds, &nfds), -EINVAL);
}

/* NCCL communicator messages (50-51): the announce carries its counters' memfd; a rank below
 * 0, zero ranks, an unknown origin or end are refused; every origin and end has a name. */
static void nccl_messages(void **state)
{
	struct proto_msg m = {.type = PROTO_NCCL_COMM}, d;
	uint8_t out[PROTO_MAX_MSG];
	int fds[PROTO_MAX_FDS], fd = new_memfd();
	size_t len, nfds;

	(void)state;
	m.nccl_comm.id = 3;
	m.nccl_comm.hash = 0xfeedull;
	m.nccl_comm.rank = 2;
	m.nccl_comm.nranks = 4;
	m.nccl_comm.cuda_dev = 2;
	m.nccl_comm.parent_id = 1;
	m.nccl_comm.origin = NCCL_ORIGIN_SPLIT;
	m.nccl_comm.fd = fd;
	assert_int_equal(proto_type_nfds(PROTO_NCCL_COMM), 1);
	assert_int_equal(proto_type_nfds(PROTO_NCCL_COMM_END), 0);
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, fds, &nfds), 0);
	assert_int_equal(nfds, 1);
	assert_int_equal(proto_decode(out, len, fds, nfds, &d), 0);
	assert_int_equal(d.nccl_comm.rank, 2);
	assert_int_equal(d.nccl_comm.origin, NCCL_ORIGIN_SPLIT);
	assert_int_equal(d.nccl_comm.parent_id, 1);
	assert_int_equal(d.nccl_comm.fd, fd);
	proto_msg_finish(&d);
	assert_false(fd_is_open(fd));
	/* Without its fd the announce does not decode. */
	assert_int_equal(proto_decode(out, len, NULL, 0, &d), -EBADMSG);
	m.nccl_comm.fd = new_memfd();
	m.nccl_comm.rank = -1;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, fds, &nfds), -EINVAL);
	m.nccl_comm.rank = 0;
	m.nccl_comm.nranks = 0;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, fds, &nfds), -EINVAL);
	m.nccl_comm.nranks = 1;
	m.nccl_comm.origin = _NCCL_ORIGIN_MAX;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, fds, &nfds), -EINVAL);
	(void)safe_close(m.nccl_comm.fd);
	m = (struct proto_msg){.type = PROTO_NCCL_COMM_END};
	m.nccl_comm_end.how = _NCCL_END_MAX;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), -EINVAL);
	for (int i = 0; i < _NCCL_ORIGIN_MAX; i++)
		assert_non_null(nccl_origin_to_string(i));
	for (int i = 0; i < _NCCL_END_MAX; i++)
		assert_non_null(nccl_end_to_string(i));
	assert_null(nccl_origin_to_string(_NCCL_ORIGIN_MAX));
	assert_null(nccl_end_to_string(_NCCL_END_MAX));
	assert_string_equal(event_kind_to_string(EVENT_NCCL), "nccl");
}

/* Trajectory events (60-61): the step's optional fields may be absent, an unknown event or
 * action is refused, an empty trajectory id decodes (the supervisor refuses it), and every
 * event and action has a name. */
static void traj_messages(void **state)
{
	struct proto_msg m = {.type = PROTO_TRAJ_STEP}, d;
	uint8_t out[PROTO_MAX_MSG];
	enum traj_event ev;
	size_t len;

	(void)state;
	m.traj_step.ev = TRAJ_STEP_END;
	strcpy(m.traj_step.trajectory, "traj-1");
	strcpy(m.traj_step.env, "env-1");
	m.traj_step.decode_mtps = 30000;
	assert_int_equal(proto_type_nfds(PROTO_TRAJ_STEP), 0);
	assert_int_equal(proto_type_nfds(PROTO_TRAJ_DECISION), 0);
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), 0);
	assert_int_equal(proto_decode(out, len, NULL, 0, &d), 0);
	assert_int_equal(d.traj_step.ev, TRAJ_STEP_END);
	assert_string_equal(d.traj_step.trajectory, "traj-1");
	assert_string_equal(d.traj_step.env, "env-1");
	assert_int_equal(d.traj_step.decode_mtps, 30000);
	assert_int_equal(d.traj_step.output_tokens, 0);
	m.traj_step.ev = _TRAJ_EVENT_MAX;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), -EINVAL);
	m = (struct proto_msg){.type = PROTO_TRAJ_DECISION};
	m.traj_decision.act = _TRAJ_ACT_MAX;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), -EINVAL);
	m.traj_decision.act = TRAJ_ACT_CHECKPOINT_SYNC;
	memset(m.traj_decision.why, 'x', sizeof(m.traj_decision.why)); /* no room for NUL */
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), -EINVAL);
	/* A step-begin answer's checkpoint fields: round trip, and absent ones read as none (a
	 * supervisor from before them). */
	m = (struct proto_msg){.type = PROTO_TRAJ_DECISION};
	m.traj_decision.ev = TRAJ_STEP_BEGIN;
	strcpy(m.traj_decision.trajectory, "traj-1");
	strcpy(m.traj_decision.env, "env-1");
	m.traj_decision.held_us = 50100;
	strcpy(m.traj_decision.ckpt, "c00000007");
	m.traj_decision.ckpt_us = 123456;
	m.traj_decision.aborted = 1;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), 0);
	assert_int_equal(proto_decode(out, len, NULL, 0, &d), 0);
	assert_int_equal(d.traj_decision.held_us, 50100);
	assert_string_equal(d.traj_decision.ckpt, "c00000007");
	assert_int_equal(d.traj_decision.ckpt_us, 123456);
	assert_int_equal(d.traj_decision.aborted, 1);
	{
		uint8_t cut[PROTO_MAX_MSG];
		ssize_t n = proto_mutate(out, len, "ckpt", MUT_REMOVE, NULL, cut, sizeof(cut));

		assert_true(n > 0);
		n = proto_mutate(cut, (size_t)n, "ckus", MUT_REMOVE, NULL, out, sizeof(out));
		assert_true(n > 0);
		n = proto_mutate(out, (size_t)n, "abrt", MUT_REMOVE, NULL, cut, sizeof(cut));
		assert_true(n > 0);
		assert_int_equal(proto_decode(cut, (size_t)n, NULL, 0, &d), 0);
		assert_string_equal(d.traj_decision.ckpt, "");
		assert_int_equal(d.traj_decision.ckpt_us, 0);
		assert_int_equal(d.traj_decision.aborted, 0);
		assert_int_equal(d.traj_decision.held_us, 50100);
	}
	m.traj_decision.aborted = 2;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), -EINVAL);
	for (int i = 0; i < _TRAJ_EVENT_MAX; i++) {
		assert_int_equal(traj_event_from_string(traj_event_to_string(i), &ev), 0);
		assert_int_equal(ev, i);
	}
	for (int i = 0; i < _TRAJ_ACT_MAX; i++)
		assert_non_null(traj_action_to_string(i));
	assert_null(traj_event_to_string(_TRAJ_EVENT_MAX));
	assert_null(traj_action_to_string(_TRAJ_ACT_MAX));
	assert_int_equal(traj_event_from_string("step", &ev), -EINVAL);
	assert_string_equal(proto_type_to_string(PROTO_TRAJ_STEP), "traj-step");
}

/* Trajectory listing (62-63): a list request and both kinds of items round-trip; an unknown
 * kind is refused; every kind has a name. */
static void traj_list_messages(void **state)
{
	struct proto_msg m = {.type = PROTO_TRAJ_LIST}, d;
	uint8_t out[PROTO_MAX_MSG];
	size_t len;

	(void)state;
	assert_int_equal(proto_type_nfds(PROTO_TRAJ_LIST), 0);
	assert_int_equal(proto_type_nfds(PROTO_TRAJ_INFO), 0);
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), 0);
	assert_int_equal(proto_decode(out, len, NULL, 0, &d), 0);
	assert_int_equal(d.type, PROTO_TRAJ_LIST);
	assert_string_equal(d.traj_list.trajectory, "");
	m = (struct proto_msg){.type = PROTO_TRAJ_INFO};
	m.traj_info.kind = TRAJ_INFO_TRAJECTORY;
	strcpy(m.traj_info.trajectory, "traj-1");
	strcpy(m.traj_info.env, "env-1");
	m.traj_info.unprotected_turns = 3;
	m.traj_info.decode_mtps = 41500;
	m.traj_info.pending = 1;
	m.traj_info.generated_tokens = 17;
	m.traj_info.ckpt_aborted = 2;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), 0);
	assert_int_equal(proto_decode(out, len, NULL, 0, &d), 0);
	assert_memory_equal(&d.traj_info, &m.traj_info, sizeof(m.traj_info));
	m.traj_info.kind = TRAJ_INFO_ENV;
	m.traj_info.cost_us = 20000;
	m.traj_info.dump_bps = 1ull << 40;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), 0);
	assert_int_equal(proto_decode(out, len, NULL, 0, &d), 0);
	assert_int_equal(d.traj_info.kind, TRAJ_INFO_ENV);
	assert_int_equal(d.traj_info.dump_bps, 1ull << 40);
	m.traj_info.kind = _TRAJ_INFO_KIND_MAX;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), -EINVAL);
	m.traj_info.kind = TRAJ_INFO_ENV;
	m.traj_info.pending = 2;
	assert_int_equal(proto_encode(&m, out, sizeof(out), &len, NULL, NULL), -EINVAL);
	for (int i = 0; i < _TRAJ_INFO_KIND_MAX; i++)
		assert_non_null(traj_info_kind_to_string(i));
	assert_null(traj_info_kind_to_string(_TRAJ_INFO_KIND_MAX));
	assert_string_equal(proto_type_to_string(PROTO_TRAJ_LIST), "traj-list");
	assert_string_equal(proto_type_to_string(PROTO_TRAJ_INFO), "traj-info");
}

/* Every value of every control-plane enum has a name, and nothing past the end does. */
static void control_names_are_complete(void **state)
{
	enum ctl_action act;

	for (int i = 0; i < _CTL_CMD_MAX; i++)
		assert_non_null(ctl_cmd_to_string(i));
	for (int i = 0; i < _CTL_ACT_MAX; i++) {
		assert_int_equal(ctl_action_from_string(ctl_action_to_string(i), &act), 0);
		assert_int_equal(act, i);
	}
	for (int i = 0; i < _METRIC_KIND_MAX; i++)
		assert_non_null(metric_kind_to_string(i));
	for (int i = 0; i < _WORKER_STATE_MAX; i++)
		assert_non_null(worker_state_to_string(i));
	for (int i = 0; i < _REGION_STATE_MAX; i++)
		assert_non_null(region_state_to_string(i));
	for (int i = 0; i < _EVENT_KIND_MAX; i++)
		assert_non_null(event_kind_to_string(i));
	for (int i = 0; i < _HEALTH_CHECK_MAX; i++)
		assert_non_null(health_check_to_string(i));
	for (int i = 0; i < _VERDICT_MAX; i++)
		assert_non_null(health_verdict_to_string(i));
	assert_null(ctl_cmd_to_string(_CTL_CMD_MAX));
	assert_null(event_kind_to_string(_EVENT_KIND_MAX));
	assert_null(health_verdict_to_string(-1));
	assert_int_equal(ctl_action_from_string("explode", &act), -EINVAL);
	assert_string_equal(health_verdict_to_string(VERDICT_UNKNOWN), "unknown");
	assert_int_equal(proto_type_nfds(PROTO_REGION_FD), 1);
	assert_int_equal(proto_type_nfds(PROTO_REGION_FETCH), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_type_round_trips),
		cmocka_unit_test(wire_format_is_as_documented),
		cmocka_unit_test(send_and_recv_over_a_socket),
		cmocka_unit_test(send_error_formats_a_reply),
		cmocka_unit_test(encode_rejects_invalid_messages),
		cmocka_unit_test(encode_reports_short_buffers),
		cmocka_unit_test(truncation_at_every_offset_is_rejected),
		cmocka_unit_test(trailing_bytes_are_rejected),
		cmocka_unit_test(oversized_packets_are_rejected),
		cmocka_unit_test(non_maps_are_rejected),
		cmocka_unit_test(huge_declared_sizes_are_rejected_cheaply),
		cmocka_unit_test(deep_nesting_is_rejected),
		cmocka_unit_test(version_mismatch_is_eprotonosupport),
		cmocka_unit_test(every_field_checked),
		cmocka_unit_test(out_of_range_values_are_rejected),
		cmocka_unit_test(in_range_edges_are_accepted),
		cmocka_unit_test(strings_with_nul_are_rejected),
		cmocka_unit_test(odd_keys_are_rejected),
		cmocka_unit_test(fd_count_must_match_the_type),
		cmocka_unit_test(finish_closes_owned_fds_once),
		cmocka_unit_test(promote_map_owns_its_fd),
		cmocka_unit_test(names_round_trip),
		cmocka_unit_test(control_names_are_complete),
		cmocka_unit_test(env_messages),
		cmocka_unit_test(nccl_messages),
		cmocka_unit_test(exec_messages),
		cmocka_unit_test(traj_messages),
		cmocka_unit_test(traj_list_messages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
