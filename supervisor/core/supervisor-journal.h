/* SPDX-License-Identifier: MIT */
/*
 * The journal that lets a restarted supervisor know what to expect: which workers were alive
 * (pid + start time, so a reused pid is not mistaken for ours), their engine group, and the
 * record of every region they owned. Fds cannot be journaled; they come back with the shims'
 * re-announce, and the journal says which regions to wait for and which were lost.
 *
 * File: STATE_DIR/journal, a sequence of records, each
 *   uint32 LE payload length | uint32 LE crc32(payload) | payload (one msgpack map)
 * A record whose length or CRC does not check out ends the journal: it is the torn tail of a
 * write cut by a crash, and is truncated away on open. Writes are plain write(2)s: the page
 * cache survives our own crash, and a power loss also loses the GPU memory the records
 * describe, so fsync per record would buy nothing. Compaction rewrites the live state into a
 * new file (fsync + rename) when the journal grows past its limit.
 */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "proto.h"

#define JOURNAL_MAX_RECORD 4096

enum journal_op {
	JOURNAL_WORKER = 'w',	     /* a worker said hello */
	JOURNAL_REGION = 'r',	     /* a region was announced or updated */
	JOURNAL_REGION_GONE = 'x',   /* a region was released or expired */
	JOURNAL_DEAD = 'd',	     /* a worker died */
	JOURNAL_WORKER_GONE = 'f',   /* a worker and all its regions were forgotten */
	JOURNAL_ENGINE = 'g',	     /* a configured engine's launched group (pid 0: none) */
	JOURNAL_MEM_INFO = 'm',	     /* a primary rank's cuMemGetInfo answer, for its shadows */
	JOURNAL_MEM_INFO_GONE = 'M', /* an engine's answers were forgotten (a new primary) */
};

struct journal_record {
	enum journal_op op;
	uint32_t pid;
	/* JOURNAL_WORKER; JOURNAL_ENGINE: starttime, engine_id, role (which group), port */
	uint32_t uid, gid;
	uint64_t starttime;
	char engine_id[PROTO_MAX_STR + 1];
	enum worker_role role;
	int32_t rank;
	uint32_t port;
	/* JOURNAL_REGION, JOURNAL_REGION_GONE (id only) */
	struct proto_region region; /* fd unused */
	uint64_t checksum, checksum_version;
	/* JOURNAL_MEM_INFO: engine_id, rank, and the answer (device_uuid, seq, free, total;
	 * device unused); JOURNAL_MEM_INFO_GONE: engine_id */
	struct proto_mem_info mem_info;
};

struct sv_journal;

/* Opens (creating) DIR/journal, replaying each intact record through cb (may be NULL), and
 * truncating a torn tail. */
int journal_open(const char *dir, int (*cb)(void *userdata, const struct journal_record *rec),
		 void *userdata, struct sv_journal **ret);
void journal_close(struct sv_journal *j);
int journal_append(struct sv_journal *j, const struct journal_record *rec);
uint64_t journal_size(const struct sv_journal *j);
/* Rewrites the journal as exactly these records (a snapshot), atomically. */
int journal_rewrite(struct sv_journal *j, const struct journal_record *recs, size_t n);

/* Encoding, exposed for tests: one framed record into buf. Returns its length or -errno. */
ssize_t journal_encode(const struct journal_record *rec, void *buf, size_t cap);
/* Decoding, exposed for tests: one record's payload (the msgpack map, without the frame) into
 * *ret. Returns 0, or -EBADMSG with *ret zeroed (a record is at most JOURNAL_MAX_RECORD bytes). */
int journal_decode(const void *buf, size_t len, struct journal_record *ret);
