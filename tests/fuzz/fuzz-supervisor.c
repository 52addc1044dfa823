/* SPDX-License-Identifier: MIT */
/*
 * The supervisor's message handler, as one connection drives it: a session of packets (see
 * gen-seeds.c for the framing), each sent with 0..3 fds through a real SOCK_SEQPACKET
 * socketpair and taken by handler_read() with a fresh registry per input. Checks beyond "no
 * crash": every reply the supervisor writes decodes, and no fd outlives the input (the
 * registry's region fds and pidfds, queued replies' fds, fds of refused packets).
 *
 * The session runs as this process: hello makes it a worker, so injections are configured
 * off (they would signal the fuzzer) and NVML/libcuda paths point nowhere.
 */
#include <sys/socket.h>

#include "fdpass.h"
#include "fuzz-common.h"
#include "log.h"
#include "supervisor-client.h"
#include "supervisor-events.h"
#include "supervisor-handler.h"
#include "supervisor-health.h"
#include "supervisor-subsystem.h"
#include "supervisor-traj-ctl.h"
#include "supervisor.h"
#include "sv-policy.h"
#include "sv-recovery.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_PACKETS 64

static struct health_gpu *gpu;

/* Environments are the daemon's alone (CRIU, BPF): their requests get its answer without them. */
static int on_env_request(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	(void)m;
	return client_send_error(s, c, EOPNOTSUPP, PROTO_ENV_REQUEST,
				 "environments are served by the daemon only");
}

static const struct sv_message_handler env_messages[] = {
	{PROTO_ENV_REQUEST, on_env_request},
	{},
};

static const struct sv_subsystem no_env = {.name = "env", .messages = env_messages};

/* The daemon's subsystems that the socket reaches, but the environments. */
static const struct sv_subsystem *const subsystems[] = {
	&no_env,
	&recovery_subsystem,
	&policy_subsystem,
	NULL,
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_fd_setup();
	log_setup("fuzz-supervisor", LOG_LEVEL_ERROR);
	return 0;
}

/* Reads every reply queued for the peer: each must decode; fds are closed. */
static void drain(int sock)
{
	for (;;) {
		struct proto_msg m;
		int r = proto_recv(sock, &m, MSG_DONTWAIT);

		if (r == -EAGAIN ||
		    r == -ECONNRESET) /* nothing more; or closed by the supervisor */
			return;
		FUZZ_CHECK(r == 0);
		proto_msg_finish(&m);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct supervisor s;
	struct sv_client *c;
	int sv[2], sndbuf = 4 * PROTO_MAX_MSG;
	size_t off = 0;

	fuzz_fd_mark();
	memset(&s, 0, sizeof(s));
	config_init_defaults(&s.config);
	subsystems_init(&s, subsystems);
	s.config.allow_inject = false;
	s.config.journal = false;
	s.config.max_fds = 32;
	s.config.max_regions_per_worker = 16;
	s.config.max_queued_bytes = 256 << 10;
	snprintf(s.config.nvml_library, sizeof(s.config.nvml_library), "/nonexistent/nvml.so");
	snprintf(s.config.cuda_library, sizeof(s.config.cuda_library), "/nonexistent/cuda.so");
	s.uid = getuid();
	s.gpu = gpu;
	FUZZ_CHECK(events_init(&s, 8) == 0);
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
	FUZZ_CHECK(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf)) == 0);
	c = client_new(&s, sv[1]);
	FUZZ_CHECK(c);

	for (int n = 0; n < MAX_PACKETS && size - off >= 3 && !c->closing; n++) {
		size_t nfds = data[off] % 4, len = (size_t)data[off + 1] << 8 | data[off + 2];
		int fds[3];
		ssize_t sent;

		off += 3;
		len = MIN(len, size - off);
		if (len == 0)
			break; /* an empty packet reads as end of stream */
		for (size_t i = 0; i < nfds; i++)
			fds[i] = fuzz_fd_new();
		sent = fdpass_send(sv[0], data + off, len, fds, nfds, MSG_DONTWAIT);
		for (size_t i = 0; i < nfds; i++)
			FUZZ_CHECK(close(fds[i]) == 0);
		off += len;
		if (sent < 0)
			break;
		while (!c->closing) {
			int r = handler_read(&s, c);

			if (r == -EAGAIN)
				break;
			FUZZ_CHECK(r == 0 || r == -ECONNRESET);
			if (r < 0)
				break;
		}
		/* What the loop would do when the socket turns writable. */
		if (!c->closing)
			(void)client_flush(&s, c);
		drain(sv[0]);
	}

	gpu = s.gpu; /* NVML is looked for once, not per input */
	s.gpu = NULL;
	client_free(&s, c);
	registry_finish(&s.reg);
	events_finish(&s);
	traj_ctl_free(&s); /* step events allocate the tracker */
	drain(sv[0]);
	FUZZ_CHECK(close(sv[0]) == 0);
	fuzz_fd_check();
	return 0;
}
