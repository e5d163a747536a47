// Where other machines reach an actor: the address it advertises to the coordinator (its
// mailbox endpoint) and the one its other listeners bind (the learner ranks' Gloo sockets).
//
// An actor is given the endpoint its mailbox binds (`orrery actor --endpoint`):
//   - tcp://HOST:PORT (a local tcp fleet: HOST is fleet.host): HOST;
//   - tcp://*:PORT (a wildcard bind, what `--emit slurm` and `--emit k8s` give): the
//     ORRERY_ADVERTISE_HOST environment variable when set (the k8s manifests set it to the pod
//     IP), else this machine's host name (a Slurm node's name; it must resolve to an address
//     the other nodes reach, not to loopback as Debian's /etc/hosts default 127.0.1.1 does);
//   - ipc:// or inproc:// (one machine): 127.0.0.1.
#pragma once

#include <string>

namespace orrery {

// This machine's host name (gethostname); "localhost" when it has none.
std::string LocalHostName();

// The host part of what other machines connect to (see above); IPv6 brackets removed.
std::string AdvertisedHost(const std::string& endpoint);

// The endpoint registered with the coordinator: a wildcard tcp bind with its host filled in
// (AdvertisedHost), every other endpoint as it is.
std::string AdvertisedEndpoint(const std::string& endpoint);

// True for a tcp endpoint that binds every interface (tcp://*:PORT).
bool IsWildcardTcp(const std::string& endpoint);

// The first globally routable address `host` resolves to, as text; "" when it resolves to none
// (or not at all). Not globally routable: loopback (127/8, ::1), private (10/8, 172.16/12,
// 192.168/16, fc00::/7), shared (100.64/10, carrier-grade NAT), link-local (169.254/16,
// fe80::/10), unspecified, and IANA's other IPv4 blocks that are not globally reachable
// (192.0.0/24, the TEST-NETs, 198.18/15, 240/4). The learner ranks' Gloo sockets refuse to listen
// on one that is routable (actors/rl/learner_comm.h).
std::string PublicAddressOf(const std::string& host);

// True when `host` resolves, and only to loopback addresses (127.0.0.0/8, ::1): other machines
// cannot reach a socket listening on it (Debian's /etc/hosts gives the host name 127.0.1.1).
bool ResolvesOnlyToLoopback(const std::string& host);

}  // namespace orrery
