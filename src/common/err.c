/*
 * err: mc_strerror() over the MC_ERRORS table and errno.
 */
#include "common/err.h"

#include <errno.h>
#include <string.h>

#define MC__PUBLIC __attribute__((visibility("default")))

MC__PUBLIC const char *mc_strerror(int code)
{
	switch (code) {
	case 0:
		return "success";
#define MC__ERR_CASE(name, value, text) \
	case value: \
		return text;
		MC_ERRORS(MC__ERR_CASE)
#undef MC__ERR_CASE
	default:
		break;
	}
	if (code < 0 && code > -4096) {
		const char *s = strerrordesc_np(-code);
		if (s)
			return s;
	}
	return "unknown error";
}

MC__PUBLIC const char *mc_errname(int code)
{
	switch (code) {
	case 0:
		return "OK";
#define MC__ERR_NAME(name, value, text) \
	case value: \
		return #name;
		MC_ERRORS(MC__ERR_NAME)
#undef MC__ERR_NAME
	default:
		break;
	}
	if (code < 0 && code > -4096) {
		const char *s = strerrorname_np(-code);
		if (s)
			return s;
	}
	return "EUNKNOWN";
}
