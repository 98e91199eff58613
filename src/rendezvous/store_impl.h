/*
 * store_impl.h - private to the store implementations (store.c, store_tcp.c,
 * store_file.c): limits, key checks, and the key-value table that both the
 * in-process store and the TCP store server keep their data in.
 *
 * The table is not thread-safe; its owner serializes access (a mutex in the
 * in-process store, the single server thread in the TCP store).
 */
#ifndef FSDP_RENDEZVOUS_STORE_IMPL_H
#define FSDP_RENDEZVOUS_STORE_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* Keys are 1..FSDP_STORE_MAX_KEY bytes with no NUL. */
#define FSDP_STORE_MAX_KEY 1024
/* The TCP store refuses larger values (the file store has no limit). */
#define FSDP_STORE_MAX_VALUE ((uint64_t)1 << 32)
/* add() values are the decimal text of an int64: at most 20 characters. */
#define FSDP_STORE_INT_CHARS 24

struct fsdp_kv_entry {
    struct fsdp_kv_entry *next;
    uint64_t hash;
    void *val; /* (len,) bytes, malloc'd; never NULL */
    size_t len;
    char key[]; /* NUL-terminated */
};

struct fsdp_kv {
    struct fsdp_kv_entry **buckets; /* (nbuckets,) chains */
    size_t nbuckets;                /* a power of two */
    size_t count;
};

int fsdp_kv_init(struct fsdp_kv *kv);
void fsdp_kv_free(struct fsdp_kv *kv);
struct fsdp_kv_entry *fsdp_kv_find(const struct fsdp_kv *kv, const char *key);
/* Stores val (malloc'd, len bytes; ownership moves to the table, also on
 * failure). Returns 0 or FSDP_ERR_NOMEM, without recording a message. */
int fsdp_kv_set(struct fsdp_kv *kv, const char *key, void *val, size_t len);
/* Adds delta to the integer held by key (absent = 0). Returns 0,
 * FSDP_ERR_FORMAT (the value is not an integer), FSDP_ERR_INVALID (int64
 * overflow) or FSDP_ERR_NOMEM, without recording a message. */
int fsdp_kv_add(struct fsdp_kv *kv, const char *key, int64_t delta, int64_t *result);

/* Parses the decimal text of an add() counter (len bytes). 0 or -1. */
int fsdp_store_parse_int(const void *val, size_t len, int64_t *out);

/* Checks a key argument; records "store: bad key ..." on failure. */
int fsdp_store_check_key(const char *key);

/* The launcher's job id ("" when none): $FSDPC_JOB_ID, else
 * $SLURM_JOB_ID.$SLURM_STEP_ID, else $TORCHELASTIC_RUN_ID. */
void fsdp_store_job_id(char *buf, size_t len);

/* Random 64-bit value from the kernel (getrandom, /dev/urandom fallback). */
uint64_t fsdp_store_random64(void);

#endif
