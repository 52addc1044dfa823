/* SPDX-License-Identifier: MIT */
/*
 * emu-ctl: fault injection into a run of the emulated GPU stack, and its status. Acts on the
 * run whose state lives in $BELAYER_EMU_DIR (default /tmp/belayer-emu-$UID). Test-only.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-errors.h"
#include "emu-state.h"
#include "util.h"

static int parse_u64(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	if (!s || !*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end)
		return -EINVAL;
	*ret = v;
	return 0;
}

static int parse_dev(const char *s, int *ret)
{
	uint64_t v;

	if (parse_u64(s, &v) < 0 || v >= (uint64_t)emu_state_ndevices()) {
		fprintf(stderr, "emu-ctl: invalid device \"%s\" (run has %d)\n", s,
			emu_state_ndevices());
		return -EINVAL;
	}
	*ret = (int)v;
	return 0;
}

static int cmd_xid(int argc, char **argv)
{
	uint64_t code;
	int dev;

	if (argc != 3 || parse_dev(argv[1], &dev) < 0 || parse_u64(argv[2], &code) < 0)
		return -EINVAL;
	return emu_xid_raise(dev, (unsigned)code);
}

static int cmd_ecc(int argc, char **argv)
{
	bool uncorrected = false;
	uint64_t count;
	int dev, i = 2;

	if (argc < 3 || parse_dev(argv[1], &dev) < 0)
		return -EINVAL;
	if (strcmp(argv[i], "--uncorrected") == 0) {
		uncorrected = true;
		i++;
	}
	if (i != argc - 1 || parse_u64(argv[i], &count) < 0)
		return -EINVAL;
	return emu_ecc_raise(dev, uncorrected, count);
}

/* RESULT: a CUresult name (CUDA_ERROR_OUT_OF_MEMORY) or any number, for NCCL and NVML too. */
static int cmd_fail(int argc, char **argv)
{
	uint64_t count;
	int result;

	if (argc != 4 || parse_u64(argv[2], &count) < 0 || count == 0 || count > UINT32_MAX ||
	    emu_cuda_error_parse(argv[3], &result) < 0)
		return -EINVAL;
	return emu_fault_add(argv[1], (unsigned)count, result);
}

static int cmd_flip(int argc, char **argv)
{
	uint64_t id, offset, mask = 1;

	if (argc < 3 || argc > 4 || parse_u64(argv[1], &id) < 0 ||
	    parse_u64(argv[2], &offset) < 0 ||
	    (argc == 4 && (parse_u64(argv[3], &mask) < 0 || mask == 0 || mask > 0xff)))
		return -EINVAL;
	return emu_mem_flip(id, offset, (uint8_t)mask);
}

static int cmd_hang(int argc, char **argv)
{
	if (argc != 2 || (strcmp(argv[1], "on") != 0 && strcmp(argv[1], "off") != 0))
		return -EINVAL;
	return emu_hang_set(strcmp(argv[1], "on") == 0);
}

static int cmd_status(int argc, char **argv)
{
	if (argc != 1)
		return -EINVAL;
	printf("dir %s\nrun %s\ndevices %d\nhang %s\n", emu_state_dir(), emu_state_run_id(),
	       emu_state_ndevices(), emu_hang_get() ? "on" : "off");
	for (int d = 0; d < emu_state_ndevices(); d++) {
		uint64_t count = 0, bytes = 0;
		int r = emu_mem_scan(d, &count, &bytes);

		if (r < 0)
			return r;
		printf("device %d capacity %" PRIu64 " used %" PRIu64 " allocations %" PRIu64
		       " xid %" PRIu64 " ecc-corrected %" PRIu64 " ecc-uncorrected %" PRIu64 "\n",
		       d, emu_state_capacity(d), bytes, count, emu_xid_count(d),
		       emu_ecc_count(d, false), emu_ecc_count(d, true));
	}
	for (unsigned i = 0; i < EMU_MAX_FAULTS; i++) {
		char func[EMU_FUNC_NAME_MAX];
		unsigned count;
		int result;

		if (emu_fault_get(i, func, &count, &result))
			printf("fail %s %u %d\n", func, count, result);
	}
	return 0;
}

static const struct {
	const char *name;
	int (*func)(int argc, char **argv);
	const char *usage;
} commands[] = {
	{"xid", cmd_xid, "xid DEV CODE                    raise XID CODE on device DEV"},
	{"ecc", cmd_ecc, "ecc DEV [--uncorrected] COUNT   add COUNT ECC errors on DEV"},
	{"fail", cmd_fail,
	 "fail FUNC COUNT RESULT          next COUNT calls of FUNC return RESULT"},
	{"flip", cmd_flip,
	 "flip ID OFFSET [MASK]           XOR MASK (default 1) into byte OFFSET of allocation ID"},
	{"hang", cmd_hang, "hang on|off                     make collectives hang (NCCL)"},
	{"status", cmd_status, "status                          devices, memory, faults"},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: emu-ctl COMMAND [ARGS]\n");
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
		fprintf(f, "  %s\n", commands[i].usage);
}

int main(int argc, char **argv)
{
	int r;

	if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	r = emu_state_open();
	if (r < 0) {
		fprintf(stderr, "emu-ctl: cannot open emulator state: %s\n", strerror(-r));
		return 1;
	}
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++) {
		if (strcmp(argv[1], commands[i].name) != 0)
			continue;
		r = commands[i].func(argc - 1, argv + 1);
		if (r == -EINVAL) {
			fprintf(stderr, "usage: emu-ctl %s\n", commands[i].usage);
			return 2;
		}
		if (r < 0) {
			fprintf(stderr, "emu-ctl %s: %s\n", argv[1], strerror(-r));
			return 1;
		}
		return 0;
	}
	usage(stderr);
	return 2;
}
