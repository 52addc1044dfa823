/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "fdpass.h"
#include "util.h"

/* Room for the most fds we ever accept, so that a peer sending more is seen (we count them)
 * rather than silently cut by the kernel, whenever it sends at most FDPASS_MAX_FDS. */
union fdpass_cmsg {
	struct cmsghdr align;
	char buf[CMSG_SPACE(sizeof(int) * FDPASS_MAX_FDS)];
};

ssize_t fdpass_send(int sock, const void *buf, size_t len, const int *fds, size_t nfds, int flags)
{
	union fdpass_cmsg control;
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;

	/* A zero-length packet would read as "peer closed" on the other side. */
	if (sock < 0 || !buf || len == 0 || nfds > FDPASS_MAX_FDS || (nfds > 0 && !fds))
		return -EINVAL;

	if (nfds > 0) {
		struct cmsghdr *cmsg;

		memset(&control, 0, sizeof(control));
		mh.msg_control = control.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		cmsg = CMSG_FIRSTHDR(&mh);
		cmsg->cmsg_level = SOL_SOCKET;
		cmsg->cmsg_type = SCM_RIGHTS;
		cmsg->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * nfds);
	}

	do
		n = sendmsg(sock, &mh, flags | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return negative_errno();
	/* SOCK_SEQPACKET sends are all or nothing; anything else is not a socket we support. */
	if ((size_t)n != len)
		return -EIO;
	return n;
}

static void close_all(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		fds[i] = safe_close(fds[i]);
}

ssize_t fdpass_recv(int sock, void *buf, size_t cap, int *ret_fds, size_t max_fds, size_t *ret_nfds,
		    int flags)
{
	union fdpass_cmsg control;
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control.buf,
		.msg_controllen = sizeof(control.buf),
	};
	int got[FDPASS_MAX_FDS];
	size_t ngot = 0;
	bool too_many = false;
	ssize_t n;

	if (ret_nfds)
		*ret_nfds = 0;
	if (sock < 0 || (!buf && cap > 0) || (max_fds > 0 && (!ret_fds || !ret_nfds)))
		return -EINVAL;

	do
		n = recvmsg(sock, &mh, flags | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return negative_errno();

	/* Collect every fd that arrived, whatever else is wrong with the packet, so none leaks. */
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		size_t k;
		int *data;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
		    c->cmsg_len < CMSG_LEN(0))
			continue;
		k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		data = (int *)(void *)CMSG_DATA(c);
		for (size_t i = 0; i < k; i++) {
			int fd;

			memcpy(&fd, data + i, sizeof(fd));
			if (ngot < ARRAY_SIZE(got))
				got[ngot++] = fd;
			else {
				/* Unreachable with our control buffer size; still never leak. */
				(void)safe_close(fd);
				too_many = true;
			}
		}
	}

	if (mh.msg_flags & MSG_TRUNC) {
		close_all(got, ngot);
		return -EMSGSIZE;
	}
	if ((mh.msg_flags & MSG_CTRUNC) || too_many || ngot > max_fds) {
		close_all(got, ngot);
		return -EBADMSG;
	}
	if (n == 0) {
		/* End of stream; a zero-length packet cannot carry anything we accept either. */
		close_all(got, ngot);
		return 0;
	}

	if (ngot > 0)
		memcpy(ret_fds, got, sizeof(int) * ngot);
	if (ret_nfds)
		*ret_nfds = ngot;
	return n;
}
