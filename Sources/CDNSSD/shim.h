// DNS-SD (Bonjour) C API. On Linux it comes from Avahi's compatibility library
// (libavahi-compat-libdnssd-dev, pkg-config "avahi-compat-libdns_sd", library "dns_sd").
// See PeerSyncDiscovery for which calls the compat layer supports.
#ifndef PEERSYNC_CDNSSD_SHIM_H
#define PEERSYNC_CDNSSD_SHIM_H
#include <dns_sd.h>
#endif
