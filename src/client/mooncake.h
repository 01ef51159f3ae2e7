/*
 * libmooncake: the client library of mooncaked.
 */
#ifndef MOONCAKE_H
#define MOONCAKE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Text for a negative error code returned by any mc_ function. */
const char *mc_strerror(int code);
/* Name of an error code ("MC_EOBJECT_NOT_FOUND", "ENOENT"). */
const char *mc_errname(int code);
/* Library version, "MAJOR.MINOR.PATCH". */
const char *mc_version(void);

#ifdef __cplusplus
}
#endif

#endif
