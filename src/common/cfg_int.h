/*
 * cfg_int: what the configuration's files share and nobody else may use.
 *
 *   cfg.c        the key table and its values: names, parsing and bounds,
 *                cfg_set, the accessors, the warnings a load collects
 *   cfg_load.c   cfg_load: defaults, then the command line, the INI file
 *                and the environment, in their order of precedence
 *   cfg_alias.c  Mooncake's spellings: its flags and MC_* variables mapped
 *                onto keys, the ones refused or ignored, and why
 *   cfg_print.c  --help, --print-config and the man page's OPTIONS, all
 *                generated from the key table and the spellings
 *
 * The dependencies run one way: cfg_load and cfg_print use cfg_alias,
 * all three use cfg.c.
 */
#ifndef MC_COMMON_CFG_INT_H
#define MC_COMMON_CFG_INT_H

#include "common/cfg.h"

/* ------------------------------------------------------------ cfg.c */

/* The key named name[0..len), or -1. */
int cfg__find_key(const char *name, size_t len);
/* What values key d accepts, for messages ("a size such as ..."); buf
 * holds the text when it is built. */
const char *cfg__accepted(const struct cfg_keydef *d, char *buf, size_t len);
/* A whole decimal number. Errors: -EINVAL, -ERANGE. */
int cfg__parse_uint(const char *s, uint64_t *out) MC_MUST_CHECK;
/* The environment variable of key: MOONCAKE_ and the key upper-cased,
 * dashes as underscores. */
void cfg__env_name(const char *key, char *buf, size_t len);
/* Append one line to c->warnings (a line lost to out of memory is all
 * that can go wrong). */
void cfg__warn_add(struct cfg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------ cfg_alias.c */

/* How a Mooncake-spelled value becomes a value of its key. */
enum cfg__conv {
	CFG__CONV_SAME,
	CFG__CONV_SIZE,
	CFG__CONV_PORT,
	CFG__CONV_HOST,
	CFG__CONV_MS,
	CFG__CONV_SECONDS,
	CFG__CONV_ENDPOINTS,
	CFG__CONV_METADATA,
	CFG__CONV_HA,
	CFG__CONV_FORCE_TCP,
};

struct cfg__alias {
	const char *name; /* variable or flag spelling */
	int key;
	enum cfg__conv conv;
};

/* The tables of cfg_keys.h, for --help and the man page. */
extern const struct cfg__alias cfg__flag_aliases[];
extern const size_t cfg__nflag_aliases;
extern const struct cfg__alias cfg__env_aliases[];
extern const size_t cfg__nenv_aliases;
/* {name, why} pairs. */
extern const char *const cfg__flags_refused[][2];
extern const size_t cfg__nflags_refused;
extern const char *const cfg__env_ignored[][2];
extern const size_t cfg__nenv_ignored;

/* What a conversion does, for --help and the man page; NULL for none. */
const char *cfg__conv_text(enum cfg__conv c);
/* Mooncake's environment variable for key k, or NULL. */
const struct cfg__alias *cfg__env_alias(int k);
/* The Mooncake flag named name[0..len), or NULL. A switch (--enable_ha)
 * also matches as --noNAME; for a switch given without a value, *value
 * becomes "true" ("false" for --noNAME). */
const struct cfg__alias *cfg__flag_alias(const char *name, size_t len, const char **value);
/* Whether a is a switch: --enable_ha, whose value cfg__check_ha checks
 * against the meta endpoints once everything is loaded. */
bool cfg__alias_is_switch(const struct cfg__alias *a);
/* Why Mooncake's flag name[0..len) is refused, or NULL. */
const char *cfg__flag_refused(const char *name, size_t len);
/* Convert value and set a's key with it. Errors: -EINVAL, -ENOMEM (err
 * names the spelling and the key it sets). */
int cfg__alias_apply(struct cfg *c, const struct cfg__alias *a, const char *value,
		     enum cfg_source src, const char *origin, char *err,
		     size_t errlen) MC_MUST_CHECK;
/* Apply a's variable, set to value in the environment; a value that
 * Mooncake and mooncaked read differently is ignored with a warning.
 * Errors: as cfg__alias_apply. */
int cfg__env_alias_apply(struct cfg *c, const struct cfg__alias *a, const char *value,
			 char *err, size_t errlen) MC_MUST_CHECK;
/* One warning line for each MOONCAKE_* variable that names no key and
 * each MC_* variable mooncaked does not map. */
void cfg__check_env_names(struct cfg *c, char *const envp[]);
/* ha: the last --enable_ha given (-1: none, 0 false, 1 true). Errors:
 * -EINVAL when it contradicts the meta endpoints (err set). */
int cfg__check_ha(const struct cfg *c, int ha, char *err, size_t errlen) MC_MUST_CHECK;

#endif
