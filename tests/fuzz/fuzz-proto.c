/* SPDX-License-Identifier: MIT */
/*
 * proto_decode() on arbitrary bytes. Input: byte 0 picks how many fds (0..2) come with the
 * packet, the rest is the packet. The fds are real (dups of /dev/null): on success the message
 * owns them and proto_msg_finish() must close exactly those; on failure they stay ours.
 */
#include "fuzz-common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_fd_setup();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[2];
	size_t nfds;
	struct proto_msg m;
	int r;

	if (size < 1)
		return 0;
	fuzz_fd_mark();
	nfds = data[0] % 3;
	for (size_t i = 0; i < nfds; i++)
		fds[i] = fuzz_fd_new();

	r = proto_decode(data + 1, size - 1, fds, nfds, &m);
	if (r == 0) {
		FUZZ_CHECK(nfds == (size_t)proto_type_nfds(m.type));
		fuzz_check_roundtrip(&m);
	} else {
		fuzz_check_failure(r, &m);
		for (size_t i = 0; i < nfds; i++)
			FUZZ_CHECK(close(fds[i]) ==
				   0); /* still ours: decode must not have closed it */
	}
	fuzz_fd_check();
	return 0;
}
