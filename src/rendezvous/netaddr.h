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
 * backend listens on and advertises.
 */
#ifndef FSDP_RENDEZVOUS_NETADDR_H
#define FSDP_RENDEZVOUS_NETADDR_H

#include <stddef.h>

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

#endif
