/* SPDX-License-Identifier: MIT */
/*
 * The logger must work inside the shim, i.e. inside an arbitrary host process: no heap, no
 * locks (a fork() while another thread holds a lock would leave the child unable to log),
 * never abort. State is a handful of words read with atomics; each line is formatted into a
 * stack buffer and leaves in one write(2), so lines from concurrent threads never interleave.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "log.h"

/* Long enough for any message we write; longer ones are cut, never split across lines. */
#define LOG_LINE_MAX  2048
#define LOG_IDENT_MAX 64

static int log_level = LOG_LEVEL_INFO;
static log_sink_t log_sink;
static int log_to_journal;

/*
 * Two ident buffers: log_setup() fills the one not in use and then publishes it, so a
 * concurrent reader sees either the old or the new name. The last byte of each buffer is never
 * written, so a reader always finds a terminating NUL.
 */
static char log_ident_buf[2][LOG_IDENT_MAX];
static const char *log_ident = "belayer";

static bool stderr_is_journal(void)
{
	const char *e = secure_getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	int n = 0;

	if (!e || sscanf(e, "%llu:%llu%n", &dev, &ino, &n) != 2 || e[n] != '\0')
		return false;
	if (fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void log_setup(const char *ident, enum log_level default_level)
{
	const char *env = secure_getenv("BELAYER_LOG_LEVEL");
	enum log_level level = default_level;
	bool bad_env = false;

	if (ident) {
		const char *cur = __atomic_load_n(&log_ident, __ATOMIC_ACQUIRE);
		char *next = cur == log_ident_buf[0] ? log_ident_buf[1] : log_ident_buf[0];

		(void)snprintf(next, LOG_IDENT_MAX, "%s", ident);
		__atomic_store_n(&log_ident, next, __ATOMIC_RELEASE);
	}

	if (env && *env && log_level_from_string(env, &level) < 0) {
		level = default_level;
		bad_env = true;
	}
	log_set_level(level);
	__atomic_store_n(&log_to_journal, stderr_is_journal(), __ATOMIC_RELAXED);

	if (bad_env)
		log_warning("Invalid BELAYER_LOG_LEVEL=%s (want error, warning, info or debug), "
			    "ignoring.",
			    env);
}

void log_set_level(enum log_level level)
{
	__atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

enum log_level log_get_level(void)
{
	return (enum log_level)__atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

void log_set_sink(log_sink_t sink)
{
	__atomic_store_n(&log_sink, sink, __ATOMIC_RELEASE);
}

int log_level_from_string(const char *s, enum log_level *ret)
{
	static const struct {
		const char *name;
		const char *number;
		enum log_level level;
	} table[] = {
		{"error", "3", LOG_LEVEL_ERROR},
		{"warning", "4", LOG_LEVEL_WARNING},
		{"info", "6", LOG_LEVEL_INFO},
		{"debug", "7", LOG_LEVEL_DEBUG},
	};

	if (!s || !ret)
		return -EINVAL;
	for (size_t i = 0; i < ARRAY_SIZE(table); i++)
		if (strcasecmp(s, table[i].name) == 0 || strcmp(s, table[i].number) == 0) {
			*ret = table[i].level;
			return 0;
		}
	return -EINVAL;
}

static void write_stderr(const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(STDERR_FILENO, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return; /* nowhere left to report it */
		buf += n;
		len -= (size_t)n;
	}
}

static const char *file_basename(const char *file)
{
	const char *slash = file ? strrchr(file, '/') : NULL;

	return slash ? slash + 1 : file ? file : "?";
}

int log_internal(enum log_level level, int error, const char *file, int line, const char *fmt, ...)
{
	/* -abs(error) without overflowing on INT_MIN (which is already negative). */
	int r = error > 0 ? -error : error;
	int saved_errno = errno;
	char buf[LOG_LINE_MAX];
	size_t prefix, journal_prefix, len;
	log_sink_t sink;
	va_list ap;
	int n;

	(void)line; /* kept in the API for a structured sink later; lines stay short */

	if ((int)level > __atomic_load_n(&log_level, __ATOMIC_RELAXED))
		return r;

	sink = __atomic_load_n(&log_sink, __ATOMIC_ACQUIRE);

	/*
	 * "<N>" for the journal goes first so that the sink can be handed the same buffer from
	 * just after it. A custom sink always gets "ident: file.c: message".
	 */
	journal_prefix = 0;
	if (!sink && __atomic_load_n(&log_to_journal, __ATOMIC_RELAXED)) {
		n = snprintf(buf, sizeof(buf), "<%d>", (int)level);
		journal_prefix = n > 0 ? (size_t)n : 0;
		n = snprintf(buf + journal_prefix, sizeof(buf) - journal_prefix,
			     "%s: ", file_basename(file));
	} else {
		n = snprintf(buf, sizeof(buf),
			     "%s: %s: ", __atomic_load_n(&log_ident, __ATOMIC_ACQUIRE),
			     file_basename(file));
	}
	prefix = journal_prefix + (n > 0 ? (size_t)n : 0);
	/* Keep one byte for the newline the stderr sink adds. */
	if (prefix > sizeof(buf) - 2)
		prefix = sizeof(buf) - 2;

	/* glibc's %m prints strerror(errno); error == 0 leaves errno as the caller had it. */
	if (r != 0)
		errno = r == INT_MIN ? INT_MAX : -r;
	va_start(ap, fmt);
	n = vsnprintf(buf + prefix, sizeof(buf) - 1 - prefix, fmt, ap);
	va_end(ap);
	len = prefix + (n < 0 ? 0 : MIN((size_t)n, sizeof(buf) - 2 - prefix));
	buf[len] = '\0';

	if (sink) {
		sink(level, buf);
	} else {
		buf[len] = '\n';
		write_stderr(buf, len + 1);
	}

	errno = saved_errno;
	return r;
}
