/*
 * cfg: configuration from the key table (cfg_keys.h), with precedence
 * flag > environment > file > default, and the origin of every value kept
 * for --print-config.
 *
 * Value syntax:
 *   SIZE      bytes with an optional binary suffix: 4096, 512K, 512M, 4G,
 *             1.5T, 2P (K/M/G/T/P, optional "i" and/or "B": 4GiB, 4GB)
 *   DURATION  a number and a unit: 500ms, 10s, 1.5s, 5m, 2h, 1d
 *   BOOL      true/false, yes/no, on/off, 1/0
 *   ADDR      numeric host:port, [v6]:port, or :port (= 127.0.0.1)
 *   RATIO     a decimal fraction 0 to 1 (0.9, .25 is not accepted: 0.25);
 *             kept in parts per million, bounds (min/max) in ppm too
 * Every parse checks for overflow and the key's bounds.
 */
#ifndef MC_COMMON_CFG_H
#define MC_COMMON_CFG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/cfg_keys.h"
#include "common/err.h"

enum cfg_key {
#define CFG__ENUM(id, ...) CFG_##id,
	CFG_KEYS(CFG__ENUM)
#undef CFG__ENUM
		CFG_NKEYS
};

enum cfg_type {
	CFG_T_STRING,
	CFG_T_PATH,
	CFG_T_BOOL,
	CFG_T_UINT,
	CFG_T_SIZE,
	CFG_T_DURATION,
	CFG_T_ADDR,
	CFG_T_ENUM,
	CFG_T_ROLES,
	CFG_T_LOGLEVEL,
	CFG_T_RATIO,
};

enum cfg_section { CFG_S_COMMON, CFG_S_META, CFG_S_MASTER, CFG_S_AGENT, CFG_NSECTIONS };

enum cfg_source { CFG_SRC_DEFAULT, CFG_SRC_FILE, CFG_SRC_ENV, CFG_SRC_FLAG };

enum cfg_role {
	CFG_ROLE_META = 1u << 0,
	CFG_ROLE_MASTER = 1u << 1,
	CFG_ROLE_AGENT = 1u << 2,
	CFG_ROLE_ALL = CFG_ROLE_META | CFG_ROLE_MASTER | CFG_ROLE_AGENT,
};

struct cfg_keydef {
	const char *name;
	enum cfg_section section;
	enum cfg_type type;
	const char *def;
	uint64_t min, max;
	const char *choices;
	const char *help;
};

extern const struct cfg_keydef cfg_keydefs[CFG_NKEYS];

struct cfg_value {
	char *text;   /* as given (owned) */
	uint64_t num; /* parsed: bytes, ms, integer, bool, role mask */
	enum cfg_source src;
	char origin[256]; /* "file /etc/mooncake/mooncaked.conf:12" */
};

struct cfg {
	struct cfg_value v[CFG_NKEYS];
	char *config_path; /* the file read, or NULL (owned) */
	char *warnings;    /* lines to report, or NULL (owned) */
};

/* What the command line asked for besides keys. */
struct cfg_cmdline {
	bool help, version, print_config, print_man_options;
};

/* Default config file, read when it exists and no --config is given. */
#define CFG_DEFAULT_FILE "/etc/mooncake/mooncaked.conf"

/*
 * Build the effective configuration: defaults, then the file (--config,
 * MOONCAKE_CONFIG, or CFG_DEFAULT_FILE if it exists), then MOONCAKE_*
 * variables from envp, then flags from argv[1..].
 * Mooncake's spellings (cfg_keys.h) are accepted among flags and
 * variables. What is accepted but deserves a word — a MOONCAKE_* variable
 * that names no key, an MC_* variable without a meaning here — is kept as
 * a line in c->warnings (cfg_warnings) for the caller to report.
 * Errors (err holds one line naming the flag/variable/file:line and what
 * is accepted): -EINVAL bad input, -ENOENT/-EACCES/... config file,
 * -ENOMEM. On error *c is freed.
 */
int cfg_load(struct cfg *c, int argc, char *const argv[], char *const envp[],
	     struct cfg_cmdline *cl, char *err, size_t errlen) MC_MUST_CHECK;
void cfg_free(struct cfg *c);
/* The warnings of cfg_load, one per line (each ends with '\n'), or "". */
const char *cfg_warnings(const struct cfg *c);

/* Parse and store one value with its origin. Errors: -EINVAL (err set). */
int cfg_set(struct cfg *c, enum cfg_key k, const char *text, enum cfg_source src,
	    const char *origin, char *err, size_t errlen) MC_MUST_CHECK;

/* Parse an INI buffer (the file's contents) into c. name is used in
 * errors ("name:line: ..."). Errors: -EINVAL (err set), -ENOMEM. */
int cfg_parse_ini(struct cfg *c, const char *name, const char *buf, size_t len, char *err,
		  size_t errlen) MC_MUST_CHECK;

/* Accessors; the key's type must match (checked with assert). */
const char *cfg_str(const struct cfg *c, enum cfg_key k);
uint64_t cfg_u64(const struct cfg *c, enum cfg_key k);
bool cfg_bool(const struct cfg *c, enum cfg_key k);
/* A RATIO key's value, 0.0 to 1.0. */
double cfg_ratio(const struct cfg *c, enum cfg_key k);
unsigned cfg_roles(const struct cfg *c);
/* The meta endpoints the roles above meta use: --meta-endpoints as
 * configured, except that a process running the meta role with
 * --meta-endpoints left at its default uses its own meta (its
 * --listen-client, 0.0.0.0 read as 127.0.0.1). Written into out. */
void cfg_meta_endpoints(const struct cfg *c, char *out, size_t len);

/* Value parsers (also used by mooncakectl). Errors: -EINVAL, -ERANGE. */
int cfg_parse_size(const char *s, uint64_t *bytes) MC_MUST_CHECK;
int cfg_parse_duration_ms(const char *s, uint64_t *ms) MC_MUST_CHECK;
int cfg_parse_bool(const char *s, bool *b) MC_MUST_CHECK;
int cfg_parse_roles(const char *s, unsigned *mask) MC_MUST_CHECK;
/* "0.9" -> 900000 parts per million; at most 1. Errors: -EINVAL,
 * -ERANGE (above 1). */
int cfg_parse_ratio_ppm(const char *s, uint64_t *ppm) MC_MUST_CHECK;

/* Output, all generated from the key table. */
void cfg_print_help(FILE *f, const char *prog);
void cfg_print_effective(FILE *f, const struct cfg *c);
void cfg_print_man_options(FILE *f);

const char *cfg_section_name(enum cfg_section s);

#endif
