/*
 * store.h - the rendezvous key-value store (Gloo's store, torch's Store).
 *
 * Keys are strings, values are bytes. get() waits until the key exists, up
 * to a deadline. add() is an atomic counter (the value is the decimal text
 * of an int64). A prefixed view puts every key of a group under its own
 * namespace ("dp[1]/...") so groups never collide.
 *
 * Implementations: tcp (a server thread on rank 0; also what MPI launches use,
 * with the address broadcast by MPI), file (a directory on a shared file
 * system, stamped with the job nonce, every value written by atomic rename)
 * and mem (in-process, for single-rank jobs and tests).
 *
 * Timeouts: a negative timeout_s means the store's default (the one given
 * when it was created); 0 checks once. A timeout error names the key and the
 * time waited. All calls are thread-safe; a TCP client serializes its
 * requests, so a long get() delays other threads' requests on that store.
 * doc/rendezvous.md describes the protocol and the file layout.
 */
#ifndef FSDP_RENDEZVOUS_STORE_H
#define FSDP_RENDEZVOUS_STORE_H

#include <stddef.h>
#include <stdint.h>

struct fsdp_store;

struct fsdp_store_ops {
    size_t size;
    const char *name;
    int (*set)(struct fsdp_store *s, const char *key, const void *val, size_t len);
    /* Waits up to timeout_s for key; *val is malloc'd (caller frees). */
    int (*get)(struct fsdp_store *s, const char *key, void **val, size_t *len, double timeout_s);
    int (*add)(struct fsdp_store *s, const char *key, int64_t delta, int64_t *result);
    /* Waits up to timeout_s until every key exists. */
    int (*wait)(struct fsdp_store *s, const char *const *keys, size_t n, double timeout_s);
    int (*check)(struct fsdp_store *s, const char *key, int *exists);
    void (*destroy)(struct fsdp_store *s);
};

struct fsdp_store {
    const struct fsdp_store_ops *ops;
};

int fsdp_store_set(struct fsdp_store *s, const char *key, const void *val, size_t len);
int fsdp_store_get(struct fsdp_store *s, const char *key, void **val, size_t *len, double timeout_s);
int fsdp_store_add(struct fsdp_store *s, const char *key, int64_t delta, int64_t *result);
int fsdp_store_wait(struct fsdp_store *s, const char *const *keys, size_t n, double timeout_s);
int fsdp_store_check(struct fsdp_store *s, const char *key, int *exists);
void fsdp_store_destroy(struct fsdp_store *s);

/* A view of base with every key prefixed by prefix + "/". Destroying the
 * view leaves base alone. */
int fsdp_store_prefix(struct fsdp_store *base, const char *prefix, struct fsdp_store **out);

/* All `size` callers with the same key meet here (add + wait), or time out
 * with an error that says how many arrived. A key may be reused for
 * successive barriers of the same `size` callers (generations are counted). */
int fsdp_store_barrier(struct fsdp_store *s, const char *key, int size, double timeout_s);

/* In-process store; timeout_s is the default deadline of get/wait. */
int fsdp_store_mem_create(double timeout_s, struct fsdp_store **out);

/* TCP store. The server runs in a thread of the process that calls
 * fsdp_store_tcp_serve (rank 0); *port receives the bound port when 0 is
 * asked. Every client (rank 0 included) connects with fsdp_store_tcp_connect.
 * Client and server prove to each other that they hold `key` (auth.h) before
 * anything else; a connection that does not is refused. connect retries
 * until timeout_s (the server may start late); timeout_s is also the
 * client's default deadline. bind_host NULL means every IPv4 address. */
struct fsdp_store_server;
struct fsdp_auth_key;
int fsdp_store_tcp_serve(const char *bind_host, int port, const struct fsdp_auth_key *key,
                         struct fsdp_store_server **out, int *bound_port);
void fsdp_store_tcp_server_stop(struct fsdp_store_server *srv);
int fsdp_store_tcp_connect(const char *host, int port, const struct fsdp_auth_key *key,
                           double timeout_s, struct fsdp_store **out);

/* File store in directory `path` (created). rank 0 creates the job's
 * namespace and stamps it; other ranks only accept a stamp that carries the
 * launcher's job id (see dist.h) when there is one, else one written after
 * their own process start minus $FSDPC_FILE_STORE_SLACK seconds (default
 * 10), so a store left by an earlier job is reported (FSDP_ERR_STALE after
 * timeout_s) instead of being read. Rank 0 replaces a stamp it finds.
 * *nonce and secret (FSDP_AUTH_KEY_BYTES, may be NULL) receive the job's
 * nonce and random secret from the stamp (0600 in a 0700 directory). */
int fsdp_store_file_open(const char *path, int rank, int world_size, double timeout_s,
                         uint64_t *nonce, unsigned char *secret, struct fsdp_store **out);
/* Removes the job's files (called at a normal end by rank 0). */
int fsdp_store_file_cleanup(struct fsdp_store *s);

#endif
