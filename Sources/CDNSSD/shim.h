// DNS-SD (Bonjour) C API. On Linux it comes from Avahi's compatibility library
// (libavahi-compat-libdnssd-dev, pkg-config "avahi-compat-libdns_sd", library "dns_sd").
// See PeerSyncDiscovery for which calls the compat layer supports.
#ifndef PEERSYNC_CDNSSD_SHIM_H
#define PEERSYNC_CDNSSD_SHIM_H
// Avahi installs the header under avahi-compat-libdns_sd/; included by that path (not through
// pkg-config, whose -D_REENTRANT made SwiftPM print "prohibited flag(s)" on every build).
#if __has_include(<avahi-compat-libdns_sd/dns_sd.h>)
#include <avahi-compat-libdns_sd/dns_sd.h>
#else
#include <dns_sd.h>
#endif
#endif
