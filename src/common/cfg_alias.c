/*
 * cfg_alias: Mooncake's spellings of mooncaked's keys (cfg_keys.h), so a
 * deployment of Mooncake's mooncake_master and mooncake_client keeps its
 * flags and MC_* variables.
 *
 * A spelling that maps one to one onto a key is converted into the key's
 * syntax (a port into the key's host:port, milliseconds into a duration,
 * etcd://HOST:PORT into an endpoint list) and set with the origin naming
 * the spelling, below the key's own flag or variable in precedence. A
 * flag that has no meaning here is refused with its reason; an MC_*
 * variable without one is ignored with a warning line, because the node's
 * inference processes may share the environment.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cfg_int.h"
#include "common/util.h"

const struct cfg__alias cfg__env_aliases[] = {
#define CFG__ALIAS(id, var, conv) {var, CFG_##id, CFG__CONV_##conv},
	CFG_ENV_ALIASES(CFG__ALIAS)
#undef CFG__ALIAS
};
const size_t cfg__nenv_aliases = MC_ARRAY_LEN(cfg__env_aliases);

const struct cfg__alias cfg__flag_aliases[] = {
#define CFG__ALIAS(name, id, conv) {name, CFG_##id, CFG__CONV_##conv},
	CFG_MOONCAKE_FLAGS(CFG__ALIAS)
#undef CFG__ALIAS
};
const size_t cfg__nflag_aliases = MC_ARRAY_LEN(cfg__flag_aliases);

const char *const cfg__flags_refused[][2] = {
#define CFG__REFUSED(name, why) {name, why},
	CFG_MOONCAKE_FLAGS_REFUSED(CFG__REFUSED)
#undef CFG__REFUSED
};
const size_t cfg__nflags_refused = MC_ARRAY_LEN(cfg__flags_refused);

const char *const cfg__env_ignored[][2] = {
#define CFG__IGNORED(name, why) {name, why},
	CFG_MOONCAKE_ENV_IGNORED(CFG__IGNORED)
#undef CFG__IGNORED
};
const size_t cfg__nenv_ignored = MC_ARRAY_LEN(cfg__env_ignored);

static const char *const client_env[] = {
#define CFG__CLIENT(name) name,
	CFG_CLIENT_ENV(CFG__CLIENT)
#undef CFG__CLIENT
};

/* What a conversion does, for --help and the man page. */
const char *cfg__conv_text(enum cfg__conv c)
{
	switch (c) {
	case CFG__CONV_SIZE:
		return "a size, spaces dropped";
	case CFG__CONV_PORT:
		return "its port";
	case CFG__CONV_HOST:
		return "its host";
	case CFG__CONV_MS:
		return "milliseconds";
	case CFG__CONV_SECONDS:
		return "seconds";
	case CFG__CONV_ENDPOINTS:
		return "a list separated by ';' or ','";
	case CFG__CONV_METADATA:
		return "P2PHANDSHAKE: no meta; etcd://HOST:PORT[;...]: "
		       "those endpoints";
	case CFG__CONV_HA:
		return "false: no meta; true: meta must be set";
	case CFG__CONV_FORCE_TCP:
		return "set: tcp";
	default:
		return NULL;
	}
}

/* The other environment name of key k (CFG_ENV_ALIASES), or NULL. */
const struct cfg__alias *cfg__env_alias(int k)
{
	for (size_t i = 0; i < MC_ARRAY_LEN(cfg__env_aliases); i++)
		if (cfg__env_aliases[i].key == k)
			return &cfg__env_aliases[i];
	return NULL;
}

static const struct cfg__alias *find_flag_alias(const char *name, size_t len)
{
	for (size_t i = 0; i < MC_ARRAY_LEN(cfg__flag_aliases); i++)
		if (strlen(cfg__flag_aliases[i].name) == len &&
		    strncmp(cfg__flag_aliases[i].name, name, len) == 0)
			return &cfg__flag_aliases[i];
	return NULL;
}

static const char *find_refused(const char *const tab[][2], size_t n, const char *name,
				size_t len)
{
	for (size_t i = 0; i < n; i++)
		if (strlen(tab[i][0]) == len && strncmp(tab[i][0], name, len) == 0)
			return tab[i][1];
	return NULL;
}

const struct cfg__alias *cfg__flag_alias(const char *name, size_t len, const char **value)
{
	const struct cfg__alias *a = find_flag_alias(name, len);
	if (a) {
		if (!*value && cfg__alias_is_switch(a))
			*value = "true";
		return a;
	}
	/* gflags' --noNAME for a boolean */
	if (*value || len <= 2 || strncmp(name, "no", 2) != 0)
		return NULL;
	a = find_flag_alias(name + 2, len - 2);
	if (!a || !cfg__alias_is_switch(a))
		return NULL;
	*value = "false";
	return a;
}

bool cfg__alias_is_switch(const struct cfg__alias *a)
{
	return a->conv == CFG__CONV_HA;
}

const char *cfg__flag_refused(const char *name, size_t len)
{
	return find_refused(cfg__flags_refused, MC_ARRAY_LEN(cfg__flags_refused), name, len);
}

/* The host:port value of an ADDR key split at its last colon. */
static void split_hostport(const char *v, char *host, size_t hlen, const char **port)
{
	const char *colon = strrchr(v, ':');
	size_t n = colon ? (size_t)(colon - v) : strlen(v);
	if (n >= hlen)
		n = hlen - 1;
	memcpy(host, v, n);
	host[n] = '\0';
	*port = colon ? colon + 1 : "";
}

/* A list separated by ';' or ',' (spaces dropped) as a comma list,
 * without the scheme prefix when strip_scheme names one. */
static int up_list(const char *in, const char *strip_scheme, char *out, size_t outlen)
{
	size_t n = 0;
	const char *p = in;
	while (*p) {
		while (*p == ' ' || *p == ';' || *p == ',')
			p++;
		if (!*p)
			break;
		size_t len = strcspn(p, ";, ");
		const char *item = p;
		if (strip_scheme && strncmp(item, strip_scheme, strlen(strip_scheme)) == 0) {
			item += strlen(strip_scheme);
			len -= strlen(strip_scheme);
		}
		if (n + len + 2 > outlen)
			return -ERANGE;
		if (n)
			out[n++] = ',';
		memcpy(out + n, item, len);
		n += len;
		p += (size_t)(item - p) + len;
	}
	out[n] = '\0';
	return 0;
}

/*
 * Convert a Mooncake-spelled value for key a->key into mooncaked's syntax,
 * given the key's value at this point of the loading (PORT and HOST keep
 * the other half). Errors: -EINVAL with err set.
 */
static int up_convert(const struct cfg__alias *a, const struct cfg *c, const char *in,
		      char *out, size_t outlen, char *err, size_t errlen)
{
	uint64_t v;
	bool b;
	char host[256];
	const char *port;
	switch (a->conv) {
	case CFG__CONV_SAME:
		snprintf(out, outlen, "%s", in);
		return 0;
	case CFG__CONV_SIZE: {
		size_t n = 0;
		for (const char *p = in; *p && n + 1 < outlen; p++)
			if (*p != ' ')
				out[n++] = *p;
		out[n] = '\0';
		return 0;
	}
	case CFG__CONV_PORT:
		if (cfg__parse_uint(in, &v) != 0 || v == 0 || v > 65535) {
			snprintf(err, errlen, "'%s' is not a port (1 to 65535)", in);
			return -EINVAL;
		}
		split_hostport(c->v[a->key].text, host, sizeof(host), &port);
		snprintf(out, outlen, "%s:%llu", host, (unsigned long long)v);
		return 0;
	case CFG__CONV_HOST:
		if (!*in) {
			snprintf(err, errlen, "an address is needed");
			return -EINVAL;
		}
		split_hostport(c->v[a->key].text, host, sizeof(host), &port);
		if (strchr(in, ':') && in[0] != '[')
			snprintf(out, outlen, "[%s]:%s", in, port);
		else
			snprintf(out, outlen, "%s:%s", in, port);
		return 0;
	case CFG__CONV_MS:
	case CFG__CONV_SECONDS:
		if (cfg__parse_uint(in, &v) != 0) {
			snprintf(err, errlen, "'%s' is not a whole number of %s", in,
				 a->conv == CFG__CONV_MS ? "milliseconds" : "seconds");
			return -EINVAL;
		}
		snprintf(out, outlen, "%llu%s", (unsigned long long)v,
			 a->conv == CFG__CONV_MS ? "ms" : "s");
		return 0;
	case CFG__CONV_ENDPOINTS:
		if (up_list(in, NULL, out, outlen) != 0 || !*out) {
			snprintf(err, errlen, "'%s' is not a list of host:port", in);
			return -EINVAL;
		}
		return 0;
	case CFG__CONV_METADATA:
		if (strcmp(in, "P2PHANDSHAKE") == 0) {
			out[0] = '\0';
			return 0;
		}
		if (strncmp(in, "etcd://", 7) == 0 &&
		    up_list(in, "etcd://", out, outlen) == 0 && *out)
			return 0;
		snprintf(err, errlen,
			 "'%s': mooncaked's metadata is the etcd v3 API: P2PHANDSHAKE or "
			 "etcd://HOST:PORT (Mooncake's HTTP and Redis metadata servers "
			 "are not supported)",
			 in);
		return -EINVAL;
	case CFG__CONV_HA:
		if (cfg_parse_bool(in, &b) != 0) {
			snprintf(err, errlen, "'%s' is not true or false", in);
			return -EINVAL;
		}
		snprintf(out, outlen, "%s", b ? c->v[a->key].text : "");
		return 0;
	case CFG__CONV_FORCE_TCP:
		snprintf(out, outlen, "tcp");
		return 0;
	}
	return -EINVAL;
}

/* Whether env entry e (NAME=VALUE) names variable n. */
static bool env_is(const char *e, const char *n)
{
	size_t len = strlen(n);
	return strncmp(e, n, len) == 0 && e[len] == '=';
}

/* MOONCAKE_* variables that name no key and MC_* variables mooncaked
 * does not map: one warning line each. */
void cfg__check_env_names(struct cfg *c, char *const envp[])
{
	for (size_t i = 0; envp && envp[i]; i++) {
		const char *e = envp[i];
		size_t nlen = strcspn(e, "=");
		if (strncmp(e, "MOONCAKE_", 9) == 0) {
			bool known = false;
			for (int k = 0; k < CFG_NKEYS && !known; k++) {
				char name[128];
				cfg__env_name(cfg_keydefs[k].name, name, sizeof(name));
				known = env_is(e, name);
			}
			for (size_t j = 0; j < MC_ARRAY_LEN(client_env) && !known; j++)
				known = env_is(e, client_env[j]);
			if (!known)
				cfg__warn_add(c,
					      "environment variable %.*s names no key (see "
					      "mooncaked --help): ignored",
					      (int)nlen, e);
		} else if (strncmp(e, "MC_", 3) == 0) {
			bool mapped = false;
			for (size_t j = 0; j < MC_ARRAY_LEN(cfg__env_aliases) && !mapped; j++)
				mapped = env_is(e, cfg__env_aliases[j].name);
			if (mapped)
				continue;
			const char *why = find_refused(
				cfg__env_ignored, MC_ARRAY_LEN(cfg__env_ignored), e, nlen);
			if (why)
				cfg__warn_add(
					c,
					"environment variable %.*s is Mooncake's and has "
					"no meaning in mooncaked (%s): ignored",
					(int)nlen, e, why);
			else
				cfg__warn_add(
					c,
					"environment variable %.*s is not one of Mooncake's "
					"variables mooncaked maps (see mooncaked --help): "
					"ignored",
					(int)nlen, e);
		}
	}
}

int cfg__alias_apply(struct cfg *c, const struct cfg__alias *a, const char *value,
		     enum cfg_source src, const char *origin, char *err, size_t errlen)
{
	char conv[1024], verr[512];
	int rc = up_convert(a, c, value, conv, sizeof(conv), verr, sizeof(verr));
	if (rc == 0)
		rc = cfg_set(c, (enum cfg_key)a->key, conv, src, origin, verr, sizeof(verr));
	if (rc) {
		snprintf(err, errlen, "%s%s: %s (Mooncake's spelling of --%s)",
			 src == CFG_SRC_FLAG ? "--" : "", a->name, verr,
			 cfg_keydefs[a->key].name);
		return rc;
	}
	return 0;
}

int cfg__env_alias_apply(struct cfg *c, const struct cfg__alias *a, const char *value,
			 char *err, size_t errlen)
{
	bool off = false;
	if (a->conv == CFG__CONV_FORCE_TCP && *value && cfg_parse_bool(value, &off) == 0 &&
	    !off) {
		cfg__warn_add(c,
			      "environment variable %s=%s: Mooncake forces TCP whenever "
			      "it is set; mooncaked only when it is empty or true: "
			      "ignored",
			      a->name, value);
		return 0;
	}
	char origin[160];
	snprintf(origin, sizeof(origin), "env %s", a->name);
	return cfg__alias_apply(c, a, value, CFG_SRC_ENV, origin, err, errlen);
}

int cfg__check_ha(const struct cfg *c, int ha, char *err, size_t errlen)
{
	if (ha < 0 || (ha == 1) == (*cfg_str(c, CFG_META_ENDPOINTS) != '\0'))
		return 0;
	snprintf(err, errlen,
		 ha ? "--enable_ha: high availability needs meta: give "
		      "--etcd_endpoints or --meta-endpoints"
		    : "--enable_ha=false but meta endpoints are given (%s): "
		      "drop one of them",
		 cfg_str(c, CFG_META_ENDPOINTS));
	return -EINVAL;
}
