/*
 * buf: growable byte buffer. See buf.h.
 */
#include "common/buf.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mc_buf_reserve(struct mc_buf *b, size_t extra)
{
	if (extra > SIZE_MAX - b->len - 1)
		return -ENOMEM;
	size_t need = b->len + extra + 1; /* room for a terminating NUL */
	if (need <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap = cap > SIZE_MAX / 2 ? need : cap * 2;
	char *p = realloc(b->data, cap);
	if (!p)
		return -ENOMEM;
	b->data = p;
	b->cap = cap;
	return 0;
}

int mc_buf_append(struct mc_buf *b, const void *data, size_t len)
{
	int rc = mc_buf_reserve(b, len);
	if (rc)
		return rc;
	if (len)
		memcpy(b->data + b->len, data, len);
	b->len += len;
	b->data[b->len] = '\0';
	return 0;
}

int mc_buf_printf(struct mc_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return -EINVAL;
	int rc = mc_buf_reserve(b, (size_t)n);
	if (rc)
		return rc;
	va_start(ap, fmt);
	vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
	return 0;
}

void mc_buf_consume(struct mc_buf *b, size_t n)
{
	if (n >= b->len) {
		b->len = 0;
	} else {
		memmove(b->data, b->data + n, b->len - n);
		b->len -= n;
	}
	if (b->data)
		b->data[b->len] = '\0';
}

void mc_buf_reset(struct mc_buf *b)
{
	b->len = 0;
	if (b->data)
		b->data[0] = '\0';
}

void mc_buf_free(struct mc_buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}
