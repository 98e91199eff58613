/*
 * netaddr.h - which local address a rank gives other hosts to reach it.
 *
 * The order (doc/cluster.md, "Addresses and interfaces"):
 *   1. $FSDPC_TCP_ADDR: this address (IPv4 or IPv6 literal, or a name)
 *   2. $FSDPC_SOCKET_IFNAME: the address of that interface (IPv4 first,
 *      else a global IPv6 address), as GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME
 *   3. every rank on this host: 127.0.0.1
 *   4. the route to the store (MASTER_ADDR, the host of tcp://, rank 0's
 *      store under mpi): the source address the kernel picks to reach it,
 *      found with a connected UDP socket (no packet is sent)
 *   5. else the first non-loopback address the host name resolves to, else
 *      the first non-loopback interface address
 * The choice, with the interface it belongs to and why, is what the tcp
 * backend listens on and advertises. Also here: a listening socket, and
 * an accepted peer's name and address without name lookups.
 */
#ifndef FSDP_RENDEZVOUS_NETADDR_H
#define FSDP_RENDEZVOUS_NETADDR_H

#include <stddef.h>
#include <sys/socket.h>

#define FSDP_NETADDR_IP_MAX 64 /* INET6_ADDRSTRLEN plus room */

struct fsdp_netaddr {
    char ip[FSDP_NETADDR_IP_MAX]; /* numeric, without brackets */
    int ipv6;
    char ifname[32];              /* interface holding ip ("" when none matches) */
    char how[96];                 /* "route to 10.0.0.1", "FSDPC_SOCKET_IFNAME=ib0", ... */
};

/* Chooses as above. route_to may be NULL or "" (no store address known);
 * one_host says that every rank of the job runs on this host. An error
 * names the variable that is wrong. */
int fsdp_netaddr_choose(const char *route_to, int one_host, struct fsdp_netaddr *out);

/* 1 when host (a name or numeric address) is a loopback address: 127/8,
 * ::1 (or IPv4-mapped 127/8), "localhost"; a name counts when every address
 * it resolves to does. */
int fsdp_netaddr_is_loopback(const char *host);

/* "ip:port", or "[ip]:port" for IPv6, into buf. */
void fsdp_netaddr_format(const char *ip, int port, char *buf, size_t len);

#define FSDP_NETADDR_SRC_BYTES 17 /* a family byte and 16 address bytes */

/* "addr:port" of an accepted peer into buf, without name lookups (cheap
 * enough for every connection of a flood), and its address alone into src
 * (IPv4 as IPv4-mapped, so one host compares equal on either socket) to
 * count connections by source. */
void fsdp_netaddr_peer(const struct sockaddr_storage *ss, char *buf, size_t len,
                       unsigned char src[FSDP_NETADDR_SRC_BYTES]);

/* A non-blocking listening socket on bind_host (NULL or "": every
 * interface) and port (0: any free one), backlog 1024; 0 with *fd_out and
 * the port bound, or an error whose message starts with who. */
int fsdp_netaddr_listen(const char *bind_host, int port, const char *who, int *fd_out,
                        int *bound_port);

#endif
