/* SPDX-License-Identifier: MIT */
/*
 * The receive path as the supervisor runs it: a packet with 0..3 fds goes through a real
 * SOCK_SEQPACKET socketpair and proto_recv() (fdpass_recv + proto_decode) takes it. Input:
 * byte 0 picks the fd count (3 is more than any message carries), the rest is the packet.
 * Whatever happens, every fd that arrived must end up owned by the message or closed.
 */
#include <sys/socket.h>

#include "fdpass.h"
#include "fuzz-common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int sv[2] = {-1, -1};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	int sndbuf = 4 * PROTO_MAX_MSG;

	fuzz_fd_setup();
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
	FUZZ_CHECK(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)) == 0);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[3];
	size_t nfds;
	struct proto_msg m;
	ssize_t n;
	int r;

	/* An empty packet reads as end of stream; larger than this is refused by the sender. */
	if (size < 2 || size - 1 > PROTO_MAX_MSG + 64)
		return 0;
	fuzz_fd_mark();
	nfds = data[0] % 4;
	for (size_t i = 0; i < nfds; i++)
		fds[i] = fuzz_fd_new();
	n = fdpass_send(sv[0], data + 1, size - 1, fds, nfds, MSG_DONTWAIT);
	FUZZ_CHECK(n == (ssize_t)(size - 1));
	/* The kernel holds its own references while the packet is in flight. */
	for (size_t i = 0; i < nfds; i++)
		FUZZ_CHECK(close(fds[i]) == 0);

	r = proto_recv(sv[1], &m, MSG_DONTWAIT);
	if (r == 0) {
		FUZZ_CHECK(nfds == (size_t)proto_type_nfds(m.type));
		fuzz_check_roundtrip(&m);
	} else if (size - 1 > PROTO_MAX_MSG) {
		FUZZ_CHECK(r == -EMSGSIZE);
	} else if (nfds > PROTO_MAX_FDS) {
		FUZZ_CHECK(r == -EBADMSG);
	} else {
		fuzz_check_failure(r, &m);
	}

	/* Exactly one packet went in and one came out. */
	FUZZ_CHECK(proto_recv(sv[1], &m, MSG_DONTWAIT) == -EAGAIN);
	fuzz_fd_check();
	return 0;
}
