/*
 * buf: a growable byte buffer. The struct is public so callers can embed
 * it; data is owned by the buffer and freed by mc_buf_free().
 */
#ifndef MC_COMMON_BUF_H
#define MC_COMMON_BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "common/err.h"

struct mc_buf {
	char *data;
	size_t len;
	size_t cap;
};

#define MC_BUF_INIT \
	{ \
		NULL, 0, 0 \
	}

/* Ensure room for extra more bytes. Errors: -ENOMEM (buffer unchanged). */
int mc_buf_reserve(struct mc_buf *b, size_t extra) MC_MUST_CHECK;
int mc_buf_append(struct mc_buf *b, const void *data, size_t len) MC_MUST_CHECK;
int mc_buf_printf(struct mc_buf *b, const char *fmt, ...) MC_MUST_CHECK
	__attribute__((format(printf, 2, 3)));
/* Drop the first n bytes. */
void mc_buf_consume(struct mc_buf *b, size_t n);
void mc_buf_reset(struct mc_buf *b);
void mc_buf_free(struct mc_buf *b);

#endif
