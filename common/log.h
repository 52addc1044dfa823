/* SPDX-License-Identifier: MIT */
/*
 * Logging: levels, one printf-checked sink, the source file as prefix.
 *
 * The level comes from BELAYER_LOG_LEVEL (error, warning, info, debug; default info for
 * programs, warning for the shim). Lines go to stderr as "ident: file.c: message"; when stderr
 * is the journal (JOURNAL_STREAM matches it) they carry a "<N>" syslog priority prefix instead
 * of the ident, so journald files them at the right level.
 */
#pragma once

#include "util.h"

enum log_level {
	LOG_LEVEL_ERROR = 3, /* syslog priorities, so the journal prefix is the level itself */
	LOG_LEVEL_WARNING = 4,
	LOG_LEVEL_INFO = 6,
	LOG_LEVEL_DEBUG = 7,
};

/* A sink receives one formatted line without trailing newline. */
typedef void (*log_sink_t)(enum log_level level, const char *line);

/* ident: program name shown on each line. default_level applies unless BELAYER_LOG_LEVEL
 * says otherwise. Safe to call more than once. */
void log_setup(const char *ident, enum log_level default_level);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* NULL restores the stderr sink. */
void log_set_sink(log_sink_t sink);
/* Parses "error", "warning", "info", "debug" (or 3, 4, 6, 7); -EINVAL otherwise. */
int log_level_from_string(const char *s, enum log_level *ret);

/* Returns -abs(error) (or 0 when error is 0), so "return log_error_errno(r, ...)" works.
 * %m in fmt prints strerror(abs(error)). */
int log_internal(enum log_level level, int error, const char *file, int line, const char *fmt, ...)
	_printf_(5, 6);

#define log_full_errno(level, error, ...) \
	log_internal((level), (error), __FILE__, __LINE__, __VA_ARGS__)
#define log_error_errno(error, ...)   log_full_errno(LOG_LEVEL_ERROR, (error), __VA_ARGS__)
#define log_warning_errno(error, ...) log_full_errno(LOG_LEVEL_WARNING, (error), __VA_ARGS__)
#define log_info_errno(error, ...)    log_full_errno(LOG_LEVEL_INFO, (error), __VA_ARGS__)
#define log_debug_errno(error, ...)   log_full_errno(LOG_LEVEL_DEBUG, (error), __VA_ARGS__)
#define log_error(...)		      log_error_errno(0, __VA_ARGS__)
#define log_warning(...)	      log_warning_errno(0, __VA_ARGS__)
#define log_info(...)		      log_info_errno(0, __VA_ARGS__)
#define log_debug(...)		      log_debug_errno(0, __VA_ARGS__)
