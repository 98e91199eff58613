/*
 * dist.c - the process's place in the job: picks the init method, learns
 * rank/size/local rank, brings up the rendezvous store and the job nonce,
 * installs the job-wide abort, and tears it all down at the end.
 *
 * This is the only file of src/ that includes mpi.h. It owns the store
 * server of rank 0 (TCP methods), the job's store handle, and MPI's life
 * when it was the one to start it. doc/rendezvous.md explains the methods.
 */
#include "config.h"
#include "rendezvous/dist.h"
#include "rendezvous/store.h"
#include "rendezvous/store_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <mpi.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DIST_MAX_ABORT_CBS 64
#define DIST_DEFAULT_TIMEOUT_S 300.0
#define DIST_FINALIZE_TIMEOUT_S 10.0

#define DIST_MAX_FINALIZE_CBS 8

struct dist_impl {
    struct fsdp_store_server *server; /* rank 0 of the TCP methods */
    char store_host[256];             /* where the TCP store is ("" for file://, one rank) */
    char store_desc[300];             /* "tcp 10.0.0.1:29500", "file /shared/x" */
    fsdp_dist_finalize_cb fin_cb[DIST_MAX_FINALIZE_CBS];
    void *fin_arg[DIST_MAX_FINALIZE_CBS];
    int n_fin;
};

/*
 * The abort callbacks. The abort can come from any thread at a bad moment,
 * so they sit in a fixed table and running them allocates nothing; the
 * table is static because the abort hook is process-wide anyway (one job per
 * process).
 */
static struct {
    pthread_mutex_t mu;
    fsdp_dist_abort_cb cb[DIST_MAX_ABORT_CBS];
    void *arg[DIST_MAX_ABORT_CBS];
    int n;
    int in_use; /* a fsdp_dist is alive */
} dist_abort = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int dist_mpi_up(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

int fsdp_dist_mpi_available(void)
{
    return dist_mpi_up();
}

static void dist_abort_hook(int exit_code, void *arg)
{
    (void)arg;
    const char *why = fsdp_err_msg();
    /* whatever the callbacks or MPI_Abort wait for, the process ends */
    fsdp_arm_hard_exit(exit_code);
    /* under the lock: a backend being destroyed meanwhile (off_abort) waits
     * until its callback has run, and never runs freed (no callback takes
     * this lock) */
    pthread_mutex_lock(&dist_abort.mu);
    int n = dist_abort.n;
    for (int i = 0; i < n && i < DIST_MAX_ABORT_CBS; i++) {
        if (dist_abort.cb[i]) {
            dist_abort.cb[i](dist_abort.arg[i], why[0] ? why : "job aborted");
        }
    }
    pthread_mutex_unlock(&dist_abort.mu);
    if (dist_mpi_up()) {
        MPI_Abort(MPI_COMM_WORLD, exit_code);
    }
    _exit(exit_code);
}

int fsdp_dist_on_abort(struct fsdp_dist *d, fsdp_dist_abort_cb cb, void *arg)
{
    (void)d;
    if (!cb) {
        return fsdp_err(FSDP_ERR_INVALID, "dist: NULL abort callback");
    }
    pthread_mutex_lock(&dist_abort.mu);
    if (dist_abort.n == DIST_MAX_ABORT_CBS) {
        pthread_mutex_unlock(&dist_abort.mu);
        return fsdp_err(FSDP_ERR_INVALID, "dist: more than %d abort callbacks",
                        DIST_MAX_ABORT_CBS);
    }
    dist_abort.arg[dist_abort.n] = arg;
    dist_abort.cb[dist_abort.n] = cb;
    dist_abort.n++;
    pthread_mutex_unlock(&dist_abort.mu);
    return 0;
}

int fsdp_dist_on_finalize(struct fsdp_dist *d, fsdp_dist_finalize_cb cb, void *arg)
{
    struct dist_impl *im = d->impl;
    for (int i = 0; i < im->n_fin; i++) {
        if (im->fin_cb[i] == cb && im->fin_arg[i] == arg) {
            return 0;
        }
    }
    if (im->n_fin == DIST_MAX_FINALIZE_CBS) {
        return fsdp_err(FSDP_ERR_INVALID, "dist: more than %d finalize callbacks",
                        DIST_MAX_FINALIZE_CBS);
    }
    im->fin_cb[im->n_fin] = cb;
    im->fin_arg[im->n_fin] = arg;
    im->n_fin++;
    return 0;
}

void fsdp_dist_off_abort(struct fsdp_dist *d, void *arg)
{
    (void)d;
    pthread_mutex_lock(&dist_abort.mu);
    int j = 0;
    for (int i = 0; i < dist_abort.n; i++) {
        if (dist_abort.arg[i] != arg) {
            dist_abort.cb[j] = dist_abort.cb[i];
            dist_abort.arg[j] = dist_abort.arg[i];
            j++;
        }
    }
    for (int i = j; i < dist_abort.n; i++) {
        dist_abort.cb[i] = NULL;
    }
    dist_abort.n = j;
    pthread_mutex_unlock(&dist_abort.mu);
}

const char *fsdp_dist_method_name(const struct fsdp_dist *d)
{
    switch (d ? d->method : FSDP_INIT_SINGLE) {
    case FSDP_INIT_MPI: return "mpi";
    case FSDP_INIT_ENV: return "env://";
    case FSDP_INIT_TCP: return "tcp://";
    case FSDP_INIT_FILE: return "file://";
    default: return "single";
    }
}

// ----------------------------------------------------------------------------
// the --init string and the environment

struct dist_spec {
    enum fsdp_init_method method;
    char host[256]; /* tcp:// */
    int port;
    char path[4096]; /* file:// */
};

static int dist_parse_port(const char *what, const char *s, int *port)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 65535) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: port '%s' is not a number in 1..65535", what, s);
    }
    *port = (int)v;
    return 0;
}

/* tcp://HOST:PORT or tcp://[V6]:PORT */
static int dist_parse_hostport(const char *init, const char *hp, struct dist_spec *sp)
{
    const char *colon;
    const char *host = hp;
    size_t hlen;
    if (hp[0] == '[') {
        const char *close = strchr(hp, ']');
        if (!close || close[1] != ':') {
            goto bad;
        }
        host = hp + 1;
        hlen = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(hp, ':');
        if (!colon) {
            goto bad;
        }
        hlen = (size_t)(colon - hp);
    }
    if (hlen == 0 || hlen >= sizeof(sp->host) || !colon[1]) {
        goto bad;
    }
    memcpy(sp->host, host, hlen);
    sp->host[hlen] = '\0';
    return dist_parse_port(init, colon + 1, &sp->port);
bad:
    return fsdp_err(FSDP_ERR_INVALID, "--init '%s': expected tcp://HOST:PORT", init);
}

int fsdp_dist_launcher_rank(void)
{
    static const char *const vars[] = {"PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                       "SLURM_PROCID", "RANK"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *s = getenv(vars[i]);
        if (s && *s) {
            return atoi(s);
        }
    }
    return 0;
}

int fsdp_dist_launcher_size(void)
{
    static const char *const vars[] = {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE",
                                       "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) {
            return atoi(v);
        }
    }
    return 1;
}

/* Which launcher started us, when init is auto. */
static enum fsdp_init_method dist_detect(char *why, size_t len)
{
    const char *size_vars[] = {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof(size_vars) / sizeof(size_vars[0]); i++) {
        const char *v = getenv(size_vars[i]);
        if (v && atoi(v) > 1) {
            snprintf(why, len, "%s=%s", size_vars[i], v);
            return FSDP_INIT_MPI;
        }
    }
    /* PMI-2/PMIx under srun: the PMI variables carry no size; SLURM's does */
    const char *pmi = getenv("PMI_FD") ? "PMI_FD" : getenv("PMIX_RANK") ? "PMIX_RANK"
                      : getenv("PMI_RANK") ? "PMI_RANK" : NULL;
    const char *ntasks = getenv("SLURM_NTASKS");
    if (pmi && ntasks && atoi(ntasks) > 1) {
        snprintf(why, len, "%s with SLURM_NTASKS=%s", pmi, ntasks);
        return FSDP_INIT_MPI;
    }
    if (pmi && !getenv("PMI_SIZE") && !ntasks && strcmp(pmi, "PMIX_RANK") == 0) {
        snprintf(why, len, "PMIX_RANK (size from MPI)");
        return FSDP_INIT_MPI;
    }
    if (getenv("RANK") || getenv("WORLD_SIZE")) {
        snprintf(why, len, "RANK/WORLD_SIZE");
        return FSDP_INIT_ENV;
    }
    if (getenv("SLURM_PROCID") && ntasks && atoi(ntasks) > 1) {
        snprintf(why, len, "SLURM_PROCID with SLURM_NTASKS=%s", ntasks);
        return FSDP_INIT_ENV;
    }
    snprintf(why, len, "no launcher");
    return FSDP_INIT_SINGLE;
}

static int dist_parse_init(const char *init, struct dist_spec *sp)
{
    char why[128];
    memset(sp, 0, sizeof(*sp));
    if (!init || !init[0] || strcmp(init, "auto") == 0) {
        sp->method = dist_detect(why, sizeof(why));
        FSDP_DEBUG(FSDP_SUB_DIST, "init auto: %s", why);
        return 0;
    }
    if (strcmp(init, "mpi") == 0) {
        sp->method = FSDP_INIT_MPI;
    } else if (strcmp(init, "env://") == 0 || strcmp(init, "env") == 0) {
        sp->method = FSDP_INIT_ENV;
    } else if (strncmp(init, "tcp://", 6) == 0) {
        sp->method = FSDP_INIT_TCP;
        FSDP_CHECK(dist_parse_hostport(init, init + 6, sp));
    } else if (strncmp(init, "file://", 7) == 0) {
        sp->method = FSDP_INIT_FILE;
        const char *path = init + 7;
        if (path[0] != '/' || strlen(path) >= sizeof(sp->path) - 64) {
            return fsdp_err(FSDP_ERR_INVALID, "--init '%s': expected file:///ABSOLUTE/PATH", init);
        }
        snprintf(sp->path, sizeof(sp->path), "%s", path);
    } else {
        return fsdp_err(FSDP_ERR_INVALID, "--init '%s': unknown method (expected auto, mpi, "
                        "env://, tcp://HOST:PORT or file:///PATH)", init);
    }
    return 0;
}

/* An integer environment variable in [lo, hi]; *set says whether it was there. */
static int dist_env_int(const char *name, long long lo, long long hi, int *out, int *set)
{
    const char *s = getenv(name);
    *set = s != NULL;
    if (!s) {
        return 0;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        return fsdp_err(FSDP_ERR_INVALID, "%s='%s' is not an integer", name, s);
    }
    if (v < lo || v > hi) {
        return fsdp_err(FSDP_ERR_INVALID, "%s=%lld is out of range (%lld..%lld)", name, v, lo, hi);
    }
    *out = (int)v;
    return 0;
}

/* RANK/WORLD_SIZE, else SLURM_PROCID/SLURM_NTASKS. */
static int dist_env_rank_size(const char *method, int *rank, int *size)
{
    const char *rn = "RANK", *wn = "WORLD_SIZE";
    int rset, wset;
    if (!getenv(rn) && !getenv(wn)) {
        rn = "SLURM_PROCID";
        wn = "SLURM_NTASKS";
    }
    FSDP_CHECK(dist_env_int(wn, 1, 1 << 24, size, &wset));
    FSDP_CHECK(dist_env_int(rn, 0, 1 << 24, rank, &rset));
    if (!rset && !wset) {
        return fsdp_err(FSDP_ERR_INVALID, "%s needs RANK and WORLD_SIZE (or SLURM_PROCID and "
                        "SLURM_NTASKS) in the environment", method);
    }
    if (!rset || !wset) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: %s is set but %s is not", method,
                        rset ? rn : wn, rset ? wn : rn);
    }
    if (*rank >= *size) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: %s=%d is not below %s=%d", method, rn, *rank, wn,
                        *size);
    }
    return 0;
}

/* An address of this host that other hosts can reach, for the MPI method:
 * $FSDPC_STORE_HOST, loopback on one host, else as netaddr.h chooses
 * (FSDPC_TCP_ADDR, FSDPC_SOCKET_IFNAME, the host name's address). */
static void dist_store_host(const struct fsdp_dist *d, char *buf, size_t len)
{
    const char *h = getenv("FSDPC_STORE_HOST");
    struct fsdp_netaddr na;
    if (h && h[0]) {
        snprintf(buf, len, "%s", h);
        return;
    }
    if (d->local_size == d->world_size) {
        snprintf(buf, len, "127.0.0.1"); /* one host: loopback always works */
        return;
    }
    if (fsdp_netaddr_choose(NULL, 0, &na) < 0) {
        fsdp_err_clear(); /* the same choice fails again later, with its message */
        snprintf(buf, len, "127.0.0.1");
        return;
    }
    if (strcmp(na.ip, "127.0.0.1") == 0) {
        FSDP_WARN(FSDP_SUB_DIST, "no non-loopback address found for host %s; the store uses "
                  "127.0.0.1 (set FSDPC_STORE_HOST or FSDPC_SOCKET_IFNAME for multi-host jobs)",
                  d->host);
    }
    snprintf(buf, len, "%s", na.ip);
}

// ----------------------------------------------------------------------------
// init methods

#define DIST_HOST_KEY_MAX 400

/* What makes two ranks neighbours: the host name, the kernel's boot id (two
 * machines that share a host name) and the network namespace (containers
 * or namespaces on one machine that share a host name but not a network). */
static void dist_host_key(const struct fsdp_dist *d, char *buf, size_t len)
{
    char boot[64] = "-", ns[64] = "-";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f)) {
            snprintf(boot, sizeof(boot), "-");
        }
        boot[strcspn(boot, "\n")] = '\0';
        fclose(f);
    }
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
    ns[n > 0 ? n : 0] = '\0';
    snprintf(buf, len, "%s|%s|%s", d->host, boot, ns);
}


/* d->job_key from the secret (len may be 0: no secret) and d->nonce. */
static void dist_job_key(struct fsdp_dist *d, const unsigned char *secret, size_t len)
{
    char ctx[64];
    snprintf(ctx, sizeof(ctx), "fsdpc job %016" PRIx64, d->nonce);
    fsdp_auth_derive(secret, len, ctx, &d->job_key);
}

static int dist_init_single(struct fsdp_dist *d, struct dist_impl *im)
{
    d->rank = 0;
    d->world_size = 1;
    d->local_rank = 0;
    d->local_size = 1;
    unsigned char secret[FSDP_AUTH_KEY_BYTES];
    d->nonce = fsdp_store_random64();
    FSDP_CHECK(fsdp_auth_random(secret, sizeof(secret)));
    dist_job_key(d, secret, sizeof(secret));
    d->authenticated = 1;
    snprintf(im->store_desc, sizeof(im->store_desc), "mem");
    return fsdp_store_mem_create(d->timeout_s, &d->store);
}

/* The MPI wire record that rank 0 broadcasts. */
struct dist_mpi_addr {
    int32_t status; /* 0, or rank 0's error code */
    int32_t port;
    uint64_t nonce;
    unsigned char secret[FSDP_AUTH_KEY_BYTES]; /* the job secret: MPI carries it */
    char host[256];
    char err[512];
};

static int dist_init_mpi(struct fsdp_dist *d, int *argc, char ***argv, struct dist_impl *im)
{
    int init = 0, fin = 0, provided = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (fin) {
        return fsdp_err(FSDP_ERR_INVALID, "init mpi: MPI was already finalized");
    }
    if (!init) {
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            return fsdp_err(FSDP_ERR_BACKEND, "init mpi: MPI_Init_thread failed");
        }
        d->mpi_initialized = 1;
        if (provided < MPI_THREAD_FUNNELED) {
            FSDP_WARN(FSDP_SUB_DIST, "MPI provides thread level %d, below MPI_THREAD_FUNNELED",
                      provided);
        }
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->world_size);
    fsdp_log_set_rank(d->rank);
    /* neighbours: MPI's shared-memory split, then the same host key (host
     * name, boot id, network namespace): namespaces or containers that MPI
     * sees as one node but that do not share a network are not */
    MPI_Comm shared, local;
    char hkey[DIST_HOST_KEY_MAX];
    dist_host_key(d, hkey, sizeof(hkey));
    int color = (int)(fsdp_hash64(hkey, strlen(hkey), 0) & 0x7fffffff);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared);
    MPI_Comm_split(shared, color, d->rank, &local);
    MPI_Comm_rank(local, &d->local_rank);
    MPI_Comm_size(local, &d->local_size);
    MPI_Comm_free(&local);
    MPI_Comm_free(&shared);

    /* rank 0 serves; every rank, rank 0 included, must reach the Bcast */
    struct dist_mpi_addr a;
    memset(&a, 0, sizeof(a));
    struct fsdp_auth_key skey;
    if (d->rank == 0) {
        long long want = fsdp_env_int("FSDPC_STORE_PORT", 0);
        a.nonce = fsdp_store_random64();
        a.status = fsdp_auth_random(a.secret, sizeof(a.secret));
        dist_store_host(d, a.host, sizeof(a.host));
        /* the store listens where the others are told to connect, not on
         * every interface ($FSDPC_STORE_BIND names another address) */
        if (a.status == 0) {
            fsdp_auth_derive(a.secret, sizeof(a.secret), "fsdpc store mpi", &skey);
            a.status = fsdp_store_tcp_serve(fsdp_env_str("FSDPC_STORE_BIND", a.host), (int)want,
                                            &skey, &im->server, &a.port);
        }
        if (a.status < 0) {
            fsdp_err_take(a.err, sizeof(a.err));
        }
    }
    MPI_Bcast(&a, (int)sizeof(a), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (a.status < 0) {
        a.err[sizeof(a.err) - 1] = '\0';
        return fsdp_err(a.status, "init mpi: rank 0 could not start the store: %s", a.err);
    }
    a.host[sizeof(a.host) - 1] = '\0';
    d->nonce = a.nonce;
    dist_job_key(d, a.secret, sizeof(a.secret));
    d->authenticated = 1;
    fsdp_auth_derive(a.secret, sizeof(a.secret), "fsdpc store mpi", &skey);
    memset(a.secret, 0, sizeof(a.secret));
    snprintf(im->store_desc, sizeof(im->store_desc), "tcp %s:%d", a.host, a.port);
    snprintf(im->store_host, sizeof(im->store_host), "%s", a.host);
    FSDP_CHECK(fsdp_store_tcp_connect(a.host, a.port, &skey, d->timeout_s, &d->store));
    return 0;
}

/* A job without a secret runs only where no one else can reach it: the
 * address the ranks connect to and, on rank 0 (bind not NULL), the address
 * the store listens on must both be loopback, else --insecure must say so. */
static int dist_check_secretless(const char *method, const char *host, const char *bind)
{
    const char *what = "the store address", *addr = host;
    if (fsdp_netaddr_is_loopback(host)) {
        if (!bind || fsdp_netaddr_is_loopback(bind)) {
            return 0;
        }
        what = "the store's listening address (FSDPC_STORE_BIND)";
        addr = bind;
    }
    if (!fsdp_auth_insecure_allowed()) {
        return fsdp_err(FSDP_ERR_AUTH, "%s: %s %s is not a loopback address and no job secret "
                        "is set: anyone who can reach it could join the job; set "
                        "FSDPC_SECRET_FILE (a 0600 file every rank reads; the job scripts make "
                        "one) or FSDPC_SECRET, or pass --insecure", method, what, addr);
    }
    FSDP_WARN(FSDP_SUB_DIST, "%s: no job secret (--insecure): the store at %s and the tcp "
              "backend accept any process that knows the job's address and size", method, addr);
    return 0;
}

/* env:// and tcp://. The store's key comes from the user's secret and what
 * every rank of the job shares (address, size, launcher job id), so that
 * two jobs with one secret stay apart; without a secret only a loopback
 * store (or --insecure) is allowed, keyed by the shared values alone. The
 * job nonce proper is random and published by rank 0 through the store. */
/* The job's nonce: drawn by rank 0, set in the store, read by every rank. */
static int dist_agree_nonce(struct fsdp_dist *d, const char *method)
{
    unsigned char nb[8];
    if (d->rank == 0) {
        uint64_t n = fsdp_store_random64();
        for (int i = 0; i < 8; i++) {
            nb[i] = (unsigned char)(n >> (8 * i));
        }
        FSDP_CHECK(fsdp_store_set(d->store, "fsdpc/nonce", nb, sizeof(nb)));
    }
    void *v;
    size_t len;
    FSDP_CHECK(fsdp_store_get(d->store, "fsdpc/nonce", &v, &len, d->timeout_s));
    if (len != 8) {
        free(v);
        return fsdp_err(FSDP_ERR_FORMAT, "%s: the job nonce in the store is %zu bytes", method,
                        len);
    }
    d->nonce = 0;
    for (int i = 0; i < 8; i++) {
        d->nonce |= (uint64_t)((unsigned char *)v)[i] << (8 * i);
    }
    free(v);
    return 0;
}

static int dist_init_tcp(struct fsdp_dist *d, const struct dist_spec *sp, struct dist_impl *im)
{
    const char *method = sp->method == FSDP_INIT_ENV ? "env://" : "tcp://";
    char host[256], job[256], seed[700];
    unsigned char secret[FSDP_AUTH_SECRET_MAX];
    size_t slen = 0;
    int port = sp->port;
    FSDP_CHECK(dist_env_rank_size(method, &d->rank, &d->world_size));
    fsdp_log_set_rank(d->rank);
    if (sp->method == FSDP_INIT_ENV) {
        const char *mp = getenv("MASTER_PORT");
        snprintf(host, sizeof(host), "%s", fsdp_env_str("MASTER_ADDR", "127.0.0.1"));
        if (mp) {
            FSDP_CHECK(dist_parse_port("MASTER_PORT", mp, &port));
        } else if (d->world_size > 1) {
            return fsdp_err(FSDP_ERR_INVALID, "env://: MASTER_PORT is not set (WORLD_SIZE=%d "
                            "needs the store's port)", d->world_size);
        }
    } else {
        snprintf(host, sizeof(host), "%s", sp->host);
    }
    int have = fsdp_auth_user_secret(secret, &slen);
    FSDP_CHECK(have);
    /* a one-rank job without a port keeps its store to itself */
    const int private_store = port == 0;
    /* the store listens on the address the others connect to, not on every
     * interface ($FSDPC_STORE_BIND names another) */
    const char *bind = private_store ? "127.0.0.1" : fsdp_env_str("FSDPC_STORE_BIND", host);
    char local[512] = "";
    if (!have && !private_store && fsdp_netaddr_is_loopback(host) &&
        fsdp_netaddr_is_loopback(bind) && !fsdp_auth_insecure_allowed()) {
        /* every rank is on this host: other users are kept out by a secret
         * only this user can read */
        FSDP_CHECK(fsdp_auth_local_secret(secret, &slen, local, sizeof(local)));
        have = 1;
    }
    if (!have && !private_store) {
        FSDP_CHECK(dist_check_secretless(method, host, d->rank == 0 ? bind : NULL));
    }
    d->authenticated = have;
    fsdp_store_job_id(job, sizeof(job));
    snprintf(seed, sizeof(seed), "fsdpc store|%s|%d|%d|%s", host, port, d->world_size, job);
    struct fsdp_auth_key skey;
    fsdp_auth_derive(secret, slen, seed, &skey);

    if (d->rank == 0) {
        FSDP_CHECK(fsdp_store_tcp_serve(bind, port, &skey, &im->server, &port));
    }
    snprintf(im->store_desc, sizeof(im->store_desc), "tcp %s:%d%s", host, port,
             local[0] ? " (per-user secret)" : have ? "" : " (no secret)");
    snprintf(im->store_host, sizeof(im->store_host), "%s", private_store ? "" : host);
    FSDP_CHECK(fsdp_store_tcp_connect(private_store ? "127.0.0.1" : host, port, &skey,
                                      d->timeout_s, &d->store));
    /* a second job that reuses this address (and its size, and has no job
     * id) gets past the hello; it must not mingle with the first */
    int64_t joined = 0;
    FSDP_CHECK(fsdp_store_add(d->store, "fsdpc/joined", 1, &joined));
    if (joined > d->world_size) {
        return fsdp_err(FSDP_ERR_MISMATCH, "%s: the store at %s:%d already has all %d ranks of "
                        "its job: another job uses this address (set FSDPC_JOB_ID, or another "
                        "port)", method, host, port, d->world_size);
    }
    FSDP_CHECK(dist_agree_nonce(d, method));
    /* without a secret the job key is derived from the nonce alone, which
     * any client that passed the (public) store handshake can read */
    dist_job_key(d, secret, slen);
    memset(secret, 0, sizeof(secret));
    return 0;
}

static int dist_init_file(struct fsdp_dist *d, const struct dist_spec *sp, struct dist_impl *im)
{
    FSDP_CHECK(dist_env_rank_size("file://", &d->rank, &d->world_size));
    fsdp_log_set_rank(d->rank);
    snprintf(im->store_desc, sizeof(im->store_desc), "file %.280s", sp->path);
    unsigned char secret[FSDP_AUTH_SECRET_MAX];
    size_t slen = 0;
    FSDP_CHECK(fsdp_store_file_open(sp->path, d->rank, d->world_size, d->timeout_s, &d->nonce,
                                    secret, &d->store));
    slen = FSDP_AUTH_KEY_BYTES;
    /* the user's secret, where named, wins over the stamp's */
    int have = fsdp_auth_user_secret(secret, &slen);
    FSDP_CHECK(have);
    if (!have) {
        slen = FSDP_AUTH_KEY_BYTES;
    }
    dist_job_key(d, secret, slen);
    d->authenticated = 1;
    memset(secret, 0, sizeof(secret));
    return 0;
}

/*
 * Local rank and size without MPI: every rank publishes its host key (host
 * name, boot id, network namespace), rank 0 numbers the ranks of each key
 * in rank order and publishes the map (int32 local rank, local size per
 * rank). The launcher's LOCAL_RANK, LOCAL_WORLD_SIZE or SLURM_LOCALID win
 * where set.
 */
static int dist_local_ranks(struct fsdp_dist *d)
{
    char key[64], mine[DIST_HOST_KEY_MAX];
    void *v = NULL;
    size_t len;
    int rc = 0;
    dist_host_key(d, mine, sizeof(mine));
    snprintf(key, sizeof(key), "fsdpc/host/%d", d->rank);
    FSDP_CHECK(fsdp_store_set(d->store, key, mine, strlen(mine)));
    if (d->rank == 0) {
        size_t n = (size_t)d->world_size;
        unsigned char *map = malloc(8 * n);
        struct fsdp_kv count;
        if (!map || fsdp_kv_init(&count) < 0) {
            free(map);
            return fsdp_err(FSDP_ERR_NOMEM, "dist: host map of %zu ranks: out of memory", n);
        }
        int64_t *lr = (int64_t *)malloc(n * sizeof(*lr));
        char (*hosts)[DIST_HOST_KEY_MAX] = malloc(n * sizeof(*hosts));
        for (size_t r = 0; r < n && rc == 0 && lr && hosts; r++) {
            snprintf(key, sizeof(key), "fsdpc/host/%zu", r);
            rc = fsdp_store_get(d->store, key, &v, &len, d->timeout_s);
            if (rc == 0) {
                if (len >= sizeof(hosts[r])) {
                    len = sizeof(hosts[r]) - 1;
                }
                memcpy(hosts[r], v, len);
                hosts[r][len] = '\0';
                free(v);
                if (fsdp_kv_add(&count, hosts[r], 1, &lr[r]) < 0) {
                    rc = fsdp_err(FSDP_ERR_NOMEM, "dist: host map: out of memory");
                }
            }
        }
        if (!lr || !hosts) {
            rc = fsdp_err(FSDP_ERR_NOMEM, "dist: host map of %zu ranks: out of memory", n);
        }
        for (size_t r = 0; r < n && rc == 0; r++) {
            int64_t size = 0;
            fsdp_kv_add(&count, hosts[r], 0, &size);
            for (int i = 0; i < 4; i++) {
                map[8 * r + (size_t)i] = (unsigned char)((uint64_t)(lr[r] - 1) >> (8 * i));
                map[8 * r + 4 + (size_t)i] = (unsigned char)((uint64_t)size >> (8 * i));
            }
        }
        if (rc == 0) {
            rc = fsdp_store_set(d->store, "fsdpc/hostmap", map, 8 * n);
        }
        fsdp_kv_free(&count);
        free(hosts);
        free(lr);
        free(map);
        FSDP_CHECK(rc);
    }
    FSDP_CHECK(fsdp_store_get(d->store, "fsdpc/hostmap", &v, &len, d->timeout_s));
    if (len != 8 * (size_t)d->world_size) {
        free(v);
        return fsdp_err(FSDP_ERR_FORMAT, "dist: host map of %zu bytes for %d ranks", len,
                        d->world_size);
    }
    const unsigned char *m = (const unsigned char *)v + 8 * (size_t)d->rank;
    d->local_rank = (int)(m[0] | m[1] << 8 | m[2] << 16 | (uint32_t)m[3] << 24);
    d->local_size = (int)(m[4] | m[5] << 8 | m[6] << 16 | (uint32_t)m[7] << 24);
    free(v);

    int set, lrank = d->local_rank, lsize = d->local_size;
    FSDP_CHECK(dist_env_int("LOCAL_RANK", 0, 1 << 20, &lrank, &set));
    if (!set) {
        FSDP_CHECK(dist_env_int("SLURM_LOCALID", 0, 1 << 20, &lrank, &set));
    }
    FSDP_CHECK(dist_env_int("LOCAL_WORLD_SIZE", 1, 1 << 20, &lsize, &set));
    if (lrank >= lsize) {
        return fsdp_err(FSDP_ERR_INVALID, "local rank %d is not below the local size %d "
                        "(LOCAL_RANK/SLURM_LOCALID, LOCAL_WORLD_SIZE)", lrank, lsize);
    }
    d->local_rank = lrank;
    d->local_size = lsize;
    return 0;
}

int fsdp_dist_init(int *argc, char ***argv, const char *init, double timeout_s,
                   struct fsdp_dist **out)
{
    struct dist_spec sp;
    int rc;
    FSDP_CHECK(dist_parse_init(init, &sp));
    pthread_mutex_lock(&dist_abort.mu);
    int busy = dist_abort.in_use;
    dist_abort.in_use = 1;
    pthread_mutex_unlock(&dist_abort.mu);
    if (busy) {
        return fsdp_err(FSDP_ERR_INVALID, "dist: already initialized in this process");
    }
    struct fsdp_dist *d = calloc(1, sizeof(*d));
    struct dist_impl *im = calloc(1, sizeof(*im));
    if (!d || !im) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "dist: out of memory");
        goto err_free;
    }
    d->impl = im;
    d->method = sp.method;
    d->timeout_s = timeout_s > 0 ? timeout_s
                                 : fsdp_env_double("FSDPC_TIMEOUT", DIST_DEFAULT_TIMEOUT_S);
    if (gethostname(d->host, sizeof(d->host) - 1) < 0) {
        snprintf(d->host, sizeof(d->host), "localhost");
    }
    /* from here a program's fsdp_die aborts the whole job, MPI included */
    fsdp_set_abort_hook(dist_abort_hook, NULL);
    /* an address or interface variable that cannot work fails before any
     * rendezvous, on every rank that has it (the real choice comes once
     * the store is up) */
    if (getenv("FSDPC_TCP_ADDR") || getenv("FSDPC_SOCKET_IFNAME")) {
        FSDP_CHECK_GOTO(fsdp_netaddr_choose(NULL, 0, &d->addr), rc, err_free);
    }

    switch (sp.method) {
    case FSDP_INIT_MPI: FSDP_CHECK_GOTO(dist_init_mpi(d, argc, argv, im), rc, err_store); break;
    case FSDP_INIT_ENV:
    case FSDP_INIT_TCP: FSDP_CHECK_GOTO(dist_init_tcp(d, &sp, im), rc, err_store); break;
    case FSDP_INIT_FILE: FSDP_CHECK_GOTO(dist_init_file(d, &sp, im), rc, err_store); break;
    default: FSDP_CHECK_GOTO(dist_init_single(d, im), rc, err_store); break;
    }
    if (sp.method != FSDP_INIT_MPI && sp.method != FSDP_INIT_SINGLE) {
        FSDP_CHECK_GOTO(dist_local_ranks(d), rc, err_store);
    }
    FSDP_CHECK_GOTO(fsdp_netaddr_choose(im->store_host, d->local_size == d->world_size, &d->addr),
                    rc, err_store);
    fsdp_log_set_rank(d->rank);
    FSDP_INFO(FSDP_SUB_DIST, "rank %d of %d (local %d of %d) on %s; init %s; store %s; address "
              "%s%s%s (%s)", d->rank, d->world_size, d->local_rank, d->local_size, d->host,
              fsdp_dist_method_name(d), im->store_desc, d->addr.ip, d->addr.ifname[0] ? " on " : "",
              d->addr.ifname, d->addr.how);
    *out = d;
    return 0;

err_store:
    /* MPI stays up (and the abort hook with it): the caller's fsdp_die must
     * still be able to take the other ranks down */
    fsdp_store_destroy(d->store);
    fsdp_store_tcp_server_stop(im->server);
err_free:
    free(im);
    free(d);
    pthread_mutex_lock(&dist_abort.mu);
    dist_abort.in_use = 0;
    pthread_mutex_unlock(&dist_abort.mu);
    return rc;
}

/*
 * Orderly end: a store barrier (bounded: a dead peer costs at most the
 * finalize timeout, never a hang), then every rank but 0 says it is leaving
 * and rank 0 waits, briefly, until all have, so that nobody's last request
 * meets a stopped server or a removed file store.
 */
static int dist_finalize_sync(struct fsdp_dist *d)
{
    double t = fsdp_env_double("FSDPC_FINALIZE_TIMEOUT", DIST_FINALIZE_TIMEOUT_S);
    if (t > d->timeout_s) {
        t = d->timeout_s;
    }
    FSDP_CHECK(fsdp_store_barrier(d->store, "fsdpc/finalize", d->world_size, t));
    if (d->rank != 0) {
        FSDP_CHECK(fsdp_store_add(d->store, "fsdpc/finalize/left", 1, NULL));
        return 0;
    }
    double deadline = fsdp_now() + (t < 5.0 ? t : 5.0);
    int64_t left = 0;
    while (left < d->world_size - 1) {
        FSDP_CHECK(fsdp_store_add(d->store, "fsdpc/finalize/left", 0, &left));
        if (fsdp_now() > deadline) {
            return fsdp_err(FSDP_ERR_TIMEOUT, "finalize: %" PRId64 " of %d ranks left the "
                            "store", left, d->world_size - 1);
        }
        if (left < d->world_size - 1) {
            usleep(2000);
        }
    }
    return 0;
}

void fsdp_dist_finalize(struct fsdp_dist *d)
{
    if (!d) {
        return;
    }
    struct dist_impl *im = d->impl;
    int ok = 1;
    for (int i = 0; i < im->n_fin; i++) {
        im->fin_cb[i](im->fin_arg[i]); /* e.g. the debug layer's summary and exit dump */
    }
    if (d->world_size > 1 && dist_finalize_sync(d) < 0) {
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        FSDP_WARN(FSDP_SUB_DIST, "finalize without all ranks: %s", msg);
        ok = 0;
    }
    if (ok && d->rank == 0 && d->method == FSDP_INIT_FILE) {
        if (fsdp_store_file_cleanup(d->store) < 0) {
            char msg[512];
            fsdp_err_take(msg, sizeof(msg));
            FSDP_WARN(FSDP_SUB_DIST, "file store cleanup: %s", msg);
        }
    }
    fsdp_store_destroy(d->store);
    fsdp_store_tcp_server_stop(im->server);
    fsdp_set_abort_hook(NULL, NULL);
    if (d->mpi_initialized && dist_mpi_up()) {
        if (ok) {
            MPI_Finalize();
        } else {
            /* MPI_Finalize may wait for ranks that are gone */
            FSDP_WARN(FSDP_SUB_DIST, "skipping MPI_Finalize: not every rank reached finalize");
        }
    }
    pthread_mutex_lock(&dist_abort.mu);
    dist_abort.n = 0;
    dist_abort.in_use = 0;
    pthread_mutex_unlock(&dist_abort.mu);
    free(im);
    free(d);
}
