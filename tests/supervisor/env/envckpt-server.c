/* SPDX-License-Identifier: MIT */
/*
 * A long-running server inside a test environment, its whole state in memory (a token and a
 * request counter): "set X" stores X; any request answers "TOKEN COUNT\n" and closes. After a
 * CRIU restore it must answer from its saved state.
 *
 * Listens on a unix socket (argument: an absolute path) or TCP 127.0.0.1:PORT (argument: the
 * port). The tests run both; the TCP one needs CRIU >= 4.2 on kernels >= 6.16 (4.1.1 fails
 * to read the socket's options there: CRIU issue #2705).
 *
 * "vfork CHILD_US PARENT_US" instead: vforks for ever, each child waiting CHILD_US before it
 * exits (0: never, after creating ./in-vfork, so that a test knows it is there), the parent
 * CHILD_US + PARENT_US per round: a process that is often (or always) a vfork child that has
 * not exec'd, as dash and posix_spawn make them briefly.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void wait_us(unsigned long us)
{
	struct timespec ts = {.tv_sec = (time_t)(us / 1000000),
			      .tv_nsec = (long)(us % 1000000) * 1000};

	while (nanosleep(&ts, &ts) < 0)
		;
}

static int vfork_loop(unsigned long child_us, unsigned long parent_us)
{
	for (;;) {
		pid_t pid = vfork();

		if (pid == 0) {
			/* Only async-signal-safe calls on the parent's stack: nanosleep, _exit. */
			if (child_us == 0) {
				(void)close(open("in-vfork", O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
				for (;;)
					pause();
			}
			wait_us(child_us);
			_exit(0);
		}
		if (pid < 0)
			return 1;
		(void)waitpid(pid, NULL, 0);
		wait_us(parent_us);
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	char token[256] = "", buf[256], out[300];
	unsigned long count = 0;
	int s, one = 1;

	if (argc == 4 && strcmp(argv[1], "vfork") == 0)
		return vfork_loop(strtoul(argv[2], NULL, 10), strtoul(argv[3], NULL, 10));
	if (argc != 2)
		return 2;
	if (argv[1][0] == '/') {
		struct sockaddr_un su = {.sun_family = AF_UNIX};

		if (strlen(argv[1]) >= sizeof(su.sun_path))
			return 2;
		memcpy(su.sun_path, argv[1], strlen(argv[1]));
		(void)unlink(argv[1]);
		s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (s < 0 || bind(s, (struct sockaddr *)&su, sizeof(su)) < 0 || listen(s, 16) < 0)
			return 1;
	} else {
		sa.sin_port = htons((uint16_t)atoi(argv[1]));
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
		    bind(s, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(s, 16) < 0)
			return 1;
	}
	for (;;) {
		int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
		ssize_t n;
		int len;

		if (c < 0)
			continue;
		n = read(c, buf, sizeof(buf) - 1);
		if (n > 0) {
			buf[n] = '\0';
			buf[strcspn(buf, "\r\n")] = '\0';
			count++;
			if (strncmp(buf, "set ", 4) == 0)
				snprintf(token, sizeof(token), "%.200s", buf + 4);
			len = snprintf(out, sizeof(out), "%.200s %lu\n", token, count);
			(void)!write(c, out, (size_t)len);
		}
		close(c);
	}
}
