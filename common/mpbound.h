/* SPDX-License-Identifier: MIT */
/*
 * A raw walk of one msgpack object before msgpack-c unpacks it. msgpack-c allocates an array's
 * or a map's elements as soon as it reads the header, so five forged bytes (0xdd ff ff ff ff)
 * ask for ~100 GB; the walk refuses any object whose headers claim more elements or bytes than
 * the bytes allowed could hold (every element takes at least one byte), and allocates nothing.
 */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * The size in bytes of the object at p[0..len), when it is complete within both len and max;
 * 0 when len ends inside it and more bytes (up to max in all) could complete it; -EBADMSG when
 * it is malformed (0xc1) or cannot fit in max bytes.
 */
static inline ssize_t mpbound_object_size(const uint8_t *p, size_t len, size_t max)
{
	/* Per first byte 0xc0..0xdf: length of the size field, fixed bytes after it, and
	 * whether the size counts bytes (0), array elements (1) or map pairs (2). */
	static const struct {
		uint8_t lenbytes, fixed, kind;
	} ext[0x20] = {
		[0x04] = {1, 0, 0},  [0x05] = {2, 0, 0}, [0x06] = {4, 0, 0}, [0x07] = {1, 1, 0},
		[0x08] = {2, 1, 0},  [0x09] = {4, 1, 0}, [0x0a] = {0, 4, 0}, [0x0b] = {0, 8, 0},
		[0x0c] = {0, 1, 0},  [0x0d] = {0, 2, 0}, [0x0e] = {0, 4, 0}, [0x0f] = {0, 8, 0},
		[0x10] = {0, 1, 0},  [0x11] = {0, 2, 0}, [0x12] = {0, 4, 0}, [0x13] = {0, 8, 0},
		[0x14] = {0, 2, 0},  [0x15] = {0, 3, 0}, [0x16] = {0, 5, 0}, [0x17] = {0, 9, 0},
		[0x18] = {0, 17, 0}, [0x19] = {1, 0, 0}, [0x1a] = {2, 0, 0}, [0x1b] = {4, 0, 0},
		[0x1c] = {2, 0, 1},  [0x1d] = {4, 0, 1}, [0x1e] = {2, 0, 2}, [0x1f] = {4, 0, 2},
	};
	const size_t lim = len < max ? len : max;
	const ssize_t incomplete = len < max ? 0 : -EBADMSG;
	uint64_t owed = 1; /* objects still to read */
	size_t off = 0;

	while (owed > 0) {
		uint64_t payload = 0, entries = 0;
		uint8_t b;

		if (off >= lim)
			return incomplete;
		b = p[off++];
		owed--;
		if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
			/* fixint, nil, bool: nothing follows */
		} else if ((b & 0xf0) == 0x80) {
			entries = 2 * (uint64_t)(b & 0x0f);
		} else if ((b & 0xf0) == 0x90) {
			entries = b & 0x0f;
		} else if ((b & 0xe0) == 0xa0) {
			payload = b & 0x1f;
		} else {
			uint8_t i = (uint8_t)(b - 0xc0), hdr = ext[i].lenbytes;
			uint64_t n = 0;

			if (hdr == 0 && ext[i].fixed == 0)
				return -EBADMSG; /* 0xc1: never used */
			if (hdr > lim - off)
				return hdr > max - off ? -EBADMSG : incomplete;
			for (uint8_t k = 0; k < hdr; k++)
				n = n << 8 | p[off + k];
			off += hdr;
			if (ext[i].kind == 1)
				entries = n;
			else if (ext[i].kind == 2)
				entries = 2 * n;
			else
				payload = n + ext[i].fixed;
		}
		if (payload > max - off)
			return -EBADMSG;
		if (payload > lim - off)
			return incomplete;
		off += (size_t)payload;
		owed += entries;
		if (owed > max - off)
			return -EBADMSG;
	}
	return (ssize_t)off;
}
