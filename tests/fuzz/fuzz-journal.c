/* SPDX-License-Identifier: MIT */
/*
 * The supervisor's journal (supervisor-journal.h) on arbitrary bytes. The first byte picks:
 *   even: journal_decode() of the rest as one record's payload; whatever it accepts must
 *         re-encode (journal_encode) and decode again to the same record.
 *   odd:  the rest written as DIR/journal in a fresh directory, then journal_open() replays it
 *         through a callback (which checks each record it is given) and truncates whatever
 *         tail does not check out; a second open must then find exactly the records kept.
 * No crash, no leak, no fd left open.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz-common.h"
#include "supervisor-journal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct replayed {
	size_t n;
	uint64_t sum; /* over the records' bytes: the second open must see the same ones */
};

static int on_record(void *userdata, const struct journal_record *rec)
{
	struct replayed *r = userdata;
	uint8_t buf[JOURNAL_MAX_RECORD + 8];
	struct journal_record again;
	ssize_t n;

	/* A replayed record is one the decoder accepted: it must round-trip too. */
	n = journal_encode(rec, buf, sizeof(buf));
	FUZZ_CHECK(n > 8);
	FUZZ_CHECK(journal_decode(buf + 8, (size_t)n - 8, &again) == 0);
	FUZZ_CHECK(memcmp(rec, &again, sizeof(again)) == 0);
	r->n++;
	for (size_t i = 0; i < sizeof(*rec); i++)
		r->sum = r->sum * 31 + ((const uint8_t *)rec)[i];
	return 0;
}

static void check_decode(const uint8_t *data, size_t size)
{
	uint8_t buf[JOURNAL_MAX_RECORD + 8];
	struct journal_record rec, again;
	ssize_t n;

	if (journal_decode(data, size, &rec) < 0) {
		FUZZ_CHECK(fuzz_all_zero(&rec, sizeof(rec)));
		return;
	}
	n = journal_encode(&rec, buf, sizeof(buf));
	FUZZ_CHECK(n > 8);
	FUZZ_CHECK(journal_decode(buf + 8, (size_t)n - 8, &again) == 0);
	FUZZ_CHECK(memcmp(&rec, &again, sizeof(again)) == 0);
}

static void check_replay(const uint8_t *data, size_t size)
{
	char dir[] = "/tmp/fuzz-journal-XXXXXX", path[sizeof(dir) + 16];
	struct replayed first = {0}, second = {0};
	struct sv_journal *j;
	struct stat st;
	FILE *f;

	FUZZ_CHECK(mkdtemp(dir));
	(void)snprintf(path, sizeof(path), "%s/journal", dir);
	f = fopen(path, "we");
	FUZZ_CHECK(f);
	FUZZ_CHECK(fwrite(data, 1, size, f) == size);
	FUZZ_CHECK(fclose(f) == 0);

	FUZZ_CHECK(journal_open(dir, on_record, &first, &j) == 0);
	FUZZ_CHECK(stat(path, &st) == 0);
	FUZZ_CHECK((uint64_t)st.st_size == journal_size(j) && (size_t)st.st_size <= size);
	journal_close(j);

	/* What was kept is intact: a second open replays the same records and truncates nothing. */
	FUZZ_CHECK(journal_open(dir, on_record, &second, &j) == 0);
	FUZZ_CHECK(second.n == first.n && second.sum == first.sum);
	FUZZ_CHECK(stat(path, &st) == 0 && (uint64_t)st.st_size == journal_size(j));
	journal_close(j);

	FUZZ_CHECK(unlink(path) == 0);
	FUZZ_CHECK(rmdir(dir) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (fuzz_devnull < 0)
		fuzz_fd_setup();
	if (size < 1)
		return 0;
	fuzz_fd_mark();
	if (data[0] % 2 == 0)
		check_decode(data + 1, size - 1);
	else
		check_replay(data + 1, size - 1);
	fuzz_fd_check();
	return 0;
}
