/*
 * auth.c - the job secret and HMAC-SHA256 handshakes (auth.h). All the
 * cryptography is OpenSSL's: HMAC, SHA-256, RAND_bytes, CRYPTO_memcmp.
 */
#include "config.h"
#include "rendezvous/auth.h"
#include "core/error.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

int fsdp_auth_random(void *buf, size_t n)
{
    if (n > (size_t)1 << 20 || RAND_bytes(buf, (int)n) != 1) {
        return fsdp_err(FSDP_ERR_SYSTEM, "auth: no random bytes from OpenSSL (RAND_bytes failed)");
    }
    return 0;
}

/* HMAC-SHA256 of the concatenation of three pieces (OpenSSL's one-shot
 * HMAC; every message here is small). */
static void auth_hmac(const void *key, size_t klen, const void *p1, size_t l1, const void *p2,
                      size_t l2, const void *p3, size_t l3, unsigned char out[FSDP_AUTH_MAC_BYTES])
{
    static const unsigned char empty[1] = {0};
    unsigned char msg[2048];
    unsigned int olen = FSDP_AUTH_MAC_BYTES;
    size_t n = l1 + l2 + l3;
    int ok = n <= sizeof(msg);
    if (ok) {
        memcpy(msg, p1, l1);
        if (l2) {
            memcpy(msg + l1, p2, l2);
        }
        if (l3) {
            memcpy(msg + l1 + l2, p3, l3);
        }
        ok = HMAC(EVP_sha256(), klen ? key : empty, (int)klen, msg, n, out, &olen) != NULL;
    }
    if (!ok) {
        /* cannot happen with the callers' sizes: a MAC of random bytes
         * never matches, so the handshake fails rather than passes */
        RAND_bytes(out, FSDP_AUTH_MAC_BYTES);
    }
    OPENSSL_cleanse(msg, sizeof(msg));
}

void fsdp_auth_derive(const void *secret, size_t len, const char *context,
                      struct fsdp_auth_key *out)
{
    static const char label[] = "fsdpc key";
    auth_hmac(secret, len, label, sizeof(label), context, strlen(context), NULL, 0, out->k);
}

void fsdp_auth_mac(const struct fsdp_auth_key *key, const char *label, const void *a,
                   size_t alen, const void *b, size_t blen, unsigned char mac[FSDP_AUTH_MAC_BYTES])
{
    auth_hmac(key->k, sizeof(key->k), label, strlen(label) + 1, a, alen, b, blen, mac);
}

int fsdp_auth_mac_equal(const unsigned char *x, const unsigned char *y)
{
    return CRYPTO_memcmp(x, y, FSDP_AUTH_MAC_BYTES) == 0;
}

/* Checks and reads an open secret file; what names it in messages
 * ("FSDPC_SECRET_FILE=PATH"). 1 with the secret, or an error. */
static int auth_secret_fd(int fd, const char *what, unsigned char *buf, size_t *len)
{
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: %s", what, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = fsdp_err(FSDP_ERR_INVALID, "%s: not a regular file", what);
    } else if (st.st_uid != geteuid()) {
        rc = fsdp_err(FSDP_ERR_INVALID, "%s: owned by uid %u, not by this user (uid %u)", what,
                      (unsigned)st.st_uid, (unsigned)geteuid());
    } else if (st.st_mode & 077) {
        rc = fsdp_err(FSDP_ERR_INVALID, "%s: mode %04o lets group or others read or write it "
                      "(chmod 600 it)", what, (unsigned)(st.st_mode & 07777));
    } else if (st.st_size < FSDP_AUTH_SECRET_MIN || st.st_size > FSDP_AUTH_SECRET_MAX + 1) {
        rc = fsdp_err(FSDP_ERR_INVALID, "%s: %lld bytes (a secret has %d to %d; e.g. openssl "
                      "rand -hex 32 > FILE)", what, (long long)st.st_size,
                      FSDP_AUTH_SECRET_MIN, FSDP_AUTH_SECRET_MAX);
    } else {
        size_t n = 0;
        unsigned char tmp[FSDP_AUTH_SECRET_MAX + 1];
        while (n < (size_t)st.st_size) {
            ssize_t r = read(fd, tmp + n, (size_t)st.st_size - n);
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r <= 0) {
                break;
            }
            n += (size_t)r;
        }
        if (n > 0 && tmp[n - 1] == '\n') {
            n--;
        }
        if (n < FSDP_AUTH_SECRET_MIN || n > FSDP_AUTH_SECRET_MAX) {
            rc = fsdp_err(FSDP_ERR_INVALID, "%s: read %zu bytes of secret (need %d to %d)", what,
                          n, FSDP_AUTH_SECRET_MIN, FSDP_AUTH_SECRET_MAX);
        } else {
            memcpy(buf, tmp, n);
            *len = n;
            rc = 1;
        }
        OPENSSL_cleanse(tmp, sizeof(tmp));
    }
    return rc;
}

static int auth_secret_file(const char *path, unsigned char *buf, size_t *len)
{
    char what[PATH_MAX + 32];
    snprintf(what, sizeof(what), "FSDPC_SECRET_FILE=%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: %s", what, errno == ELOOP
                        ? "is a symbolic link (name the file itself)" : strerror(errno));
    }
    int rc = auth_secret_fd(fd, what, buf, len);
    close(fd);
    return rc;
}

int fsdp_auth_user_secret(unsigned char *buf, size_t *len)
{
    const char *s = getenv("FSDPC_SECRET");
    const char *f = getenv("FSDPC_SECRET_FILE");
    if (f && !*f) {
        return fsdp_err(FSDP_ERR_INVALID, "FSDPC_SECRET_FILE is set but empty: name the secret "
                        "file, or unset the variable");
    }
    if (s && f) {
        return fsdp_err(FSDP_ERR_INVALID, "both FSDPC_SECRET and FSDPC_SECRET_FILE are set: "
                        "set one");
    }
    if (f) {
        return auth_secret_file(f, buf, len);
    }
    if (!s) {
        return 0;
    }
    size_t n = strlen(s);
    if (n < FSDP_AUTH_SECRET_MIN || n > FSDP_AUTH_SECRET_MAX) {
        return fsdp_err(FSDP_ERR_INVALID, "FSDPC_SECRET has %zu characters (a secret has %d to "
                        "%d; e.g. openssl rand -hex 32)", n, FSDP_AUTH_SECRET_MIN,
                        FSDP_AUTH_SECRET_MAX);
    }
    memcpy(buf, s, n);
    *len = n;
    return 1;
}

// ----------------------------------------------------------------------------
// the per-user secret of one-host jobs

/* The per-user directory: $XDG_RUNTIME_DIR/fsdpc, else $HOME/.fsdpc, else
 * /tmp/fsdpc-UID; made 0700 when missing, and opened only when it is this
 * user's, not a link, and private. 0 with *dfd, or an error. */
static int auth_local_dir(char *dir, size_t len, int *dfd)
{
    const char *x = getenv("XDG_RUNTIME_DIR"), *h = getenv("HOME");
    if (x && x[0] == '/') {
        snprintf(dir, len, "%s/fsdpc", x);
    } else if (h && h[0] == '/') {
        snprintf(dir, len, "%s/.fsdpc", h);
    } else {
        snprintf(dir, len, "/tmp/fsdpc-%u", (unsigned)geteuid());
    }
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        return fsdp_err(FSDP_ERR_IO, "per-user secret: cannot create %s: %s", dir,
                        strerror(errno));
    }
    struct stat st;
    *dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*dfd < 0 || fstat(*dfd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 077)) {
        int e = errno;
        int bad = *dfd >= 0;
        if (*dfd >= 0) {
            close(*dfd);
        }
        return fsdp_err(FSDP_ERR_INVALID, "per-user secret: %s %s; it must be a directory of "
                        "this user's that only it can use (rm -r it, or set FSDPC_SECRET_FILE)",
                        dir, bad ? "is another user's or open to others" : e == ELOOP ||
                        e == ENOTDIR ? "is not a directory" : strerror(e));
    }
    return 0;
}

int fsdp_auth_local_secret(unsigned char *buf, size_t *len, char *path, size_t path_len)
{
    char dir[PATH_MAX - 32], tmp[64], what[PATH_MAX + 32];
    int dfd = -1;
    FSDP_CHECK(auth_local_dir(dir, sizeof(dir), &dfd));
    snprintf(path, path_len, "%s/secret", dir);
    snprintf(what, sizeof(what), "per-user secret %s", path);
    int fd = openat(dfd, "secret", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT) {
        /* first use: written whole under another name, then linked into
         * place, so that ranks starting together all read one secret */
        unsigned char r[FSDP_AUTH_KEY_BYTES];
        char hex[2 * FSDP_AUTH_KEY_BYTES + 2];
        snprintf(tmp, sizeof(tmp), ".secret-%d", (int)getpid());
        int w = fsdp_auth_random(r, sizeof(r)) == 0
                ? openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600) : -1;
        for (int i = 0; i < FSDP_AUTH_KEY_BYTES; i++) {
            snprintf(hex + 2 * i, 3, "%02x", r[i]);
        }
        hex[2 * FSDP_AUTH_KEY_BYTES] = '\n';
        if (w >= 0) {
            int ok = write(w, hex, 2 * FSDP_AUTH_KEY_BYTES + 1) == 2 * FSDP_AUTH_KEY_BYTES + 1;
            close(w);
            if (ok) {
                linkat(dfd, tmp, dfd, "secret", 0); /* EEXIST: another rank was first */
            }
            unlinkat(dfd, tmp, 0);
        }
        OPENSSL_cleanse(r, sizeof(r));
        OPENSSL_cleanse(hex, sizeof(hex));
        fd = openat(dfd, "secret", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    }
    close(dfd);
    if (fd < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: %s", what, strerror(errno));
    }
    int rc = auth_secret_fd(fd, what, buf, len);
    close(fd);
    return rc < 0 ? rc : 0;
}

int fsdp_auth_insecure_allowed(void)
{
    const char *s = getenv("FSDPC_INSECURE");
    return s && (strcmp(s, "1") == 0 || strcasecmp(s, "yes") == 0 || strcasecmp(s, "true") == 0);
}
