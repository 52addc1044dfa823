/* SPDX-License-Identifier: MIT */
/*
 * gpu-vmm-survive: does VMM memory outlive the process that created it, when another process
 * holds its exported POSIX fd? This is what shadow promotion rests on (DESIGN §1.2).
 *
 * Four processes. The coordinator (this process) never touches CUDA, so its children start
 * with a clean driver state:
 *   exporter  cuMemCreate (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), map, fill with a known
 *             pattern, read it back, export the fd and send it to the holder; then it is
 *             SIGKILLed, like a crashed engine worker;
 *   holder    never initializes CUDA: it only holds the fd, like the supervisor;
 *   importer  initializes CUDA at start, like a parked shadow; gets the fd from the holder,
 *             imports it (cuMemImportFromShareableHandle), reserves, maps, sets access and
 *             reads the pattern back with DtoH copies.
 * Cases:
 *   fd-only   the holder passes the fd on only after the exporter was killed and reaped:
 *             between the kill and the import, the fd in the holder is the only reference;
 *   imported  the importer imports, maps and verifies before the kill, closes its fd, and the
 *             holder exits: the importer's handle and mapping are the only references;
 *   fault     as fd-only, but the exporter is not killed: it dies of a GPU fault, as an engine
 *             does (experiment E6 of the shim review). It launches a kernel that stores to a
 *             reserved address with nothing mapped (a GPU MMU fault, Xid 31 on a real GPU),
 *             gets the sticky error (cuda.h, CUDA_ERROR_ILLEGAL_ADDRESS: "any further CUDA
 *             work will return the same error. To continue using CUDA, the process must be
 *             terminated and relaunched") and exits.
 * After the kill the importer reads everything twice: at once, and again after a settle
 * delay, in case the driver tears a dead process's context down asynchronously.
 *
 * Usage: gpu-vmm-survive --case fd-only|imported|fault [--size N[KMG]] [--settle-ms N]
 *                        [--device N]
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu-check.h"

/* Values on the coordinator's control sockets. */
enum {
	MSG_READY = 1, /* exporter: memory filled and fd sent; importer: CUDA initialized */
	MSG_HAVE,      /* holder: has the fd */
	MSG_IMPORTED,  /* importer (case imported): imported, mapped, verified */
	MSG_GO,	       /* coordinator: the exporter is dead and reaped */
	MSG_FAIL,
	MSG_FAULT, /* coordinator (case fault): fault now */
};

/* Exit status of an exporter that got the sticky error of its fault and exited. */
#define EXIT_FAULTED 3

/* The faulting kernel, PTX for any GPU since Volta (JIT-compiled by the driver): one 8-byte
 * store to the address it is given. The emulator runs the host implementation registered
 * under the same name (gpu-exp-kernels-host.c). */
static const char fault_ptx[] = ".version 7.0\n"
				".target sm_70\n"
				".address_size 64\n"
				".visible .entry belayer_gpu_fault_store(\n"
				"\t.param .u64 belayer_gpu_fault_store_param_0\n"
				")\n"
				"{\n"
				"\t.reg .b64 %rd<3>;\n"
				"\tld.param.u64 %rd1, [belayer_gpu_fault_store_param_0];\n"
				"\tcvta.to.global.u64 %rd2, %rd1;\n"
				"\tst.global.u64 [%rd2], %rd1;\n"
				"\tret;\n"
				"}\n";

#define STEP_TIMEOUT_MS 60000
#define CONTROL_BYTES	(2u << 20) /* the smallest granularity: always within the allocation */

struct opts {
	bool fd_only;
	bool fault;
	uint64_t size;
	unsigned settle_ms;
	int dev;
};

struct proc {
	const struct opts *o;
	int ctl;  /* to the coordinator */
	int peer; /* exporter -> holder -> importer */
	int peer2;
};

static uint64_t seed;

static void ctl_send(int ctl, uint64_t v)
{
	(void)gpu_send(ctl, -1, v);
}

/* Blocks until the coordinator sends something (the exporter is killed while waiting). */
static uint64_t ctl_wait(int ctl, int timeout_ms)
{
	uint64_t v = MSG_FAIL;

	if (gpu_recv(ctl, timeout_ms, NULL, &v) < 0)
		return MSG_FAIL;
	return v;
}

/* Stores to a reserved address with nothing mapped; returns EXIT_FAULTED when the driver
 * reported the fault, 1 otherwise. */
static int fault_now(void)
{
	CUdeviceptr hole = 0;
	CUmodule mod;
	CUfunction f;
	void *params[] = {&hole};
	CUresult r, rs;

	r = cu.cuMemAddressReserve(&hole, 2u << 20, 0, 0, 0);
	if (r == CUDA_SUCCESS)
		r = cu.cuModuleLoadData(&mod, fault_ptx);
	if (r == CUDA_SUCCESS)
		r = cu.cuModuleGetFunction(&f, mod, "belayer_gpu_fault_store");
	if (r != CUDA_SUCCESS) {
		printf("exporter: preparing the faulting kernel failed: %s\n", gpu_cu_name(r));
		return 1;
	}
	r = cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
	rs = cu.cuCtxSynchronize();
	printf("exporter: stored to reserved, unmapped 0x%llx: launch %s, cuCtxSynchronize %s, "
	       "then a DtoD copy %s\n",
	       (unsigned long long)hole, gpu_cu_name(r), gpu_cu_name(rs),
	       gpu_cu_name(cu.cuMemcpyDtoDAsync(hole, hole, 8, NULL)));
	if (r == CUDA_SUCCESS && rs == CUDA_SUCCESS) {
		printf("exporter: the store did not fault\n");
		return 1;
	}
	printf("exporter: exiting on the sticky error\n");
	return EXIT_FAULTED;
}

static int exporter(void *arg)
{
	struct proc *p = arg;
	const struct opts *o = p->o;
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = o->dev},
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
	};
	CUmemGenericAllocationHandle h;
	uint64_t size = o->size, bad, first;
	size_t gran = 0;
	CUdeviceptr va;
	CUresult r;
	int fd = -1;

	if (gpu_cu_open(o->dev) < 0)
		goto fail;
	r = cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS || !gran) {
		printf("exporter: cuMemGetAllocationGranularity: %s\n", gpu_cu_name(r));
		goto fail;
	}
	size = (size + gran - 1) / gran * gran;
	r = gpu_vmm_alloc(o->dev, size, &h, &va);
	if (r != CUDA_SUCCESS) {
		printf("summary: exporter: POSIX-fd exportable cuMemCreate/map of %" PRIu64
		       " bytes failed: %s\n",
		       size, gpu_cu_name(r));
		goto fail;
	}
	r = gpu_pattern_fill(va, size, seed);
	if (r == CUDA_SUCCESS)
		r = gpu_pattern_check(va, size, seed, &bad, &first);
	if (r != CUDA_SUCCESS || bad) {
		printf("summary: exporter: writing the pattern failed (%s, %" PRIu64
		       " mismatched words)\n",
		       gpu_cu_name(r), r == CUDA_SUCCESS ? bad : 0);
		goto fail;
	}
	/* Control: the checker must see a different pattern (another seed) as all wrong. */
	r = gpu_pattern_check(va, CONTROL_BYTES, seed ^ 1, &bad, &first);
	if (r != CUDA_SUCCESS || bad != CONTROL_BYTES / 8) {
		printf("summary: exporter: the pattern checker missed a wrong pattern (%" PRIu64
		       " of %u words flagged)\n",
		       bad, CONTROL_BYTES / 8);
		goto fail;
	}
	r = cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS || fd < 0) {
		printf("summary: exporter: cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR): "
		       "%s\n",
		       gpu_cu_name(r));
		goto fail;
	}
	if (gpu_send(p->peer, fd, size) < 0) {
		printf("exporter: sending the fd failed: %m\n");
		goto fail;
	}
	(void)close(fd);
	printf("exporter (pid %d): %" PRIu64 " bytes (granularity %zu) at 0x%llx, POSIX fd "
	       "exported and sent to the holder; pattern written and read back: 0 mismatches "
	       "(control: another pattern mismatches in every word)\n",
	       (int)getpid(), size, gran, (unsigned long long)va);
	fflush(stdout);
	ctl_send(p->ctl, MSG_READY);
	/* Keeps the memory mapped until the coordinator kills this process, or tells it to
	 * fault. */
	if (ctl_wait(p->ctl, -1) == MSG_FAULT)
		return fault_now();
	return 1;
fail:
	ctl_send(p->ctl, MSG_FAIL);
	return 1;
}

static int holder(void *arg)
{
	struct proc *p = arg;
	uint64_t size;
	int fd = -1, r;

	r = gpu_recv(p->peer, STEP_TIMEOUT_MS, &fd, &size);
	if (r < 0 || fd < 0) {
		printf("holder: no fd from the exporter (%s)\n", strerror(r < 0 ? -r : EBADMSG));
		ctl_send(p->ctl, MSG_FAIL);
		return 1;
	}
	printf("holder (pid %d, never initializes CUDA): holds the exported fd\n", (int)getpid());
	fflush(stdout);
	ctl_send(p->ctl, MSG_HAVE);
	if (p->o->fd_only && ctl_wait(p->ctl, STEP_TIMEOUT_MS) != MSG_GO)
		return 1;
	if (gpu_send(p->peer2, fd, size) < 0) {
		printf("holder: passing the fd to the importer failed: %m\n");
		return 1;
	}
	printf("holder: passed the fd to the importer%s and closed it\n",
	       p->o->fd_only ? " after the exporter's death" : "");
	(void)close(fd);
	return 0;
}

/* Reads the whole allocation back and prints the comparison; 0 when it matches. */
static int verify(CUdeviceptr va, uint64_t size, const char *when)
{
	uint64_t bad = 0, first = 0;
	double t = gpu_now();
	CUresult r;

	r = gpu_pattern_check(va, size, seed, &bad, &first);
	if (r != CUDA_SUCCESS) {
		printf("importer: reading %s: cuMemcpyDtoH failed: %s\n", when, gpu_cu_name(r));
		printf("summary: DtoH read %s failed: %s\n", when, gpu_cu_name(r));
		return -1;
	}
	printf("importer: read back %s: %" PRIu64 " bytes checked, %" PRIu64
	       " mismatched 8-byte words",
	       when, size, bad);
	if (bad)
		printf(" (first at byte %" PRIu64 ")", first);
	printf(" [%.2f s]\n", gpu_now() - t);
	if (bad) {
		printf("summary: %" PRIu64 " of %" PRIu64 " words differ when read %s\n", bad,
		       size / 8, when);
		return -1;
	}
	return 0;
}

static int importer(void *arg)
{
	struct proc *p = arg;
	const struct opts *o = p->o;
	CUmemGenericAllocationHandle h;
	const char *after = o->fd_only ? "after the exporter's death" : "before the kill";
	CUdeviceptr va;
	uint64_t size;
	CUresult r;
	int fd = -1, e;

	if (gpu_cu_open(o->dev) < 0)
		goto fail;
	ctl_send(p->ctl, MSG_READY);
	e = gpu_recv(p->peer, STEP_TIMEOUT_MS * 2, &fd, &size);
	if (e < 0 || fd < 0) {
		printf("importer: no fd from the holder (%s)\n", strerror(e < 0 ? -e : EBADMSG));
		goto fail;
	}
	r = cu.cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
					      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	(void)close(fd);
	if (r != CUDA_SUCCESS) {
		printf("summary: cuMemImportFromShareableHandle %s failed: %s\n", after,
		       gpu_cu_name(r));
		goto fail;
	}
	r = gpu_vmm_map(h, size, o->dev, &va);
	if (r != CUDA_SUCCESS) {
		printf("summary: mapping the imported handle %s failed (reserve/map/set access): "
		       "%s\n",
		       after, gpu_cu_name(r));
		goto fail;
	}
	printf("importer (pid %d, CUDA initialized before the kill): imported the fd %s, "
	       "mapped %" PRIu64 " bytes at 0x%llx, fd closed\n",
	       (int)getpid(), after, size, (unsigned long long)va);
	if (!o->fd_only) {
		if (verify(va, size, "before the kill") < 0)
			goto fail;
		fflush(stdout);
		ctl_send(p->ctl, MSG_IMPORTED);
		if (ctl_wait(p->ctl, STEP_TIMEOUT_MS) != MSG_GO)
			return 1;
	}
	if (verify(va, size, "right after the kill") < 0)
		return 1;
	if (o->settle_ms) {
		char when[64];

		fflush(stdout);
		(void)poll(NULL, 0, (int)o->settle_ms);
		snprintf(when, sizeof(when), "%u ms later", o->settle_ms);
		if (verify(va, size, when) < 0)
			return 1;
	}
	printf("summary: %" PRIu64 " bytes survived %s of the exporter (%s): 0 mismatches\n", size,
	       o->fault ? "a GPU fault and exit" : "SIGKILL",
	       o->fd_only ? "fd held only, imported after the kill"
			  : "imported and mapped before the kill, no fd left");
	return 0;
fail:
	ctl_send(p->ctl, MSG_FAIL);
	return 1;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option options[] = {
		{"case", required_argument, NULL, 'c'},
		{"size", required_argument, NULL, 's'},
		{"settle-ms", required_argument, NULL, 'w'},
		{"device", required_argument, NULL, 'd'},
		{},
	};
	bool have_case = false;
	int c;

	*o = (struct opts){.size = 64u << 20, .settle_ms = 500};
	while ((c = getopt_long(argc, argv, "", options, NULL)) >= 0) {
		switch (c) {
		case 'c':
			if (strcmp(optarg, "fd-only") != 0 && strcmp(optarg, "imported") != 0 &&
			    strcmp(optarg, "fault") != 0)
				return -EINVAL;
			o->fault = strcmp(optarg, "fault") == 0;
			o->fd_only = o->fault || strcmp(optarg, "fd-only") == 0;
			have_case = true;
			break;
		case 's':
			if (gpu_parse_size(optarg, &o->size) < 0 || !o->size)
				return -EINVAL;
			break;
		case 'w':
			o->settle_ms = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'd':
			o->dev = atoi(optarg);
			break;
		default:
			return -EINVAL;
		}
	}
	return have_case && optind == argc ? 0 : -EINVAL;
}

static int pair(int sv[2])
{
	return socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
}

int main(int argc, char **argv)
{
	struct opts o;
	int ctl_e[2], ctl_h[2], ctl_i[2], eh[2], hi[2];
	pid_t pe = -1, ph = -1, pi = -1;
	struct proc pr;
	double t_kill;
	int st, ret = 1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (parse_args(argc, argv, &o) < 0) {
		fprintf(stderr, "usage: gpu-vmm-survive --case fd-only|imported|fault "
				"[--size N[KMG]] [--settle-ms N] [--device N]\n");
		return 2;
	}
	seed = (uint64_t)time(NULL) * 0x100000001b3ull ^ (uint64_t)getpid();
	if (pair(ctl_e) < 0 || pair(ctl_h) < 0 || pair(ctl_i) < 0 || pair(eh) < 0 || pair(hi) < 0) {
		printf("summary: socketpair: %m\n");
		return 1;
	}
	printf("case %s: %s\n",
	       o.fault	   ? "fault"
	       : o.fd_only ? "fd-only"
			   : "imported",
	       o.fault ? "the exporter dies of a GPU fault; between its exit and the import only "
			 "the holder's fd references the memory"
	       : o.fd_only
		       ? "between the SIGKILL and the import only the holder's fd references "
			 "the memory"
		       : "at the SIGKILL only the importer's imported handle and mapping reference "
			 "the memory");

	/* The importer first: it initializes CUDA long before the exporter dies. */
	pr = (struct proc){.o = &o, .ctl = ctl_i[1], .peer = hi[1], .peer2 = -1};
	pi = gpu_fork(importer, &pr);
	if (ctl_wait(ctl_i[0], STEP_TIMEOUT_MS) != MSG_READY) {
		printf("summary: the importer could not initialize CUDA\n");
		goto out;
	}
	pr = (struct proc){.o = &o, .ctl = ctl_e[1], .peer = eh[0], .peer2 = -1};
	pe = gpu_fork(exporter, &pr);
	pr = (struct proc){.o = &o, .ctl = ctl_h[1], .peer = eh[1], .peer2 = hi[0]};
	ph = gpu_fork(holder, &pr);
	if (pe < 0 || ph < 0 || pi < 0) {
		printf("summary: fork: %m\n");
		goto out;
	}
	if (ctl_wait(ctl_e[0], STEP_TIMEOUT_MS) != MSG_READY) {
		printf("coordinator: the exporter failed\n");
		goto out;
	}
	if (ctl_wait(ctl_h[0], STEP_TIMEOUT_MS) != MSG_HAVE) {
		printf("summary: the holder did not get the fd\n");
		goto out;
	}
	if (!o.fd_only) {
		if (ctl_wait(ctl_i[0], STEP_TIMEOUT_MS) != MSG_IMPORTED)
			goto out;
		st = gpu_wait(ph, STEP_TIMEOUT_MS);
		ph = -1;
		if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			printf("summary: the holder failed to pass the fd on\n");
			goto out;
		}
		printf("coordinator: the holder has exited; only the importer references the "
		       "memory\n");
	}

	t_kill = gpu_now();
	if (o.fault) {
		ctl_send(ctl_e[0], MSG_FAULT);
		st = gpu_wait(pe, STEP_TIMEOUT_MS);
		pe = -1;
		if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != EXIT_FAULTED) {
			printf("summary: the exporter did not exit on a GPU fault (status %d)\n",
			       st);
			goto out;
		}
		printf("coordinator: exporter faulted, exited and was reaped in %.3f s\n",
		       gpu_now() - t_kill);
	} else {
		(void)kill(pe, SIGKILL);
		st = gpu_wait(pe, STEP_TIMEOUT_MS);
		pe = -1;
		if (st < 0 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
			printf("summary: the exporter did not die of SIGKILL (status %d)\n", st);
			goto out;
		}
		printf("coordinator: exporter killed with SIGKILL and reaped in %.3f s\n",
		       gpu_now() - t_kill);
	}
	ctl_send(o.fd_only ? ctl_h[0] : ctl_i[0], MSG_GO);

	if (ph > 0) {
		st = gpu_wait(ph, STEP_TIMEOUT_MS);
		ph = -1;
		if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			printf("summary: the holder failed to pass the fd on after the kill\n");
			goto out;
		}
	}
	st = gpu_wait(pi, STEP_TIMEOUT_MS * 2);
	pi = -1;
	if (st < 0)
		printf("summary: the importer timed out\n");
	else if (WIFSIGNALED(st))
		printf("summary: the importer died of signal %d\n", WTERMSIG(st));
	else
		ret = WEXITSTATUS(st) == 0 ? 0 : 1;
out:
	if (pe > 0)
		(void)kill(pe, SIGKILL);
	if (ph > 0)
		(void)kill(ph, SIGKILL);
	if (pi > 0)
		(void)kill(pi, SIGKILL);
	if (pe > 0)
		(void)waitpid(pe, NULL, 0);
	if (ph > 0)
		(void)waitpid(ph, NULL, 0);
	if (pi > 0)
		(void)waitpid(pi, NULL, 0);
	return ret;
}
