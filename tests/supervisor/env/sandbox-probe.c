/* SPDX-License-Identifier: MIT */
/*
 * A hostile agent's probes (issue 19), run as an environment's own command: each tries one
 * way out of the sandbox and prints one line, "NAME contained WHY" or "NAME ESCAPED WHAT".
 * Every probe is harmless to the host even when it gets through: it opens, connects or
 * creates and closes again, mounts on an empty directory of its own, sets the clock to what it
 * reads, writes nothing to a host file.
 *
 * Usage: sandbox-probe KEY=VALUE...; the keys name what the test set up outside:
 *   tcp=PORT        a host service on 127.0.0.1       abstract=NAME  a host abstract socket
 *   metrics=PORT    the supervisor's /metrics         svsock=PATH    the supervisor's socket
 *   svpid=PID       the supervisor                    hostfile=PATH  a host-only file
 *   other=PATH      another environment's upper layer  state=PATH     the state directory
 *   devnodes=PATH,... device nodes the test made inside that must not open
 *   etcfile=PATH    a host file of /etc, mode 0600     etcdir=PATH    a host directory of /etc,
 *                                                                    0700, holding a file "key"
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <linux/reboot.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static const char *arg(int argc, char **argv, const char *key)
{
	size_t n = strlen(key);

	for (int i = 1; i < argc; i++)
		if (strncmp(argv[i], key, n) == 0 && argv[i][n] == '=')
			return argv[i] + n + 1;
	return NULL;
}

static int escaped_n;

/* A probe's verdict: contained unless it got through; err: why the attempt failed (0 for a
 * probe that reads a state rather than tries an action). */
static void verdict(const char *name, bool got_through, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void verdict(const char *name, bool got_through, int err, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (got_through)
		escaped_n++;
	printf("%s %s %s%s%s\n", name, got_through ? "ESCAPED" : "contained", what,
	       got_through || !err ? "" : ": ", got_through || !err ? "" : strerror(err));
	fflush(stdout);
}

/* An attempt: a result r < 0 (errno e) is contained. */
static void attempt(const char *name, long r, int e, const char *what)
{
	verdict(name, r >= 0, e, "%s", what);
	if (r > 2)
		(void)close((int)r);
}

#define TRY(name, call, what)                   \
	do {                                    \
		errno = 0;                      \
		long r_ = (long)(call);         \
		attempt(name, r_, errno, what); \
	} while (0)

static bool status_field(const char *field, char *buf, size_t cap)
{
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];
	size_t n = strlen(field);
	bool found = false;

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f))
		if (strncmp(line, field, n) == 0 && line[n] == ':') {
			snprintf(buf, cap, "%s", line + n + 1 + strspn(line + n + 1, " \t"));
			buf[strcspn(buf, "\n")] = 0;
			found = true;
		}
	fclose(f);
	return found;
}

static void privileges(void)
{
	/* What a default Docker container lacks too (and CAP_MKNOD, CAP_NET_RAW, which it has). */
	static const struct {
		int cap;
		const char *name;
	} bad[] = {
		{21, "sys_admin"}, {16, "sys_module"},	 {12, "net_admin"},	 {27, "mknod"},
		{39, "bpf"},	   {38, "perfmon"},	 {2, "dac_read_search"}, {19, "sys_ptrace"},
		{13, "net_raw"},   {17, "sys_rawio"},	 {22, "sys_boot"},	 {25, "sys_time"},
		{34, "syslog"},	   {24, "sys_resource"},
	};
	char v[64], held[256] = "";
	unsigned long long eff = 0;

	if (status_field("CapEff", v, sizeof(v)))
		eff = strtoull(v, NULL, 16);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (eff & (1ull << bad[i].cap))
			snprintf(held + strlen(held), sizeof(held) - strlen(held), " %s",
				 bad[i].name);
	verdict("capabilities", held[0] != 0, 0, "CapEff %s%s", v, held);
	verdict("no_new_privs", prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1, 0, "no_new_privs %d",
		prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));
	v[0] = 0;
	(void)status_field("Seccomp", v, sizeof(v));
	verdict("seccomp", strcmp(v, "2") != 0, 0, "Seccomp mode %s", v);
}

static void host_files(const char *hostfile)
{
	struct {
		struct file_handle h;
		unsigned char bytes[8];
	} fh = {.h = {.handle_bytes = 8, .handle_type = 1}};
	int mnt = -1, fd = open("/usr", O_RDONLY | O_DIRECTORY | O_CLOEXEC), e;
	char path[64];

	/* "shocker": a handle to inode 2 (the file system's root) of the device /usr is on */
	memcpy(fh.bytes, &(uint32_t){2}, 4);
	TRY("open_by_handle_at", syscall(SYS_open_by_handle_at, fd, &fh.h, O_RDONLY),
	    "the root of /usr's file system by handle");
	TRY("name_to_handle_at", syscall(SYS_name_to_handle_at, AT_FDCWD, "/usr", &fh.h, &mnt, 0),
	    "a handle of /usr");
	if (fd >= 0)
		close(fd);
	TRY("remount_usr_rw", mount(NULL, "/usr", NULL, MS_REMOUNT | MS_BIND, NULL),
	    "remount /usr read-write");
	snprintf(path, sizeof(path), "/usr/.belayer-probe-%d", (int)getpid());
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	e = errno;
	if (fd >= 0)
		(void)unlink(path);
	attempt("write_usr", fd, e, "create a file in the host's /usr");
	if (hostfile)
		TRY("host_file", open(hostfile, O_RDONLY | O_CLOEXEC), hostfile);
	/* chroot into a subdirectory and climb: a mount namespace's root holds */
	if (hostfile && fork() == 0) {
		(void)mkdir("/tmp/.jail", 0700);
		if (chroot("/tmp/.jail") == 0)
			for (int i = 0; i < 64; i++)
				(void)!chdir("..");
		(void)!chroot(".");
		TRY("chroot_climb", open(hostfile, O_RDONLY | O_CLOEXEC),
		    "the host file after "
		    "a chroot climb");
		_exit(0);
	}
	(void)wait(NULL);
}

/* Bytes read from path (up to 64 KiB), -1 when it cannot be opened or read. */
static ssize_t read_bytes(const char *path)
{
	static char buf[1 << 16];
	int fd = open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	ssize_t n, total = 0;

	if (fd < 0)
		return -1;
	while ((n = read(fd, buf, sizeof(buf))) > 0 && total < (ssize_t)sizeof(buf))
		total += n;
	close(fd);
	return n < 0 ? -1 : total;
}

/* The host's /etc is there read-only less what an unprivileged host user could not read:
 * secrets give nothing (an empty file, an empty directory, or EACCES), the rest reads as on
 * the host, and the host's programs still run on it. */
static void host_etc(int argc, char **argv)
{
	static const char *const secret[] = {"/etc/shadow", "/etc/gshadow"};
	static const char *const public[] = {"/etc/passwd", "/etc/os-release", "/etc/ld.so.cache"};
	const char *v;
	char name[64], line[128] = "";
	ssize_t n;
	FILE *p;

	for (size_t i = 0; i < sizeof(secret) / sizeof(secret[0]); i++) {
		snprintf(name, sizeof(name), "etc_%s", secret[i] + 5);
		n = read_bytes(secret[i]);
		verdict(name, n > 0, 0, "%s gives %zd bytes", secret[i], n);
	}
	if ((v = arg(argc, argv, "etcfile"))) {
		n = read_bytes(v);
		verdict("etc_secret_file", n > 0, 0, "a 0600 host file of /etc gives %zd bytes", n);
	}
	if ((v = arg(argc, argv, "etcdir"))) {
		DIR *d = opendir(v);
		int listed = 0;
		char key[PATH_MAX];

		if (d) {
			for (struct dirent *de; (de = readdir(d));)
				listed += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
			closedir(d);
		}
		verdict("etc_secret_dir", listed > 0, 0, "a 0700 host directory of /etc lists %d",
			listed);
		snprintf(key, sizeof(key), "%s/key", v);
		n = read_bytes(key);
		verdict("etc_secret_dir_file", n > 0, 0, "a file in it gives %zd bytes", n);
	}
	TRY("etc_unmask", umount2("/etc/shadow", MNT_DETACH), "unmount the mask of /etc/shadow");
	/* Not ways out, but the mask must not cost what the agent needs: a host file every user
	 * reads, and sh and python3 (whose ssl module reads /etc/ssl) running on them. */
	for (size_t i = 0; i < sizeof(public) / sizeof(public[0]); i++) {
		snprintf(name, sizeof(name), "etc_%s", public[i] + 5);
		n = read_bytes(public[i]);
		verdict(name, n <= 0, 0, "%s reads %zd bytes", public[i], n);
	}
	p = popen("python3 -c 'import pwd, ssl; print(pwd.getpwuid(0).pw_name, "
		  "bool(ssl.create_default_context()))' 2>&1",
		  "re");
	if (p) {
		if (!fgets(line, sizeof(line), p))
			line[0] = 0;
		line[strcspn(line, "\n")] = 0;
		(void)pclose(p);
	}
	verdict("etc_python3", strcmp(line, "root True") != 0, 0, "sh and python3 run: '%s'", line);
}

static void mounts(void)
{
	static const struct {
		const char *type, *what;
	} fs[] = {
		{"proc", "proc"},	{"sysfs", "sysfs"},
		{"cgroup2", "cgroup2"}, {"cgroup", "cgroup"},
		{"bpf", "bpffs"},	{"debugfs", "debugfs"},
		{"tracefs", "tracefs"}, {"binfmt_misc", "binfmt_misc"},
		{"tmpfs", "tmpfs"},
	};
	char name[64];

	(void)mkdir("/tmp/.mnt", 0700);
	for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++) {
		snprintf(name, sizeof(name), "mount_%s", fs[i].type);
		errno = 0;
		int r = mount(fs[i].what, "/tmp/.mnt", fs[i].type, 0,
			      strcmp(fs[i].type, "cgroup") == 0 ? "pids" : NULL);

		verdict(name, r == 0, errno, "mount %s", fs[i].type);
		if (r == 0)
			(void)umount2("/tmp/.mnt", MNT_DETACH);
	}
	TRY("fsopen", syscall(SYS_fsopen, "tmpfs", 0), "fsopen(tmpfs)");
	TRY("open_tree", syscall(SYS_open_tree, AT_FDCWD, "/usr", 1 /* OPEN_TREE_CLONE */),
	    "clone the /usr mount");
}

static void devices_and_proc(void)
{
	char buf[64];
	int fd;
	ssize_t n;

	TRY("mknod_block", mknod("/tmp/.sda", S_IFBLK | 0600, makedev(8, 0)),
	    "a block device node (8:0)");
	(void)unlink("/tmp/.sda");
	TRY("mknod_kmsg", mknod("/tmp/.kmsg", S_IFCHR | 0600, makedev(1, 11)), "/dev/kmsg's node");
	(void)unlink("/tmp/.kmsg");
	TRY("core_pattern", open("/proc/sys/kernel/core_pattern", O_WRONLY | O_CLOEXEC),
	    "open core_pattern to write");
	TRY("sysrq_trigger", open("/proc/sysrq-trigger", O_WRONLY | O_CLOEXEC),
	    "open sysrq-trigger to write");
	TRY("sys_kernel", open("/sys/kernel", O_RDONLY | O_DIRECTORY | O_CLOEXEC),
	    "open /sys/kernel");
	/* a pty of its own works; the host's are not there (devpts numbers from 0 per instance) */
	fd = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
	{
		int lock = 0;
		unsigned int pty = 99;

		if (fd >= 0)
			(void)ioctl(fd, TIOCGPTN, &pty);
		verdict("pty", fd < 0 || pty != 0 || ioctl(fd, TIOCSPTLCK, &lock) < 0, 0,
			"a pty of the environment's own devpts (number %u)", pty);
		if (fd >= 0)
			close(fd);
	}
	/* what an agent needs of /dev keeps working under the device allow-list */
	{
		static const char *const usable[] = {"/dev/null", "/dev/zero", "/dev/full",
						     "/dev/random", "/dev/urandom"};

		for (size_t i = 0; i < sizeof(usable) / sizeof(usable[0]); i++) {
			errno = 0;
			fd = open(usable[i], O_RDWR | O_CLOEXEC);
			verdict("dev_usable", fd < 0, 0, "%s opens%s%s", usable[i],
				fd < 0 ? ": " : "", fd < 0 ? strerror(errno) : "");
			if (fd >= 0)
				close(fd);
		}
	}
	fd = open("/proc/keys", O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, buf, sizeof(buf)) : -1;
	if (fd >= 0)
		close(fd);
	verdict("proc_keys", n > 0, 0, "/proc/keys gives %zd bytes", n);
}

/* Device nodes the test put into the environment's file system (devnodes=PATH,...: a block
 * device and /dev/kmsg, made on the host side): the device allow-list refuses them. kmsg opens
 * write-only, which needs no capability; a block device read-only. */
static void foreign_nodes(const char *list)
{
	char copy[1024], *save = NULL;

	if (!list) {
		verdict("devnodes", true, 0, "no devnodes= given");
		return;
	}
	snprintf(copy, sizeof(copy), "%s", list);
	for (char *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
		struct stat st;

		if (stat(p, &st) < 0) {
			verdict("devnode", true, errno, "%s is not there", p);
			continue;
		}
		TRY("devnode",
		    open(p, (S_ISBLK(st.st_mode) ? O_RDONLY : O_WRONLY) | O_NOCTTY | O_CLOEXEC), p);
	}
}

static int tcp_connect(const char *port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)atoi(port)),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		return s;
	close(s);
	return -1;
}

static int unix_connect(const char *path, bool abstract)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	size_t n = strlen(path);

	if (n + 1 >= sizeof(sa.sun_path))
		return -1;
	memcpy(sa.sun_path + abstract, path, n);
	if (s >= 0 &&
	    connect(s, (struct sockaddr *)&sa,
		    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + abstract + n)) == 0)
		return s;
	if (s >= 0)
		close(s);
	return -1;
}

/* Any line of file that contains needle. */
static bool file_has(const char *file, const char *needle)
{
	FILE *f = fopen(file, "re");
	char line[4096];
	bool hit = false;

	if (!f)
		return false;
	while (!hit && fgets(line, sizeof(line), f))
		hit = strstr(line, needle) != NULL;
	fclose(f);
	return hit;
}

static void network(int argc, char **argv)
{
	const char *v;

	if ((v = arg(argc, argv, "tcp")))
		TRY("host_tcp", tcp_connect(v), "a host service on 127.0.0.1");
	if ((v = arg(argc, argv, "metrics")))
		TRY("supervisor_metrics", tcp_connect(v), "the supervisor's /metrics");
	if ((v = arg(argc, argv, "abstract")))
		TRY("host_abstract_socket", unix_connect(v, true), "a host abstract unix socket");
	TRY("af_packet", socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0), "an AF_PACKET socket");
	TRY("raw_socket", socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP),
	    "a raw ICMP socket");
	if ((v = arg(argc, argv, "svsock"))) {
		TRY("supervisor_socket", unix_connect(v, false), "the supervisor's socket");
		verdict("proc_net_unix", file_has("/proc/net/unix", v), 0,
			"/proc/net/unix naming the supervisor's socket");
	}
}

static void supervisor_and_others(int argc, char **argv)
{
	const char *v;
	struct stat st;

	if ((v = arg(argc, argv, "svpid")))
		TRY("signal_supervisor", kill(atoi(v), 0), "signal 0 to the supervisor's pid");
	if ((v = arg(argc, argv, "other")))
		TRY("other_env_layer", stat(v, &st), "another environment's upper layer");
	if ((v = arg(argc, argv, "state"))) {
		TRY("state_dir", stat(v, &st), "the supervisor's state directory");
		verdict("mountinfo", file_has("/proc/self/mountinfo", v), 0,
			"/proc/self/mountinfo naming the state directory");
	}
	verdict("cgroup_path", file_has("/proc/self/cgroup", "belayer"), 0,
		"/proc/self/cgroup naming the host's cgroups");
}

static void kernel(void)
{
	union bpf_attr a = {
		.map_type = BPF_MAP_TYPE_ARRAY, .key_size = 4, .value_size = 4, .max_entries = 1};
	struct perf_event_attr pe = {
		.type = PERF_TYPE_SOFTWARE, .size = sizeof(pe), .config = PERF_COUNT_SW_CPU_CLOCK};
	struct timespec now;
	pid_t pid;
	int st, e;

	TRY("bpf_map_create", syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof(a)), "a BPF map");
	TRY("perf_event_open", syscall(SYS_perf_event_open, &pe, -1, 0, -1, 0),
	    "a system-wide perf event on CPU 0");
	TRY("userns", unshare(CLONE_NEWUSER), "a new user namespace");
	TRY("netns", unshare(CLONE_NEWNET), "a new network namespace");
	pid = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
	e = errno;
	if (pid == 0)
		_exit(0);
	if (pid > 0)
		(void)waitpid(pid, &st, 0);
	attempt("clone_newuser", pid > 0 ? 0 : -1, e, "clone into a new user namespace");
	TRY("init_module", syscall(SYS_init_module, "", 0, ""), "load a kernel module");
	TRY("finit_module", syscall(SYS_finit_module, -1, "", 0), "load a module from an fd");
	TRY("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0), "kexec");
	TRY("reboot",
	    syscall(SYS_reboot, LINUX_REBOOT_MAGIC1, LINUX_REBOOT_MAGIC2, LINUX_REBOOT_CMD_CAD_ON,
		    NULL),
	    "reboot (ctrl-alt-del on)");
	TRY("add_key", syscall(SYS_add_key, "user", "belayer-probe", "x", 1, -4 /* session */),
	    "a key in the kernel keyring");
	(void)clock_gettime(CLOCK_REALTIME, &now);
	TRY("clock_settime", clock_settime(CLOCK_REALTIME, &now), "set the clock");
	TRY("io_uring_setup", syscall(SYS_io_uring_setup, 1, &(char[120]){0}), "an io_uring");
	/* its own uts namespace: a join that needs CAP_SYS_ADMIN and nothing else */
	TRY("setns", syscall(SYS_setns, open("/proc/self/ns/uts", O_RDONLY | O_CLOEXEC), 0),
	    "join a namespace");
}

/* What only an allow-list refuses (issue 19): calls Docker's default profile leaves out that a
 * deny-list of the dangerous ones let through. */
static void unlisted(void)
{
	struct {
		uint32_t size, spare;
		uint64_t mnt_id, param;
	} req = {24, 0, ~0ull /* LSMT_ROOT */, 0};
	uint64_t ids[8];
	long r;
	int e;

	/* ASLR off for what this process executes next: an exploit's odds, not a privilege */
	errno = 0;
	r = syscall(SYS_personality, 0x0040000 /* ADDR_NO_RANDOMIZE */);
	e = errno;
	if (r >= 0)
		(void)syscall(SYS_personality, (unsigned long)r);
	attempt("personality_no_aslr", r < 0 ? -1 : 0, e, "personality(ADDR_NO_RANDOMIZE)");
	/* kcmp orders kernel pointers (Docker: only with CAP_SYS_PTRACE) */
	TRY("kcmp", syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, 0, 0) < 0 ? -1 : 0,
	    "kcmp of its own fd 0");
	/* a recent call not reviewed for the list: Linux 6.8's listmount, the mount ids under
	 * its root */
	TRY("listmount", syscall(458 /* listmount */, &req, ids, 8, 0) < 0 ? -1 : 0,
	    "listmount of its mount namespace");
}

/* A fork bomb of at most 1000 processes, each blocked on a pipe until the probe closes it:
 * contained if the environment's pids limit stops it first. */
static void fork_bomb(void)
{
	int p[2], n = 0, e = 0;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return;
	for (; n < 1000; n++) {
		pid = fork();
		if (pid == 0) {
			char c;

			close(p[1]);
			(void)!read(p[0], &c, 1);
			_exit(0);
		}
		if (pid < 0) {
			e = errno;
			break;
		}
	}
	close(p[0]);
	close(p[1]);
	while (wait(NULL) > 0)
		;
	verdict("fork_bomb", n >= 1000, e, "%d of 1000 processes started", n);
}

/* A memory hog in a child: 1 GiB touched 16 MiB at a time, its progress through a pipe.
 * Contained if the environment's memory limit kills it (or refuses it) first. */
static void memory_hog(void)
{
	const size_t step = 16u << 20, total = 1u << 30;
	int p[2], st = 0;
	size_t got = 0, mib;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return;
	pid = fork();
	if (pid == 0) {
		close(p[0]);
		for (size_t done = 0; done < total; done += step) {
			char *m = malloc(step);

			if (!m)
				_exit(2);
			memset(m, 1, step);
			mib = (done + step) >> 20;
			(void)!write(p[1], &mib, sizeof(mib));
		}
		_exit(0);
	}
	close(p[1]);
	while (read(p[0], &mib, sizeof(mib)) == sizeof(mib))
		got = mib;
	close(p[0]);
	(void)waitpid(pid, &st, 0);
	verdict("memory_hog", WIFEXITED(st) && WEXITSTATUS(st) == 0, 0,
		"%zu of 1024 MiB touched, %s %d", got,
		WIFSIGNALED(st) ? "killed by signal" : "exit status",
		WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	privileges();
	host_files(arg(argc, argv, "hostfile"));
	host_etc(argc, argv);
	mounts();
	devices_and_proc();
	foreign_nodes(arg(argc, argv, "devnodes"));
	network(argc, argv);
	supervisor_and_others(argc, argv);
	kernel();
	unlisted();
	fork_bomb();
	memory_hog();
	printf("done %d escaped\n", escaped_n);
	return escaped_n ? 1 : 0;
}
