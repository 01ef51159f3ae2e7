/*
 * daemon: process frame. Work in progress: roles are started here once
 * the RPC and HTTP layers land.
 */
#include "daemon/daemon.h"

#include "common/log.h"

#define LOG_SUBSYS LOGS_DAEMON

int daemon_run(const struct cfg *cfg)
{
	(void)cfg;
	log_error("the process frame is not built yet");
	return 1;
}
