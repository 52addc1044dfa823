/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory transport of the emulated NCCL. The unique id names a rendezvous file,
 * $BELAYER_EMU_DIR/nccl-<nonce>, that ranks create or join in any order under flock; it holds
 * per-rank progress counters, one collective slot per rank and one byte ring per ordered pair
 * of ranks. Its size is fixed by nranks alone (bounded memory), and the last rank to join
 * unlinks the name: ids are single-use, like NCCL's, and nothing outlives the mappings.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "emu-state.h"
#include "nccl-internal.h"

#define SHM_MAGIC "belayer-nccl-v1"

static size_t align_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

/* Slots shrink as ranks grow so that the segment stays within tens of MiB at 64 ranks; pair
 * rings likewise (n^2 of them). Both are sparse until touched. */
size_t nccl_shm_size(int nranks, uint64_t *ret_slot_bytes, uint32_t *ret_chan_bytes)
{
	size_t n = (size_t)nranks;
	uint64_t slot = MIN(MAX((16u << 20) / n, 64u << 10), 1u << 20);
	uint32_t chan = MIN(MAX((8u << 20) / (n * n), 4u << 10), 256u << 10);
	size_t size;

	slot = align_up(slot, 4096);
	chan = align_up(chan, 4096);
	size = align_up(sizeof(struct nccl_shm_hdr), 64);
	size += n * sizeof(struct nccl_shm_rank);
	size += n * n * sizeof(struct nccl_shm_chan);
	size = align_up(size, 4096);
	size += n * slot + n * n * chan;
	if (ret_slot_bytes)
		*ret_slot_bytes = slot;
	if (ret_chan_bytes)
		*ret_chan_bytes = chan;
	return size;
}

static void shm_layout(struct nccl_shm *shm, size_t n)
{
	uint8_t *base = (uint8_t *)shm->hdr;
	size_t off = align_up(sizeof(struct nccl_shm_hdr), 64);

	shm->ranks = (struct nccl_shm_rank *)(base + off);
	off += n * sizeof(struct nccl_shm_rank);
	shm->chans = (struct nccl_shm_chan *)(base + off);
	off += n * n * sizeof(struct nccl_shm_chan);
	off = align_up(off, 4096);
	shm->slots = base + off;
	off += n * shm->hdr->slot_bytes;
	shm->chan_data = base + off;
}

static int rendezvous_path(char *buf, size_t len, const uint8_t nonce[NCCL_EMU_NONCE_BYTES])
{
	const char *dir = emu_state_dir();
	char hex[2 * NCCL_EMU_NONCE_BYTES + 1];
	int n;

	if (!dir)
		return -ENOENT;
	for (size_t i = 0; i < NCCL_EMU_NONCE_BYTES; i++)
		snprintf(hex + 2 * i, 3, "%02x", nonce[i]);
	n = snprintf(buf, len, "%s/nccl-%s", dir, hex);
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return 0;
}

/* The flock must be dropped explicitly: the mapping keeps the open file description, and
 * with it the lock, alive past close(). */
static void unlock_closep(int *fd)
{
	if (*fd >= 0)
		(void)flock(*fd, LOCK_UN);
	closep(fd);
}

int nccl_shm_join(struct nccl_shm *shm, const uint8_t nonce[NCCL_EMU_NONCE_BYTES], int nranks,
		  int rank, int bus)
{
	_cleanup_(unlock_closep) int fd = -1;
	char path[PATH_MAX];
	uint64_t slot_bytes;
	uint32_t chan_bytes;
	size_t size = nccl_shm_size(nranks, &slot_bytes, &chan_bytes);
	struct nccl_shm_hdr *hdr;
	struct stat st;
	bool fresh;
	int r;

	r = rendezvous_path(path, sizeof(path), nonce);
	if (r < 0)
		return r;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return negative_errno();
	/* The lock orders creation against joining; it is held for microseconds. */
	if (flock(fd, LOCK_EX) < 0)
		return negative_errno();
	if (fstat(fd, &st) < 0)
		return negative_errno();
	fresh = st.st_size == 0;
	if (fresh) {
		if (ftruncate(fd, (off_t)size) < 0)
			return negative_errno();
	} else if ((size_t)st.st_size != size) {
		return -EINVAL;
	}
	hdr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (hdr == MAP_FAILED)
		return negative_errno();
	if (fresh) {
		memcpy(hdr->magic, SHM_MAGIC, sizeof(SHM_MAGIC));
		hdr->nranks = (uint32_t)nranks;
		hdr->slot_bytes = slot_bytes;
		hdr->chan_bytes = chan_bytes;
		hdr->size = size;
	} else if (memcmp(hdr->magic, SHM_MAGIC, sizeof(SHM_MAGIC)) != 0 ||
		   hdr->nranks != (uint32_t)nranks || hdr->size != size) {
		(void)munmap(hdr, size);
		return -EINVAL;
	}
	shm->hdr = hdr;
	shm->size = size;
	shm_layout(shm, (size_t)nranks);
	if (atomic_load(&shm->ranks[rank].joined)) {
		nccl_shm_unmap(shm);
		return -EADDRINUSE;
	}
	shm->ranks[rank].pid = getpid();
	shm->ranks[rank].bus = bus;
	atomic_store(&shm->ranks[rank].joined, 1);
	if (atomic_fetch_add(&hdr->njoined, 1) + 1 == (uint32_t)nranks)
		(void)unlink(path); /* everyone holds a mapping; the name has served */
	nccl_shm_wake(shm);
	return 0;
}

bool nccl_shm_all_joined(const struct nccl_shm *shm)
{
	return atomic_load(&shm->hdr->njoined) == shm->hdr->nranks;
}

void nccl_shm_unmap(struct nccl_shm *shm)
{
	if (shm->hdr)
		(void)munmap(shm->hdr, shm->size);
	*shm = (struct nccl_shm){};
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

/* Shared (not PRIVATE) futex ops: the word lives in a file mapping shared by processes. */
void nccl_shm_wake(struct nccl_shm *shm)
{
	atomic_fetch_add(&shm->hdr->doorbell, 1);
	if (atomic_load(&shm->hdr->waiters) > 0)
		(void)futex(&shm->hdr->doorbell, FUTEX_WAKE, INT_MAX, NULL);
}

void nccl_shm_wait(struct nccl_shm *shm, uint32_t seen, int timeout_ms)
{
	struct timespec ts = {
		.tv_sec = timeout_ms / 1000,
		.tv_nsec = (long)(timeout_ms % 1000) * 1000000L,
	};

	atomic_fetch_add(&shm->hdr->waiters, 1);
	/* A wake between the caller's read of seen and here changed the doorbell: the futex
	 * returns at once (EAGAIN) instead of sleeping through it. */
	(void)futex(&shm->hdr->doorbell, FUTEX_WAIT, seen, &ts);
	atomic_fetch_sub(&shm->hdr->waiters, 1);
}
