/*
 * cfg: parsing and printing of the configuration key table. See cfg.h.
 *
 * Order of application: defaults, file, environment, flags; each later
 * source overwrites the earlier one, so the last writer is the effective
 * value and its origin is what --print-config shows. The INI parser is a
 * small one of our own so that every error names file:line.
 */
#include "common/cfg.h"

#include <assert.h>
#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/io.h"
#include "common/log.h"
#include "common/util.h"

const struct cfg_keydef cfg_keydefs[CFG_NKEYS] = {
#define CFG__DEF(id, name, sec, type, def, lo, hi, choices, help)              \
	[CFG_##id] = {name, CFG_S_##sec, CFG_T_##type, def, lo, hi, choices,   \
		      help},
	CFG_KEYS(CFG__DEF)
#undef CFG__DEF
};

static const char *const section_names[CFG_NSECTIONS] = {"common", "meta",
							  "master", "agent"};

const char *cfg_section_name(enum cfg_section s)
{
	return (unsigned)s < CFG_NSECTIONS ? section_names[s] : "?";
}

/* ------------------------------------------------------------ values */

/* Parse "123", "1.5" into an integer part and a fraction numerator over
 * 10^fdigits. Advances *sp past the number. */
static int parse_decimal(const char **sp, uint64_t *ip, uint64_t *fnum,
			 uint64_t *fden)
{
	const char *s = *sp;
	uint64_t i = 0, fn = 0, fd = 1;
	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	while (isdigit((unsigned char)*s)) {
		uint64_t digit = (uint64_t)(*s++ - '0');
		if (i > (UINT64_MAX - digit) / 10)
			return -ERANGE;
		i = i * 10 + digit;
	}
	if (*s == '.') {
		s++;
		if (!isdigit((unsigned char)*s))
			return -EINVAL;
		while (isdigit((unsigned char)*s)) {
			if (fd < 1000000000000ull) { /* 12 digits are plenty */
				fn = fn * 10 + (uint64_t)(*s - '0');
				fd *= 10;
			}
			s++;
		}
	}
	*sp = s;
	*ip = i;
	*fnum = fn;
	*fden = fd;
	return 0;
}

/* value = (i + fn/fd) * mult, exact when whole; -ERANGE on overflow. */
static int scale(uint64_t i, uint64_t fn, uint64_t fd, uint64_t mult,
		 uint64_t *out)
{
	unsigned __int128 v = (unsigned __int128)i * mult;
	v += (unsigned __int128)fn * mult / fd;
	if (v > UINT64_MAX)
		return -ERANGE;
	*out = (uint64_t)v;
	return 0;
}

int cfg_parse_size(const char *s, uint64_t *bytes)
{
	uint64_t i, fn, fd, mult = 1;
	if (!s)
		return -EINVAL;
	int rc = parse_decimal(&s, &i, &fn, &fd);
	if (rc)
		return rc;
	switch (toupper((unsigned char)*s)) {
	case 'K': mult = 1ull << 10; s++; break;
	case 'M': mult = 1ull << 20; s++; break;
	case 'G': mult = 1ull << 30; s++; break;
	case 'T': mult = 1ull << 40; s++; break;
	case 'P': mult = 1ull << 50; s++; break;
	default: break;
	}
	if (mult > 1 && *s == 'i')
		s++;
	if (toupper((unsigned char)*s) == 'B')
		s++;
	if (*s != '\0')
		return -EINVAL;
	if (mult == 1 && fn != 0)
		return -EINVAL; /* "1.5" bytes */
	return scale(i, fn, fd, mult, bytes);
}

int cfg_parse_duration_ms(const char *s, uint64_t *ms)
{
	uint64_t i, fn, fd, mult;
	if (!s)
		return -EINVAL;
	int rc = parse_decimal(&s, &i, &fn, &fd);
	if (rc)
		return rc;
	if (strcmp(s, "ms") == 0)
		mult = 1;
	else if (strcmp(s, "s") == 0)
		mult = 1000;
	else if (strcmp(s, "m") == 0 || strcmp(s, "min") == 0)
		mult = 60000;
	else if (strcmp(s, "h") == 0)
		mult = 3600000;
	else if (strcmp(s, "d") == 0)
		mult = 86400000;
	else
		return -EINVAL;
	return scale(i, fn, fd, mult, ms);
}

int cfg_parse_bool(const char *s, bool *b)
{
	static const char *const yes[] = {"true", "yes", "on", "1"};
	static const char *const no[] = {"false", "no", "off", "0"};
	for (size_t i = 0; i < MC_ARRAY_LEN(yes); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*b = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*b = false;
			return 0;
		}
	}
	return -EINVAL;
}

int cfg_parse_roles(const char *s, unsigned *mask)
{
	unsigned m = 0;
	const char *p = s;
	if (!*p)
		return -EINVAL;
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == 6 && strncmp(p, "master", 6) == 0)
			m |= CFG_ROLE_MASTER;
		else if (len == 4 && strncmp(p, "meta", 4) == 0)
			m |= CFG_ROLE_META;
		else if (len == 5 && strncmp(p, "agent", 5) == 0)
			m |= CFG_ROLE_AGENT;
		else if (len == 10 && strncmp(p, "standalone", 10) == 0)
			m |= CFG_ROLE_ALL;
		else
			return -EINVAL;
		if (!end)
			break;
		p = end + 1;
	}
	*mask = m;
	return 0;
}

int cfg_parse_ratio_ppm(const char *s, uint64_t *ppm)
{
	uint64_t i, fn, fd, v;
	if (!s)
		return -EINVAL;
	int rc = parse_decimal(&s, &i, &fn, &fd);
	if (rc)
		return rc;
	if (*s != '\0')
		return -EINVAL;
	if (i > 1)
		return -ERANGE;
	rc = scale(i, fn, fd, 1000000, &v);
	if (rc)
		return rc;
	if (v > 1000000)
		return -ERANGE;
	*ppm = v;
	return 0;
}

static int parse_uint(const char *s, uint64_t *out)
{
	uint64_t i, fn, fd;
	int rc = parse_decimal(&s, &i, &fn, &fd);
	if (rc)
		return rc;
	if (*s != '\0' || fd != 1)
		return -EINVAL;
	*out = i;
	return 0;
}

static bool enum_has(const char *choices, const char *s)
{
	size_t n = strlen(s);
	const char *p = choices;
	while (*p) {
		const char *end = strchr(p, '|');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && strncmp(p, s, n) == 0)
			return true;
		p += len + (end ? 1 : 0);
	}
	return false;
}

static const char *accepted(const struct cfg_keydef *d, char *buf, size_t len)
{
	switch (d->type) {
	case CFG_T_SIZE:
		return "a size such as 4096, 512K, 512M, 4G or 1.5T";
	case CFG_T_DURATION:
		return "a duration such as 500ms, 10s, 5m or 2h";
	case CFG_T_BOOL:
		return "true or false";
	case CFG_T_UINT:
		return "a non-negative integer";
	case CFG_T_ADDR:
		return "a numeric host:port such as 127.0.0.1:2379, [::1]:2379 or :2379";
	case CFG_T_ROLES:
		return "meta, master, agent or standalone, or a comma list of them";
	case CFG_T_ENUM:
		snprintf(buf, len, "one of %s", d->choices);
		return buf;
	case CFG_T_LOGLEVEL:
		return "a level (error, warn, info, debug, trace), optionally "
		       "with name=level pairs: info,raft=debug";
	case CFG_T_PATH:
		return "a path";
	case CFG_T_RATIO:
		return "a ratio between 0 and 1 such as 0.9";
	default:
		return "a string";
	}
}

/* Format a bound in the key's unit for messages. */
static void format_num(const struct cfg_keydef *d, uint64_t v, char *buf,
		       size_t len)
{
	static const char sfx[] = "KMGTP";
	if (d->type == CFG_T_SIZE) {
		int i = -1;
		while (i < 4 && v >= 1024 && v % 1024 == 0) {
			v /= 1024;
			i++;
		}
		if (i >= 0)
			snprintf(buf, len, "%llu%c", (unsigned long long)v, sfx[i]);
		else
			snprintf(buf, len, "%llu", (unsigned long long)v);
	} else if (d->type == CFG_T_DURATION) {
		static const struct { uint64_t ms; const char *unit; } units[] = {
			{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}};
		for (size_t i = 0; i < MC_ARRAY_LEN(units); i++) {
			if (v && v % units[i].ms == 0) {
				snprintf(buf, len, "%llu%s",
					 (unsigned long long)(v / units[i].ms),
					 units[i].unit);
				return;
			}
		}
		snprintf(buf, len, "%llu%s", (unsigned long long)v,
			 v ? "ms" : "s");
	} else if (d->type == CFG_T_RATIO) {
		snprintf(buf, len, "%g", (double)v / 1e6);
	} else {
		snprintf(buf, len, "%llu", (unsigned long long)v);
	}
}

/* Parse text for key d into *num. Errors: -EINVAL with err set. */
static int parse_value(const struct cfg_keydef *d, const char *text,
		       uint64_t *num, char *err, size_t errlen)
{
	char ebuf[256], acc[128];
	int rc = 0;
	*num = 0;
	switch (d->type) {
	case CFG_T_STRING:
	case CFG_T_PATH:
		return 0;
	case CFG_T_BOOL: {
		bool b = false;
		rc = cfg_parse_bool(text, &b);
		*num = b;
		break;
	}
	case CFG_T_UINT:
		rc = parse_uint(text, num);
		break;
	case CFG_T_SIZE:
		rc = cfg_parse_size(text, num);
		break;
	case CFG_T_DURATION:
		rc = cfg_parse_duration_ms(text, num);
		break;
	case CFG_T_RATIO:
		rc = cfg_parse_ratio_ppm(text, num);
		if (rc == -ERANGE)
			rc = -EINVAL; /* "is not a ratio between 0 and 1" */
		break;
	case CFG_T_ADDR: {
		struct sockaddr_storage ss;
		rc = mc_parse_hostport(text, &ss);
		break;
	}
	case CFG_T_ENUM:
		rc = enum_has(d->choices, text) ? 0 : -EINVAL;
		break;
	case CFG_T_ROLES: {
		unsigned m = 0;
		rc = cfg_parse_roles(text, &m);
		*num = m;
		break;
	}
	case CFG_T_LOGLEVEL: {
		unsigned char lv[LOGS_COUNT];
		if (log_parse_levels(text, lv, ebuf, sizeof(ebuf)) != 0) {
			snprintf(err, errlen, "'%s': %s", text, ebuf);
			return -EINVAL;
		}
		return 0;
	}
	}
	if (rc == -ERANGE) {
		snprintf(err, errlen, "'%s' is too large", text);
		return -EINVAL;
	}
	if (rc) {
		snprintf(err, errlen, "'%s' is not %s", text,
			 accepted(d, acc, sizeof(acc)));
		return -EINVAL;
	}
	if ((d->type == CFG_T_UINT || d->type == CFG_T_SIZE ||
	     d->type == CFG_T_DURATION || d->type == CFG_T_RATIO) &&
	    (d->min || d->max) && (*num < d->min || *num > d->max)) {
		char lo[32], hi[32];
		format_num(d, d->min, lo, sizeof(lo));
		format_num(d, d->max, hi, sizeof(hi));
		snprintf(err, errlen, "'%s' is out of range (%s to %s)", text, lo,
			 hi);
		return -EINVAL;
	}
	return 0;
}

int cfg_set(struct cfg *c, enum cfg_key k, const char *text,
	    enum cfg_source src, const char *origin, char *err, size_t errlen)
{
	const struct cfg_keydef *d = &cfg_keydefs[k];
	uint64_t num;
	int rc = parse_value(d, text, &num, err, errlen);
	if (rc)
		return rc;
	char *copy = strdup(text);
	if (!copy) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	free(c->v[k].text);
	c->v[k].text = copy;
	c->v[k].num = num;
	c->v[k].src = src;
	snprintf(c->v[k].origin, sizeof(c->v[k].origin), "%s", origin);
	return 0;
}

static int find_key(const char *name, size_t len)
{
	for (int k = 0; k < CFG_NKEYS; k++)
		if (strlen(cfg_keydefs[k].name) == len &&
		    strncmp(cfg_keydefs[k].name, name, len) == 0)
			return k;
	return -1;
}

/* ------------------------------------------------------------ INI file */

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

int cfg_parse_ini(struct cfg *c, const char *name, const char *buf, size_t len,
		  char *err, size_t errlen)
{
	int section = -1;
	unsigned lineno = 0;
	bool seen[CFG_NKEYS] = {false};
	size_t pos = 0;
	char line[4096];

	while (pos < len) {
		size_t start = pos;
		while (pos < len && buf[pos] != '\n')
			pos++;
		size_t llen = pos - start;
		if (pos < len)
			pos++; /* the newline */
		lineno++;
		if (llen >= sizeof(line)) {
			snprintf(err, errlen, "%s:%u: line longer than %zu bytes",
				 name, lineno, sizeof(line) - 1);
			return -EINVAL;
		}
		if (memchr(buf + start, '\0', llen)) {
			snprintf(err, errlen, "%s:%u: NUL byte in line", name,
				 lineno);
			return -EINVAL;
		}
		memcpy(line, buf + start, llen);
		line[llen] = '\0';
		char *s = trim(line);
		if (*s == '\0' || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			char *end = strchr(s, ']');
			if (!end || *trim(end + 1) != '\0') {
				snprintf(err, errlen,
					 "%s:%u: malformed section header", name,
					 lineno);
				return -EINVAL;
			}
			*end = '\0';
			char *sec = trim(s + 1);
			section = -1;
			for (int i = 0; i < CFG_NSECTIONS; i++)
				if (strcmp(sec, section_names[i]) == 0)
					section = i;
			if (section < 0) {
				snprintf(err, errlen,
					 "%s:%u: unknown section [%s] (use [common], "
					 "[meta], [master] or [agent])",
					 name, lineno, sec);
				return -EINVAL;
			}
			continue;
		}
		char *eq = strchr(s, '=');
		if (!eq) {
			snprintf(err, errlen,
				 "%s:%u: expected 'key = value' or '[section]'",
				 name, lineno);
			return -EINVAL;
		}
		*eq = '\0';
		char *key = trim(s), *val = trim(eq + 1);
		/* Strip one pair of double quotes around the value. */
		size_t vlen = strlen(val);
		if (vlen >= 2 && val[0] == '"' && val[vlen - 1] == '"') {
			val[vlen - 1] = '\0';
			val++;
		}
		int k = find_key(key, strlen(key));
		if (k < 0) {
			snprintf(err, errlen, "%s:%u: unknown key '%s'", name,
				 lineno, key);
			return -EINVAL;
		}
		if (section < 0) {
			snprintf(err, errlen,
				 "%s:%u: key '%s' outside a section (it belongs in "
				 "[%s])",
				 name, lineno, key,
				 section_names[cfg_keydefs[k].section]);
			return -EINVAL;
		}
		if ((int)cfg_keydefs[k].section != section) {
			snprintf(err, errlen,
				 "%s:%u: key '%s' belongs in [%s], not [%s]", name,
				 lineno, key, section_names[cfg_keydefs[k].section],
				 section_names[section]);
			return -EINVAL;
		}
		if (seen[k]) {
			snprintf(err, errlen, "%s:%u: key '%s' set twice", name,
				 lineno, key);
			return -EINVAL;
		}
		seen[k] = true;
		char origin[256], verr[512];
		snprintf(origin, sizeof(origin), "file %s:%u", name, lineno);
		int rc = cfg_set(c, (enum cfg_key)k, val, CFG_SRC_FILE, origin,
				 verr, sizeof(verr));
		if (rc) {
			snprintf(err, errlen, "%s:%u: %s: %s", name, lineno, key,
				 verr);
			return rc;
		}
	}
	return 0;
}

static int load_file(struct cfg *c, const char *path, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		snprintf(err, errlen, "--config: cannot open '%s': %s", path,
			 strerror(e));
		return -e;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_size > (16 << 20)) {
		snprintf(err, errlen,
			 "--config: '%s' is not a regular file of at most 16 MiB",
			 path);
		close(fd);
		return -EINVAL;
	}
	size_t len = (size_t)st.st_size;
	char *buf = malloc(len + 1);
	if (!buf) {
		close(fd);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	int rc = mc_read_full(fd, buf, len);
	if (rc) {
		snprintf(err, errlen, "--config: reading '%s': %s", path, strerror(-rc));
		free(buf);
		close(fd);
		return rc;
	}
	close(fd);
	buf[len] = '\0';
	rc = cfg_parse_ini(c, path, buf, len, err, errlen);
	free(buf);
	if (rc == 0) {
		c->config_path = strdup(path);
		if (!c->config_path) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	}
	return rc;
}

/* ------------------------------------------------------------ loading */

static void env_name(const char *key, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "MOONCAKE_");
	for (const char *p = key; *p && n + 1 < len; p++)
		buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
	buf[n] = '\0';
}

/* ------------------------------------------------------------ Mooncake's spellings */

enum up_conv {
	UP_SAME,
	UP_SIZE,
	UP_PORT,
	UP_HOST,
	UP_MS,
	UP_SECONDS,
	UP_ENDPOINTS,
	UP_METADATA,
	UP_HA,
	UP_FORCE_TCP,
};

struct up_alias {
	const char *name; /* variable or flag spelling */
	int key;
	enum up_conv conv;
};

static const struct up_alias env_aliases[] = {
#define CFG__ALIAS(id, var, conv) {var, CFG_##id, UP_##conv},
	CFG_ENV_ALIASES(CFG__ALIAS)
#undef CFG__ALIAS
};

static const struct up_alias flag_aliases[] = {
#define CFG__ALIAS(name, id, conv) {name, CFG_##id, UP_##conv},
	CFG_MOONCAKE_FLAGS(CFG__ALIAS)
#undef CFG__ALIAS
};

static const char *const flags_refused[][2] = {
#define CFG__REFUSED(name, why) {name, why},
	CFG_MOONCAKE_FLAGS_REFUSED(CFG__REFUSED)
#undef CFG__REFUSED
};

static const char *const env_ignored[][2] = {
#define CFG__IGNORED(name, why) {name, why},
	CFG_MOONCAKE_ENV_IGNORED(CFG__IGNORED)
#undef CFG__IGNORED
};

static const char *const client_env[] = {
#define CFG__CLIENT(name) name,
	CFG_CLIENT_ENV(CFG__CLIENT)
#undef CFG__CLIENT
};

/* What a conversion does, for --help and the man page. */
static const char *up_conv_text(enum up_conv c)
{
	switch (c) {
	case UP_SIZE: return "a size, spaces dropped";
	case UP_PORT: return "its port";
	case UP_HOST: return "its host";
	case UP_MS: return "milliseconds";
	case UP_SECONDS: return "seconds";
	case UP_ENDPOINTS: return "a list separated by ';' or ','";
	case UP_METADATA: return "P2PHANDSHAKE: no meta; etcd://HOST:PORT[;...]: "
				 "those endpoints";
	case UP_HA: return "false: no meta; true: meta must be set";
	case UP_FORCE_TCP: return "set: tcp";
	default: return NULL;
	}
}

/* The other environment name of key k (CFG_ENV_ALIASES), or NULL. */
static const struct up_alias *env_alias(int k)
{
	for (size_t i = 0; i < MC_ARRAY_LEN(env_aliases); i++)
		if (env_aliases[i].key == k)
			return &env_aliases[i];
	return NULL;
}

static const struct up_alias *find_flag_alias(const char *name, size_t len)
{
	for (size_t i = 0; i < MC_ARRAY_LEN(flag_aliases); i++)
		if (strlen(flag_aliases[i].name) == len &&
		    strncmp(flag_aliases[i].name, name, len) == 0)
			return &flag_aliases[i];
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

static int parse_uint(const char *s, uint64_t *out);

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
static int up_convert(const struct up_alias *a, const struct cfg *c, const char *in,
		      char *out, size_t outlen, char *err, size_t errlen)
{
	uint64_t v;
	bool b;
	char host[256];
	const char *port;
	switch (a->conv) {
	case UP_SAME:
		snprintf(out, outlen, "%s", in);
		return 0;
	case UP_SIZE: {
		size_t n = 0;
		for (const char *p = in; *p && n + 1 < outlen; p++)
			if (*p != ' ')
				out[n++] = *p;
		out[n] = '\0';
		return 0;
	}
	case UP_PORT:
		if (parse_uint(in, &v) != 0 || v == 0 || v > 65535) {
			snprintf(err, errlen, "'%s' is not a port (1 to 65535)", in);
			return -EINVAL;
		}
		split_hostport(c->v[a->key].text, host, sizeof(host), &port);
		snprintf(out, outlen, "%s:%llu", host, (unsigned long long)v);
		return 0;
	case UP_HOST:
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
	case UP_MS:
	case UP_SECONDS:
		if (parse_uint(in, &v) != 0) {
			snprintf(err, errlen, "'%s' is not a whole number of %s", in,
				 a->conv == UP_MS ? "milliseconds" : "seconds");
			return -EINVAL;
		}
		snprintf(out, outlen, "%llu%s", (unsigned long long)v,
			 a->conv == UP_MS ? "ms" : "s");
		return 0;
	case UP_ENDPOINTS:
		if (up_list(in, NULL, out, outlen) != 0 || !*out) {
			snprintf(err, errlen, "'%s' is not a list of host:port", in);
			return -EINVAL;
		}
		return 0;
	case UP_METADATA:
		if (strcmp(in, "P2PHANDSHAKE") == 0) {
			out[0] = '\0';
			return 0;
		}
		if (strncmp(in, "etcd://", 7) == 0 && up_list(in, "etcd://", out, outlen) == 0 &&
		    *out)
			return 0;
		snprintf(err, errlen,
			 "'%s': mooncaked's metadata is the etcd v3 API: P2PHANDSHAKE or "
			 "etcd://HOST:PORT (Mooncake's HTTP and Redis metadata servers "
			 "are not supported)",
			 in);
		return -EINVAL;
	case UP_HA:
		if (cfg_parse_bool(in, &b) != 0) {
			snprintf(err, errlen, "'%s' is not true or false", in);
			return -EINVAL;
		}
		snprintf(out, outlen, "%s", b ? c->v[a->key].text : "");
		return 0;
	case UP_FORCE_TCP:
		snprintf(out, outlen, "tcp");
		return 0;
	}
	return -EINVAL;
}

/* Append one warning line. */
static void warn_add(struct cfg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn_add(struct cfg *c, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	size_t old = c->warnings ? strlen(c->warnings) : 0, add = strlen(line);
	char *w = realloc(c->warnings, old + add + 2);
	if (!w)
		return; /* a lost warning, nothing worse */
	memcpy(w + old, line, add);
	w[old + add] = '\n';
	w[old + add + 1] = '\0';
	c->warnings = w;
}

const char *cfg_warnings(const struct cfg *c)
{
	return c->warnings ? c->warnings : "";
}

static const char *env_get(char *const envp[], const char *name)
{
	size_t n = strlen(name);
	for (size_t i = 0; envp && envp[i]; i++)
		if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=')
			return envp[i] + n + 1;
	return NULL;
}

void cfg_free(struct cfg *c)
{
	for (int k = 0; k < CFG_NKEYS; k++) {
		free(c->v[k].text);
		c->v[k].text = NULL;
	}
	free(c->config_path);
	c->config_path = NULL;
	free(c->warnings);
	c->warnings = NULL;
}

/* One parsed command-line assignment, applied after file and env. */
struct flag_set {
	int key;
	const char *value;
	const char *flag;            /* as written, without dashes */
	const struct up_alias *up;   /* a Mooncake spelling, or NULL */
};

/* Whether env entry e (NAME=VALUE) names variable n. */
static bool env_is(const char *e, const char *n)
{
	size_t len = strlen(n);
	return strncmp(e, n, len) == 0 && e[len] == '=';
}

/* MOONCAKE_* variables that name no key and MC_* variables mooncaked
 * does not map: one warning line each. */
static void check_env_names(struct cfg *c, char *const envp[])
{
	for (size_t i = 0; envp && envp[i]; i++) {
		const char *e = envp[i];
		size_t nlen = strcspn(e, "=");
		if (strncmp(e, "MOONCAKE_", 9) == 0) {
			bool known = false;
			for (int k = 0; k < CFG_NKEYS && !known; k++) {
				char name[128];
				env_name(cfg_keydefs[k].name, name, sizeof(name));
				known = env_is(e, name);
			}
			for (size_t j = 0; j < MC_ARRAY_LEN(client_env) && !known; j++)
				known = env_is(e, client_env[j]);
			if (!known)
				warn_add(c,
					 "environment variable %.*s names no key (see "
					 "mooncaked --help): ignored",
					 (int)nlen, e);
		} else if (strncmp(e, "MC_", 3) == 0) {
			bool mapped = false;
			for (size_t j = 0; j < MC_ARRAY_LEN(env_aliases) && !mapped; j++)
				mapped = env_is(e, env_aliases[j].name);
			if (mapped)
				continue;
			const char *why = find_refused(env_ignored, MC_ARRAY_LEN(env_ignored),
						       e, nlen);
			if (why)
				warn_add(c,
					 "environment variable %.*s is Mooncake's and has "
					 "no meaning in mooncaked (%s): ignored",
					 (int)nlen, e, why);
			else
				warn_add(c,
					 "environment variable %.*s is not one of Mooncake's "
					 "variables mooncaked maps (see mooncaked --help): "
					 "ignored",
					 (int)nlen, e);
		}
	}
}

/* Apply a Mooncake-spelled value to its key. */
static int apply_alias(struct cfg *c, const struct up_alias *a, const char *value,
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

int cfg_load(struct cfg *c, int argc, char *const argv[], char *const envp[],
	     struct cfg_cmdline *cl, char *err, size_t errlen)
{
	struct flag_set *sets = NULL;
	size_t nsets = 0;
	const char *config_path = NULL;
	int ha = -1; /* --enable_ha: -1 not given, else its value */
	int rc;

	memset(c, 0, sizeof(*c));
	memset(cl, 0, sizeof(*cl));
	for (int k = 0; k < CFG_NKEYS; k++) {
		rc = cfg_set(c, (enum cfg_key)k, cfg_keydefs[k].def,
			     CFG_SRC_DEFAULT, "default", err, errlen);
		assert(rc == 0 && "a default in cfg_keys.h does not parse");
		if (rc)
			goto fail;
	}

	/* Pass 1: the command line, so --config is known before the file. */
	sets = calloc((size_t)(argc > 0 ? argc : 1), sizeof(*sets));
	if (!sets) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			cl->help = true;
			continue;
		}
		if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
			cl->version = true;
			continue;
		}
		if (strcmp(a, "--print-config") == 0) {
			cl->print_config = true;
			continue;
		}
		if (strcmp(a, "--print-man-options") == 0) {
			cl->print_man_options = true;
			continue;
		}
		/* gflags (Mooncake's) also take one dash. */
		bool two = strncmp(a, "--", 2) == 0;
		if (!two && (a[0] != '-' || a[1] == '\0')) {
			snprintf(err, errlen,
				 "unexpected argument '%s' (options are --key=value; "
				 "see --help)",
				 a);
			rc = -EINVAL;
			goto fail;
		}
		const char *name = a + (two ? 2 : 1);
		const char *eq = strchr(name, '=');
		size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
		const char *value = eq ? eq + 1 : NULL;
		bool is_config = two && nlen == 6 && strncmp(name, "config", 6) == 0;
		int k = is_config || !two ? -1 : find_key(name, nlen);
		const struct up_alias *up = NULL;
		if (!is_config && k < 0) {
			up = find_flag_alias(name, nlen);
			/* gflags' --noNAME for a boolean */
			if (!up && !value && nlen > 2 && strncmp(name, "no", 2) == 0) {
				const struct up_alias *neg = find_flag_alias(name + 2, nlen - 2);
				if (neg && neg->conv == UP_HA) {
					up = neg;
					value = "false";
				}
			}
			if (up)
				k = up->key;
		}
		if (!is_config && k < 0) {
			const char *why = find_refused(flags_refused, MC_ARRAY_LEN(flags_refused),
						       name, nlen);
			if (why)
				snprintf(err, errlen,
					 "%s%.*s is Mooncake's and has no meaning in "
					 "mooncaked: %s",
					 two ? "--" : "-", (int)nlen, name, why);
			else
				snprintf(err, errlen, "unknown flag '%s%.*s' (see --help)",
					 two ? "--" : "-", (int)nlen, name);
			rc = -EINVAL;
			goto fail;
		}
		if (!value) {
			/* A bare boolean means true; others take the next arg. */
			if ((k >= 0 && !up && cfg_keydefs[k].type == CFG_T_BOOL) ||
			    (up && up->conv == UP_HA)) {
				value = "true";
			} else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
				value = argv[++i];
			} else {
				char acc[128];
				snprintf(err, errlen,
					 "%s%.*s: missing value (expected %s)",
					 two ? "--" : "-", (int)nlen, name,
					 is_config ? "a file path"
					 : up	   ? "a value"
						   : accepted(&cfg_keydefs[k], acc,
							      sizeof(acc)));
				rc = -EINVAL;
				goto fail;
			}
		}
		if (is_config) {
			config_path = value;
			continue;
		}
		sets[nsets].key = k;
		sets[nsets].value = value;
		sets[nsets].flag = up ? up->name : cfg_keydefs[k].name;
		sets[nsets].up = up;
		nsets++;
	}

	/* The file. */
	if (!config_path)
		config_path = env_get(envp, "MOONCAKE_CONFIG");
	if (config_path && !*config_path)
		config_path = NULL; /* --config= : no file at all */
	else if (!config_path && access(CFG_DEFAULT_FILE, F_OK) == 0)
		config_path = CFG_DEFAULT_FILE;
	if (config_path) {
		rc = load_file(c, config_path, err, errlen);
		if (rc)
			goto fail;
	}

	/* The environment: a key's own variable, else Mooncake's. */
	for (int k = 0; k < CFG_NKEYS; k++) {
		char name[128], verr[512], origin[160];
		env_name(cfg_keydefs[k].name, name, sizeof(name));
		const char *v = env_get(envp, name);
		if (v) {
			snprintf(origin, sizeof(origin), "env %s", name);
			rc = cfg_set(c, (enum cfg_key)k, v, CFG_SRC_ENV, origin, verr,
				     sizeof(verr));
			if (rc) {
				snprintf(err, errlen, "%s: %s", name, verr);
				goto fail;
			}
			continue;
		}
		const struct up_alias *al = env_alias(k);
		if (!al || !(v = env_get(envp, al->name)))
			continue;
		bool off = false;
		if (al->conv == UP_FORCE_TCP && *v && cfg_parse_bool(v, &off) == 0 && !off) {
			warn_add(c,
				 "environment variable %s=%s: Mooncake forces TCP whenever "
				 "it is set; mooncaked only when it is empty or true: "
				 "ignored",
				 al->name, v);
			continue;
		}
		snprintf(origin, sizeof(origin), "env %s", al->name);
		rc = apply_alias(c, al, v, CFG_SRC_ENV, origin, err, errlen);
		if (rc)
			goto fail;
	}
	check_env_names(c, envp);

	/* The flags, in command-line order. */
	for (size_t i = 0; i < nsets; i++) {
		char origin[160], verr[512];
		snprintf(origin, sizeof(origin), "flag --%s", sets[i].flag);
		if (sets[i].up) {
			rc = apply_alias(c, sets[i].up, sets[i].value, CFG_SRC_FLAG, origin,
					 err, errlen);
			if (rc)
				goto fail;
			if (sets[i].up->conv == UP_HA) {
				bool b = false;
				ha = cfg_parse_bool(sets[i].value, &b) == 0 && b;
			}
			continue;
		}
		rc = cfg_set(c, (enum cfg_key)sets[i].key, sets[i].value,
			     CFG_SRC_FLAG, origin, verr, sizeof(verr));
		if (rc) {
			snprintf(err, errlen, "--%s: %s", sets[i].flag, verr);
			goto fail;
		}
	}
	if (ha >= 0 && (ha == 1) != (*cfg_str(c, CFG_META_ENDPOINTS) != '\0')) {
		snprintf(err, errlen,
			 ha ? "--enable_ha: high availability needs meta: give "
			      "--etcd_endpoints or --meta-endpoints"
			    : "--enable_ha=false but meta endpoints are given (%s): "
			      "drop one of them",
			 cfg_str(c, CFG_META_ENDPOINTS));
		rc = -EINVAL;
		goto fail;
	}
	free(sets);
	return 0;
fail:
	free(sets);
	cfg_free(c);
	return rc;
}

/* ------------------------------------------------------------ accessors */

const char *cfg_str(const struct cfg *c, enum cfg_key k)
{
	return c->v[k].text;
}

uint64_t cfg_u64(const struct cfg *c, enum cfg_key k)
{
	assert(cfg_keydefs[k].type == CFG_T_UINT ||
	       cfg_keydefs[k].type == CFG_T_SIZE ||
	       cfg_keydefs[k].type == CFG_T_DURATION);
	return c->v[k].num;
}

double cfg_ratio(const struct cfg *c, enum cfg_key k)
{
	assert(cfg_keydefs[k].type == CFG_T_RATIO);
	return (double)c->v[k].num / 1e6;
}

bool cfg_bool(const struct cfg *c, enum cfg_key k)
{
	assert(cfg_keydefs[k].type == CFG_T_BOOL);
	return c->v[k].num != 0;
}

unsigned cfg_roles(const struct cfg *c)
{
	return (unsigned)c->v[CFG_ROLE].num;
}

void cfg_meta_endpoints(const struct cfg *c, char *out, size_t len)
{
	if (!(cfg_roles(c) & CFG_ROLE_META) || c->v[CFG_META_ENDPOINTS].src != CFG_SRC_DEFAULT) {
		snprintf(out, len, "%s", cfg_str(c, CFG_META_ENDPOINTS));
		return;
	}
	const char *listen = cfg_str(c, CFG_LISTEN_CLIENT);
	const char *colon = strrchr(listen, ':');
	if (strncmp(listen, "0.0.0.0:", 8) == 0)
		snprintf(out, len, "http://127.0.0.1%s", colon);
	else
		snprintf(out, len, "http://%s", listen);
}

/* ------------------------------------------------------------ output */

static const char *metavar(const struct cfg_keydef *d)
{
	switch (d->type) {
	case CFG_T_PATH: return "PATH";
	case CFG_T_BOOL: return "BOOL";
	case CFG_T_UINT: return "N";
	case CFG_T_SIZE: return "SIZE";
	case CFG_T_DURATION: return "DURATION";
	case CFG_T_ADDR: return "HOST:PORT";
	case CFG_T_ENUM: return d->choices;
	case CFG_T_ROLES: return "ROLES";
	case CFG_T_LOGLEVEL: return "SPEC";
	case CFG_T_RATIO: return "RATIO";
	default: return "STRING";
	}
}

static const char *const role_help[][2] = {
	{"meta", "Raft-replicated metadata KV store speaking etcd's v3 gRPC API"},
	{"master", "cache-pool coordinator: segments, objects, placement, "
		   "leases, eviction"},
	{"agent", "per-node DRAM/SSD cache segments, transfer engine, local "
		  "client socket"},
	{"standalone", "meta + master + agent in one process (the default)"},
};

static const char *const cmd_help[][2] = {
	{"--config=FILE", "read this INI file (default " CFG_DEFAULT_FILE
			  " if it exists; MOONCAKE_CONFIG also names it; "
			  "--config= reads none)"},
	{"--print-config", "print the effective value of every key and where "
			   "it came from, then exit"},
	{"--print-man-options", "print the OPTIONS section of mooncaked(8) "
				"from the key table, then exit"},
	{"--help", "print this help and exit"},
	{"--version", "print the version and exit"},
};

/* "  lhs   text" with text wrapped at 79 columns under itself. */
static void print_wrapped(FILE *f, const char *lhs, const char *text)
{
	const int indent = 32;
	int col = fprintf(f, "  %s", lhs);
	if (col >= indent) {
		fputc('\n', f);
		col = 0;
	}
	fprintf(f, "%*s", indent - col, "");
	col = indent;
	const char *p = text;
	while (*p) {
		const char *sp = strchr(p, ' ');
		int wlen = sp ? (int)(sp - p) : (int)strlen(p);
		if (col > indent && col + 1 + wlen > 79) {
			fprintf(f, "\n%*s", indent, "");
			col = indent;
		} else if (col > indent) {
			fputc(' ', f);
			col++;
		}
		fprintf(f, "%.*s", wlen, p);
		col += wlen;
		p += wlen;
		while (*p == ' ')
			p++;
	}
	fputc('\n', f);
}

/* One line of --help's Mooncake spellings. */
static void help_alias(FILE *f, const char *dashes, const struct up_alias *a)
{
	char lhs[96], text[256];
	snprintf(lhs, sizeof(lhs), "%s%s", dashes, a->name);
	if (up_conv_text(a->conv))
		snprintf(text, sizeof(text), "--%s (%s)", cfg_keydefs[a->key].name,
			 up_conv_text(a->conv));
	else
		snprintf(text, sizeof(text), "--%s", cfg_keydefs[a->key].name);
	print_wrapped(f, lhs, text);
}

void cfg_print_help(FILE *f, const char *prog)
{
	fprintf(f,
		"Usage: %s [--role=ROLES] [--config=FILE] [--KEY=VALUE ...]\n\n"
		"mooncaked: distributed KV-cache pool and memory transfer engine.\n\n"
		"Roles (--role; a comma list runs several in one process):\n",
		prog);
	for (size_t i = 0; i < MC_ARRAY_LEN(role_help); i++)
		fprintf(f, "  %-12s %s\n", role_help[i][0], role_help[i][1]);
	fprintf(f, "\nCommands:\n");
	for (size_t i = 0; i < MC_ARRAY_LEN(cmd_help); i++)
		print_wrapped(f, cmd_help[i][0], cmd_help[i][1]);
	fprintf(f, "\nKeys: each is a flag --KEY=VALUE, an environment variable "
		   "MOONCAKE_KEY\n(dashes become underscores) and a key in the "
		   "config file's [section].\nPrecedence: flag > environment > "
		   "file > default.\n");
	for (int s = 0; s < CFG_NSECTIONS; s++) {
		fprintf(f, "\n[%s]\n", section_names[s]);
		for (int k = 0; k < CFG_NKEYS; k++) {
			const struct cfg_keydef *d = &cfg_keydefs[k];
			if ((int)d->section != s)
				continue;
			char lhs[96], text[1024];
			snprintf(lhs, sizeof(lhs), "--%s=%s", d->name, metavar(d));
			if (env_alias(k))
				snprintf(text, sizeof(text), "%s; also Mooncake's "
					 "variable %s (default: %s)", d->help,
					 env_alias(k)->name, *d->def ? d->def : "none");
			else
				snprintf(text, sizeof(text), "%s (default: %s)", d->help,
					 *d->def ? d->def : "none");
			print_wrapped(f, lhs, text);
		}
	}
	fprintf(f, "\nMooncake's spellings (mooncake_master and mooncake_client "
		   "flags, MC_* variables),\nbelow the key's own flag or variable "
		   "in precedence:\n");
	for (size_t i = 0; i < MC_ARRAY_LEN(flag_aliases); i++)
		help_alias(f, "--", &flag_aliases[i]);
	for (size_t i = 0; i < MC_ARRAY_LEN(env_aliases); i++)
		help_alias(f, "", &env_aliases[i]);
	fprintf(f, "Refused (no meaning here; mooncaked(8) says why):");
	for (size_t i = 0; i < MC_ARRAY_LEN(flags_refused); i++)
		fprintf(f, "%s --%s", i % 4 == 3 ? "\n " : "", flags_refused[i][0]);
	fprintf(f, "\nIgnored with a warning:");
	for (size_t i = 0; i < MC_ARRAY_LEN(env_ignored); i++)
		fprintf(f, "%s %s", i % 4 == 3 ? "\n " : "", env_ignored[i][0]);
	fprintf(f, "\nA MOONCAKE_* variable that names no key and any other MC_* "
		   "variable are\nreported with a warning.\n");
	fprintf(f, "\nSizes: 4096, 512K, 512M, 4G, 1.5T. Durations: 500ms, 10s, "
		   "5m, 2h.\nSignals: SIGTERM/SIGINT drain in-flight calls and "
		   "exit; SIGHUP reopens --log-file.\nExit status: 0 ok, 1 "
		   "runtime error, 2 bad command line or configuration.\n");
}

static const char *source_name(enum cfg_source s)
{
	switch (s) {
	case CFG_SRC_DEFAULT: return "default";
	case CFG_SRC_FILE: return "file";
	case CFG_SRC_ENV: return "env";
	case CFG_SRC_FLAG: return "flag";
	}
	return "?";
}

void cfg_print_effective(FILE *f, const struct cfg *c)
{
	fprintf(f, "# config file: %s\n",
		c->config_path ? c->config_path : "(none)");
	for (int s = 0; s < CFG_NSECTIONS; s++) {
		fprintf(f, "[%s]\n", section_names[s]);
		for (int k = 0; k < CFG_NKEYS; k++) {
			const struct cfg_keydef *d = &cfg_keydefs[k];
			if ((int)d->section != s)
				continue;
			const struct cfg_value *v = &c->v[k];
			char lhs[512];
			snprintf(lhs, sizeof(lhs), "%s = %s", d->name, v->text);
			if (v->src == CFG_SRC_DEFAULT)
				fprintf(f, "%-44s # default\n", lhs);
			else
				fprintf(f, "%-44s # %s (%s)\n", lhs,
					source_name(v->src), v->origin);
		}
	}
}

/* Write s escaped for roff (backslash, minus, a leading dot), breaking
 * the input line at spaces so no line is longer than 80 bytes. */
static void roff(FILE *f, const char *s)
{
	size_t col = 0;
	bool bol = true;
	for (; *s; s++) {
		if (*s == ' ' && col > 60) {
			fputc('\n', f);
			col = 0;
			bol = true;
			continue;
		}
		if (bol && (*s == '.' || *s == '\''))
			col += (size_t)fprintf(f, "\\&");
		bol = false;
		if (*s == '\\')
			col += (size_t)fprintf(f, "\\e");
		else if (*s == '-')
			col += (size_t)fprintf(f, "\\-");
		else
			col += (size_t)(fputc(*s, f) != EOF);
	}
}

/* One spelling of MOONCAKE SPELLINGS: .TP, the name, the key it sets and
 * how its value is converted. */
static void man_alias(FILE *f, const char *dashes, const struct up_alias *a)
{
	fprintf(f, ".TP\n.B %s", dashes);
	roff(f, a->name);
	fputs("\n.BR \\-\\-", f);
	roff(f, cfg_keydefs[a->key].name);
	if (up_conv_text(a->conv)) {
		fputs(" :\n", f);
		roff(f, up_conv_text(a->conv));
		fputs(".\n", f);
	} else {
		fputs(" .\n", f);
	}
}

void cfg_print_man_options(FILE *f)
{
	fputs(".\\\" Generated by mooncaked --print-man-options from "
	      "src/common/cfg_keys.h.\n.\\\" Do not edit; run make man.\n",
	      f);
	fputs(".SH OPTIONS\n", f);
	for (size_t i = 0; i < MC_ARRAY_LEN(cmd_help); i++) {
		const char *lhs = cmd_help[i][0];
		const char *eq = strchr(lhs, '=');
		if (eq) {
			char name[64];
			snprintf(name, sizeof(name), "%.*s", (int)(eq - lhs + 1),
				 lhs);
			fputs(".TP\n.BI ", f);
			roff(f, name);
			fputs(" ", f);
			roff(f, eq + 1);
		} else {
			fputs(".TP\n.B ", f);
			roff(f, lhs);
		}
		fputs("\n", f);
		roff(f, cmd_help[i][1]);
		fputs(".\n", f);
	}
	fputs(".SH CONFIGURATION KEYS\nEach key is a flag\n.BI \\-\\- key =value\n"
	      ", an environment variable\n.BI MOONCAKE_ KEY\n"
	      "(upper case, dashes become underscores)\nand a key of the config "
	      "file in the section shown.\nPrecedence: flag, environment, file, "
	      "default.\n",
	      f);
	for (int s = 0; s < CFG_NSECTIONS; s++) {
		fprintf(f, ".SS [%s]\n", section_names[s]);
		for (int k = 0; k < CFG_NKEYS; k++) {
			const struct cfg_keydef *d = &cfg_keydefs[k];
			if ((int)d->section != s)
				continue;
			fputs(".TP\n.BI \\-\\-", f);
			roff(f, d->name);
			fputs("= ", f);
			roff(f, metavar(d));
			fputs("\n", f);
			roff(f, d->help);
			if (env_alias(k)) {
				char up[128];
				env_name(d->name, up, sizeof(up));
				fputs(".\nAlso Mooncake's environment variable\n.B ", f);
				roff(f, env_alias(k)->name);
				fputs("\n(below ", f);
				roff(f, up);
				fputs(" in precedence)", f);
			}
			fputs(".\nDefault:\n.BR ", f);
			roff(f, *d->def ? d->def : "none");
			fputs(" .\n", f);
		}
	}
	fputs(".SH MOONCAKE SPELLINGS\nThe flags of Mooncake's mooncake_master and "
	      "mooncake_client and the\nMC_* variables of its transfer engine that "
	      "map one to one onto a key are\naccepted (flags also with one dash, "
	      "as gflags takes them), converted as\nshown, and named as the "
	      "value's origin by\n.BR \\-\\-print\\-config .\n"
	      "A variable counts below the key's own MOONCAKE_* variable; flags "
	      "apply in\ncommand-line order.\n.SS Flags\n",
	      f);
	for (size_t i = 0; i < MC_ARRAY_LEN(flag_aliases); i++)
		man_alias(f, "\\-\\-", &flag_aliases[i]);
	fputs(".SS Environment\n", f);
	for (size_t i = 0; i < MC_ARRAY_LEN(env_aliases); i++)
		man_alias(f, "", &env_aliases[i]);
	fputs(".SS Refused flags\nThese mean nothing here; mooncaked exits with "
	      "status 2 and this reason.\n",
	      f);
	for (size_t i = 0; i < MC_ARRAY_LEN(flags_refused); i++) {
		fputs(".TP\n.B \\-\\-", f);
		roff(f, flags_refused[i][0]);
		fputs("\n", f);
		roff(f, flags_refused[i][1]);
		fputs(".\n", f);
	}
	fputs(".SS Ignored variables\nThese mean nothing here; each set one is "
	      "reported with a warning line\nand ignored (the node's inference "
	      "processes may share the environment).\nSo is any other MC_* "
	      "variable, and a MOONCAKE_* variable that names no key.\n",
	      f);
	for (size_t i = 0; i < MC_ARRAY_LEN(env_ignored); i++) {
		fputs(".TP\n.B ", f);
		roff(f, env_ignored[i][0]);
		fputs("\n", f);
		roff(f, env_ignored[i][1]);
		fputs(".\n", f);
	}
}
