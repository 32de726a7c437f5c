package dist

import (
	"context"
	"net"
	"strings"
	"time"
)

// bindLookupTimeout bounds the name lookup of BindHost: a slow resolver
// must not hold up the start of a job.
const bindLookupTimeout = 5 * time.Second

// BindHost is the host the store should listen on for a job whose master
// address is masterAddr, chosen so that the other processes, which dial
// masterAddr, reach it and nobody else needlessly can:
//
//   - "", "localhost" or a loopback address → loopback ("127.0.0.1"; a
//     loopback address other than 127.0.0.1, such as ::1, is returned as
//     it is, since a dial to it would miss 127.0.0.1);
//   - a non-loopback address of this machine's interfaces, or a name
//     resolving to one → that address, so the store is reachable where
//     the job looks for it and on no other network;
//   - anything else → "0.0.0.0", every interface. The master address is
//     then a name or address this machine does not hold itself — a
//     load balancer's, a NAT's, a container's published one — which still
//     routes here; binding any one local address might miss the path
//     those connections arrive by. A name that fails to resolve, or
//     resolves only to loopback here (a hosts file mapping the machine's
//     own name to 127.0.1.1), lands here too: other machines may resolve
//     it to this one's real address. The token guards the store.
func BindHost(masterAddr string) string {
	ctx, cancel := context.WithTimeout(context.Background(), bindLookupTimeout)
	defer cancel()
	return bindHost(masterAddr, func(host string) ([]net.IP, error) {
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		ips := make([]net.IP, len(addrs))
		for i, a := range addrs {
			ips[i] = a.IP
		}
		return ips, err
	}, localIPs)
}

// localIPs are the addresses of this machine's interfaces.
func localIPs() []net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ips = append(ips, n.IP)
		}
	}
	return ips
}

func bindHost(masterAddr string, lookup func(string) ([]net.IP, error), local func() []net.IP) string {
	host := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(masterAddr), "["), "]")
	lower := strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" || lower == "localhost" || strings.HasSuffix(lower, ".localhost") {
		return loopback
	}
	isLocal := func(ip net.IP) bool {
		for _, m := range local() {
			if ip.Equal(m) {
				return true
			}
		}
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		switch {
		case ip.Equal(net.IPv4(127, 0, 0, 1)):
			return loopback
		case ip.IsLoopback() || isLocal(ip):
			return ip.String()
		}
		return "0.0.0.0"
	}
	ips, err := lookup(host)
	if err != nil {
		// Unknown here does not mean unreachable from elsewhere.
		return "0.0.0.0"
	}
	for _, ip := range ips {
		if !ip.IsLoopback() && isLocal(ip) {
			return ip.String()
		}
	}
	// A name that resolves only to loopback here (a hosts file mapping the
	// machine's own name to 127.0.1.1) may resolve to this machine's real
	// address elsewhere: only every interface serves both.
	return "0.0.0.0"
}
