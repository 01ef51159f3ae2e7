/*
 * data: reference-counted entry payloads. The log owns one reference per
 * entry; every queued message carrying the entry owns another, so a message
 * stays valid even if the log is truncated or compacted before the ready
 * that carries it is handed out.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "meta/raft/raft_int.h"

struct raft__blob {
	size_t refs;
	unsigned char data[];
};

static struct raft__blob *blob_of(const void *data)
{
	return MC_CONTAINER_OF((unsigned char *)data, struct raft__blob, data);
}

int raft__data_new(const void *src, size_t len, const void **out)
{
	struct raft__blob *b;

	if (len == 0) {
		*out = NULL;
		return 0;
	}
	b = malloc(sizeof(*b) + len);
	if (!b)
		return -ENOMEM;
	b->refs = 1;
	memcpy(b->data, src, len);
	*out = b->data;
	return 0;
}

void raft__data_ref(const void *data)
{
	if (data)
		blob_of(data)->refs++;
}

void raft__data_unref(const void *data)
{
	struct raft__blob *b;

	if (!data)
		return;
	b = blob_of(data);
	if (--b->refs == 0)
		free(b);
}
