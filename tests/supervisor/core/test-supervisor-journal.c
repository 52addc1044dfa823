/* SPDX-License-Identifier: MIT */
/* supervisor-journal: records round-trip, torn tails and corruption are truncated, rewrite. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "supervisor-journal.h"
#include "test-util.h"
#include "util.h"

#define MAX_SEEN 64

static struct journal_record seen[MAX_SEEN];
static size_t n_seen;

static int collect(void *userdata, const struct journal_record *rec)
{
	(void)userdata;
	assert_true(n_seen < MAX_SEEN);
	seen[n_seen++] = *rec;
	return 0;
}

static void sample(struct journal_record *recs)
{
	memset(recs, 0, 4 * sizeof(*recs));
	recs[0].op = JOURNAL_WORKER;
	recs[0].pid = 4242;
	recs[0].uid = 1000;
	recs[0].gid = 100;
	recs[0].starttime = 123456789;
	snprintf(recs[0].engine_id, sizeof(recs[0].engine_id), "vllm-0");
	recs[0].role = ROLE_PRIMARY;
	recs[0].rank = -1;
	recs[1].op = JOURNAL_REGION;
	recs[1].pid = 4242;
	recs[1].region.id = 7;
	recs[1].region.va = 0x7f0000000000;
	recs[1].region.size = 8 << 20;
	recs[1].region.cls = REGION_WEIGHTS;
	recs[1].region.order = 1;
	recs[1].region.weights_version = 3;
	memset(recs[1].region.device_uuid, 0xab, PROTO_UUID_LEN);
	recs[1].checksum = 0xdeadbeef;
	recs[1].checksum_version = 4;
	recs[2].op = JOURNAL_REGION_GONE;
	recs[2].pid = 4242;
	recs[2].region.id = 7;
	recs[3].op = JOURNAL_DEAD;
	recs[3].pid = 4242;
	for (int i = 0; i < 4; i++)
		recs[i].region.fd = -1;
}

static char *journal_path(const char *dir)
{
	static char path[512];

	snprintf(path, sizeof(path), "%s/journal", dir);
	return path;
}

static void records_round_trip(void **state)
{
	char *dir = test_mkdtemp("belayer-journal");
	struct journal_record recs[4];
	struct sv_journal *j;

	sample(recs);
	assert_int_equal(journal_open(dir, NULL, NULL, &j), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(journal_append(j, &recs[i]), 0);
	journal_close(j);
	n_seen = 0;
	assert_int_equal(journal_open(dir, collect, NULL, &j), 0);
	assert_int_equal(n_seen, 4);
	for (int i = 0; i < 4; i++)
		assert_memory_equal(&seen[i], &recs[i], sizeof(recs[i]));
	journal_close(j);
	test_rmtree(dir);
	free(dir);
}

/* Appends n records to a new journal in dir, reopens it: the same n come back. */
static void append_then_replay(const char *dir, const struct journal_record *recs, int n)
{
	struct sv_journal *j;

	assert_int_equal(journal_open(dir, NULL, NULL, &j), 0);
	for (int i = 0; i < n; i++)
		assert_int_equal(journal_append(j, &recs[i]), 0);
	journal_close(j);
	n_seen = 0;
	assert_int_equal(journal_open(dir, collect, NULL, &j), 0);
	assert_int_equal(n_seen, n);
	for (int i = 0; i < n; i++)
		assert_memory_equal(&seen[i], &recs[i], sizeof(recs[i]));
	journal_close(j);
}

/* A configured engine's launched group (what a restarted supervisor adopts): leader pid, start
 * time, role and port come back as written; pid 0 (no group) too. */
static void engine_record_round_trip(void **state)
{
	char *dir = test_mkdtemp("belayer-journal");
	struct journal_record recs[2];

	memset(recs, 0, sizeof(recs));
	recs[0].op = JOURNAL_ENGINE;
	recs[0].pid = 5151;
	recs[0].starttime = 987654321;
	recs[0].role = ROLE_SHADOW;
	recs[0].port = 8001;
	snprintf(recs[0].engine_id, sizeof(recs[0].engine_id), "llm");
	recs[1] = recs[0];
	recs[1].pid = 0;
	recs[1].starttime = 0;
	recs[1].port = 0;
	recs[1].role = ROLE_PRIMARY;
	for (int i = 0; i < 2; i++)
		recs[i].region.fd = -1;
	append_then_replay(dir, recs, 2);
	test_rmtree(dir);
	free(dir);
}

/* A primary rank's cuMemGetInfo answer (issue 22: a shadow launched after a restart sizes
 * itself from them) and an engine's answers forgotten come back as written; an answer whose
 * free exceeds its total, or whose call number is past what a shim records, is refused. */
static void mem_info_record_round_trip(void **state)
{
	char *dir = test_mkdtemp("belayer-journal");
	struct journal_record recs[2], bad;
	uint8_t buf[JOURNAL_MAX_RECORD + 8];
	ssize_t n;

	memset(recs, 0, sizeof(recs));
	recs[0].op = JOURNAL_MEM_INFO;
	recs[0].rank = 3;
	recs[0].mem_info.seq = PROTO_MAX_MEM_INFO - 1;
	recs[0].mem_info.free = 5ull << 30;
	recs[0].mem_info.total = 80ull << 30;
	memset(recs[0].mem_info.device_uuid, 0x5a, PROTO_UUID_LEN);
	snprintf(recs[0].engine_id, sizeof(recs[0].engine_id), "llm");
	recs[1].op = JOURNAL_MEM_INFO_GONE;
	snprintf(recs[1].engine_id, sizeof(recs[1].engine_id), "llm");
	for (int i = 0; i < 2; i++)
		recs[i].region.fd = -1;
	append_then_replay(dir, recs, 2);
	bad = recs[0];
	bad.mem_info.free = bad.mem_info.total + 1;
	n = journal_encode(&bad, buf, sizeof(buf));
	assert_true(n > 8);
	assert_int_equal(journal_decode(buf + 8, (size_t)n - 8, &bad), -EBADMSG);
	bad = recs[0];
	bad.mem_info.seq = PROTO_MAX_MEM_INFO;
	n = journal_encode(&bad, buf, sizeof(buf));
	assert_true(n > 8);
	assert_int_equal(journal_decode(buf + 8, (size_t)n - 8, &bad), -EBADMSG);
	test_rmtree(dir);
	free(dir);
}

/* A crash mid-write leaves part of a record: it is cut away, the records before it stay, and
 * appends continue after the last good one. */
static void torn_tail_truncated(void **state)
{
	char *dir = test_mkdtemp("belayer-journal");
	struct journal_record recs[4];
	uint8_t frame[JOURNAL_MAX_RECORD + 8];
	struct sv_journal *j;
	struct stat st;
	ssize_t len;
	off_t good;
	int fd;

	sample(recs);
	assert_int_equal(journal_open(dir, NULL, NULL, &j), 0);
	assert_int_equal(journal_append(j, &recs[0]), 0);
	assert_int_equal(journal_append(j, &recs[1]), 0);
	good = (off_t)journal_size(j);
	journal_close(j);

	len = journal_encode(&recs[3], frame, sizeof(frame));
	assert_true(len > 8);
	for (ssize_t cut = 1; cut < len; cut++) {
		fd = open(journal_path(dir), O_WRONLY | O_CLOEXEC);
		assert_int_equal(ftruncate(fd, good), 0);
		assert_int_equal(pwrite(fd, frame, (size_t)cut, good), cut);
		close(fd);
		n_seen = 0;
		assert_int_equal(journal_open(dir, collect, NULL, &j), 0);
		assert_int_equal(n_seen, 2);
		assert_int_equal(journal_size(j), (uint64_t)good);
		journal_close(j);
		assert_int_equal(stat(journal_path(dir), &st), 0);
		assert_int_equal(st.st_size, good);
	}
	/* Appending after a truncation continues cleanly. */
	assert_int_equal(journal_open(dir, NULL, NULL, &j), 0);
	assert_int_equal(journal_append(j, &recs[3]), 0);
	journal_close(j);
	n_seen = 0;
	assert_int_equal(journal_open(dir, collect, NULL, &j), 0);
	assert_int_equal(n_seen, 3);
	assert_int_equal(seen[2].op, JOURNAL_DEAD);
	journal_close(j);
	test_rmtree(dir);
	free(dir);
}

/* A flipped bit fails the CRC: that record and everything after it are dropped. */
static void corruption_stops_replay(void **state)
{
	char *dir = test_mkdtemp("belayer-journal");
	struct journal_record recs[4];
	struct sv_journal *j;
	uint64_t after_first;
	uint8_t b;
	int fd;

	sample(recs);
	assert_int_equal(journal_open(dir, NULL, NULL, &j), 0);
	assert_int_equal(journal_append(j, &recs[0]), 0);
	after_first = journal_size(j);
	for (int i = 1; i < 4; i++)
		assert_int_equal(journal_append(j, &recs[i]), 0);
	journal_close(j);
	fd = open(journal_path(dir), O_RDWR | O_CLOEXEC);
	assert_int_equal(pread(fd, &b, 1, (off_t)after_first + 12), 1);
	b ^= 0x10;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)after_first + 12), 1);
	close(fd);
	n_seen = 0;
	assert_int_equal(journal_open(dir, collect, NULL, &j), 0);
	assert_int_equal(n_seen, 1);
	assert_int_equal(journal_size(j), after_first);
	journal_close(j);
	test_rmtree(dir);
	free(dir);
}

static void rewrite_replaces_atomically(void **state)
{
	char *dir = test_mkdtemp("belayer-journal");
	struct journal_record recs[4];
	struct sv_journal *j;

	sample(recs);
	assert_int_equal(journal_open(dir, NULL, NULL, &j), 0);
	for (int k = 0; k < 50; k++)
		for (int i = 0; i < 4; i++)
			assert_int_equal(journal_append(j, &recs[i]), 0);
	assert_int_equal(journal_rewrite(j, recs, 2), 0);
	assert_int_equal(journal_append(j, &recs[3]), 0);
	journal_close(j);
	n_seen = 0;
	assert_int_equal(journal_open(dir, collect, NULL, &j), 0);
	assert_int_equal(n_seen, 3);
	assert_int_equal(seen[0].op, JOURNAL_WORKER);
	assert_int_equal(seen[1].op, JOURNAL_REGION);
	assert_int_equal(seen[2].op, JOURNAL_DEAD);
	journal_close(j);
	test_rmtree(dir);
	free(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(records_round_trip),
		cmocka_unit_test(engine_record_round_trip),
		cmocka_unit_test(mem_info_record_round_trip),
		cmocka_unit_test(torn_tail_truncated),
		cmocka_unit_test(corruption_stops_replay),
		cmocka_unit_test(rewrite_replaces_atomically),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
