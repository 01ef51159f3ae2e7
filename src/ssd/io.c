/*
 * io: the SSD tier's I/O engine (ssd_int.h). The owner (the store, on its
 * owner's thread) submits operations; they run elsewhere and come back
 * through a queue that the owner empties in ssd__io_reap, told by an
 * eventfd. So the owner's thread never waits on the disk.
 *
 *   data reads and writes: either one io_uring with up to depth
 *   operations in flight, which the owner's thread drives itself: it
 *   submits from ssd__io_submit, and the ring's completions make the
 *   owner's eventfd readable (registered with the ring), so a read costs
 *   no hand-off between threads on either side; it hands each completion
 *   back before it checks the next one's sum, and starts queued
 *   operations first; after a long check the rest wait for the owner's
 *   next turn, so that what was answered goes out first (an RPC answer
 *   is sent when the loop turns, not at once); or depth threads each
 *   doing blocking pread/pwrite. A read that asks for it has its CRC-32C
 *   checked before it is handed back (a long one on a thread of its own,
 *   so that the owner's thread goes back to its loop), and copied on
 *   where asked in the same pass (ssd_get_copy); a write that asks
 *   for it has its CRC-32C computed right after it is submitted, so the
 *   sum runs while the device writes (a long one on the checking thread:
 *   the write is handed back when both are over; on a pool thread, after
 *   the write). A short transfer is resumed where it stopped.
 *   jobs (index writes and compaction steps; syncs): a helper thread per
 *   lane, in submission order, so the store's group commits stay ordered.
 *
 * io_uring is the default: measured on the development VM's virtio disk
 * (ext4, O_DIRECT, 1 MiB and 16 MiB blocks, 8-32 in flight) it matched or
 * beat 8-32 threads, at a fraction of their CPU; the threads are the
 * fallback where the kernel or a container's seccomp profile refuses
 * io_uring_setup. Until 2026-12-06 a thread of its own drove the ring:
 * each read then took two more wake-ups (owner -> ring thread at submit,
 * ring thread -> owner at the end).
 *
 * The ring is touched only by the owner's thread. Its completions are
 * posted by task work that the kernel runs in the thread that submitted
 * (it interrupts an epoll_wait or poll of that thread, which then sees
 * the eventfd readable): operations in flight belong to that thread, so
 * the owner changes thread only with none in flight (the store opens on
 * one thread and is driven by another only after its recovery reaped
 * everything).
 */
#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "ssd/ssd_int.h"

#define LOG_SUBSYS LOGS_SSD

/* Largest piece of one read or write handed to the kernel at a time (the
 * io_uring length field is 32 bits). */
#define IO_CHUNK_MAX (1ull << 30)
/* Reads and writes up to this long have their checksum checked or
 * computed on the owner's thread (40 us for 1 MiB on the development
 * VM, less than handing it to a thread and back); longer ones on the
 * checking thread, so the owner's loop is not held. */
#define IO_INLINE_SUM_BYTES (1ull << 20)
/* After a read whose check on the owner's thread was this long, the next
 * completions wait for the owner's next turn (the eventfd made readable
 * again): what the read's callback answered goes out first, instead of
 * after every completion's check. */
#define IO_YIELD_SUM_BYTES (64ull << 10)
/* Most threads of the thread-pool engine (its depth). */
#define IO_THREADS_MAX 64u

struct opq {
	struct ssd__op *head, *tail;
};

static void opq_push(struct opq *q, struct ssd__op *op)
{
	op->next = NULL;
	if (q->tail)
		q->tail->next = op;
	else
		q->head = op;
	q->tail = op;
}

static struct ssd__op *opq_pop(struct opq *q)
{
	struct ssd__op *op = q->head;
	if (op) {
		q->head = op->next;
		if (!q->head)
			q->tail = NULL;
	}
	return op;
}

struct ssd__io {
	enum ssd_io_kind kind; /* URING or THREADS, once started */
	unsigned depth;
	unsigned pending; /* owner's thread: submitted, not reaped */

	/* data operations waiting for a slot */
	pthread_mutex_t mu;
	pthread_cond_t cv; /* threads: work or quit */
	struct opq q;
	bool quit;

	/* io_uring (owner's thread only) */
	struct io_uring ring;
	bool ring_ok;
	unsigned inflight; /* in the ring */

	/* io_uring: long sums, and the thread that runs them (the owner's
	 * thread goes back to its loop) */
	pthread_mutex_t vmu;
	pthread_cond_t vcv;
	struct opq vq;
	bool vquit;
	pthread_t vthread;
	bool vthread_ok;

	/* thread pool */
	pthread_t *threads;
	unsigned nthreads;

	/* helper threads for jobs, one per lane */
	struct lane {
		struct ssd__io *io;
		pthread_mutex_t mu;
		pthread_cond_t cv;
		struct opq q;
		bool quit;
		pthread_t thread;
		bool thread_ok;
	} lanes[SSD__LANES];

	/* finished, for the owner */
	pthread_mutex_t dmu;
	struct opq done;
	int done_fd; /* eventfd */
};

static void post_done(struct ssd__io *io, struct ssd__op *op)
{
	pthread_mutex_lock(&io->dmu);
	bool was_empty = io->done.head == NULL;
	opq_push(&io->done, op);
	pthread_mutex_unlock(&io->dmu);
	if (was_empty) {
		uint64_t one = 1;
		/* Only EAGAIN (counter full) can fail: it is readable then. */
		ssize_t w = write(io->done_fd, &one, sizeof(one));
		(void)w;
	}
}

/* A read that asks for it: its bytes against the sum it should have
 * (and copied where asked as they are summed). */
static void check_read(struct ssd__op *op)
{
	if (op->result || op->kind != SSD__OP_READ || !op->verify)
		return;
	uint32_t crc = op->copy_to ? crc32c_copy(0, op->copy_to, op->buf, op->crc_len)
				   : crc32c(0, op->buf, op->crc_len);
	if (crc != op->want_crc)
		op->result = MC_ECHECKSUM;
}

/* A data operation has moved all its bytes or failed, on another thread
 * than the owner's: check and hand back. */
static void finish(struct ssd__io *io, struct ssd__op *op)
{
	check_read(op);
	post_done(io, op);
}

/* ------------------------------------------------------------ io_uring */

/* The sum of a write that asks for one. */
static void sum_write(struct ssd__op *op)
{
	op->sum_crc = crc32c(0, op->buf, op->crc_len);
	op->sum = false;
}

/* One part of op is over: false while another still runs. */
static bool part_done(struct ssd__op *op)
{
	return atomic_fetch_sub(&op->parts, 1) == 1;
}

static void *verify_main(void *arg)
{
	struct ssd__io *io = arg;
	for (;;) {
		pthread_mutex_lock(&io->vmu);
		struct ssd__op *op;
		while (!(op = opq_pop(&io->vq)) && !io->vquit)
			pthread_cond_wait(&io->vcv, &io->vmu);
		pthread_mutex_unlock(&io->vmu);
		if (!op)
			return NULL;
		if (!op->sum) {
			finish(io, op); /* a read to check */
			continue;
		}
		/* A write's sum, while the ring writes it. */
		sum_write(op);
		if (part_done(op))
			post_done(io, op);
	}
}

static void verify_push(struct ssd__io *io, struct ssd__op *op)
{
	pthread_mutex_lock(&io->vmu);
	opq_push(&io->vq, op);
	pthread_cond_signal(&io->vcv);
	pthread_mutex_unlock(&io->vmu);
}

/* A ring operation is over, on the owner's thread (unless a write's sum
 * still runs on the checking thread, which hands it back then): a long
 * read to check goes to the checking thread; true: op is done here, its
 * sum checked. */
static bool ring_finish(struct ssd__io *io, struct ssd__op *op)
{
	if (!part_done(op))
		return false;
	if (op->result == 0 && op->kind == SSD__OP_READ && op->verify &&
	    op->crc_len > IO_INLINE_SUM_BYTES) {
		verify_push(io, op);
		return false;
	}
	check_read(op);
	return true;
}

/* Hand what is prepared to the kernel. An error leaves the entries in the
 * ring, where the next submission takes them (one is due: a completion
 * or a new operation comes through the owner). */
static void ring_submit(struct ssd__io *io)
{
	int rc;
	while ((rc = io_uring_submit(&io->ring)) == -EINTR)
		;
	if (rc < 0)
		log_error("io_uring_submit: %s", mc_strerror(rc));
}

/* A free submission entry. The ring has one per operation in flight, so
 * it is not exhausted; if it ever were, submitting what is prepared
 * frees entries. */
static struct io_uring_sqe *get_sqe(struct ssd__io *io)
{
	struct io_uring_sqe *sqe;
	while (!(sqe = io_uring_get_sqe(&io->ring)))
		ring_submit(io);
	return sqe;
}

/* The rest of op's transfer into a submission entry. */
static void ring_prep(struct ssd__io *io, struct ssd__op *op)
{
	struct io_uring_sqe *sqe = get_sqe(io);
	uint64_t n = op->len - op->moved;
	if (n > IO_CHUNK_MAX)
		n = IO_CHUNK_MAX;
	uint8_t *p = (uint8_t *)op->buf + op->moved;
	if (op->kind == SSD__OP_READ)
		io_uring_prep_read(sqe, op->fd, p, (unsigned)n, op->off + op->moved);
	else
		io_uring_prep_write(sqe, op->fd, p, (unsigned)n, op->off + op->moved);
	io_uring_sqe_set_data(sqe, op);
}

/* Start queued operations while the ring has room; a write's sum runs
 * once the device has it (a long one on the checking thread). */
static void ring_fill(struct ssd__io *io)
{
	struct ssd__op *op, *sums = NULL, *far = NULL;
	bool any = false;
	while (io->inflight < io->depth && (op = opq_pop(&io->q))) {
		ring_prep(io, op);
		io->inflight++;
		any = true;
		if (op->sum && op->crc_len <= IO_INLINE_SUM_BYTES) {
			op->next = sums;
			sums = op;
		} else if (op->sum) {
			atomic_store(&op->parts, 2);
			op->next = far;
			far = op;
		}
	}
	if (!any)
		return;
	/* (Linked through next, free while they are in the ring.) */
	ring_submit(io);
	while (far) {
		op = far;
		far = far->next;
		verify_push(io, op);
	}
	for (; sums; sums = sums->next)
		sum_write(sums);
}

/* The next operation the ring finished, or NULL when none is left (then
 * queued operations start). Short transfers are resumed; queued ones
 * start as soon as one leaves the ring, before its sum is checked. One
 * at a time, so that each is handed back (its answer sent) before the
 * next one's sum: the disk and the clients need not wait for them all. */
static struct ssd__op *ring_next(struct ssd__io *io)
{
	struct io_uring_cqe *cqe;
	while (io_uring_peek_cqe(&io->ring, &cqe) == 0) {
		struct ssd__op *op = io_uring_cqe_get_data(cqe);
		int res = cqe->res;
		io_uring_cqe_seen(&io->ring, cqe);
		if (res == -EINTR || res == -EAGAIN) {
			ring_prep(io, op);
			ring_submit(io);
			continue;
		}
		if (res < 0) {
			op->result = res;
		} else if (res == 0) {
			op->result = -EIO; /* end of file, or no progress */
		} else {
			op->moved += (uint64_t)res;
			if (op->moved < op->len) {
				ring_prep(io, op);
				ring_submit(io);
				continue;
			}
		}
		io->inflight--;
		ring_fill(io);
		if (ring_finish(io, op))
			return op;
	}
	ring_fill(io);
	return NULL;
}

/* ------------------------------------------------------------ threads */

static void run_sync(struct ssd__op *op)
{
	while (op->moved < op->len) {
		uint64_t n = op->len - op->moved;
		if (n > IO_CHUNK_MAX)
			n = IO_CHUNK_MAX;
		uint8_t *p = (uint8_t *)op->buf + op->moved;
		off_t off = (off_t)(op->off + op->moved);
		ssize_t r = op->kind == SSD__OP_READ ? pread(op->fd, p, n, off)
						     : pwrite(op->fd, p, n, off);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r < 0) {
			op->result = -errno;
			return;
		}
		if (r == 0) {
			op->result = -EIO;
			return;
		}
		op->moved += (uint64_t)r;
	}
}

static void *pool_main(void *arg)
{
	struct ssd__io *io = arg;
	for (;;) {
		pthread_mutex_lock(&io->mu);
		struct ssd__op *op;
		while (!(op = opq_pop(&io->q)) && !io->quit)
			pthread_cond_wait(&io->cv, &io->mu);
		pthread_mutex_unlock(&io->mu);
		if (!op)
			return NULL;
		run_sync(op);
		if (op->sum)
			sum_write(op);
		finish(io, op);
	}
}

/* ------------------------------------------------------------ jobs */

static void *job_main(void *arg)
{
	struct lane *l = arg;
	for (;;) {
		pthread_mutex_lock(&l->mu);
		struct ssd__op *op;
		while (!(op = opq_pop(&l->q)) && !l->quit)
			pthread_cond_wait(&l->cv, &l->mu);
		pthread_mutex_unlock(&l->mu);
		if (!op)
			return NULL;
		op->job(op);
		post_done(l->io, op);
	}
}

/* ------------------------------------------------------------ API */

/* Wait for what the ring still has in flight (its buffers are written
 * until then; nothing is handed back), stop the checking thread and free
 * the ring. The owner stops with nothing pending; this is for a store
 * that failed. */
static void stop_ring(struct ssd__io *io)
{
	if (io->ring_ok && io->inflight) {
		ring_submit(io);
		struct __kernel_timespec ts = {.tv_sec = 10};
		struct io_uring_cqe *cqe;
		while (io->inflight && io_uring_wait_cqe_timeout(&io->ring, &cqe, &ts) == 0) {
			io_uring_cqe_seen(&io->ring, cqe);
			io->inflight--;
		}
		if (io->inflight)
			log_error("SSD I/O: %u operations still in flight at stop",
				  io->inflight);
	}
	if (io->vthread_ok) {
		pthread_mutex_lock(&io->vmu);
		io->vquit = true;
		pthread_cond_signal(&io->vcv);
		pthread_mutex_unlock(&io->vmu);
		pthread_join(io->vthread, NULL);
		io->vthread_ok = false;
	}
	if (io->ring_ok)
		io_uring_queue_exit(&io->ring);
	io->ring_ok = false;
}

static int start_ring(struct ssd__io *io)
{
	int rc = io_uring_queue_init(io->depth, &io->ring, 0);
	if (rc < 0)
		return rc;
	io->ring_ok = true;
	/* Each completion makes the owner's eventfd readable. */
	rc = io_uring_register_eventfd(&io->ring, io->done_fd);
	if (rc < 0)
		return rc;
	rc = pthread_create(&io->vthread, NULL, verify_main, io);
	if (rc)
		return -rc;
	io->vthread_ok = true;
	return 0;
}

static int start_pool(struct ssd__io *io)
{
	unsigned n = io->depth < IO_THREADS_MAX ? io->depth : IO_THREADS_MAX;
	io->threads = calloc(n, sizeof(*io->threads));
	if (!io->threads)
		return -ENOMEM;
	for (unsigned i = 0; i < n; i++) {
		int rc = pthread_create(&io->threads[i], NULL, pool_main, io);
		if (rc)
			return -rc;
		io->nthreads++;
	}
	return 0;
}

int ssd__io_new(enum ssd_io_kind kind, unsigned depth, struct ssd__io **out)
{
	struct ssd__io *io = calloc(1, sizeof(*io));
	if (!io)
		return -ENOMEM;
	io->depth = depth;
	pthread_mutex_init(&io->mu, NULL);
	pthread_cond_init(&io->cv, NULL);
	for (unsigned i = 0; i < SSD__LANES; i++) {
		io->lanes[i].io = io;
		pthread_mutex_init(&io->lanes[i].mu, NULL);
		pthread_cond_init(&io->lanes[i].cv, NULL);
	}
	pthread_mutex_init(&io->dmu, NULL);
	pthread_mutex_init(&io->vmu, NULL);
	pthread_cond_init(&io->vcv, NULL);
	io->kind = SSD_IO_URING;
	int rc = 0;
	io->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (io->done_fd < 0) {
		rc = -errno;
		goto fail;
	}
	for (unsigned i = 0; i < SSD__LANES; i++) {
		rc = pthread_create(&io->lanes[i].thread, NULL, job_main, &io->lanes[i]);
		if (rc) {
			rc = -rc;
			goto fail;
		}
		io->lanes[i].thread_ok = true;
	}
	if (kind != SSD_IO_THREADS) {
		rc = start_ring(io);
		if (rc == 0)
			goto ok;
		if (kind == SSD_IO_URING) {
			log_error("io_uring unavailable (%s): the SSD tier cannot "
				  "use it; ssd-io=threads uses a thread pool",
				  mc_strerror(rc));
			rc = MC_ECONFIG;
			goto fail;
		}
		log_warn("io_uring unavailable (%s): SSD I/O on %u threads", mc_strerror(rc),
			 depth);
		stop_ring(io);
	}
	io->kind = SSD_IO_THREADS;
	rc = start_pool(io);
	if (rc)
		goto fail;
ok:
	*out = io;
	return 0;
fail:
	ssd__io_free(io);
	return rc;
}

const char *ssd__io_name(const struct ssd__io *io)
{
	return io->kind == SSD_IO_URING ? "io_uring" : "threads";
}

void ssd__io_submit(struct ssd__io *io, struct ssd__op *op)
{
	op->result = 0;
	op->moved = 0;
	op->next = NULL;
	atomic_store(&op->parts, 1);
	io->pending++;
	if (op->kind == SSD__OP_JOB) {
		struct lane *l = &io->lanes[op->lane < SSD__LANES ? op->lane : 0];
		pthread_mutex_lock(&l->mu);
		opq_push(&l->q, op);
		pthread_cond_signal(&l->cv);
		pthread_mutex_unlock(&l->mu);
		return;
	}
	if (op->len == 0) {
		post_done(io, op);
		return;
	}
	if (io->kind == SSD_IO_URING) {
		opq_push(&io->q, op); /* (the owner's alone) */
		ring_fill(io);
		return;
	}
	pthread_mutex_lock(&io->mu);
	opq_push(&io->q, op);
	pthread_cond_signal(&io->cv);
	pthread_mutex_unlock(&io->mu);
}

int ssd__io_fd(const struct ssd__io *io)
{
	return io->done_fd;
}

unsigned ssd__io_reap(struct ssd__io *io)
{
	uint64_t v;
	/* Clear the eventfd before taking the queue: an operation posted
	 * after the take makes it readable again. */
	ssize_t r = read(io->done_fd, &v, sizeof(v));
	(void)r;
	unsigned n = 0;
	for (struct ssd__op *op; io->kind == SSD_IO_URING && (op = ring_next(io)) != NULL;) {
		bool long_check = op->kind == SSD__OP_READ && op->verify &&
				  op->crc_len >= IO_YIELD_SUM_BYTES;
		io->pending--;
		n++;
		op->done(op);
		if (long_check && io_uring_cq_ready(&io->ring)) {
			uint64_t one = 1;
			ssize_t w = write(io->done_fd, &one, sizeof(one));
			(void)w; /* (only EAGAIN: readable anyway) */
			break;
		}
	}
	pthread_mutex_lock(&io->dmu);
	struct ssd__op *op = io->done.head;
	io->done.head = io->done.tail = NULL;
	pthread_mutex_unlock(&io->dmu);
	while (op) {
		struct ssd__op *next = op->next;
		io->pending--;
		n++;
		op->done(op);
		op = next;
	}
	return n;
}

void ssd__io_wait(struct ssd__io *io, int timeout_ms)
{
	struct pollfd p = {.fd = io->done_fd, .events = POLLIN};
	while (poll(&p, 1, timeout_ms) < 0 && errno == EINTR)
		;
}

unsigned ssd__io_pending(const struct ssd__io *io)
{
	return io->pending;
}

void ssd__io_free(struct ssd__io *io)
{
	if (!io)
		return;
	pthread_mutex_lock(&io->mu);
	io->quit = true;
	pthread_cond_broadcast(&io->cv);
	pthread_mutex_unlock(&io->mu);
	stop_ring(io);
	for (unsigned i = 0; i < io->nthreads; i++)
		pthread_join(io->threads[i], NULL);
	free(io->threads);
	for (unsigned i = 0; i < SSD__LANES; i++) {
		struct lane *l = &io->lanes[i];
		pthread_mutex_lock(&l->mu);
		l->quit = true;
		pthread_cond_signal(&l->cv);
		pthread_mutex_unlock(&l->mu);
		if (l->thread_ok)
			pthread_join(l->thread, NULL);
	}
	if (io->done_fd >= 0)
		close(io->done_fd);
	pthread_mutex_destroy(&io->mu);
	pthread_cond_destroy(&io->cv);
	for (unsigned i = 0; i < SSD__LANES; i++) {
		pthread_mutex_destroy(&io->lanes[i].mu);
		pthread_cond_destroy(&io->lanes[i].cv);
	}
	pthread_mutex_destroy(&io->dmu);
	pthread_mutex_destroy(&io->vmu);
	pthread_cond_destroy(&io->vcv);
	free(io);
}
