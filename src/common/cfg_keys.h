/*
 * cfg_keys: THE table of configuration keys. It drives flag, environment
 * and file parsing, --help, --print-config and the OPTIONS section of
 * mooncaked(8), so they cannot drift apart.
 *
 * X(id, name, section, type, default, min, max, choices, help)
 *   name     = the flag (--name), the file key, MOONCAKE_NAME in the env
 *   section  = where the key goes in the file: [common] [meta] [master] [agent]
 *   min/max  = bounds for UINT, SIZE (bytes), DURATION (ms) and RATIO
 *              (parts per million: 0.9 is 900000)
 *   choices  = "a|b|c" for ENUM
 * Units are part of the value (512M, 10s); names carry the unit where the
 * value is a bare number.
 */
#ifndef MC_COMMON_CFG_KEYS_H
#define MC_COMMON_CFG_KEYS_H

#define CFG_KEYS(X) \
	X(ROLE, "role", COMMON, ROLES, "standalone", 0, 0, NULL, \
	  "roles this process runs: meta, master, agent, standalone " \
	  "(= all three); a comma list combines them") \
	X(DATA_DIR, "data-dir", COMMON, PATH, "/var/lib/mooncake", 0, 0, NULL, \
	  "directory for the lock file, pid file, WAL and snapshots; one " \
	  "daemon per directory") \
	X(PID_FILE, "pid-file", COMMON, PATH, "", 0, 0, NULL, \
	  "write the daemon's pid here (empty: <data-dir>/mooncaked.pid)") \
	X(LOG_LEVEL, "log-level", COMMON, LOGLEVEL, "info", 0, 0, NULL, \
	  "log level, for all subsystems or per subsystem: " \
	  "info,raft=debug,rpc=warn") \
	X(LOG_FILE, "log-file", COMMON, PATH, "", 0, 0, NULL, \
	  "append log lines to this file instead of stderr; reopened on " \
	  "SIGHUP") \
	X(LOG_MAX_SIZE, "log-max-size", COMMON, SIZE, "0", 0, 1ull << 40, NULL, \
	  "rotate --log-file once it reaches this size: FILE becomes FILE.1, " \
	  "FILE.1 becomes FILE.2 and so on, and a new FILE is begun; 0: never " \
	  "(leave rotation to logrotate and SIGHUP)") \
	X(LOG_MAX_FILES, "log-max-files", COMMON, UINT, "5", 1, 1000, NULL, \
	  "rotated log files kept by --log-max-size (FILE.1 to FILE.N); the " \
	  "oldest is deleted") \
	X(RPC_MAX_MESSAGE_SIZE, "rpc-max-message-size", COMMON, SIZE, "64M", 1024, \
	  1073741824ull, NULL, \
	  "largest gRPC message accepted or sent; larger ones fail with " \
	  "RESOURCE_EXHAUSTED") \
	X(RPC_MAX_CALL_MEMORY, "rpc-max-call-memory", COMMON, SIZE, "1G", 1048576, \
	  1ull << 40, NULL, \
	  "the most memory the calls of a gRPC server may hold at once: the " \
	  "bytes of requests being received, what they decode to, answers " \
	  "the clients have not taken yet and meta's watchers, one " \
	  "connection's at most a quarter " \
	  "of it; a call that would pass it fails with RESOURCE_EXHAUSTED (at " \
	  "least " \
	  "twice --rpc-max-message-size; never below twice the largest request " \
	  "a server accepts, plus 1M)") \
	X(SHUTDOWN_TIMEOUT, "shutdown-timeout", COMMON, DURATION, "10s", 0, 3600000, NULL, \
	  "on SIGTERM/SIGINT, how long to wait for in-flight calls before " \
	  "cancelling them: the agent's client requests first (new ones are " \
	  "refused with MC_ESHUTDOWN), then each role's stop, then gRPC calls, " \
	  "each phase at most this long") \
	X(DIAG_SERVICE, "diag-service", COMMON, BOOL, "false", 0, 0, NULL, \
	  "also serve mooncake.diag.Diag (echo and streaming diagnostics used " \
	  "by mooncakectl bench rpc) on every RPC port") \
	X(CLUSTER_ID, "cluster-id", COMMON, STRING, "mooncake", 0, 0, NULL, \
	  "prefix of every key in meta: /mooncake/<cluster-id>/...") \
	X(META_ENDPOINTS, "meta-endpoints", COMMON, STRING, "http://127.0.0.1:2379", 0, 0, \
	  NULL, \
	  "meta service (or etcd) endpoints, a comma list of " \
	  "[http://]host:port; a process running the meta role with this " \
	  "left at its default uses its own --listen-client; empty: no meta") \
	X(CLUSTER_SECRET_FILE, "cluster-secret-file", COMMON, PATH, "", 0, 0, NULL, \
	  "file holding the secret transfer engines prove to each other " \
	  "(HMAC challenge) on every tcp, shm and rdma connection and " \
	  "descriptor fetch; the same file on every host (mooncakectl secret " \
	  "create F makes one); a master given it requires a token of it of " \
	  "every caller of its API, a meta member of every caller of its " \
	  "peer port (the other members) and etcd API (--client-auth); " \
	  "empty: <data-dir>/cluster.secret, created (random, 0600) at the " \
	  "agent's first start, allowed only " \
	  "while the agent listens on loopback addresses (a master or a meta " \
	  "peer port or etcd API without it then only on loopback, open to " \
	  "local callers)") \
	X(INSECURE_TRANSFER, "insecure-transfer", COMMON, BOOL, "false", 0, 0, NULL, \
	  "run the transfer engine without authentication: anyone who " \
	  "reaches its data or RPC port reads and writes its registered " \
	  "memory, and a master, a meta peer port or etcd API listen " \
	  "beyond loopback open to anyone; logged as a warning at every " \
	  "start; not with " \
	  "--cluster-secret-file") \
	X(LISTEN_CLIENT, "listen-client", META, ADDR, "127.0.0.1:2379", 0, 0, NULL, \
	  "meta: etcd v3 gRPC API (host:port, numeric)") \
	X(CLIENT_AUTH, "client-auth", META, ENUM, "secret", 0, 0, "secret|none", \
	  "meta: who may call the etcd API on --listen-client. secret: with " \
	  "--cluster-secret-file, only callers that prove it (the daemons " \
	  "and mooncakectl with a token of it; etcd clients as user root " \
	  "with the secret file's contents as password, e.g. etcdctl --user " \
	  "root:SECRET); without one the API is open and listens on loopback " \
	  "only (else --insecure-transfer). none: anyone who reaches the port " \
	  "(etcd clients without credentials, such as upstream Mooncake's), " \
	  "a warning at every start") \
	X(AUTH_TOKEN_TTL, "auth-token-ttl", META, DURATION, "5m", 1000, 86400000, NULL, \
	  "meta: how long a token from the etcd API's Authenticate is good " \
	  "for (etcd's --auth-token-ttl); its client then authenticates " \
	  "again") \
	X(LISTEN_PEER, "listen-peer", META, ADDR, "127.0.0.1:2380", 0, 0, NULL, \
	  "meta: Raft peer gRPC (host:port)") \
	X(META_HTTP, "meta-http", META, ADDR, "127.0.0.1:2381", 0, 0, NULL, \
	  "meta: HTTP /metrics and /healthz (host:port)") \
	X(ADVERTISE_PEER, "advertise-peer", META, STRING, "", 0, 0, NULL, \
	  "meta: the host:port other members reach this one at, when it " \
	  "differs from --listen-peer (a proxy, NAT); empty: --listen-peer") \
	X(ADVERTISE_CLIENT, "advertise-client", META, STRING, "", 0, 0, NULL, \
	  "meta: the client host:port published in the member list; empty: " \
	  "--listen-client") \
	X(NAME, "name", META, STRING, "default", 0, 0, NULL, \
	  "meta: this member's name, as listed in --initial-cluster") \
	X(INITIAL_CLUSTER, "initial-cluster", META, STRING, "", 0, 0, NULL, \
	  "meta: founding members as name=host:port,... (their peer " \
	  "addresses); empty: this member alone (name=listen-peer)") \
	X(INITIAL_CLUSTER_STATE, "initial-cluster-state", META, ENUM, "new", 0, 0, \
	  "new|existing", \
	  "meta: new founds a cluster; existing joins one after `member " \
	  "add` (ignored once the data dir has a WAL)") \
	X(HEARTBEAT_INTERVAL, "heartbeat-interval", META, DURATION, "100ms", 1, 60000, NULL, \
	  "meta: Raft tick and leader heartbeat interval") \
	X(ELECTION_TIMEOUT, "election-timeout", META, DURATION, "1s", 2, 600000, NULL, \
	  "meta: a follower that hears no leader this long starts an " \
	  "election (at least 2 heartbeat intervals)") \
	X(SNAPSHOT_COUNT, "snapshot-count", META, UINT, "100000", 1, 100000000, NULL, \
	  "meta: applied entries between snapshots, as etcd's (the WAL and " \
	  "the in-memory log are then compacted); each copies the whole " \
	  "store, encoded a slice at a time while the member serves") \
	X(MAX_REQUEST_BYTES, "max-request-bytes", META, SIZE, "1536K", 1024, 67108864, NULL, \
	  "meta: largest write (its log entry); larger ones fail with " \
	  "etcd's \"request is too large\"; the client port refuses any " \
	  "request larger than this plus 512K, as etcd's gRPC server does") \
	X(QUOTA_BACKEND_BYTES, "quota-backend-bytes", META, SIZE, "2G", 4096, \
	  1099511627776ull, NULL, \
	  "meta: space quota of the key-value store (keys, values and " \
	  "history, 64 bytes a lease), as etcd's; past it writes and lease " \
	  "grants fail with NOSPACE and an alarm is raised") \
	X(AUTO_COMPACTION_MODE, "auto-compaction-mode", META, ENUM, "periodic", 0, 0, \
	  "periodic|revision", \
	  "meta: how --auto-compaction-retention is read, as etcd's: " \
	  "periodic (a duration: the leader compacts the history older than " \
	  "that, every retention period, at most every hour) or revision (a " \
	  "count: every 5 minutes, all but the newest that many revisions)") \
	X(AUTO_COMPACTION_RETENTION, "auto-compaction-retention", META, STRING, "5m", 0, 0, \
	  NULL, \
	  "meta: history kept by the leader's automatic compaction: a " \
	  "duration (5m, 1h; a bare number is hours, as etcd reads it) or a " \
	  "revision count (--auto-compaction-mode=revision); 0 turns it off " \
	  "(etcd's default; here history then grows, in memory and in every " \
	  "snapshot, until a client compacts)") \
	X(WATCH_PROGRESS_NOTIFY_INTERVAL, "watch-progress-notify-interval", META, DURATION, \
	  "10m", 100, 86400000, NULL, \
	  "meta: how often idle watchers created with progress_notify get a " \
	  "progress notification") \
	X(MASTER_LISTEN, "master-listen", MASTER, ADDR, "127.0.0.1:50051", 0, 0, NULL, \
	  "master: gRPC service mooncake.master.Master (host:port)") \
	X(MASTER_HTTP, "master-http", MASTER, ADDR, "127.0.0.1:9003", 0, 0, NULL, \
	  "master: HTTP /metrics and /healthz (host:port)") \
	X(MASTER_ADVERTISE, "master-advertise", MASTER, STRING, "", 0, 0, NULL, \
	  "master: host:port agents reach this master at, written to the " \
	  "leader key in meta (empty: --master-listen)") \
	X(AGENT_TTL, "agent-ttl", MASTER, DURATION, "10s", 100, 86400000ull, NULL, \
	  "master: an agent silent this long is dead: its segments are " \
	  "unmounted and objects left without a replica removed (one " \
	  "started again on its data dir takes its place at once)") \
	X(PUT_TIMEOUT, "put-timeout", MASTER, DURATION, "30s", 10, 86400000ull, NULL, \
	  "master: a put started (PutStart) and not ended within this is " \
	  "revoked and its space reused") \
	X(DEFAULT_KV_LEASE_TTL, "default-kv-lease-ttl", MASTER, DURATION, "5s", 1, \
	  3600000ull, NULL, \
	  "master: read lease granted by GetReplicas; a leased object is " \
	  "not evicted or removed (unless forced) before it ends") \
	X(EVICTION_HIGH_WATERMARK_RATIO, "eviction-high-watermark-ratio", MASTER, RATIO, \
	  "0.9", 1, 1000000, NULL, \
	  "master: evict when DRAM-tier usage passes this fraction of " \
	  "capacity; with SSD tiers mounted, demote to them instead (an " \
	  "object no SSD tier can take is evicted)") \
	X(EVICTION_RATIO, "eviction-ratio", MASTER, RATIO, "0.1", 1, 1000000, NULL, \
	  "master: fraction of DRAM-tier capacity freed by one eviction " \
	  "round, least recently read first") \
	X(LEADER_LEASE_TTL, "leader-lease-ttl", MASTER, DURATION, "5s", 1000, 600000, NULL, \
	  "master: TTL of the meta lease that holds the leader key; a " \
	  "leader that cannot renew it within this stops serving") \
	X(MIRROR_LOG_SIZE, "mirror-log-size", MASTER, SIZE, "16M", 65536, 1ull << 40, NULL, \
	  "master: per segment, changes kept until its agent acknowledges " \
	  "them in its mirror; an agent further behind re-reads the whole " \
	  "segment") \
	X(AGENT_LISTEN, "agent-listen", AGENT, ADDR, "127.0.0.1:12345", 0, 0, NULL, \
	  "agent: transfer-engine control gRPC (host:port)") \
	X(AGENT_HTTP, "agent-http", AGENT, ADDR, "127.0.0.1:9100", 0, 0, NULL, \
	  "agent: HTTP /metrics and /healthz (host:port)") \
	X(GLOBAL_SEGMENT_SIZE, "global-segment-size", AGENT, SIZE, "0", 0, 1ull << 50, NULL, \
	  "agent: DRAM this node contributes to the pool (its segment); 0: " \
	  "1 GiB or a quarter of the RAM, whichever is smaller") \
	X(LOCAL_BUFFER_SIZE, "local-buffer-size", AGENT, SIZE, "16M", 4096, 1ull << 40, NULL, \
	  "agent: staging buffer of each client session (shared memory for " \
	  "values passed by copy), and the most a client may ask for") \
	X(NUMA_NODE, "numa-node", AGENT, STRING, "", 0, 0, NULL, \
	  "agent: bind the segment and client buffers to this NUMA node " \
	  "(empty: no binding)") \
	X(HUGEPAGES, "hugepages", AGENT, ENUM, "auto", 0, 0, "auto|on|off", \
	  "agent: back the segment with 2 MiB huge pages: auto (when the " \
	  "kernel has them reserved, else 4 KiB pages and a log line), on " \
	  "(refuse to start without), off") \
	X(FORCE_SEGMENT_SIZE, "force-segment-size", AGENT, BOOL, "false", 0, 0, NULL, \
	  "agent: start even when the segment does not fit: more than the " \
	  "memory available, more than the memory-lock limit (RLIMIT_MEMLOCK) " \
	  "when RDMA pins it, more than the free huge pages with " \
	  "--hugepages=on; without it the agent refuses to start and says " \
	  "which figure is short") \
	X(SOCKET, "socket", AGENT, PATH, "/run/mooncake/agent.sock", 0, 0, NULL, \
	  "agent: the clients' Unix socket (mode 0660); when the default's " \
	  "directory cannot be written: $XDG_RUNTIME_DIR/mooncake/agent.sock, " \
	  "else <data-dir>/agent.sock") \
	X(MASTER_ADDRESS, "master-address", AGENT, STRING, "", 0, 0, NULL, \
	  "agent: the master's host:port, instead of the leader key in meta " \
	  "(a standby's redirect is still followed); empty: from meta, or " \
	  "this process's master when it runs one and --meta-endpoints is " \
	  "empty") \
	X(PUT_LEASE_SIZE, "put-lease-size", AGENT, SIZE, "16M", 0, 1ull << 40, NULL, \
	  "agent: space of its segment the master leases to it (at most an " \
	  "eighth of the segment), so puts whose one replica is this segment " \
	  "(values up to a quarter of the lease) are sealed with one master " \
	  "call; single puts onto another agent's segment use remote leases " \
	  "of a quarter of it there (values up to a 64th); 0: every put " \
	  "takes PutStart and PutEnd") \
	X(REMOTE_LEASE_CACHE_SIZE, "remote-lease-cache-size", AGENT, SIZE, "64K", 0, \
	  1ull << 20, NULL, \
	  "agent: values up to this size whose replica is on another agent " \
	  "are read without asking the master again while its read lease " \
	  "lasts, their bytes checked against their checksum (a value " \
	  "removed by force may be served until the lease ends, like any " \
	  "lease holder reads it); 0: ask every time") \
	X(CLIENT_LEASE_TABLE, "client-lease-table", AGENT, UINT, "65536", 0, 4194304, NULL, \
	  "agent: slots (rounded up to a power of two, 256 bytes each) of " \
	  "the table, shared read-only with its clients, where it publishes " \
	  "the read leases it holds on objects in its DRAM segment, so that " \
	  "libmooncake answers gets of them in the client's process without " \
	  "a round trip (keys of up to 216 bytes; any local session can see " \
	  "which keys are there, as it can read the segment); 0: none, " \
	  "every get asks the agent") \
	X(BUSY_POLL_US, "busy-poll-us", AGENT, UINT, "50", 0, 1000000, NULL, \
	  "agent: microseconds the loop polls without sleeping after each " \
	  "client request, reply and end of copies while one session alone " \
	  "sends requests, so that its next request is taken without a " \
	  "thread wakeup (never while copy threads work or a request waits " \
	  "for the master or another agent); 0: always sleep") \
	X(CLIENT_MAX_SESSIONS, "client-max-sessions", AGENT, UINT, "4096", 1, 1000000, NULL, \
	  "agent: client sessions open at once, every user together; one " \
	  "more is refused (-EUSERS; logged and counted)") \
	X(CLIENT_MAX_SESSIONS_PER_UID, "client-max-sessions-per-uid", AGENT, UINT, "2048", 1, \
	  1000000, NULL, \
	  "agent: client sessions one user (uid) may have open at once; one " \
	  "more is refused (-EUSERS)") \
	X(CLIENT_REPLY_BUFFER_SIZE, "client-reply-buffer-size", AGENT, SIZE, "64M", 65536, \
	  1ull << 40, NULL, \
	  "agent: per session, replies the client has not read yet plus the " \
	  "memory made for what they carry (a get's values without a " \
	  "destination); past it the session's requests are not read until " \
	  "it reads (the session stays open), and a get that needs more waits" \
	  " for room") \
	X(CLIENT_MAX_FDS, "client-max-fds", AGENT, UINT, "256", 32, 1000000, NULL, \
	  "agent: per session, descriptors the agent holds for its requests " \
	  "in flight and its unread replies (its buffers' apart); past it the " \
	  "session's requests are not read until it reads") \
	X(CLIENT_MAX_BUFFERS, "client-max-buffers", AGENT, UINT, "1024", 1, 1000000, NULL, \
	  "agent: buffers (registered or allocated) one session may hold, " \
	  "each a descriptor and a mapping; one more is refused (-ENOSPC)") \
	X(CLIENT_MAX_VIEWS, "client-max-views", AGENT, UINT, "65536", 1, 16777216, NULL, \
	  "agent: zero-copy views one session may hold (each keeps a read " \
	  "lease and a copy of its key); a get asking for one more fails " \
	  "that item (-ENOSPC)") \
	X(CLIENT_ALLOC_SIZE, "client-alloc-size", AGENT, SIZE, "0", 0, 1ull << 50, NULL, \
	  "agent: memory of the buffers the agent makes for clients " \
	  "(AllocBuffer), every session together; past it AllocBuffer is " \
	  "refused (-ENOSPC); 0: the machine's RAM") \
	X(AGENT_COPY_THREADS, "agent-copy-threads", AGENT, UINT, "0", 0, 64, NULL, \
	  "agent: threads that copy object bytes; 0: one per core, at most 8") \
	X(AGENT_NAME, "agent-name", AGENT, STRING, "", 0, 0, NULL, \
	  "agent: its segment name in meta (empty: the agent-listen " \
	  "host:port)") \
	X(PROTOCOL, "protocol", AGENT, ENUM, "auto", 0, 0, "auto|tcp|rdma|shm", \
	  "transfer engine transport for remote peers: auto (rdma when a " \
	  "usable device exists, else tcp, logging why; shm on this host), " \
	  "tcp (also on this host), rdma (also on this host; no usable " \
	  "device refuses the start), shm (this host only)") \
	X(TE_THREADS, "te-threads", AGENT, UINT, "0", 0, 1024, NULL, \
	  "transfer engine data-plane threads (0: one per core)") \
	X(TE_TCP_CONNS, "te-tcp-conns", AGENT, UINT, "4", 1, 32, NULL, \
	  "TCP connections per peer segment; slices are striped over them") \
	X(TE_SLICE_SIZE, "te-slice-size", AGENT, SIZE, "1M", 65536, 67108864, NULL, \
	  "transfer requests are cut into slices of this size") \
	X(TE_DATA_LISTEN, "te-data-listen", AGENT, STRING, "", 0, 0, NULL, \
	  "transfer engine TCP data listener, numeric host:port (empty: the " \
	  "agent-listen host, an ephemeral port); advertised to peers in the " \
	  "segment descriptor") \
	X(TE_IO_TIMEOUT, "te-io-timeout", AGENT, DURATION, "10s", 100, 3600000, NULL, \
	  "a transfer path that makes no progress this long is declared " \
	  "dead (its slices go to the other paths)") \
	X(TE_LEASE_TTL, "te-lease-ttl", AGENT, DURATION, "10s", 1000, 3600000, NULL, \
	  "lease of the segment descriptor in meta: it disappears this long " \
	  "after the agent dies") \
	X(RDMA_DEVICES, "rdma-devices", AGENT, STRING, "", 0, 0, NULL, \
	  "RDMA devices for the rdma transport, mlx5_0,mlx5_1 (empty: every " \
	  "usable one)") \
	X(RDMA_GID_INDEX, "rdma-gid-index", AGENT, STRING, "auto", 0, 0, NULL, \
	  "GID index for RoCE, 0-255 (auto: RoCE v2 with an IPv4-mapped " \
	  "address first)") \
	X(RDMA_MTU, "rdma-mtu", AGENT, ENUM, "auto", 0, 0, "auto|256|512|1024|2048|4096", \
	  "path MTU of RDMA connections in bytes: auto (the port's active " \
	  "MTU), or at most this (never more than the active MTU)") \
	X(SSD_PATH, "ssd-path", AGENT, PATH, "", 0, 0, NULL, \
	  "agent: directory of its SSD tier (created when missing; one agent " \
	  "per directory, not the data dir itself); objects demoted from " \
	  "DRAM or put there survive a restart; empty: no SSD tier") \
	X(SSD_SIZE, "ssd-size", AGENT, SIZE, "0", 0, 1ull << 50, NULL, \
	  "agent: space of --ssd-path the SSD tier takes (preallocated; the " \
	  "agent refuses to start when the file system has less free); " \
	  "required with --ssd-path") \
	X(SSD_HIGH_WATERMARK_RATIO, "ssd-high-watermark-ratio", AGENT, RATIO, "0.9", 1, \
	  1000000, NULL, \
	  "agent: the master evicts objects from this agent's SSD tier (for " \
	  "real) when its use passes this fraction of --ssd-size") \
	X(SSD_EVICTION_RATIO, "ssd-eviction-ratio", AGENT, RATIO, "0.1", 1, 1000000, NULL, \
	  "agent: fraction of --ssd-size one SSD eviction round frees, least " \
	  "recently read first") \
	X(SSD_FLUSH_ON_STOP, "ssd-flush-on-stop", AGENT, BOOL, "false", 0, 0, NULL, \
	  "agent: on SIGTERM, write the objects of its DRAM segment to the " \
	  "SSD tier before leaving (within --shutdown-timeout), so that a " \
	  "restart on the same --ssd-path finds them") \
	X(SSD_PROMOTE_ON_HIT, "ssd-promote-on-hit", AGENT, BOOL, "true", 0, 0, NULL, \
	  "agent: a get of an object on this agent's SSD tier copies it back " \
	  "to its DRAM segment when there is room below the eviction " \
	  "watermark (the SSD copy is then deleted)") \
	X(SSD_VERIFY_ON_START, "ssd-verify-on-start", AGENT, BOOL, "false", 0, 0, NULL, \
	  "agent: read every object of the SSD tier at start and drop those " \
	  "whose bytes fail their checksum (a slower start; otherwise a read " \
	  "finds them, fails and drops them)") \
	X(SSD_SYNC_INTERVAL, "ssd-sync-interval", AGENT, DURATION, "5s", 0, 3600000, NULL, \
	  "agent: least time between two syncs of the SSD tier to stable " \
	  "storage: what a power loss can lose (a kill -9 loses nothing that " \
	  "reached the SSD tier); puts and the reuse of removed space never " \
	  "wait for it; 0: sync back to back") \
	X(SSD_IO, "ssd-io", AGENT, ENUM, "auto", 0, 0, "auto|io_uring|threads", \
	  "agent: how the SSD tier's data I/O runs: io_uring (fail at start " \
	  "when the kernel or a seccomp profile refuses it), threads (a pool " \
	  "doing pread/pwrite; also for valgrind, which cannot follow " \
	  "io_uring's shared rings), auto (io_uring, else threads)") \
	X(SSD_BOUNCE_SIZE, "ssd-bounce-size", AGENT, SIZE, "64M", 1048576, 1ull << 40, NULL, \
	  "agent: memory, registered with the transfer engine, that objects " \
	  "of its SSD tier are read into for other agents' gets; larger " \
	  "objects cannot be read from another node") \
	X(SSD_STAGING_SIZE, "ssd-staging-size", AGENT, SIZE, "64M", 0, 1ull << 36, NULL, \
	  "agent: memory on transparent 2 MiB pages that the SSD tier's reads " \
	  "(and demotions, and puts over 1 MiB) go through when a " \
	  "value's own memory is on 4 KiB pages (a virtual disk moves a MiB " \
	  "of them as 256 pieces: 2-2.5x slower on the test VM), then a " \
	  "copy; taken at start (at most half the " \
	  "memory available); values that do " \
	  "not fit, and all of them when the kernel gives no huge pages (a " \
	  "warning), go directly; 0: always directly (no copy: for local " \
	  "NVMe, to which 4 KiB pages cost little)")

/*
 * Mooncake's spellings. Mooncake users set MC_* variables for its transfer
 * engine and pass mooncake_master / mooncake_client gflags; those that map
 * one to one onto a key are accepted, each value converted as its
 * conversion says, shown by --print-config as its origin and listed in
 * --help and the man page. Those without a meaning here are refused (a
 * flag: exit status 2) or ignored with a warning (a variable, which the
 * node's inference processes may share), with a line saying why.
 *
 * Conversions:
 *   SAME       the value as given
 *   SIZE       a size, spaces dropped ("4 GB" is 4GB)
 *   PORT       the port of the key's host:port (its host kept)
 *   HOST       the host of the key's host:port (its port kept)
 *   MS         integer milliseconds
 *   SECONDS    integer seconds
 *   ENDPOINTS  a list separated by ';' or ','
 *   METADATA   Mooncake's metadata_server: P2PHANDSHAKE (no meta) or
 *              etcd://HOST:PORT[;HOST:PORT]
 *   HA         true: meta is used (it must be set); false: no meta
 *   FORCE_TCP  set (empty or true): protocol tcp
 */

/* Environment variables read below the key's own MOONCAKE_* variable
 * (so below it and below flags). X(id, variable, conversion) */
#define CFG_ENV_ALIASES(X) \
	X(RDMA_GID_INDEX, "MC_GID_INDEX", SAME) \
	X(PROTOCOL, "MC_FORCE_TCP", FORCE_TCP) \
	X(RDMA_MTU, "MC_MTU", SAME) \
	X(LOG_LEVEL, "MC_LOG_LEVEL", SAME) \
	X(TE_SLICE_SIZE, "MC_SLICE_SIZE", SIZE) \
	X(CLUSTER_ID, "MC_STORE_CLUSTER_ID", SAME) \
	X(RDMA_DEVICES, "MC_MS_FILTERS", SAME)

/* Flags of mooncake_master and mooncake_client, applied in command-line
 * order with mooncaked's own. X(spelling, id, conversion) */
#define CFG_MOONCAKE_FLAGS(X) \
	X("rpc_port", MASTER_LISTEN, PORT) \
	X("rpc_address", MASTER_LISTEN, HOST) \
	X("metrics_port", MASTER_HTTP, PORT) \
	X("eviction_high_watermark_ratio", EVICTION_HIGH_WATERMARK_RATIO, SAME) \
	X("eviction_ratio", EVICTION_RATIO, SAME) \
	X("default_kv_lease_ttl", DEFAULT_KV_LEASE_TTL, MS) \
	X("client_ttl", AGENT_TTL, SECONDS) \
	X("put_start_discard_timeout_sec", PUT_TIMEOUT, SECONDS) \
	X("enable_ha", META_ENDPOINTS, HA) \
	X("etcd_endpoints", META_ENDPOINTS, ENDPOINTS) \
	X("cluster_id", CLUSTER_ID, SAME) \
	X("metadata_server", META_ENDPOINTS, METADATA) \
	X("master_server_address", MASTER_ADDRESS, SAME) \
	X("device_names", RDMA_DEVICES, SAME) \
	X("global_segment_size", GLOBAL_SEGMENT_SIZE, SIZE) \
	X("local_buffer_size", LOCAL_BUFFER_SIZE, SIZE)

/* Mooncake flags with no meaning here: refused. X(spelling, why) */
#define CFG_MOONCAKE_FLAGS_REFUSED(X) \
	X("port", "ambiguous: mooncake_master's RPC port is --rpc_port " \
		  "(--master-listen), mooncake_client's port is --agent-listen") \
	X("max_threads", "the master serves every call on one event loop; " \
			 "there is no thread pool to size") \
	X("rpc_thread_num", "the master serves every call on one event loop; " \
			    "there is no thread pool to size") \
	X("rpc_conn_timeout_seconds", "connections are kept; every call " \
				      "carries its own deadline") \
	X("rpc_enable_tcp_no_delay", "TCP_NODELAY is always set") \
	X("enable_metric_reporting", "metrics are always served on /metrics " \
				     "(--master-http)") \
	X("default_kv_soft_pin_ttl", "a soft pin lasts as long as its object") \
	X("allow_evict_soft_pinned_objects", "soft-pinned objects are always " \
					     "evictable, after every other object") \
	X("enable_offload", "there is no SSD or file tier yet") \
	X("root_fs_dir", "there is no SSD or file tier yet") \
	X("global_file_segment_size", "there is no SSD or file tier yet") \
	X("enable_disk_eviction", "there is no SSD or file tier yet") \
	X("quota_bytes", "Mooncake's storage-tier quota (mooncaked's " \
			 "--quota-backend-bytes is meta's space quota)") \
	X("memory_allocator", "one allocator: size classes with coalescing") \
	X("allocation_strategy", "one placement rule: the writer's segment " \
				 "first, then the emptiest") \
	X("enable_http_metadata_server", "metadata is --role=meta (etcd v3 " \
					 "API), not an HTTP server") \
	X("http_metadata_server_port", "metadata is --role=meta (etcd v3 " \
				       "API), not an HTTP server") \
	X("http_metadata_server_host", "metadata is --role=meta (etcd v3 " \
				       "API), not an HTTP server") \
	X("put_start_release_timeout_sec", "a revoked put's space is freed " \
					   "when it is revoked (--put-timeout)") \
	X("config_path", "mooncaked reads an INI file: --config=FILE") \
	X("host", "the agent listens on --agent-listen=HOST:PORT and moves " \
		  "data on --te-data-listen") \
	X("threads", "client requests are served on one loop; copies on " \
		     "--agent-copy-threads") \
	X("enable_cxl", "no CXL memory support") \
	X("cxl_path", "no CXL memory support") \
	X("cxl_size", "no CXL memory support")

/* MC_* variables with no meaning here: ignored with a warning. Other
 * MC_* variables get a generic one. X(variable, why) */
#define CFG_MOONCAKE_ENV_IGNORED(X) \
	X("MC_IB_PORT", "the first ACTIVE port of each device is used") \
	X("MC_NUM_CQ_PER_CTX", "RDMA queues are sized by mooncaked (one CQ " \
			       "per device)") \
	X("MC_NUM_COMP_CHANNELS_PER_CTX", "RDMA queues are sized by " \
					  "mooncaked (one channel per device)") \
	X("MC_MAX_CQE_PER_CTX", "RDMA queues are sized by mooncaked") \
	X("MC_MAX_EP_PER_CTX", "RDMA queues are sized by mooncaked") \
	X("MC_NUM_QP_PER_EP", "one queue pair per peer and NIC") \
	X("MC_MAX_SGE", "RDMA queues are sized by mooncaked") \
	X("MC_MAX_WR", "RDMA queues are sized by mooncaked") \
	X("MC_MAX_INLINE", "RDMA queues are sized by mooncaked") \
	X("MC_WORKERS_PER_CTX", "data threads are --te-threads") \
	X("MC_RETRY_CNT", "the RDMA retry count is fixed at 7") \
	X("MC_SLICE_TIMEOUT", "a silent path is declared dead after " \
			      "--te-io-timeout") \
	X("MC_HANDSHAKE_PORT", "the handshake runs on --agent-listen") \
	X("MC_LOG_DIR", "log to a file with --log-file") \
	X("MC_STORE_USE_HUGEPAGE", "huge pages are used whenever reserved " \
				   "(--hugepages=auto); --hugepages=on " \
				   "requires them") \
	X("MC_STORE_HUGEPAGE_SIZE", "the segment uses 2 MiB huge pages") \
	X("MC_STORE_MEMCPY", "copies on one host always go through shared " \
			     "memory") \
	X("MC_MS_AUTO_DISC", "every usable RDMA device is used when " \
			     "--rdma-devices is empty") \
	X("MC_TE_METRIC", "metrics are always served on /metrics") \
	X("MC_IB_TC", "the RDMA traffic class is not configurable") \
	X("MC_IB_SL", "the RDMA service level is not configurable") \
	X("MC_USE_IPV6", "addresses are numeric host:port, IPv6 as [v6]:port")

/* MOONCAKE_* variables that are not keys but are read by clients
 * (libmooncake, the Python package, Mooncake's connectors): no warning. */
/* clang-format off (one name a line; clang-format 14 does not settle on
 * a layout of this list) */
#define CFG_CLIENT_ENV(X) \
	X("MOONCAKE_CONFIG") \
	X("MOONCAKE_SOCKET") \
	X("MOONCAKE_LIB") \
	X("MOONCAKE_CONFIG_PATH") \
	X("MOONCAKE_MASTER") \
	X("MOONCAKE_TE_META_DATA_SERVER") \
	X("MOONCAKE_LOCAL_HOSTNAME") \
	X("MOONCAKE_DEVICE")
/* clang-format on */

#endif
