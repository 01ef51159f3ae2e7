/*
 * cfg_load: the effective configuration from its sources (cfg_load) and
 * the INI file's parser (cfg_parse_ini).
 *
 * Order of application: defaults, file, environment, flags; each later
 * source overwrites the earlier one, so the last writer is the effective
 * value and its origin is what --print-config shows. The command line is
 * read first all the same, to know --config before the file, and its
 * assignments are applied last, in command-line order. The INI parser is
 * a small one of our own so that every error names file:line.
 */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cfg_int.h"
#include "common/io.h"
#include "common/util.h"

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

int cfg_parse_ini(struct cfg *c, const char *name, const char *buf, size_t len, char *err,
		  size_t errlen)
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
			snprintf(err, errlen, "%s:%u: line longer than %zu bytes", name,
				 lineno, sizeof(line) - 1);
			return -EINVAL;
		}
		if (memchr(buf + start, '\0', llen)) {
			snprintf(err, errlen, "%s:%u: NUL byte in line", name, lineno);
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
				snprintf(err, errlen, "%s:%u: malformed section header", name,
					 lineno);
				return -EINVAL;
			}
			*end = '\0';
			char *sec = trim(s + 1);
			section = -1;
			for (int i = 0; i < CFG_NSECTIONS; i++)
				if (strcmp(sec, cfg_section_name((enum cfg_section)i)) == 0)
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
			snprintf(err, errlen, "%s:%u: expected 'key = value' or '[section]'",
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
		int k = cfg__find_key(key, strlen(key));
		if (k < 0) {
			snprintf(err, errlen, "%s:%u: unknown key '%s'", name, lineno, key);
			return -EINVAL;
		}
		if (section < 0) {
			snprintf(err, errlen,
				 "%s:%u: key '%s' outside a section (it belongs in "
				 "[%s])",
				 name, lineno, key, cfg_section_name(cfg_keydefs[k].section));
			return -EINVAL;
		}
		if ((int)cfg_keydefs[k].section != section) {
			snprintf(err, errlen, "%s:%u: key '%s' belongs in [%s], not [%s]",
				 name, lineno, key, cfg_section_name(cfg_keydefs[k].section),
				 cfg_section_name((enum cfg_section)section));
			return -EINVAL;
		}
		if (seen[k]) {
			snprintf(err, errlen, "%s:%u: key '%s' set twice", name, lineno, key);
			return -EINVAL;
		}
		seen[k] = true;
		char origin[256], verr[512];
		snprintf(origin, sizeof(origin), "file %s:%u", name, lineno);
		int rc = cfg_set(c, (enum cfg_key)k, val, CFG_SRC_FILE, origin, verr,
				 sizeof(verr));
		if (rc) {
			snprintf(err, errlen, "%s:%u: %s: %s", name, lineno, key, verr);
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
		snprintf(err, errlen, "--config: cannot open '%s': %s", path, strerror(e));
		return -e;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (16 << 20)) {
		snprintf(err, errlen, "--config: '%s' is not a regular file of at most 16 MiB",
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

static const char *env_get(char *const envp[], const char *name)
{
	size_t n = strlen(name);
	for (size_t i = 0; envp && envp[i]; i++)
		if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=')
			return envp[i] + n + 1;
	return NULL;
}

/* One parsed command-line assignment, applied after file and env. */
struct flag_set {
	int key;
	const char *value;
	const char *flag;            /* as written, without dashes */
	const struct cfg__alias *up; /* a Mooncake spelling, or NULL */
};

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
		rc = cfg_set(c, (enum cfg_key)k, cfg_keydefs[k].def, CFG_SRC_DEFAULT,
			     "default", err, errlen);
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
		int k = is_config || !two ? -1 : cfg__find_key(name, nlen);
		const struct cfg__alias *up = NULL;
		if (!is_config && k < 0) {
			up = cfg__flag_alias(name, nlen, &value);
			if (up)
				k = up->key;
		}
		if (!is_config && k < 0) {
			const char *why = cfg__flag_refused(name, nlen);
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
			if (k >= 0 && !up && cfg_keydefs[k].type == CFG_T_BOOL) {
				value = "true";
			} else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
				value = argv[++i];
			} else {
				char acc[128];
				snprintf(err, errlen, "%s%.*s: missing value (expected %s)",
					 two ? "--" : "-", (int)nlen, name,
					 is_config ? "a file path"
					 : up      ? "a value"
						   : cfg__accepted(&cfg_keydefs[k], acc,
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
		cfg__env_name(cfg_keydefs[k].name, name, sizeof(name));
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
		const struct cfg__alias *al = cfg__env_alias(k);
		if (!al || !(v = env_get(envp, al->name)))
			continue;
		rc = cfg__env_alias_apply(c, al, v, err, errlen);
		if (rc)
			goto fail;
	}
	cfg__check_env_names(c, envp);

	/* The flags, in command-line order. */
	for (size_t i = 0; i < nsets; i++) {
		char origin[160], verr[512];
		snprintf(origin, sizeof(origin), "flag --%s", sets[i].flag);
		if (sets[i].up) {
			rc = cfg__alias_apply(c, sets[i].up, sets[i].value, CFG_SRC_FLAG,
					      origin, err, errlen);
			if (rc)
				goto fail;
			if (cfg__alias_is_switch(sets[i].up)) {
				bool b = false;
				ha = cfg_parse_bool(sets[i].value, &b) == 0 && b;
			}
			continue;
		}
		rc = cfg_set(c, (enum cfg_key)sets[i].key, sets[i].value, CFG_SRC_FLAG, origin,
			     verr, sizeof(verr));
		if (rc) {
			snprintf(err, errlen, "--%s: %s", sets[i].flag, verr);
			goto fail;
		}
	}
	rc = cfg__check_ha(c, ha, err, errlen);
	if (rc)
		goto fail;
	if (cfg_u64(c, CFG_RPC_MAX_CALL_MEMORY) / 2 < cfg_u64(c, CFG_RPC_MAX_MESSAGE_SIZE)) {
		snprintf(err, errlen,
			 "--rpc-max-call-memory (%" PRIu64 " bytes) is below twice "
			 "--rpc-max-message-size (%" PRIu64 "): a message that large "
			 "could not be received and decoded",
			 cfg_u64(c, CFG_RPC_MAX_CALL_MEMORY),
			 cfg_u64(c, CFG_RPC_MAX_MESSAGE_SIZE));
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
