# mooncaked — one hand-written Makefile (GNU make).
#
#   make                 static build/mooncaked, build/mooncakectl, build/libmooncake.{a,so}
#   make test            build and run every test (unit + integration)
#   make SAN=1 test      the same under AddressSanitizer + UBSan, in build-san/
#   make DYN=1           dynamically linked binaries in build-dyn/ (for valgrind,
#                        which misreports inside a static glibc)
#   make bench           benchmarks (figures beside the machine's own limit;
#                        meta: a 3-member cluster beside a 3-member etcd,
#                        and etcdctl check perf against both)
#   make fuzz            libFuzzer targets (clang)
#   make fuzz-seeds      rewrite the WAL and MVCC snapshot seed corpora
#   make man             regenerate the committed man pages from the config key table
#   make format-check    clang-format (.clang-format) finds nothing to change in
#                        FILES (default: every C file under src/ and test/unit)
#   make format          rewrite FILES in that style
#   make install PREFIX=/usr/local DESTDIR=
#   make clean           remove build/ and build-san/
#   V=1                  show full commands
#
# Header dependencies are tracked with -MMD; a change of flags rebuilds
# everything (build/.flags stamp).

PREFIX  ?= /usr/local
# The Python package (python/mooncake) goes here; it finds libmooncake.so.0
# in $(PREFIX)/lib.
PYDIR   ?= $(PREFIX)/lib/python3/dist-packages
DESTDIR ?=
CC      ?= cc
SAN     ?= 0
WERROR  ?= 1
PYTHON  ?= /usr/bin/python3

FUZZ    ?= 0
DYN     ?= 0
ifeq ($(SAN),1)
B       := build-san
else ifeq ($(FUZZ),1)
B       := build-fuzz
CC      := clang
else ifeq ($(DYN),1)
B       := build-dyn
else
B       := build
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

VERSION := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
GITREV  := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

WARN    := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wstrict-prototypes \
           -Wmissing-prototypes -Wformat=2 -Wvla
ifeq ($(WERROR),1)
WARN    += -Werror
endif
OPT     ?= -O2
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE -g $(OPT) $(WARN) -pthread \
              -Isrc -I$(B)/gen -DMC_VERSION='"$(VERSION)"' -DMC_GITREV='"$(GITREV)"' \
              -fno-strict-aliasing $(CFLAGS)
ifeq ($(SAN),1)
CFLAGS_ALL += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -O1
LDFLAGS_SAN := -fsanitize=address,undefined
endif
ifeq ($(FUZZ),1)
CFLAGS_ALL += -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -O1
LDFLAGS_SAN := -fsanitize=address,undefined
endif

# Libraries. Production binaries are fully static; SAN and test builds link
# the shared libraries (ASan cannot be static).
RDMA_STATIC_LIBS := $(shell pkg-config --static --libs libibverbs librdmacm 2>/dev/null)
LIBS_STATIC  := -l:libuv_a.a -lnghttp2 -lprotobuf-c -luring -lnuma $(RDMA_STATIC_LIBS) -lpthread -ldl -lm
LIBS_DYNAMIC := -luv -lnghttp2 -lprotobuf-c -luring -lnuma -libverbs -lrdmacm -lpthread -ldl -lm

ifneq ($(SAN)$(FUZZ)$(DYN),000)
BIN_LDFLAGS := $(LDFLAGS_SAN)
BIN_LIBS    := $(LIBS_DYNAMIC)
BIN_RDMA_PROVIDERS :=
else
# glibc warns that getaddrinfo/getproto* (pulled in by librdmacm/libnl)
# need glibc's shared NSS modules at run time. mooncaked resolves every
# address numerically, so those paths are never taken; the warnings are
# known and filtered below.
BIN_LDFLAGS := -static
BIN_LIBS    := $(LIBS_STATIC)
# A static libibverbs finds no device unless its providers are linked in:
# this object registers them (STYLE.md build notes); the binaries name it
# explicitly, src/transfer/rdma_dev.c refers to it weakly.
BIN_RDMA_PROVIDERS := $(B)/obj/transfer/rdma_providers.o
$(B)/obj/transfer/rdma_providers.o: private CFLAGS_ALL += -DRDMA_STATIC_PROVIDERS=all
endif

# ---------------------------------------------------------------- sources
PROTOS     := $(wildcard proto/*.proto)
GEN_C      := $(patsubst proto/%.proto,$(B)/gen/%.pb-c.c,$(PROTOS))
GEN_H      := $(GEN_C:.c=.h)
PY_GEN     := $(patsubst proto/%.proto,$(B)/py/%_pb2.py,$(PROTOS))

# The daemon's internal library: every subsystem except main, ctl and the
# client library. Subsystem folders are picked up by wildcard so adding a
# file needs no Makefile edit.
CORE_DIRS  := common rpc http etcd transfer meta meta/raft master ssd agent doctor daemon
CORE_SRCS  := $(foreach d,$(CORE_DIRS),$(wildcard src/$(d)/*.c))
CORE_OBJS  := $(patsubst src/%.c,$(B)/obj/%.o,$(CORE_SRCS)) \
              $(patsubst $(B)/gen/%.c,$(B)/obj/gen/%.o,$(GEN_C))

CTL_SRCS   := $(wildcard src/ctl/*.c)
CTL_OBJS   := $(patsubst src/%.c,$(B)/obj/%.o,$(CTL_SRCS))

# libmooncake: the client library, its own -fPIC tree. It uses a few
# common modules (errors, whole-buffer I/O, framing, address windows) and the client
# protocol's generated code compiled again position-independent; it needs
# only libc, pthreads and libprotobuf-c (no libuv, no nghttp2).
CLIENT_SRCS := $(wildcard src/client/*.c) src/common/err.c src/common/io.c src/common/uframe.c \
               src/common/vmwin.c src/common/ltab.c src/common/crc32c.c src/common/util.c
CLIENT_PIC  := $(patsubst src/%.c,$(B)/pic/%.o,$(CLIENT_SRCS)) $(B)/pic/gen/client.pb-c.o
CLIENT_LIBS := -lprotobuf-c -lpthread

FUZZ_SRCS  := $(wildcard test/fuzz/fuzz_*.c)
REPLAY_BINS := $(patsubst test/fuzz/%.c,$(B)/fuzz-replay/%,$(FUZZ_SRCS))
FUZZ_BINS  := $(patsubst test/fuzz/%.c,$(B)/fuzz/%,$(FUZZ_SRCS))
UNIT_SRCS  := $(wildcard test/unit/test_*.c)
UNIT_BINS  := $(patsubst test/unit/%.c,$(B)/test/%,$(UNIT_SRCS))

BINS := $(B)/mooncaked $(B)/mooncakectl
LIBS := $(B)/libmooncake.a $(B)/libmooncake.so

.PHONY: all test bench soak fuzz fuzz-run fuzz-seeds man install clean format format-check
.SECONDARY: $(GEN_C) $(GEN_H)
all: $(BINS) $(LIBS) $(B)/man/mooncaked.8

# ---------------------------------------------------------------- flags stamp
FLAGS_LINE := $(CC) $(CFLAGS_ALL) $(BIN_LDFLAGS)
$(B)/.flags: FORCE
	@mkdir -p $(B)
	@echo '$(FLAGS_LINE)' | cmp -s - $@ || echo '$(FLAGS_LINE)' > $@
FORCE:

# ---------------------------------------------------------------- protobuf
$(B)/gen/%.pb-c.c $(B)/gen/%.pb-c.h: proto/%.proto
	@mkdir -p $(B)/gen
	@echo "  PROTOC  $<"
	$(Q)protoc-c --c_out=$(B)/gen -Iproto $<

# Python message classes for the integration tests (protobuf-compiler).
$(B)/py/%_pb2.py: proto/%.proto
	@mkdir -p $(B)/py
	$(Q)protoc --python_out=$(B)/py -Iproto $<

# ---------------------------------------------------------------- objects
# Pure cores (STYLE.md rule 6) do no I/O, read no clock, start no thread
# and draw no random numbers: time and seeds are inputs. Each is compiled
# and then checked twice: the headers it read, directly or through any
# other header (by their include guards after preprocessing: <time.h>,
# <sys/time.h>, <unistd.h>, <pthread.h>, <uv.h>), and the functions its
# object calls (clocks, libuv, pthreads, random sources). A failing core
# loses its object, so the build stops there.
# A new pure core goes into this list.
PURE_SRCS := $(wildcard src/meta/raft/*.c) $(wildcard src/meta/mvcc*.c) src/meta/lease.c src/meta/avl.c src/meta/wal_format.c src/meta/sm.c \
             src/common/extalloc.c src/common/lhash.c \
             src/master/alloc.c src/master/core.c src/master/index.c \
             src/master/lease.c src/master/mlog.c src/master/segment.c src/master/tier.c \
             src/rpc/frame.c src/transfer/wire.c src/ssd/rec.c
PURE_OBJS := $(patsubst src/%.c,$(B)/obj/%.o,$(PURE_SRCS))
PURE_GUARDS := _TIME_H|_SYS_TIME_H|_UNISTD_H|_PTHREAD_H|UV_H
PURE_CALLS := mc_now_.*|mc_wall_.*|clock_gettime|clock|gettimeofday|time|uv_.*|pthread_.*|rand|random|srand|rand_r|getrandom|mc_random
$(PURE_OBJS): $(B)/obj/%.o: src/%.c $(B)/.flags | $(GEN_H)
	@mkdir -p $(dir $@)
	@echo "  CC PURE $<"
	$(Q)$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@
	$(Q)hdrs=$$($(CC) $(CFLAGS_ALL) -E -dM $< | awk '$$1 == "#define" {print $$2}' | \
	  grep -xE '$(PURE_GUARDS)' | sed -e 's/^_SYS_TIME_H$$/<sys\/time.h>/' \
	  -e 's/^UV_H$$/<uv.h>/' -e 's/^_\([A-Z]*\)_H$$/<\1.h>/' | tr 'A-Z' 'a-z' | tr '\n' ' '); \
	calls=$$(nm -u $@ | awk '{print $$2}' | grep -xE '$(PURE_CALLS)' | tr '\n' ' '); \
	if [ -n "$$hdrs$$calls" ]; then rm -f $@; \
	  echo "$<: a pure core (PURE_SRCS in the Makefile) does no I/O and reads no clock, but it$${hdrs:+ includes $$hdrs}$${calls:+ calls $$calls}"; \
	  echo "  (which header pulls them in: $(CC) -D_GNU_SOURCE -Isrc -I$(B)/gen -H -fsyntax-only $<)"; \
	  exit 1; fi

$(B)/obj/%.o: src/%.c $(B)/.flags | $(GEN_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(B)/obj/gen/%.o: $(B)/gen/%.c $(B)/.flags | $(GEN_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS_ALL) -Wno-missing-prototypes -MMD -MP -c $< -o $@

$(B)/pic/%.o: src/%.c $(B)/.flags | $(GEN_H)
	@mkdir -p $(dir $@)
	@echo "  CC PIC  $<"
	$(Q)$(CC) $(CFLAGS_ALL) -fPIC -fvisibility=hidden -MMD -MP -c $< -o $@

$(B)/pic/gen/%.o: $(B)/gen/%.c $(B)/.flags | $(GEN_H)
	@mkdir -p $(dir $@)
	@echo "  CC PIC  $<"
	$(Q)$(CC) $(CFLAGS_ALL) -Wno-missing-prototypes -fPIC -fvisibility=hidden -MMD -MP -c $< -o $@

# ---------------------------------------------------------------- archives
$(B)/libmcd.a: $(CORE_OBJS)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(B)/libmooncake.a: $(CLIENT_PIC)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(B)/libmooncake.so: $(CLIENT_PIC)
	@echo "  LD      $@"
	$(Q)$(CC) -shared -Wl,-soname,libmooncake.so.0 -Wl,--no-undefined $(LDFLAGS_SAN) -o $@ $^ $(CLIENT_LIBS)

# ---------------------------------------------------------------- binaries
LINK_FILTER := 2>&1 | grep -vE "in statically linked applications requires at runtime|: in function \`" >&2; test $${PIPESTATUS[0]} -eq 0
SHELL := /bin/bash

$(B)/mooncaked: $(B)/obj/main.o $(B)/libmcd.a $(BIN_RDMA_PROVIDERS)
	@echo "  LD      $@"
	$(Q)set -o pipefail; $(CC) $(BIN_LDFLAGS) -o $@ $< $(BIN_RDMA_PROVIDERS) $(B)/libmcd.a $(BIN_LIBS) $(LINK_FILTER)

# mooncakectl put/get/rm are clients of the agent: they use libmooncake.
$(B)/mooncakectl: $(CTL_OBJS) $(B)/libmooncake.a $(B)/libmcd.a $(BIN_RDMA_PROVIDERS)
	@echo "  LD      $@"
	$(Q)set -o pipefail; $(CC) $(BIN_LDFLAGS) -o $@ $(CTL_OBJS) $(BIN_RDMA_PROVIDERS) $(B)/libmooncake.a $(B)/libmcd.a $(BIN_LIBS) $(LINK_FILTER)

# ---------------------------------------------------------------- man pages
# man/mooncaked.8 is committed; its OPTIONS section comes from the config
# key table (mooncaked --print-man-options). `make man` refreshes it and
# test/integration/test_docs.sh fails when it is stale.
$(B)/man/mooncaked.8: man/mooncaked.8.in $(B)/mooncaked
	@mkdir -p $(dir $@)
	$(Q)$(B)/mooncaked --print-man-options > $@.opts
	$(Q)sed -e '/^\.\\" @OPTIONS@/{r $@.opts' -e 'd}' -e 's/@VERSION@/$(VERSION)/' $< > $@
	$(Q)rm -f $@.opts

man: $(B)/man/mooncaked.8
	cp $(B)/man/mooncaked.8 man/mooncaked.8

# ---------------------------------------------------------------- tests
TEST_CFLAGS := $(filter-out -Wmissing-prototypes,$(CFLAGS_ALL)) -Itest
$(B)/test/%: test/unit/%.c $(B)/libmcd.a $(B)/.flags
	@mkdir -p $(dir $@)
	@echo "  CC TEST $<"
	$(Q)$(CC) $(TEST_CFLAGS) -MMD -MP -o $@ $< $(B)/libmcd.a -lcriterion $(LIBS_DYNAMIC) $(LDFLAGS_SAN)

# The software verbs device (test/verbs-emu/, a TEST device): test_rdma*
# binaries link it in place of libibverbs/librdmacm.
VEMU_SRCS := $(wildcard test/verbs-emu/*.c)
VEMU_OBJS := $(patsubst test/verbs-emu/%.c,$(B)/verbs-emu/%.o,$(VEMU_SRCS))
LIBS_VEMU := $(filter-out -libverbs -lrdmacm,$(LIBS_DYNAMIC))
$(B)/verbs-emu/%.o: test/verbs-emu/%.c $(B)/.flags
	@mkdir -p $(dir $@)
	@echo "  CC EMU  $<"
	$(Q)$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(B)/verbs-emu/libverbs-emu.a: $(VEMU_OBJS)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

# A TEST stand-in for the CUDA driver (test/cuda-emu/): Python tests load
# it to hand libmooncake device memory the CPU cannot touch. Never
# installed; built without the sanitizers (it is loaded by ctypes).
CUDA_EMU := $(B)/cuda-emu/libcuda.so.1
$(CUDA_EMU): test/cuda-emu/cuda_emu.c
	@mkdir -p $(dir $@)
	@echo "  CC EMU  $<"
	$(Q)$(CC) -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared -Wl,-soname,libcuda.so.1 -o $@ $< -lpthread

# test_client*: libmooncake's own modules, linked from its archive.
CLIENT_TEST_BINS := $(filter $(B)/test/test_client%,$(UNIT_BINS))
$(CLIENT_TEST_BINS): $(B)/test/%: test/unit/%.c $(B)/libmooncake.a $(B)/libmcd.a $(B)/.flags
	@mkdir -p $(dir $@)
	@echo "  CC TEST $< (libmooncake)"
	$(Q)$(CC) $(TEST_CFLAGS) -MMD -MP -o $@ $< $(B)/libmooncake.a $(B)/libmcd.a -lcriterion $(LIBS_DYNAMIC) $(LDFLAGS_SAN)

RDMA_TEST_BINS := $(filter $(B)/test/test_rdma%,$(UNIT_BINS))
$(RDMA_TEST_BINS): $(B)/test/%: test/unit/%.c $(B)/libmcd.a $(B)/verbs-emu/libverbs-emu.a $(B)/.flags
	@mkdir -p $(dir $@)
	@echo "  CC TEST $< (verbs-emu)"
	$(Q)$(CC) $(TEST_CFLAGS) -MMD -MP -o $@ $< $(B)/libmcd.a $(B)/verbs-emu/libverbs-emu.a -lcriterion $(LIBS_VEMU) $(LDFLAGS_SAN)

# TEST BUILDS of the daemon and the CLI on the software verbs device, for
# the rdma integration tests (test/integration/test_transfer_rdma.py): the
# same objects as the production binaries, linked (dynamically) with
# verbs-emu instead of libibverbs. Never installed.
EMU_BINS := $(B)/test/mooncaked-emu $(B)/test/mooncakectl-emu
$(B)/test/mooncaked-emu: $(B)/obj/main.o $(B)/libmcd.a $(B)/verbs-emu/libverbs-emu.a
	@mkdir -p $(dir $@)
	@echo "  LD      $@ (verbs-emu)"
	$(Q)$(CC) $(LDFLAGS_SAN) -o $@ $< $(B)/libmcd.a $(B)/verbs-emu/libverbs-emu.a $(LIBS_VEMU)

$(B)/test/mooncakectl-emu: $(CTL_OBJS) $(B)/libmooncake.a $(B)/libmcd.a $(B)/verbs-emu/libverbs-emu.a
	@mkdir -p $(dir $@)
	@echo "  LD      $@ (verbs-emu)"
	$(Q)$(CC) $(LDFLAGS_SAN) -o $@ $(CTL_OBJS) $(B)/libmooncake.a $(B)/libmcd.a $(B)/verbs-emu/libverbs-emu.a $(LIBS_VEMU)

# Fuzz targets: replayed over their corpus by make test (any compiler);
# `make fuzz` builds them with clang's libFuzzer in build-fuzz/ and runs
# each for FUZZ_SECONDS.
FUZZ_SECONDS ?= 30
$(B)/fuzz-replay/%: test/fuzz/%.c test/fuzz/replay.c $(B)/libmcd.a
	@mkdir -p $(dir $@)
	@echo "  CC FUZZ $<"
	$(Q)$(CC) $(TEST_CFLAGS) -o $@ $< test/fuzz/replay.c $(B)/libmcd.a $(LIBS_DYNAMIC) $(LDFLAGS_SAN)

$(B)/fuzz/%: test/fuzz/%.c $(B)/libmcd.a
	@mkdir -p $(dir $@)
	@echo "  CC FUZZ $<"
	$(Q)$(CC) $(TEST_CFLAGS) -fsanitize=fuzzer -o $@ $< $(B)/libmcd.a $(LIBS_DYNAMIC) $(LDFLAGS_SAN)

fuzz:
	$(MAKE) FUZZ=1 fuzz-run

# The seed corpora written with the project's own writers (test/fuzz/seeds.c):
# valid WAL segments and MVCC snapshots. Run after a format change and
# commit the files.
$(B)/fuzz-seeds: test/fuzz/seeds.c $(B)/libmcd.a
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(TEST_CFLAGS) -o $@ $< $(B)/libmcd.a $(LIBS_DYNAMIC) $(LDFLAGS_SAN)

fuzz-seeds: $(B)/fuzz-seeds
	$(B)/fuzz-seeds test/fuzz/corpus

fuzz-run: $(FUZZ_BINS)
	@for f in $(FUZZ_BINS); do n=$$(basename $$f); mkdir -p $(B)/corpus/$$n test/fuzz/corpus/$$n; \
	  echo "== fuzz $$n for $(FUZZ_SECONDS)s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(B)/corpus/$$n test/fuzz/corpus/$$n || exit 1; done

test: all $(UNIT_BINS) $(EMU_BINS) $(CUDA_EMU) $(PY_GEN) $(REPLAY_BINS)
	$(Q)BUILD=$(B) PYTHON=$(PYTHON) SAN=$(SAN) test/run.sh

BENCH_SRCS := $(wildcard test/bench/bench_*.c)
BENCH_BINS := $(patsubst test/bench/%.c,$(B)/bench/%,$(BENCH_SRCS))
$(B)/bench/%: test/bench/%.c $(B)/libmcd.a
	@mkdir -p $(dir $@)
	@echo "  CC BENCH $<"
	$(Q)$(CC) $(TEST_CFLAGS) -o $@ $< $(B)/libmcd.a $(LIBS_DYNAMIC) $(LDFLAGS_SAN)

# Long randomized runs: many more Raft simulation seeds.
SOAK_SEEDS ?= 20000
soak: all $(UNIT_BINS)
	$(Q)RAFT_SIM_SEEDS=$(SOAK_SEEDS) RAFT_SIM_STEPS=8000 $(B)/test/test_raft_sim --jobs 2

bench: all $(BENCH_BINS) $(EMU_BINS)
	$(Q)$(B)/mooncakectl bench rpc
	$(Q)$(B)/mooncakectl bench master
	$(Q)$(B)/mooncakectl bench resync --agents=64 --objects=1M
	$(Q)$(B)/bench/bench_master_index 1000000 100 5
	$(Q)for p in shm tcp; do for op in write read; do \
	  $(B)/mooncakectl bench transfer --protocol=$$p --op=$$op --duration=2s || exit 1; done; done
	$(Q)$(B)/mooncakectl bench store --duration=1s
	$(Q)for c in 4 16; do for m in separate local; do $(B)/mooncakectl bench store \
	  --value-size=4K --clients=$$c --op=put,get,mixed,batch-put,batch-get --master=$$m \
	  --duration=3s || exit 1; done; done
	$(Q)$(B)/mooncakectl bench sessions --sessions=1000
	$(Q)$(B)/mooncakectl bench ssd --duration=3s
	$(Q)$(B)/mooncakectl bench store --tier=ssd --duration=4s --rounds=4
	$(Q)for op in write read; do VERBS_EMU_DEVICES=2 $(B)/test/mooncakectl-emu bench transfer \
	  --protocol=rdma --op=$$op --duration=2s || exit 1; done
	$(Q)d=$$(mktemp -d) && $(B)/bench/bench_wal $$d 256 64; rm -rf $$d
	$(Q)$(B)/bench/bench_hostmem 64 1024 4
	$(Q)BUILD=$(B) $(PYTHON) test/bench/bench_pd.py --protocol=tcp
	$(Q)test/bench/bench_meta.sh $(B)
	$(Q)test/bench/bench_meta_perf.sh $(B)

# ---------------------------------------------------------------- format
# The committed .clang-format (tuned with Debian 12's clang-format 14 to
# change as little of the existing code as it can). format-check lists
# every file clang-format would change, with the number of places, and
# fails if there is one; it changes nothing.
FILES := $(sort $(wildcard src/*.[ch] src/*/*.[ch] src/*/*/*.[ch] test/unit/*.[ch]))
CLANG_FORMAT ?= clang-format
format-check:
	$(Q)command -v $(CLANG_FORMAT) >/dev/null || { echo "$(CLANG_FORMAT) not found (Debian package clang-format)"; exit 1; }
	$(Q)bad=0; for f in $(FILES); do \
	  n=$$($(CLANG_FORMAT) --style=file --dry-run $$f 2>&1 | grep -c 'warning:'); \
	  if [ "$$n" -gt 0 ]; then echo "$$f: differs ($$n replacements)"; bad=$$((bad + 1)); fi; done; \
	if [ $$bad -gt 0 ]; then echo "format-check: $$bad files differ from .clang-format (make format FILES=...)"; exit 1; fi; \
	echo "format-check: $(words $(FILES)) files formatted"

format:
	$(Q)command -v $(CLANG_FORMAT) >/dev/null || { echo "$(CLANG_FORMAT) not found (Debian package clang-format)"; exit 1; }
	$(Q)$(CLANG_FORMAT) --style=file -i $(FILES)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include \
	  $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man8 \
	  $(DESTDIR)$(PREFIX)/share/doc/mooncaked
	install -m 0755 $(B)/mooncaked $(B)/mooncakectl $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(B)/libmooncake.a $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(B)/libmooncake.so $(DESTDIR)$(PREFIX)/lib/libmooncake.so.0
	ln -sf libmooncake.so.0 $(DESTDIR)$(PREFIX)/lib/libmooncake.so
	install -m 0644 src/client/mooncake.h $(DESTDIR)$(PREFIX)/include/
	install -m 0644 $(B)/man/mooncaked.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -m 0644 man/mooncakectl.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -d $(DESTDIR)$(PREFIX)/share/man/man3 $(DESTDIR)$(PYDIR)/mooncake
	install -m 0644 man/libmooncake.3 $(DESTDIR)$(PREFIX)/share/man/man3/
	install -m 0644 python/mooncake/*.py $(DESTDIR)$(PYDIR)/mooncake/
	install -m 0644 conf/mooncaked.conf $(DESTDIR)$(PREFIX)/share/doc/mooncaked/
	install -d $(DESTDIR)$(PREFIX)/lib/systemd/system $(DESTDIR)$(PREFIX)/lib/sysusers.d
	for u in deploy/*.service.in; do \
	  sed 's|@PREFIX@|$(PREFIX)|g' $$u > $(DESTDIR)$(PREFIX)/lib/systemd/system/$$(basename $$u .in); done
	install -m 0644 deploy/mooncaked.sysusers $(DESTDIR)$(PREFIX)/lib/sysusers.d/mooncaked.conf
	install -m 0644 deploy/mooncaked.default $(DESTDIR)$(PREFIX)/share/doc/mooncaked/

clean:
	rm -rf build build-san build-fuzz build-dyn

-include $(shell find $(B) -name '*.d' 2>/dev/null)
