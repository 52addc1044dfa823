/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "test-util.h"

#define CAPTURE_MAX 8

static struct {
	size_t n;
	enum log_level level[CAPTURE_MAX];
	char line[CAPTURE_MAX][4096];
} captured;

static void capture_sink(enum log_level level, const char *line)
{
	if (captured.n < CAPTURE_MAX) {
		captured.level[captured.n] = level;
		(void)snprintf(captured.line[captured.n], sizeof(captured.line[0]), "%s", line);
	}
	captured.n++;
}

static int setup_capture(void **state)
{
	memset(&captured, 0, sizeof(captured));
	(void)unsetenv("BELAYER_LOG_LEVEL");
	(void)unsetenv("JOURNAL_STREAM");
	log_setup("test-ident", LOG_LEVEL_INFO);
	log_set_sink(capture_sink);
	return 0;
}

static int teardown_capture(void **state)
{
	log_set_sink(NULL);
	(void)unsetenv("BELAYER_LOG_LEVEL");
	(void)unsetenv("JOURNAL_STREAM");
	return 0;
}

static void level_from_string_accepts_names_and_numbers(void **state)
{
	static const struct {
		const char *s;
		enum log_level level;
	} cases[] = {
		{"error", LOG_LEVEL_ERROR}, {"warning", LOG_LEVEL_WARNING},
		{"info", LOG_LEVEL_INFO},   {"debug", LOG_LEVEL_DEBUG},
		{"DEBUG", LOG_LEVEL_DEBUG}, {"3", LOG_LEVEL_ERROR},
		{"4", LOG_LEVEL_WARNING},   {"6", LOG_LEVEL_INFO},
		{"7", LOG_LEVEL_DEBUG},
	};

	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		enum log_level l = 0;

		assert_int_equal(log_level_from_string(cases[i].s, &l), 0);
		assert_int_equal(l, cases[i].level);
	}
}

static void level_from_string_rejects_others(void **state)
{
	static const char *const bad[] = {"", "warn", "5", "8", "0", "infoo", " info", "07"};
	enum log_level l = LOG_LEVEL_INFO;

	for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
		assert_int_equal(log_level_from_string(bad[i], &l), -EINVAL);
	assert_int_equal(log_level_from_string(NULL, &l), -EINVAL);
	assert_int_equal(l, LOG_LEVEL_INFO);
}

static void lines_below_the_level_are_dropped(void **state)
{
	log_set_level(LOG_LEVEL_WARNING);
	assert_int_equal(log_get_level(), LOG_LEVEL_WARNING);
	log_debug("debug %d", 1);
	log_info("info %d", 2);
	log_warning("warning %d", 3);
	log_error("error %d", 4);
	assert_int_equal(captured.n, 2);
	assert_int_equal(captured.level[0], LOG_LEVEL_WARNING);
	assert_int_equal(captured.level[1], LOG_LEVEL_ERROR);

	log_set_level(LOG_LEVEL_DEBUG);
	log_debug("debug %d", 5);
	assert_int_equal(captured.n, 3);
	assert_int_equal(captured.level[2], LOG_LEVEL_DEBUG);
}

static void line_carries_ident_and_file(void **state)
{
	log_info("hello %s %d", "world", 42);
	assert_int_equal(captured.n, 1);
	assert_string_equal(captured.line[0], "test-ident: test-log.c: hello world 42");

	log_setup("other", LOG_LEVEL_INFO);
	log_set_sink(capture_sink);
	log_info("again");
	assert_string_equal(captured.line[1], "other: test-log.c: again");
}

static void percent_m_prints_the_error(void **state)
{
	char want[256];

	(void)log_error_errno(-ENOENT, "open: %m");
	(void)log_error_errno(EACCES, "positive: %m");
	assert_int_equal(captured.n, 2);
	(void)snprintf(want, sizeof(want), "test-ident: test-log.c: open: %s", strerror(ENOENT));
	assert_string_equal(captured.line[0], want);
	(void)snprintf(want, sizeof(want), "test-ident: test-log.c: positive: %s",
		       strerror(EACCES));
	assert_string_equal(captured.line[1], want);
}

static void percent_m_without_error_uses_errno(void **state)
{
	char want[256];

	errno = EBADF;
	log_error("close: %m");
	(void)snprintf(want, sizeof(want), "test-ident: test-log.c: close: %s", strerror(EBADF));
	assert_string_equal(captured.line[0], want);
}

static void returns_negative_error_and_keeps_errno(void **state)
{
	errno = EXDEV;
	assert_int_equal(log_error_errno(-EIO, "x"), -EIO);
	assert_int_equal(log_error_errno(EIO, "x"), -EIO);
	assert_int_equal(log_error_errno(0, "x"), 0);
	/* Filtered out, still the same value: "return log_debug_errno(r, ...)" works at any level. */
	log_set_level(LOG_LEVEL_ERROR);
	assert_int_equal(log_debug_errno(-ENOMEM, "%m"), -ENOMEM);
	assert_int_equal(log_debug_errno(ENOMEM, "%m"), -ENOMEM);
	assert_int_equal(errno, EXDEV);
	assert_int_equal(captured.n, 3);
}

static void env_level_overrides_default(void **state)
{
	assert_int_equal(setenv("BELAYER_LOG_LEVEL", "debug", 1), 0);
	log_setup("t", LOG_LEVEL_WARNING);
	assert_int_equal(log_get_level(), LOG_LEVEL_DEBUG);

	assert_int_equal(setenv("BELAYER_LOG_LEVEL", "3", 1), 0);
	log_setup("t", LOG_LEVEL_WARNING);
	assert_int_equal(log_get_level(), LOG_LEVEL_ERROR);

	assert_int_equal(unsetenv("BELAYER_LOG_LEVEL"), 0);
	log_setup("t", LOG_LEVEL_WARNING);
	assert_int_equal(log_get_level(), LOG_LEVEL_WARNING);
}

static void bad_env_level_warns_and_keeps_default(void **state)
{
	assert_int_equal(setenv("BELAYER_LOG_LEVEL", "loud", 1), 0);
	log_setup("t", LOG_LEVEL_INFO);
	assert_int_equal(log_get_level(), LOG_LEVEL_INFO);
	assert_int_equal(captured.n, 1);
	assert_int_equal(captured.level[0], LOG_LEVEL_WARNING);
	assert_non_null(strstr(captured.line[0], "BELAYER_LOG_LEVEL=loud"));
}

/* Points stderr at a fresh temporary file for the duration of a test. */
struct stderr_capture {
	char path[64];
	int saved;
	int fd;
};

static void stderr_capture_start(struct stderr_capture *c, int extra_flags)
{
	(void)snprintf(c->path, sizeof(c->path), "/tmp/test-log-XXXXXX");
	c->fd = mkostemp(c->path, O_CLOEXEC | extra_flags);
	assert_true(c->fd >= 0);
	c->saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
	assert_true(c->saved >= 0);
	assert_int_equal(dup2(c->fd, STDERR_FILENO), STDERR_FILENO);
}

/* Restores stderr and returns what was written (static buffer). */
static const char *stderr_capture_stop(struct stderr_capture *c, size_t *ret_len)
{
	static char buf[1 << 20];
	ssize_t n;

	assert_int_equal(dup2(c->saved, STDERR_FILENO), STDERR_FILENO);
	(void)close(c->saved);
	n = pread(c->fd, buf, sizeof(buf) - 1, 0);
	assert_true(n >= 0);
	buf[n] = '\0';
	(void)close(c->fd);
	(void)unlink(c->path);
	if (ret_len)
		*ret_len = (size_t)n;
	return buf;
}

static void stderr_gets_one_line_per_message(void **state)
{
	struct stderr_capture c;
	const char *out;

	stderr_capture_start(&c, 0);
	log_setup("ident", LOG_LEVEL_INFO);
	log_set_sink(NULL);
	log_info("first %d", 1);
	log_warning_errno(-EPIPE, "second: %m");
	out = stderr_capture_stop(&c, NULL);

	char want[256];
	(void)snprintf(want, sizeof(want),
		       "ident: test-log.c: first 1\nident: test-log.c: second: %s\n",
		       strerror(EPIPE));
	assert_string_equal(out, want);
}

static void journal_stream_gets_priority_prefix(void **state)
{
	struct stderr_capture c;
	struct stat st;
	char env[64];
	const char *out;

	stderr_capture_start(&c, 0);
	assert_int_equal(fstat(STDERR_FILENO, &st), 0);
	(void)snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev,
		       (unsigned long long)st.st_ino);
	assert_int_equal(setenv("JOURNAL_STREAM", env, 1), 0);
	log_setup("ident", LOG_LEVEL_INFO);
	log_set_sink(NULL);
	log_error("bad %d", 3);
	log_warning("meh");
	log_info("fine");

	/* Another file (the journal's stream is not ours): no prefix, the ident instead. */
	(void)snprintf(env, sizeof(env), "%llu:%llu", (unsigned long long)st.st_dev,
		       (unsigned long long)st.st_ino + 1);
	assert_int_equal(setenv("JOURNAL_STREAM", env, 1), 0);
	log_setup("ident", LOG_LEVEL_INFO);
	log_info("plain");
	out = stderr_capture_stop(&c, NULL);

	assert_string_equal(out, "<3>test-log.c: bad 3\n<4>test-log.c: meh\n<6>test-log.c: fine\n"
				 "ident: test-log.c: plain\n");
}

static void overlong_message_is_cut_to_one_line(void **state)
{
	static char big[10000];
	struct stderr_capture c;
	const char *out;
	size_t len;

	memset(big, 'x', sizeof(big) - 1);
	stderr_capture_start(&c, 0);
	log_setup("ident", LOG_LEVEL_INFO);
	log_set_sink(NULL);
	log_info("%s", big);
	out = stderr_capture_stop(&c, &len);

	assert_true(len > 1000 && len <= 2048);
	assert_int_equal(out[len - 1], '\n');
	assert_null(memchr(out, '\n', len - 1));
	assert_memory_equal(out, "ident: test-log.c: xxx", 22);
}

#define THREADS		 4
#define LINES_PER_THREAD 400

static void *log_lines(void *arg)
{
	int t = (int)(intptr_t)arg;

	for (int i = 0; i < LINES_PER_THREAD; i++)
		log_info("thread %d line %d %0200d", t, i, 0);
	return NULL;
}

static void concurrent_lines_never_interleave(void **state)
{
	int seen[THREADS] = {0};
	pthread_t th[THREADS];
	struct stderr_capture c;
	const char *out, *p;
	size_t len, lines = 0;

	stderr_capture_start(&c, O_APPEND);
	log_setup("ident", LOG_LEVEL_INFO);
	log_set_sink(NULL);
	for (int t = 0; t < THREADS; t++)
		assert_int_equal(pthread_create(&th[t], NULL, log_lines, (void *)(intptr_t)t), 0);
	for (int t = 0; t < THREADS; t++)
		assert_int_equal(pthread_join(th[t], NULL), 0);
	out = stderr_capture_stop(&c, &len);

	/* Every line whole, and each thread's lines in its own order. */
	for (p = out; p < out + len; lines++) {
		const char *nl = memchr(p, '\n', (size_t)(out + len - p));
		int t, i, consumed = 0;

		assert_non_null(nl);
		assert_int_equal(sscanf(p, "ident: test-log.c: thread %d line %d %*200[0]%n", &t,
					&i, &consumed),
				 2);
		assert_ptr_equal(p + consumed, nl);
		assert_true(t >= 0 && t < THREADS);
		assert_int_equal(i, seen[t]);
		seen[t]++;
		p = nl + 1;
	}
	assert_int_equal(lines, THREADS * LINES_PER_THREAD);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(level_from_string_accepts_names_and_numbers),
		cmocka_unit_test(level_from_string_rejects_others),
		cmocka_unit_test_setup_teardown(lines_below_the_level_are_dropped, setup_capture,
						teardown_capture),
		cmocka_unit_test_setup_teardown(line_carries_ident_and_file, setup_capture,
						teardown_capture),
		cmocka_unit_test_setup_teardown(percent_m_prints_the_error, setup_capture,
						teardown_capture),
		cmocka_unit_test_setup_teardown(percent_m_without_error_uses_errno, setup_capture,
						teardown_capture),
		cmocka_unit_test_setup_teardown(returns_negative_error_and_keeps_errno,
						setup_capture, teardown_capture),
		cmocka_unit_test_setup_teardown(env_level_overrides_default, setup_capture,
						teardown_capture),
		cmocka_unit_test_setup_teardown(bad_env_level_warns_and_keeps_default,
						setup_capture, teardown_capture),
		cmocka_unit_test_setup_teardown(stderr_gets_one_line_per_message, setup_capture,
						teardown_capture),
		cmocka_unit_test_setup_teardown(journal_stream_gets_priority_prefix, setup_capture,
						teardown_capture),
		cmocka_unit_test_setup_teardown(overlong_message_is_cut_to_one_line, setup_capture,
						teardown_capture),
		cmocka_unit_test_setup_teardown(concurrent_lines_never_interleave, setup_capture,
						teardown_capture),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
