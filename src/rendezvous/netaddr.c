/*
 * netaddr.c - which local address a rank gives other hosts (netaddr.h).
 */
#include "config.h"
#include "rendezvous/netaddr.h"
#include "core/error.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

static int na_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

int fsdp_netaddr_is_loopback(const char *host)
{
    if (!host || !*host) {
        return 0;
    }
    if (strcasecmp(host, "localhost") == 0) {
        return 1;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) {
        return 0;
    }
    int all = 1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        all = all && na_is_loopback(ai->ai_addr);
    }
    freeaddrinfo(res);
    return all;
}

/* A global address: not link-local (IPv6 fe80::/10 needs a scope id that
 * other hosts cannot use). */
static int na_usable(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET6) {
        return !IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    }
    return sa->sa_family == AF_INET;
}

static void na_set(struct fsdp_netaddr *out, const struct sockaddr *sa)
{
    const void *a = sa->sa_family == AF_INET6
                        ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                        : (const void *)&((const struct sockaddr_in *)sa)->sin_addr;
    inet_ntop(sa->sa_family, a, out->ip, sizeof(out->ip));
    out->ipv6 = sa->sa_family == AF_INET6;
}

static int na_same_addr(const struct sockaddr *x, const struct sockaddr *y)
{
    if (x->sa_family != y->sa_family) {
        return 0;
    }
    if (x->sa_family == AF_INET) {
        return ((const struct sockaddr_in *)x)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)y)->sin_addr.s_addr;
    }
    return x->sa_family == AF_INET6 &&
           memcmp(&((const struct sockaddr_in6 *)x)->sin6_addr,
                  &((const struct sockaddr_in6 *)y)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

/* The interface that holds out->ip, into out->ifname. */
static void na_find_ifname(struct fsdp_netaddr *out)
{
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST}, *res = NULL;
    struct ifaddrs *ifs = NULL;
    out->ifname[0] = '\0';
    if (getaddrinfo(out->ip, NULL, &hints, &res) != 0) {
        return;
    }
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (i->ifa_addr && na_same_addr(i->ifa_addr, res->ai_addr)) {
                snprintf(out->ifname, sizeof(out->ifname), "%s", i->ifa_name);
                break;
            }
        }
        freeifaddrs(ifs);
    }
    freeaddrinfo(res);
}

static int na_from_ifname(const char *name, struct fsdp_netaddr *out)
{
    struct ifaddrs *ifs = NULL;
    const struct sockaddr *v4 = NULL, *v6 = NULL;
    char names[256] = "";
    size_t used = 0;
    if (getifaddrs(&ifs) < 0) {
        return fsdp_err(FSDP_ERR_SYSTEM, "FSDPC_SOCKET_IFNAME=%s: cannot list the interfaces: "
                        "%s", name, strerror(errno));
    }
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET &&
                             i->ifa_addr->sa_family != AF_INET6)) {
            continue;
        }
        if (strcmp(i->ifa_name, name) == 0 && (i->ifa_flags & IFF_UP) && na_usable(i->ifa_addr)) {
            if (i->ifa_addr->sa_family == AF_INET && !v4) {
                v4 = i->ifa_addr;
            } else if (i->ifa_addr->sa_family == AF_INET6 && !v6) {
                v6 = i->ifa_addr;
            }
        }
        if (!strstr(names, i->ifa_name) && used + strlen(i->ifa_name) + 3 < sizeof(names)) {
            used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
                                     used ? ", " : "", i->ifa_name);
        }
    }
    int rc = 0;
    if (v4 || v6) {
        na_set(out, v4 ? v4 : v6);
        snprintf(out->ifname, sizeof(out->ifname), "%s", name);
        snprintf(out->how, sizeof(out->how), "FSDPC_SOCKET_IFNAME=%s", name);
    } else {
        rc = fsdp_err(FSDP_ERR_INVALID, "FSDPC_SOCKET_IFNAME=%s: no such interface that is up "
                      "and has an address on this host (interfaces: %s)", name, names);
    }
    freeifaddrs(ifs);
    return rc;
}

/* The source address the kernel would use towards host (a UDP connect
 * sends nothing). 0, or -1 when there is no route. */
static int na_route_to(const char *host, struct fsdp_netaddr *out)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (getaddrinfo(host, "9", &hints, &res) != 0) {
        return -1;
    }
    int rc = -1;
    for (struct addrinfo *ai = res; ai && rc < 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            na_set(out, (struct sockaddr *)&ss);
            rc = 0;
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    freeaddrinfo(res);
    return rc;
}

/* The first non-loopback address the host name resolves to, else of an
 * interface that is up. 0, or -1 when there is none. */
static int na_from_host_name(struct fsdp_netaddr *out)
{
    char host[256];
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (gethostname(host, sizeof(host) - 1) == 0 && getaddrinfo(host, NULL, &hints, &res) == 0) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            if (!na_is_loopback(ai->ai_addr) && na_usable(ai->ai_addr)) {
                na_set(out, ai->ai_addr);
                freeaddrinfo(res);
                snprintf(out->how, sizeof(out->how), "host name %.80s", host);
                return 0;
            }
        }
        freeaddrinfo(res);
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (i->ifa_addr && (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK) &&
                (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6) &&
                na_usable(i->ifa_addr)) {
                na_set(out, i->ifa_addr);
                snprintf(out->how, sizeof(out->how), "first interface that is up");
                freeifaddrs(ifs);
                return 0;
            }
        }
        freeifaddrs(ifs);
    }
    return -1;
}

int fsdp_netaddr_choose(const char *route_to, int one_host, struct fsdp_netaddr *out)
{
    memset(out, 0, sizeof(*out));
    const char *env = getenv("FSDPC_TCP_ADDR");
    const char *ifn = getenv("FSDPC_SOCKET_IFNAME");
    if (env && *env) {
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
        int g = getaddrinfo(env, NULL, &hints, &res);
        if (g != 0) {
            return fsdp_err(FSDP_ERR_INVALID, "FSDPC_TCP_ADDR='%s' is not an address or a "
                            "resolvable host name: %s", env, gai_strerror(g));
        }
        na_set(out, res->ai_addr);
        freeaddrinfo(res);
        snprintf(out->how, sizeof(out->how), "FSDPC_TCP_ADDR");
    } else if (ifn && *ifn) {
        FSDP_CHECK(na_from_ifname(ifn, out));
    } else if (one_host) {
        snprintf(out->ip, sizeof(out->ip), "127.0.0.1");
        snprintf(out->how, sizeof(out->how), "every rank on this host");
    } else if (route_to && *route_to && na_route_to(route_to, out) == 0 &&
               !fsdp_netaddr_is_loopback(out->ip)) {
        snprintf(out->how, sizeof(out->how), "route to %.80s", route_to);
    } else if (na_from_host_name(out) < 0) {
        snprintf(out->ip, sizeof(out->ip), "127.0.0.1");
        snprintf(out->how, sizeof(out->how), "no other address found");
    }
    if (!out->ifname[0]) {
        na_find_ifname(out);
    }
    return 0;
}

void fsdp_netaddr_format(const char *ip, int port, char *buf, size_t len)
{
    snprintf(buf, len, strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, port);
}

void fsdp_netaddr_peer(const struct sockaddr_storage *ss, char *buf, size_t len,
                       unsigned char src[FSDP_NETADDR_SRC_BYTES])
{
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    memset(src, 0, FSDP_NETADDR_SRC_BYTES);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
        src[11] = src[12] = 0xff;
        memcpy(src + 13, &a->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
        memcpy(src + 1, &a->sin6_addr, 16);
    }
    /* ::ffff:a.b.c.d, tested byte by byte (src + 1 is not aligned for an
     * in6_addr): an IPv4 peer on an IPv6 socket counts as itself */
    static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(src + 1, v4mapped, sizeof(v4mapped)) == 0) {
        src[0] = 4;
    }
    snprintf(buf, len, "%s:%u", host, port);
}

int fsdp_netaddr_listen(const char *bind_host, int port, const char *who, int *fd_out,
                        int *bound_port)
{
    struct addrinfo hints = {0}, *res = NULL;
    char ports[16];
    const char *host = bind_host && bind_host[0] ? bind_host : "0.0.0.0";
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(ports, sizeof(ports), "%d", port);
    int g = getaddrinfo(host, ports, &hints, &res);
    if (g != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: cannot resolve bind address '%s': %s", who,
                        host, gai_strerror(g));
    }
    int fd = socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return fsdp_err(FSDP_ERR_SYSTEM, "%s: socket: %s", who, strerror(errno));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) < 0) {
        int e = errno;
        close(fd);
        freeaddrinfo(res);
        return fsdp_err(e == EADDRINUSE ? FSDP_ERR_IO : FSDP_ERR_SYSTEM,
                        "%s: cannot bind %s:%d: %s%s", who, host, port, strerror(e),
                        e == EADDRINUSE ? " (another job or store on this port?)" : "");
    }
    freeaddrinfo(res);
    if (listen(fd, 1024) < 0) {
        int e = errno;
        close(fd);
        return fsdp_err(FSDP_ERR_SYSTEM, "%s: listen on port %d: %s", who, port,
                        strerror(e));
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}
