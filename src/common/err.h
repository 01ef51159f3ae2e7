/*
 * err: the project's error codes.
 *
 * Fallible functions return 0 or a negative code: either a negative errno
 * (-ENOMEM, -EINVAL, ...) or one of the MC_E* codes below, which live in a
 * range no errno uses (-700 and below). The store codes keep the numbers
 * Mooncake users already handle (OBJECT_ALREADY_EXISTS = -705, ...).
 * mc_strerror() names either kind.
 */
#ifndef MC_COMMON_ERR_H
#define MC_COMMON_ERR_H

#define MC_ERRORS(X) \
	X(MC_EINTERNAL, -700, "internal error") \
	X(MC_ESEGMENT_NOT_FOUND, -701, "segment not found") \
	X(MC_ENO_SPACE, -702, "no space left in the cache pool") \
	X(MC_EINVALID_REPLICA, -703, "invalid replica") \
	X(MC_EOBJECT_NOT_FOUND, -704, "object not found") \
	X(MC_EOBJECT_ALREADY_EXISTS, -705, "object already exists") \
	X(MC_EOBJECT_HAS_LEASE, -706, "object is held by a read lease") \
	X(MC_ELEASE_EXPIRED, -707, "lease expired") \
	X(MC_ETOO_FEW_SEGMENTS, -708, \
	  "more replicas asked for than " \
	  "segments are mounted (each replica needs a segment of its own)") \
	X(MC_ECONFIG, -800, "invalid configuration") \
	X(MC_EPROTOCOL, -801, "protocol error") \
	X(MC_EUNAVAILABLE, -802, "service unavailable") \
	X(MC_ETIMEDOUT, -803, "deadline exceeded") \
	X(MC_ECANCELLED, -804, "cancelled") \
	X(MC_ETOO_LARGE, -805, "message too large") \
	X(MC_ELOCKED, -806, "resource is locked by another process") \
	X(MC_ENOT_LEADER, -807, "not the leader") \
	X(MC_ESHUTDOWN, -808, "shutting down") \
	X(MC_ECOMPACTED, -809, "revision has been compacted") \
	X(MC_ECHECKSUM, -810, \
	  "checksum mismatch: the bytes are not the " \
	  "object's") \
	X(MC_EREMOTE_ACCESS, -820, "remote address is not inside a registered region")

enum mc_err {
#define MC__ERR_ENUM(name, value, text) name = value,
	MC_ERRORS(MC__ERR_ENUM)
#undef MC__ERR_ENUM
};

/* Text for a negative errno or an MC_E* code; never NULL. Thread-safe. */
const char *mc_strerror(int code);

/* Name of an MC_E* code ("MC_ENO_SPACE") or errno ("ENOENT"); never NULL. */
const char *mc_errname(int code);

#define MC_MUST_CHECK __attribute__((warn_unused_result))

#endif
