/*
 * auth.h - the job secret and the handshake that proves it: HMAC-SHA256
 * (OpenSSL's libcrypto) over fresh challenges from both ends.
 *
 * Every connection of the job (rendezvous store and tcp backend) starts
 * with a mutual challenge-response: each end sends a random challenge and
 * answers the other's with a MAC keyed by a key derived from the job
 * secret, so that neither a client nor a server that lacks the secret gets
 * past the first round trip, and a recorded handshake is worth nothing (the
 * challenges are new each time). The two directions use different labels,
 * so a MAC cannot be reflected back to its sender.
 *
 * Where the secret comes from (doc/rendezvous.md, "Authentication"):
 *   mpi           rank 0 draws 32 random bytes and MPI_Bcast's them
 *   env://, tcp:// $FSDPC_SECRET, or the file named by $FSDPC_SECRET_FILE
 *                 (mode 0600 or stricter, owned by the user); without one a
 *                 loopback store takes the per-user secret (below), and a
 *                 non-loopback one refuses to start; in insecure mode
 *                 ($FSDPC_INSECURE=1, the programs' --insecure) both are
 *                 keyed by public values only (protects against accidents,
 *                 not against other local users)
 *   file://       32 random bytes in the store's stamp (0600 in a 0700
 *                 directory), unless $FSDPC_SECRET(_FILE) names one
 *   one rank      32 random bytes
 */
#ifndef FSDP_RENDEZVOUS_AUTH_H
#define FSDP_RENDEZVOUS_AUTH_H

#include <stddef.h>

#define FSDP_AUTH_KEY_BYTES 32    /* keys and secrets drawn here */
#define FSDP_AUTH_CHAL_BYTES 16   /* challenge */
#define FSDP_AUTH_MAC_BYTES 32    /* HMAC-SHA256 */
#define FSDP_AUTH_SECRET_MIN 16   /* shortest secret accepted from the user */
#define FSDP_AUTH_SECRET_MAX 4096

struct fsdp_auth_key {
    unsigned char k[FSDP_AUTH_KEY_BYTES];
};

/* Cryptographically random bytes (OpenSSL's RAND_bytes). 0 or an error. */
int fsdp_auth_random(void *buf, size_t n);

/* key = HMAC-SHA256(secret, "fsdpc key\0" context): a key per use (store,
 * tcp backend) and per job from one secret. secret may be empty (len 0):
 * then the key depends on context only, i.e. on public values. */
void fsdp_auth_derive(const void *secret, size_t len, const char *context,
                      struct fsdp_auth_key *out);

/* mac = HMAC-SHA256(key, label "\0" a b). */
void fsdp_auth_mac(const struct fsdp_auth_key *key, const char *label, const void *a,
                   size_t alen, const void *b, size_t blen, unsigned char mac[FSDP_AUTH_MAC_BYTES]);

/* 1 when the two MACs are equal, in time independent of where they differ. */
int fsdp_auth_mac_equal(const unsigned char *x, const unsigned char *y);

/* The user's secret from $FSDPC_SECRET or the file $FSDPC_SECRET_FILE
 * (which must be a regular file of the user's, not readable or writable by
 * group or others, FSDP_AUTH_SECRET_MIN to _MAX bytes, one trailing newline
 * dropped). Returns 1 with *len bytes in buf (FSDP_AUTH_SECRET_MAX bytes),
 * 0 when neither variable is set, or an error naming what is wrong. */
int fsdp_auth_user_secret(unsigned char *buf, size_t *len);

/* The per-user secret of a job whose ranks all run on this host as this
 * user: PATH = $XDG_RUNTIME_DIR/fsdpc/secret (else $HOME/.fsdpc/secret,
 * else /tmp/fsdpc-UID/secret), 32 random bytes (hex) written on first use
 * in a directory made 0700; the directory and the file must be this user's
 * and private (checked as for FSDPC_SECRET_FILE). 0 with the secret in buf
 * (FSDP_AUTH_SECRET_MAX bytes) and PATH in path, or an error naming it. */
int fsdp_auth_local_secret(unsigned char *buf, size_t *len, char *path, size_t path_len);

/* 1 when the user asked to run without a secret ($FSDPC_INSECURE=1). */
int fsdp_auth_insecure_allowed(void);

#endif
