/*
 * ssd_int: what the SSD tier's files share.
 *
 *   rec.c    the on-disk formats: data and index headers, index records
 *            (pure: no I/O, no clock; the fuzz target's entry)
 *   io.c     the I/O engine: data reads and writes on an io_uring or a
 *            thread pool, blocking jobs on a helper thread, finished
 *            operations handed back to the owner through an eventfd
 *   store.c  the store: the object table, puts, gets, removals, group
 *            commit, syncs and compaction of the index
 *   open.c   the store opened (files made or checked, the index read
 *            back, objects checked) and closed
 * store_int.h holds the state store.c and open.c share.
 */
#ifndef MC_SSD_SSD_INT_H
#define MC_SSD_SSD_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ssd/ssd.h"

/* ------------------------------------------------------------ rec.c */

#define SSD__DATA_MAGIC "MCSSDDAT"
#define SSD__INDEX_MAGIC "MCSSDIDX"
#define SSD__VERSION 1u
#define SSD__HDR_BYTES 64u
/* The data area starts after one header block. */
#define SSD__DATA_START SSD_ALIGN
#define SSD__REC_HDR_BYTES 40u
#define SSD__REC_MARK 0x5Du
#define SSD__REC_MAX_BYTES (SSD__REC_HDR_BYTES + SSD_MAX_KEY_BYTES)

enum ssd__rec_type { SSD__REC_PUT = 1, SSD__REC_DEL = 2 };

/* The header of ssd.data (first 64 bytes of its first block) and of
 * ssd.index. */
struct ssd__hdr {
	char magic[8];
	uint32_t version;
	uint32_t block_bytes; /* SSD_ALIGN */
	uint64_t store_id;    /* random, the same in both files */
	uint64_t capacity;    /* data: the data area's bytes */
	uint64_t generation;  /* index: its compaction count */
};

/* One index record; key borrowed. PUT: the object (offset, size, crc,
 * seq). DEL: the removal of the PUT with this seq and offset. */
struct ssd__rec {
	uint8_t type;
	uint16_t klen;
	uint64_t seq, offset, size;
	uint32_t crc;
	const uint8_t *key;
};

void ssd__hdr_encode(uint8_t out[SSD__HDR_BYTES], const struct ssd__hdr *h);
/* Errors: -EINVAL (short, bad magic, bad CRC, unknown version or block
 * size, a reserved byte set). magic is the expected one. */
int ssd__hdr_decode(const uint8_t *p, size_t len, const char *magic,
		    struct ssd__hdr *h) MC_MUST_CHECK;

/* Bytes a record of klen key bytes takes (8-aligned). */
size_t ssd__rec_len(size_t klen);
/* The seed of record CRCs: ties a record to its store and index
 * generation, so records of an older index or another store fail. */
uint32_t ssd__rec_seed(uint64_t store_id, uint64_t generation);
/* Encode r into out (ssd__rec_len(r->klen) bytes). */
void ssd__rec_encode(uint8_t *out, const struct ssd__rec *r, uint32_t seed);

enum ssd__dec {
	SSD__DEC_OK = 0,
	SSD__DEC_SHORT = 1, /* needs more bytes than len */
	SSD__DEC_BAD = 2,   /* not a valid record */
};
/*
 * Decode the record at p (len bytes available). On SSD__DEC_OK *r points
 * into p and *used is its length. A record is valid when its length,
 * marker, type, key length, reserved bytes, padding and CRC are right and
 * a PUT has size > 0 and aligned offset (a DEL: size 0). Pure.
 */
enum ssd__dec ssd__rec_decode(const uint8_t *p, size_t len, uint32_t seed, struct ssd__rec *r,
			      size_t *used);

/* ------------------------------------------------------------ io.c */

enum ssd__op_kind { SSD__OP_READ, SSD__OP_WRITE, SSD__OP_JOB };
/* Job lanes: each runs its jobs one at a time, in order. */
enum { SSD__LANE_APPEND = 0, SSD__LANE_SYNC = 1, SSD__LANES = 2 };

/* One operation of the engine, in its submitter's storage. */
struct ssd__op {
	struct ssd__op *next;
	enum ssd__op_kind kind;
	int fd;
	void *buf;
	uint64_t len, off;
	uint64_t moved; /* bytes done (short transfers resume) */
	/* READ: check that the CRC-32C of the first crc_len bytes is
	 * want_crc (result MC_ECHECKSUM when not), copying them to copy_to
	 * (when not NULL) in the same pass. */
	bool verify;
	uint32_t want_crc;
	uint64_t crc_len;
	void *copy_to;
	/* WRITE: compute the CRC-32C of the first crc_len bytes into
	 * sum_crc while the write is in flight (sum is cleared once done). */
	bool sum;
	uint32_t sum_crc;
	/* Parts still running (the transfer, and a sum on another thread):
	 * the last one hands the operation back. */
	atomic_uint parts;
	/* JOB: run on the lane's helper thread; sets result. */
	void (*job)(struct ssd__op *op);
	unsigned lane;
	/* On the owner's thread, from ssd__io_reap. */
	void (*done)(struct ssd__op *op);
	int result; /* 0 or negative */
};

struct ssd__io;

/* Start the engine. Errors: MC_ECONFIG (URING asked for and refused;
 * logged), negative errno (threads, eventfd), -ENOMEM. */
int ssd__io_new(enum ssd_io_kind kind, unsigned depth, struct ssd__io **out) MC_MUST_CHECK;
/* Name of the engine in use: "io_uring" or "threads". */
const char *ssd__io_name(const struct ssd__io *io);
/* Queue op (from the owner's thread). READ/WRITE run up to depth at a
 * time, JOBs one at a time in order per lane. */
void ssd__io_submit(struct ssd__io *io, struct ssd__op *op);
/* The eventfd readable while finished operations wait. */
int ssd__io_fd(const struct ssd__io *io);
/* Run done for every finished operation; returns how many. */
unsigned ssd__io_reap(struct ssd__io *io);
/* Block until something finished or timeout_ms passed (-1: forever). */
void ssd__io_wait(struct ssd__io *io, int timeout_ms);
/* Operations submitted and not reaped. */
unsigned ssd__io_pending(const struct ssd__io *io);
/* Stop the threads and free (nothing may be pending). */
void ssd__io_free(struct ssd__io *io);

#endif
