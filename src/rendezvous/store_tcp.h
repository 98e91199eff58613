/*
 * store_tcp.h - private to the TCP store (store_tcp.c: client,
 * store_tcp_server.c: server): the wire format.
 *
 * Every message, request or reply, is a 32-byte little-endian header
 * followed by klen key bytes and vlen value bytes:
 *     u32 magic "FSDS" | u16 version | u16 type | i64 arg | u32 klen |
 *     u32 reserved (0) | u64 vlen
 * A connection starts with a mutual challenge-response (auth.h): HELLO
 * carries the client's challenge, the server answers CHALLENGE with its own
 * challenge and its MAC over both, the client checks that MAC and sends
 * AUTH with its MAC; only then does the server answer OK and take
 * requests. The server refuses and closes a connection whose first bytes
 * are not this exchange with the right magic, version and MACs.
 * doc/rendezvous.md has the whole protocol.
 */
#ifndef FSDP_RENDEZVOUS_STORE_TCP_H
#define FSDP_RENDEZVOUS_STORE_TCP_H

#include "rendezvous/auth.h"

#include <stddef.h>
#include <stdint.h>

#define STCP_MAGIC 0x53445346u /* "FSDS" on the wire */
#define STCP_VERSION 2
#define STCP_HDR 32
#define STCP_HELLO_KEY_MAX 256
#define STCP_HELLO_TIMEOUT_S 10.0 /* a connection must say hello within this */
#define STCP_CONNECT_TRY_S 0.25   /* one connect attempt waits this long at most */
#define STCP_PREAUTH_REPLY_MAX 4096 /* value bytes of a reply before the server's proof */

enum stcp_type {
    STCP_HELLO = 1, /* key client description, value client challenge -> CHALLENGE */
    STCP_SET = 2,   /* key, value -> OK */
    STCP_GET = 3,   /* key, arg timeout ms -> VALUE | TIMEOUT */
    STCP_ADD = 4,   /* key, arg delta -> VALUE (arg result) | ERR */
    STCP_WAIT = 5,  /* value: keys, each NUL-terminated; arg timeout ms -> OK | TIMEOUT (key) */
    STCP_CHECK = 6, /* key -> VALUE (arg 0/1) */
    STCP_AUTH = 7,  /* value client MAC -> OK | ERR */
    STCP_R_OK = 64,
    STCP_R_VALUE = 65,
    STCP_R_TIMEOUT = 66,
    STCP_R_ERR = 67, /* value: message */
    STCP_R_CHALLENGE = 68, /* value: server challenge, server MAC */
};

/* MAC labels of the two directions (never equal: no reflection). */
#define STCP_LABEL_SERVER "fsdpc store server"
#define STCP_LABEL_CLIENT "fsdpc store client"

struct stcp_hdr {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    int64_t arg;
    uint32_t klen;
    uint32_t reserved;
    uint64_t vlen;
};

static inline void stcp_put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static inline uint64_t stcp_get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

static inline void stcp_pack(unsigned char *b, int type, int64_t arg, size_t klen, size_t vlen)
{
    stcp_put_le(b + 0, STCP_MAGIC, 4);
    stcp_put_le(b + 4, STCP_VERSION, 2);
    stcp_put_le(b + 6, (uint64_t)type, 2);
    stcp_put_le(b + 8, (uint64_t)arg, 8);
    stcp_put_le(b + 16, klen, 4);
    stcp_put_le(b + 20, 0, 4);
    stcp_put_le(b + 24, vlen, 8);
}

static inline void stcp_unpack(const unsigned char *b, struct stcp_hdr *h)
{
    h->magic = (uint32_t)stcp_get_le(b + 0, 4);
    h->version = (uint16_t)stcp_get_le(b + 4, 2);
    h->type = (uint16_t)stcp_get_le(b + 6, 2);
    h->arg = (int64_t)stcp_get_le(b + 8, 8);
    h->klen = (uint32_t)stcp_get_le(b + 16, 4);
    h->reserved = (uint32_t)stcp_get_le(b + 20, 4);
    h->vlen = stcp_get_le(b + 24, 8);
}

#endif
