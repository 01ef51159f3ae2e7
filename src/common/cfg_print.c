/*
 * cfg_print: what mooncaked prints about its configuration, generated
 * from the key table and Mooncake's spellings so that it cannot drift
 * from what is parsed: --help, --print-config (each key's effective value
 * and where it came from) and the OPTIONS, CONFIGURATION KEYS and
 * MOONCAKE SPELLINGS sections of mooncaked(8) (make man).
 */
#include <stdio.h>
#include <string.h>

#include "common/cfg_int.h"
#include "common/util.h"

static const char *metavar(const struct cfg_keydef *d)
{
	switch (d->type) {
	case CFG_T_PATH:
		return "PATH";
	case CFG_T_BOOL:
		return "BOOL";
	case CFG_T_UINT:
		return "N";
	case CFG_T_SIZE:
		return "SIZE";
	case CFG_T_DURATION:
		return "DURATION";
	case CFG_T_ADDR:
		return "HOST:PORT";
	case CFG_T_ENUM:
		return d->choices;
	case CFG_T_ROLES:
		return "ROLES";
	case CFG_T_LOGLEVEL:
		return "SPEC";
	case CFG_T_RATIO:
		return "RATIO";
	default:
		return "STRING";
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
static void help_alias(FILE *f, const char *dashes, const struct cfg__alias *a)
{
	char lhs[96], text[256];
	snprintf(lhs, sizeof(lhs), "%s%s", dashes, a->name);
	if (cfg__conv_text(a->conv))
		snprintf(text, sizeof(text), "--%s (%s)", cfg_keydefs[a->key].name,
			 cfg__conv_text(a->conv));
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
		fprintf(f, "\n[%s]\n", cfg_section_name((enum cfg_section)s));
		for (int k = 0; k < CFG_NKEYS; k++) {
			const struct cfg_keydef *d = &cfg_keydefs[k];
			if ((int)d->section != s)
				continue;
			char lhs[96], text[1024];
			snprintf(lhs, sizeof(lhs), "--%s=%s", d->name, metavar(d));
			if (cfg__env_alias(k))
				snprintf(text, sizeof(text),
					 "%s; also Mooncake's "
					 "variable %s (default: %s)",
					 d->help, cfg__env_alias(k)->name,
					 *d->def ? d->def : "none");
			else
				snprintf(text, sizeof(text), "%s (default: %s)", d->help,
					 *d->def ? d->def : "none");
			print_wrapped(f, lhs, text);
		}
	}
	fprintf(f, "\nMooncake's spellings (mooncake_master and mooncake_client "
		   "flags, MC_* variables),\nbelow the key's own flag or variable "
		   "in precedence:\n");
	for (size_t i = 0; i < cfg__nflag_aliases; i++)
		help_alias(f, "--", &cfg__flag_aliases[i]);
	for (size_t i = 0; i < cfg__nenv_aliases; i++)
		help_alias(f, "", &cfg__env_aliases[i]);
	fprintf(f, "Refused (no meaning here; mooncaked(8) says why):");
	for (size_t i = 0; i < cfg__nflags_refused; i++)
		fprintf(f, "%s --%s", i % 4 == 3 ? "\n " : "", cfg__flags_refused[i][0]);
	fprintf(f, "\nIgnored with a warning:");
	for (size_t i = 0; i < cfg__nenv_ignored; i++)
		fprintf(f, "%s %s", i % 4 == 3 ? "\n " : "", cfg__env_ignored[i][0]);
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
	case CFG_SRC_DEFAULT:
		return "default";
	case CFG_SRC_FILE:
		return "file";
	case CFG_SRC_ENV:
		return "env";
	case CFG_SRC_FLAG:
		return "flag";
	}
	return "?";
}

void cfg_print_effective(FILE *f, const struct cfg *c)
{
	fprintf(f, "# config file: %s\n", c->config_path ? c->config_path : "(none)");
	for (int s = 0; s < CFG_NSECTIONS; s++) {
		fprintf(f, "[%s]\n", cfg_section_name((enum cfg_section)s));
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
				fprintf(f, "%-44s # %s (%s)\n", lhs, source_name(v->src),
					v->origin);
		}
	}
}

/* The escaped length of the word at s (up to a space). */
static size_t roff_word(const char *s)
{
	size_t n = 2; /* a leading "\&" */
	for (; *s && *s != ' '; s++)
		n += *s == '\\' || *s == '-' ? 2 : 1;
	return n;
}

/* Write s escaped for roff (backslash, minus, a leading dot), breaking
 * the input line at spaces so no line is longer than 80 bytes. */
static void roff(FILE *f, const char *s)
{
	size_t col = 0;
	bool bol = true;
	for (; *s; s++) {
		if (*s == ' ' && (col > 60 || col + 1 + roff_word(s + 1) > 79)) {
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
static void man_alias(FILE *f, const char *dashes, const struct cfg__alias *a)
{
	fprintf(f, ".TP\n.B %s", dashes);
	roff(f, a->name);
	fputs("\n.BR \\-\\-", f);
	roff(f, cfg_keydefs[a->key].name);
	if (cfg__conv_text(a->conv)) {
		fputs(" :\n", f);
		roff(f, cfg__conv_text(a->conv));
		fputs(".\n", f);
	} else {
		fputs(" .\n", f);
	}
}

/* One .TP entry per {name, why} pair: the name after dashes, the reason. */
static void man_reasons(FILE *f, const char *dashes, const char *const tab[][2], size_t n)
{
	for (size_t i = 0; i < n; i++) {
		fprintf(f, ".TP\n.B %s", dashes);
		roff(f, tab[i][0]);
		fputs("\n", f);
		roff(f, tab[i][1]);
		fputs(".\n", f);
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
			snprintf(name, sizeof(name), "%.*s", (int)(eq - lhs + 1), lhs);
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
		fprintf(f, ".SS [%s]\n", cfg_section_name((enum cfg_section)s));
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
			if (cfg__env_alias(k)) {
				char up[128];
				cfg__env_name(d->name, up, sizeof(up));
				fputs(".\nAlso Mooncake's environment variable\n.B ", f);
				roff(f, cfg__env_alias(k)->name);
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
	for (size_t i = 0; i < cfg__nflag_aliases; i++)
		man_alias(f, "\\-\\-", &cfg__flag_aliases[i]);
	fputs(".SS Environment\n", f);
	for (size_t i = 0; i < cfg__nenv_aliases; i++)
		man_alias(f, "", &cfg__env_aliases[i]);
	fputs(".SS Refused flags\nThese mean nothing here; mooncaked exits with "
	      "status 2 and this reason.\n",
	      f);
	man_reasons(f, "\\-\\-", cfg__flags_refused, cfg__nflags_refused);
	fputs(".SS Ignored variables\nThese mean nothing here; each set one is "
	      "reported with a warning line\nand ignored (the node's inference "
	      "processes may share the environment).\nSo is any other MC_* "
	      "variable, and a MOONCAKE_* variable that names no key.\n",
	      f);
	man_reasons(f, "", cfg__env_ignored, cfg__nenv_ignored);
}
