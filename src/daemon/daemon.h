/*
 * daemon: the process frame shared by every role — data-dir lock, pid
 * file, log setup, signal handling (SIGTERM/SIGINT graceful shutdown,
 * SIGHUP log reopen), and starting the roles the configuration names on
 * one libuv loop. It sits above the role subsystems (meta, master, agent)
 * and below main.
 */
#ifndef MC_DAEMON_DAEMON_H
#define MC_DAEMON_DAEMON_H

#include "common/cfg.h"

/* Run until a shutdown signal. Returns the process exit status: 0 after
 * a clean shutdown, 1 when start-up or shutdown failed (logged). */
int daemon_run(const struct cfg *cfg);

#endif
