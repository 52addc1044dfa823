/* SPDX-License-Identifier: MIT */
/*
 * The emulator's cross-process state: one file mapped MAP_SHARED by every process of a run.
 * Created under flock() by the first process, which also fixes the configuration; later
 * processes check magic, version and size and refuse a file they do not understand.
 */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "emu-state.h"
#include "util.h"

#define EMU_STATE_MAGIC	  0x42454d55u /* "BEMU" */
#define EMU_STATE_VERSION 1u
#define EMU_RUN_ID_LEN	  16
#define EMU_NAME_PREFIX	  "belayer-emu:"

struct emu_fault {
	char func[EMU_FUNC_NAME_MAX];
	unsigned remaining;
	int result;
};

struct emu_device {
	uint64_t capacity;
	uint64_t used; /* upper bound of live bytes, reset to the truth by each scan */
	uint64_t xid_count;
	unsigned xids[EMU_MAX_EVENTS];
	uint64_t ecc[2]; /* corrected, uncorrected */
};

struct emu_shared {
	uint32_t magic;
	uint32_t version;
	uint64_t size;
	pthread_mutex_t lock; /* process-shared, robust */
	char run_id[EMU_RUN_ID_LEN + 1];
	int ndevices;
	uint64_t next_alloc_id;
	/* Number of fault rules with calls left: the only thing the fast path reads. */
	_Atomic unsigned fault_rules;
	_Atomic int hang;
	struct emu_fault faults[EMU_MAX_FAULTS];
	struct emu_device dev[EMU_MAX_DEVICES];
};

static struct emu_shared *shared;
static char state_dir[512];
static pthread_once_t open_once = PTHREAD_ONCE_INIT;
static int open_result;

static int parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (toupper((unsigned char)*end)) {
	case 'G':
		v <<= 10;
		/* fall through */
	case 'M':
		v <<= 10;
		/* fall through */
	case 'K':
		v <<= 10;
		end++;
		break;
	case '\0':
		break;
	default:
		return -EINVAL;
	}
	if (*end && !(toupper((unsigned char)*end) == 'B' && end[1] == '\0'))
		return -EINVAL;
	*ret = v;
	return 0;
}

static void shared_init(struct emu_shared *s)
{
	pthread_mutexattr_t attr;
	const char *e;
	uint64_t capacity = 8ull << 30;
	int ndev = 2;
	unsigned char rnd[EMU_RUN_ID_LEN / 2];

	pthread_mutexattr_init(&attr);
	pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&s->lock, &attr);
	pthread_mutexattr_destroy(&attr);

	e = secure_getenv("BELAYER_EMU_DEVICES");
	if (e && *e) {
		ndev = atoi(e);
		if (ndev < 1 || ndev > EMU_MAX_DEVICES)
			ndev = 2;
	}
	e = secure_getenv("BELAYER_EMU_MEM");
	if (e && *e && parse_size(e, &capacity) < 0)
		capacity = 8ull << 30;

	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
		uint64_t t = (uint64_t)getpid() ^ (uint64_t)(uintptr_t)s;
		memcpy(rnd, &t, sizeof(rnd));
	}
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(s->run_id + 2 * i, 3, "%02x", rnd[i]);

	s->ndevices = ndev;
	s->next_alloc_id = 1;
	for (int i = 0; i < EMU_MAX_DEVICES; i++)
		s->dev[i].capacity = capacity;
	s->size = sizeof(*s);
	s->version = EMU_STATE_VERSION;
	/* Magic last: a reader that sees it sees everything above. flock orders it anyway. */
	s->magic = EMU_STATE_MAGIC;
}

static int mkdir_p(const char *path)
{
	char buf[sizeof(state_dir)];

	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
		return -ENAMETOOLONG;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0700) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static void do_open(void)
{
	_cleanup_close_ int fd = -1;
	char path[sizeof(state_dir) + 16];
	const char *e = secure_getenv("BELAYER_EMU_DIR");
	struct stat st;
	void *p;
	int r;

	if (e && *e)
		snprintf(state_dir, sizeof(state_dir), "%s", e);
	else
		snprintf(state_dir, sizeof(state_dir), "/tmp/belayer-emu-%u", (unsigned)getuid());
	r = mkdir_p(state_dir);
	if (r < 0) {
		open_result = r;
		return;
	}
	snprintf(path, sizeof(path), "%s/state", state_dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 || flock(fd, LOCK_EX) < 0 || fstat(fd, &st) < 0) {
		open_result = negative_errno();
		return;
	}
	if (st.st_size == 0 && ftruncate(fd, sizeof(struct emu_shared)) < 0) {
		open_result = negative_errno();
		return;
	}
	if (st.st_size != 0 && st.st_size != (off_t)sizeof(struct emu_shared)) {
		open_result = -EPROTO; /* another version of the emulator made it */
		return;
	}
	p = mmap(NULL, sizeof(struct emu_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		open_result = negative_errno();
		return;
	}
	if (st.st_size == 0)
		shared_init(p);
	if (((struct emu_shared *)p)->magic != EMU_STATE_MAGIC ||
	    ((struct emu_shared *)p)->version != EMU_STATE_VERSION ||
	    ((struct emu_shared *)p)->size != sizeof(struct emu_shared)) {
		(void)munmap(p, sizeof(struct emu_shared));
		open_result = -EPROTO;
		return;
	}
	(void)flock(fd, LOCK_UN);
	shared = p;
	open_result = 0;
}

int emu_state_open(void)
{
	pthread_once(&open_once, do_open);
	return open_result;
}

static struct emu_shared *get(void)
{
	if (!shared && emu_state_open() < 0)
		return NULL;
	return shared;
}

static void lock(struct emu_shared *s)
{
	/* A process that died holding the lock left counters that are each consistent on their
	 * own (single stores); taking over is safe. */
	if (pthread_mutex_lock(&s->lock) == EOWNERDEAD)
		pthread_mutex_consistent(&s->lock);
}

static void unlock(struct emu_shared *s)
{
	pthread_mutex_unlock(&s->lock);
}

int emu_state_ndevices(void)
{
	struct emu_shared *s = get();
	return s ? s->ndevices : 0;
}

uint64_t emu_state_capacity(int dev)
{
	struct emu_shared *s = get();
	if (!s || dev < 0 || dev >= s->ndevices)
		return 0;
	return s->dev[dev].capacity;
}

const char *emu_state_dir(void)
{
	return get() ? state_dir : NULL;
}

const char *emu_state_run_id(void)
{
	struct emu_shared *s = get();
	return s ? s->run_id : NULL;
}

int emu_state_uuid(int dev, unsigned char ret_uuid[16])
{
	struct emu_shared *s = get();
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over run id and index */

	if (!s || dev < 0 || dev >= s->ndevices)
		return -EINVAL;
	for (int i = 0; i < 16; i++) {
		const unsigned char c = i < EMU_RUN_ID_LEN ? (unsigned char)s->run_id[i] : 0;
		h = (h ^ c ^ (uint64_t)dev << 8) * 0x100000001b3ull;
		ret_uuid[i] = (unsigned char)(h >> 56);
	}
	ret_uuid[6] = (ret_uuid[6] & 0x0f) | 0x40; /* a version-4-looking UUID, like NVIDIA's */
	ret_uuid[8] = (ret_uuid[8] & 0x3f) | 0x80;
	return 0;
}

int emu_state_uuid_string(int dev, char *buf, size_t len)
{
	unsigned char u[16];
	int n;

	if (emu_state_uuid(dev, u) < 0)
		return -EINVAL;
	n = snprintf(buf, len,
		     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		     u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
		     u[12], u[13], u[14], u[15]);
	return n >= 0 && (size_t)n < len ? 0 : -ENOSPC;
}

int emu_state_pci_bus_id(int dev, char *buf, size_t len)
{
	struct emu_shared *s = get();

	if (!s || dev < 0 || dev >= s->ndevices || len == 0)
		return -EINVAL;
	snprintf(buf, len, "0000:%02x:00.0", 0x18 + dev);
	return 0;
}

/* ---- memory: names, scans, charges ---- */

int emu_mem_parse_name(const char *name, int *ret_dev, uint64_t *ret_id, uint64_t *ret_bytes)
{
	struct emu_shared *s = get();
	const char *p = name;
	char *end;
	unsigned long dev;
	unsigned long long id, bytes;

	if (!s)
		return -EINVAL;
	if (strncmp(p, "/memfd:", 7) == 0)
		p += 7;
	else if (strncmp(p, "memfd:", 6) == 0)
		p += 6;
	if (strncmp(p, EMU_NAME_PREFIX, strlen(EMU_NAME_PREFIX)) != 0)
		return -EINVAL;
	p += strlen(EMU_NAME_PREFIX);
	if (strncmp(p, s->run_id, EMU_RUN_ID_LEN) != 0 || p[EMU_RUN_ID_LEN] != ':')
		return -EINVAL;
	p += EMU_RUN_ID_LEN + 1;
	if (*p++ != 'd' || !isdigit((unsigned char)*p))
		return -EINVAL;
	dev = strtoul(p, &end, 10);
	if (*end != ':' || dev >= EMU_MAX_DEVICES || !isdigit((unsigned char)end[1]))
		return -EINVAL;
	id = strtoull(end + 1, &end, 10);
	if (*end != ':' || !isdigit((unsigned char)end[1]))
		return -EINVAL;
	bytes = strtoull(end + 1, &end, 10);
	if (*end != '\0' && *end != ' ')
		return -EINVAL;
	if (ret_dev)
		*ret_dev = (int)dev;
	if (ret_id)
		*ret_id = id;
	if (ret_bytes)
		*ret_bytes = bytes;
	return 0;
}

struct live {
	uint64_t id;
	uint64_t bytes;
	int dev;
};

struct live_set {
	struct live *v;
	size_t n, cap;
};

static int live_add(struct live_set *set, const char *name)
{
	struct live l;

	if (emu_mem_parse_name(name, &l.dev, &l.id, &l.bytes) < 0)
		return 0;
	if (set->n == set->cap) {
		size_t cap = set->cap ? set->cap * 2 : 64;
		struct live *v = realloc(set->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		set->v = v;
		set->cap = cap;
	}
	set->v[set->n++] = l;
	return 0;
}

static int live_cmp(const void *a, const void *b)
{
	const struct live *x = a, *y = b;
	return x->id < y->id ? -1 : x->id > y->id;
}

static int scan_pid_fds(struct live_set *set, int pid_dirfd)
{
	_cleanup_close_ int dfd = openat(pid_dirfd, "fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;
	struct dirent *de;
	int r = 0;

	if (dfd < 0)
		return 0; /* gone, or not ours to look at */
	d = fdopendir(dfd);
	if (!d)
		return 0;
	dfd = -1; /* owned by d now */
	while ((de = readdir(d)) && r == 0) {
		char target[256];
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		n = readlinkat(dirfd(d), de->d_name, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		if (strncmp(target, "/memfd:" EMU_NAME_PREFIX, 7 + strlen(EMU_NAME_PREFIX)) == 0)
			r = live_add(set, target);
	}
	closedir(d);
	return r;
}

static int scan_pid_maps(struct live_set *set, int pid_dirfd)
{
	_cleanup_close_ int fd = openat(pid_dirfd, "maps", O_RDONLY | O_CLOEXEC);
	_cleanup_fclose_ FILE *f = NULL;
	char line[1024];
	int r = 0;

	if (fd < 0)
		return 0;
	f = fdopen(fd, "re");
	if (!f)
		return 0;
	fd = -1;
	while (r == 0 && fgets(line, sizeof(line), f)) {
		char *m = strstr(line, "/memfd:" EMU_NAME_PREFIX);
		if (m) {
			m[strcspn(m, "\n")] = '\0';
			r = live_add(set, m);
		}
	}
	return r;
}

/* Sorts set by id and drops repeats (an allocation seen through several fds or mappings). */
static void live_dedupe(struct live_set *set)
{
	size_t j = 0;

	if (!set->n)
		return;
	qsort(set->v, set->n, sizeof(*set->v), live_cmp);
	for (size_t i = 0; i < set->n; i++)
		if (j == 0 || set->v[j - 1].id != set->v[i].id)
			set->v[j++] = set->v[i];
	set->n = j;
}

/* Collects the allocations of this run that some process still references; deduplicated,
 * sorted by id. */
static int scan_live(struct live_set *set)
{
	DIR *proc = opendir("/proc");
	struct dirent *de;
	int r = 0;

	if (!proc)
		return -errno;
	while ((de = readdir(proc)) && r == 0) {
		_cleanup_close_ int pfd = -1;

		if (!isdigit((unsigned char)de->d_name[0]))
			continue;
		pfd = openat(dirfd(proc), de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (pfd < 0)
			continue;
		r = scan_pid_fds(set, pfd);
		if (r == 0)
			r = scan_pid_maps(set, pfd);
	}
	closedir(proc);
	if (r < 0)
		return r;
	live_dedupe(set);
	return 0;
}

/* Resets every device's counter to the scanned truth, leaving out allocation exclude_id (one
 * being created right now under the lock, charged separately). Caller holds the lock. */
static int reconcile_locked(struct emu_shared *s, uint64_t exclude_id)
{
	struct live_set set = {};
	uint64_t used[EMU_MAX_DEVICES] = {};
	int r = scan_live(&set);

	if (r < 0) {
		free(set.v);
		return r;
	}
	for (size_t i = 0; i < set.n; i++)
		if (set.v[i].id != exclude_id && set.v[i].dev < EMU_MAX_DEVICES)
			used[set.v[i].dev] += set.v[i].bytes;
	for (int d = 0; d < EMU_MAX_DEVICES; d++)
		s->dev[d].used = used[d];
	free(set.v);
	return 0;
}

static int charge_locked(struct emu_shared *s, int dev, uint64_t bytes, uint64_t exclude_id)
{
	struct emu_device *d = &s->dev[dev];
	int r;

	if (bytes <= d->capacity && d->used <= d->capacity - bytes) {
		d->used += bytes;
		return 0;
	}
	r = reconcile_locked(s, exclude_id);
	if (r < 0)
		return r;
	if (bytes > d->capacity || d->used > d->capacity - bytes)
		return -ENOMEM;
	d->used += bytes;
	return 0;
}

int emu_mem_charge(int dev, uint64_t bytes)
{
	struct emu_shared *s = get();
	int r;

	if (!s)
		return -ENXIO;
	if (dev < 0 || dev >= s->ndevices)
		return -EINVAL;
	lock(s);
	r = charge_locked(s, dev, bytes, 0);
	unlock(s);
	return r;
}

void emu_mem_uncharge(int dev, uint64_t bytes)
{
	/* Deliberately nothing: only a scan can tell that the last reference is gone (see the
	 * header). The next reconcile drops these bytes if they are really free. */
}

uint64_t emu_mem_used(int dev)
{
	struct emu_shared *s = get();
	uint64_t used;

	if (!s || dev < 0 || dev >= s->ndevices)
		return 0;
	lock(s);
	(void)reconcile_locked(s, 0);
	used = s->dev[dev].used;
	unlock(s);
	return used;
}

int emu_mem_create(int dev, uint64_t bytes, uint64_t *ret_id)
{
	struct emu_shared *s = get();
	_cleanup_close_ int fd = -1;
	char name[128];
	uint64_t id;
	int r;

	if (!s)
		return -ENXIO;
	if (dev < 0 || dev >= s->ndevices || bytes == 0)
		return -EINVAL;
	/* Creation and charge under one lock: a concurrent scan never sees an allocation that
	 * exists but is not yet charged (it would be counted twice). */
	lock(s);
	id = s->next_alloc_id++;
	snprintf(name, sizeof(name), EMU_NAME_PREFIX "%s:d%d:%" PRIu64 ":%" PRIu64, s->run_id, dev,
		 id, bytes);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0) {
		r = negative_errno();
		goto out;
	}
	r = charge_locked(s, dev, bytes, id);
	if (r < 0)
		goto out;
	if (ftruncate(fd, (off_t)bytes) < 0) {
		r = negative_errno();
		goto out;
	}
	*ret_id = id;
	r = TAKE_FD(fd);
out:
	unlock(s);
	return r;
}

int emu_mem_scan(int dev, uint64_t *ret_count, uint64_t *ret_bytes)
{
	struct live_set set = {};
	uint64_t count = 0, bytes = 0;
	int r;

	if (!get())
		return -ENXIO;
	r = scan_live(&set);
	if (r < 0)
		goto out;
	for (size_t i = 0; i < set.n; i++) {
		if (dev >= 0 && set.v[i].dev != dev)
			continue;
		count++;
		bytes += set.v[i].bytes;
	}
	if (ret_count)
		*ret_count = count;
	if (ret_bytes)
		*ret_bytes = bytes;
out:
	free(set.v);
	return r;
}

/* Opens allocation id through the fd table of any process holding it. */
static int open_alloc(uint64_t id, uint64_t *ret_bytes)
{
	DIR *proc = opendir("/proc");
	struct dirent *de;
	int found = -ENOENT;

	if (!proc)
		return -errno;
	while (found < 0 && (de = readdir(proc))) {
		char path[300];
		DIR *d;
		struct dirent *fe;

		if (!isdigit((unsigned char)de->d_name[0]))
			continue;
		snprintf(path, sizeof(path), "/proc/%s/fd", de->d_name);
		d = opendir(path);
		if (!d)
			continue;
		while (found < 0 && (fe = readdir(d))) {
			char target[256];
			uint64_t fid, bytes;
			ssize_t n;

			if (fe->d_name[0] == '.')
				continue;
			n = readlinkat(dirfd(d), fe->d_name, target, sizeof(target) - 1);
			if (n <= 0)
				continue;
			target[n] = '\0';
			if (emu_mem_parse_name(target, NULL, &fid, &bytes) < 0 || fid != id)
				continue;
			found = openat(dirfd(d), fe->d_name, O_RDWR | O_CLOEXEC);
			if (found >= 0)
				*ret_bytes = bytes;
			else
				found = -ENOENT;
		}
		closedir(d);
	}
	closedir(proc);
	return found;
}

int emu_mem_flip(uint64_t id, uint64_t offset, uint8_t mask)
{
	_cleanup_close_ int fd = -1;
	uint64_t bytes = 0;
	uint8_t b;

	if (!get())
		return -ENXIO;
	fd = open_alloc(id, &bytes);
	if (fd < 0)
		return fd;
	if (offset >= bytes)
		return -ERANGE;
	if (pread(fd, &b, 1, (off_t)offset) != 1)
		return negative_errno();
	b ^= mask;
	if (pwrite(fd, &b, 1, (off_t)offset) != 1)
		return negative_errno();
	return 0;
}

/* ---- fault injection ---- */

int emu_fault_add(const char *func, unsigned count, int result)
{
	struct emu_shared *s = get();
	int r = -ENOSPC;

	if (!s)
		return -ENXIO;
	if (!func || !*func || strlen(func) >= EMU_FUNC_NAME_MAX || count == 0)
		return -EINVAL;
	lock(s);
	for (int i = 0; i < EMU_MAX_FAULTS; i++) {
		struct emu_fault *f = &s->faults[i];
		if (f->remaining && strcmp(f->func, func) != 0)
			continue;
		if (!f->remaining)
			atomic_fetch_add(&s->fault_rules, 1);
		snprintf(f->func, sizeof(f->func), "%s", func);
		f->result = result;
		f->remaining = count; /* a new rule for the same function replaces the old one */
		r = 0;
		break;
	}
	unlock(s);
	return r;
}

bool emu_fault_take(const char *func, int *ret_result)
{
	struct emu_shared *s = shared;
	bool fired = false;

	if (!s && emu_state_open() < 0)
		return false;
	s = shared;
	if (atomic_load_explicit(&s->fault_rules, memory_order_acquire) == 0)
		return false;
	lock(s);
	for (int i = 0; i < EMU_MAX_FAULTS; i++) {
		struct emu_fault *f = &s->faults[i];
		if (!f->remaining || strcmp(f->func, func) != 0)
			continue;
		*ret_result = f->result;
		if (--f->remaining == 0)
			atomic_fetch_sub(&s->fault_rules, 1);
		fired = true;
		break;
	}
	unlock(s);
	return fired;
}

bool emu_fault_armed(void)
{
	struct emu_shared *s = shared;

	if (!s && emu_state_open() < 0)
		return false;
	return atomic_load_explicit(&shared->fault_rules, memory_order_acquire) != 0;
}

unsigned emu_fault_pending(void)
{
	struct emu_shared *s = get();
	return s ? atomic_load(&s->fault_rules) : 0;
}

bool emu_fault_get(unsigned i, char ret_func[EMU_FUNC_NAME_MAX], unsigned *ret_count,
		   int *ret_result)
{
	struct emu_shared *s = get();
	bool ok = false;

	if (!s || i >= EMU_MAX_FAULTS)
		return false;
	lock(s);
	if (s->faults[i].remaining) {
		memcpy(ret_func, s->faults[i].func, EMU_FUNC_NAME_MAX);
		*ret_count = s->faults[i].remaining;
		*ret_result = s->faults[i].result;
		ok = true;
	}
	unlock(s);
	return ok;
}

/* ---- XID, ECC, hang ---- */

static struct emu_device *device(struct emu_shared *s, int dev)
{
	if (!s || dev < 0 || dev >= s->ndevices)
		return NULL;
	return &s->dev[dev];
}

int emu_xid_raise(int dev, unsigned xid)
{
	struct emu_shared *s = get();
	struct emu_device *d = device(s, dev);

	if (!d)
		return s ? -EINVAL : -ENXIO;
	lock(s);
	d->xids[d->xid_count % EMU_MAX_EVENTS] = xid;
	d->xid_count++;
	unlock(s);
	return 0;
}

bool emu_xid_next(int dev, uint64_t *cursor, unsigned *ret_xid)
{
	struct emu_shared *s = get();
	struct emu_device *d = device(s, dev);
	bool ok = false;

	if (!d)
		return false;
	lock(s);
	/* A reader that fell more than the ring behind lost the oldest events. */
	if (d->xid_count > EMU_MAX_EVENTS && *cursor < d->xid_count - EMU_MAX_EVENTS)
		*cursor = d->xid_count - EMU_MAX_EVENTS;
	if (*cursor < d->xid_count) {
		*ret_xid = d->xids[*cursor % EMU_MAX_EVENTS];
		(*cursor)++;
		ok = true;
	}
	unlock(s);
	return ok;
}

uint64_t emu_xid_count(int dev)
{
	struct emu_shared *s = get();
	struct emu_device *d = device(s, dev);
	uint64_t n;

	if (!d)
		return 0;
	lock(s);
	n = d->xid_count;
	unlock(s);
	return n;
}

uint64_t emu_ecc_count(int dev, bool uncorrected)
{
	struct emu_shared *s = get();
	struct emu_device *d = device(s, dev);
	uint64_t n;

	if (!d)
		return 0;
	lock(s);
	n = d->ecc[uncorrected];
	unlock(s);
	return n;
}

int emu_ecc_raise(int dev, bool uncorrected, uint64_t count)
{
	struct emu_shared *s = get();
	struct emu_device *d = device(s, dev);

	if (!d)
		return s ? -EINVAL : -ENXIO;
	lock(s);
	d->ecc[uncorrected] += count;
	unlock(s);
	return 0;
}

int emu_hang_set(bool on)
{
	struct emu_shared *s = get();

	if (!s)
		return -ENXIO;
	atomic_store(&s->hang, on);
	return 0;
}

bool emu_hang_get(void)
{
	struct emu_shared *s = get();
	return s && atomic_load(&s->hang);
}

int emu_mem_for_each_process(int dev, int (*fn)(int pid, uint64_t bytes, void *userdata),
			     void *userdata)
{
	DIR *proc;
	struct dirent *de;
	int r = 0;

	if (!get())
		return -ENXIO;
	proc = opendir("/proc");
	if (!proc)
		return -errno;
	while ((de = readdir(proc)) && r == 0) {
		_cleanup_close_ int pfd = -1;
		struct live_set set = {};
		uint64_t bytes = 0;

		if (!isdigit((unsigned char)de->d_name[0]))
			continue;
		pfd = openat(dirfd(proc), de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (pfd < 0)
			continue;
		r = scan_pid_maps(&set, pfd);
		live_dedupe(&set);
		for (size_t i = 0; r == 0 && i < set.n; i++)
			if (dev < 0 || set.v[i].dev == dev)
				bytes += set.v[i].bytes;
		free(set.v);
		if (r == 0 && bytes)
			r = fn(atoi(de->d_name), bytes, userdata);
	}
	closedir(proc);
	return r;
}
