/*
 * cfg: the configuration key table and its values. See cfg.h; the other
 * files of the configuration are named in cfg_int.h.
 *
 * A key's value is kept twice: as text, the way it was given (what
 * --print-config shows), and parsed into a number in the key's unit
 * (bytes, milliseconds, parts per million, a role mask, 0/1), checked
 * against the key's bounds when it is set. Every parser refuses what it
 * does not read whole and says what it accepts, so each source's error
 * can name the flag, variable or file line and the syntax expected.
 */
#include "common/cfg.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/cfg_int.h"
#include "common/log.h"
#include "common/util.h"

const struct cfg_keydef cfg_keydefs[CFG_NKEYS] = {
#define CFG__DEF(id, name, sec, type, def, lo, hi, choices, help) \
	[CFG_##id] = {name, CFG_S_##sec, CFG_T_##type, def, lo, hi, choices, help},
	CFG_KEYS(CFG__DEF)
#undef CFG__DEF
};

static const char *const section_names[CFG_NSECTIONS] = {"common", "meta", "master", "agent"};

const char *cfg_section_name(enum cfg_section s)
{
	return (unsigned)s < CFG_NSECTIONS ? section_names[s] : "?";
}

/* ------------------------------------------------------------ values */

/* Parse "123", "1.5" into an integer part and a fraction numerator over
 * 10^fdigits. Advances *sp past the number. */
static int parse_decimal(const char **sp, uint64_t *ip, uint64_t *fnum, uint64_t *fden)
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
static int scale(uint64_t i, uint64_t fn, uint64_t fd, uint64_t mult, uint64_t *out)
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
	case 'K':
		mult = 1ull << 10;
		s++;
		break;
	case 'M':
		mult = 1ull << 20;
		s++;
		break;
	case 'G':
		mult = 1ull << 30;
		s++;
		break;
	case 'T':
		mult = 1ull << 40;
		s++;
		break;
	case 'P':
		mult = 1ull << 50;
		s++;
		break;
	default:
		break;
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

int cfg__parse_uint(const char *s, uint64_t *out)
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

const char *cfg__accepted(const struct cfg_keydef *d, char *buf, size_t len)
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
static void format_num(const struct cfg_keydef *d, uint64_t v, char *buf, size_t len)
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
		static const struct {
			uint64_t ms;
			const char *unit;
		} units[] = {{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}};
		for (size_t i = 0; i < MC_ARRAY_LEN(units); i++) {
			if (v && v % units[i].ms == 0) {
				snprintf(buf, len, "%llu%s",
					 (unsigned long long)(v / units[i].ms), units[i].unit);
				return;
			}
		}
		snprintf(buf, len, "%llu%s", (unsigned long long)v, v ? "ms" : "s");
	} else if (d->type == CFG_T_RATIO) {
		snprintf(buf, len, "%g", (double)v / 1e6);
	} else {
		snprintf(buf, len, "%llu", (unsigned long long)v);
	}
}

/* Parse text for key d into *num. Errors: -EINVAL with err set. */
static int parse_value(const struct cfg_keydef *d, const char *text, uint64_t *num, char *err,
		       size_t errlen)
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
		rc = cfg__parse_uint(text, num);
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
			 cfg__accepted(d, acc, sizeof(acc)));
		return -EINVAL;
	}
	if ((d->type == CFG_T_UINT || d->type == CFG_T_SIZE || d->type == CFG_T_DURATION ||
	     d->type == CFG_T_RATIO) &&
	    (d->min || d->max) && (*num < d->min || *num > d->max)) {
		char lo[32], hi[32];
		format_num(d, d->min, lo, sizeof(lo));
		format_num(d, d->max, hi, sizeof(hi));
		snprintf(err, errlen, "'%s' is out of range (%s to %s)", text, lo, hi);
		return -EINVAL;
	}
	return 0;
}

int cfg_set(struct cfg *c, enum cfg_key k, const char *text, enum cfg_source src,
	    const char *origin, char *err, size_t errlen)
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

/* ------------------------------------------------------------ names */

int cfg__find_key(const char *name, size_t len)
{
	for (int k = 0; k < CFG_NKEYS; k++)
		if (strlen(cfg_keydefs[k].name) == len &&
		    strncmp(cfg_keydefs[k].name, name, len) == 0)
			return k;
	return -1;
}

void cfg__env_name(const char *key, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "MOONCAKE_");
	for (const char *p = key; *p && n + 1 < len; p++)
		buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
	buf[n] = '\0';
}

/* ------------------------------------------------------------ the object */

void cfg__warn_add(struct cfg *c, const char *fmt, ...)
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

/* ------------------------------------------------------------ accessors */

const char *cfg_str(const struct cfg *c, enum cfg_key k)
{
	return c->v[k].text;
}

uint64_t cfg_u64(const struct cfg *c, enum cfg_key k)
{
	assert(cfg_keydefs[k].type == CFG_T_UINT || cfg_keydefs[k].type == CFG_T_SIZE ||
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
	if (!(cfg_roles(c) & CFG_ROLE_META) ||
	    c->v[CFG_META_ENDPOINTS].src != CFG_SRC_DEFAULT) {
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
