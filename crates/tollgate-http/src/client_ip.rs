//! The client's address: the socket peer's, or, only through trusted proxies,
//! the one the forwarding headers name.
//!
//! A forwarding header is just text the client can write. It is read only when
//! the socket peer is a configured trusted proxy, and then from the right: each
//! trusted proxy appends the address it saw, so the right-most address that is
//! not itself a trusted proxy is the first one no trusted hop vouches for, the
//! client. Anything to its left was written by the client and is ignored.
//!
//! - An entry that is not an address (`unknown`, an obfuscated `_name`, a typo)
//!   ends the walk: nothing to its left can be believed, and the client is the
//!   last trusted hop reached (the proxy that wrote it).
//! - When every hop is a trusted proxy, the left-most one is the client.
//! - Only one header is read, the one the proxies are configured to write
//!   ([`ForwardedHeader`]): reading a header the proxies pass through untouched
//!   would let the client choose its own address.
//! - IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`) are IPv4 addresses.
//! - IPv6 clients are keyed by their /64 by default: one host usually has a
//!   whole /64 and can pick a fresh address per request.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;
use http::header::FORWARDED;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// `X-Forwarded-For`.
const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// Which forwarding header the trusted proxies write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (NGINX, HAProxy, Envoy, most
    /// load balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`; only the
    /// `for` parameter is read.
    Forwarded,
}

/// How to find a request's client address and key it.
#[derive(Debug, Clone)]
pub struct ClientIpConfig {
    trusted: Vec<IpNet>,
    header: ForwardedHeader,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

impl Default for ClientIpConfig {
    /// No trusted proxy (the peer address is the client), `X-Forwarded-For`
    /// once proxies are trusted, IPv4 clients by address, IPv6 clients by /64.
    fn default() -> Self {
        Self {
            trusted: Vec::new(),
            header: ForwardedHeader::default(),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }
}

impl ClientIpConfig {
    /// The default: trust no proxy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the proxies in `nets` (in addition to any already trusted).
    pub fn trust(mut self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        self.trusted.extend(nets.into_iter().map(|n| n.trunc()));
        self
    }

    /// Reads `header` from trusted proxies.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Keys IPv6 clients by their network of `len` bits (default 64, at most 128).
    pub fn ipv6_prefix(mut self, len: u8) -> Self {
        self.ipv6_prefix = len.min(128);
        self
    }

    /// Keys IPv4 clients by their network of `len` bits (default 32, at most 32).
    pub fn ipv4_prefix(mut self, len: u8) -> Self {
        self.ipv4_prefix = len.min(32);
        self
    }

    /// The trusted proxy networks.
    pub fn trusted(&self) -> &[IpNet] {
        &self.trusted
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client's address, from the socket `peer` and the request `headers`.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.is_trusted(peer) {
            return peer;
        }
        let hops = match self.header {
            ForwardedHeader::XForwardedFor => x_forwarded_for(headers),
            ForwardedHeader::Forwarded => forwarded(headers),
        };
        let mut client = peer;
        for hop in hops.iter().rev() {
            let Some(ip) = hop else {
                return client;
            };
            client = canonical(*ip);
            if !self.is_trusted(client) {
                return client;
            }
        }
        client
    }

    /// The rate limit key of a client address: the address itself, or its
    /// network (`2001:db8:1:2::/64`) when the configured prefix is shorter
    /// than the address.
    pub fn key(&self, ip: IpAddr) -> String {
        match canonical(ip) {
            IpAddr::V4(v4) if self.ipv4_prefix < 32 => Ipv4Net::new(v4, self.ipv4_prefix)
                .expect("prefix clamped to 32")
                .trunc()
                .to_string(),
            IpAddr::V6(v6) if self.ipv6_prefix < 128 => Ipv6Net::new(v6, self.ipv6_prefix)
                .expect("prefix clamped to 128")
                .trunc()
                .to_string(),
            other => IpText::new(other).as_str().to_owned(),
        }
    }

    /// [`ClientIpConfig::key`] of [`ClientIpConfig::client_ip`].
    pub fn client_key(&self, peer: IpAddr, headers: &HeaderMap) -> String {
        self.key(self.client_ip(peer, headers))
    }
}

/// An IP address as text, written on the stack. An IPv4 address is written
/// digit by digit: `Display` takes about a thousand instructions for one,
/// and the gateway writes the client's address for its key and for each
/// forwarding header of every request. IPv6 goes through `Display`.
#[derive(Clone, Copy)]
pub struct IpText {
    /// Room for the longest, `ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff`.
    buf: [u8; 39],
    len: usize,
}

impl IpText {
    /// `ip` as text, as its `Display` writes it.
    pub fn new(ip: IpAddr) -> Self {
        let mut text = Self {
            buf: [0; 39],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b'.');
                    }
                    if octet >= 100 {
                        text.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        text.push(b'0' + octet / 10 % 10);
                    }
                    text.push(b'0' + octet % 10);
                }
            }
            IpAddr::V6(v6) => {
                use std::io::Write;
                let mut rest = &mut text.buf[..];
                // The buffer holds the longest IPv6 text: this cannot fail.
                let _ = write!(rest, "{v6}");
                let left = rest.len();
                text.len = text.buf.len() - left;
            }
        }
        text
    }

    fn push(&mut self, byte: u8) {
        self.buf[self.len] = byte;
        self.len += 1;
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits, dots, colons and hex digits are written.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

/// IPv4-mapped IPv6 addresses as the IPv4 addresses they are.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One node of a forwarding chain: `192.0.2.1`, `192.0.2.1:80`,
/// `2001:db8::1`, `[2001:db8::1]` or `[2001:db8::1]:443`; `None` for anything
/// else (`unknown`, `_hidden`, garbage).
fn node(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Ok(ip) = IpAddr::from_str(text) {
        return Some(ip);
    }
    if let Ok(socket) = SocketAddr::from_str(text) {
        return Some(socket.ip());
    }
    text.strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .and_then(|t| IpAddr::from_str(t).ok())
}

/// Every `X-Forwarded-For` line, joined in order, split at commas.
fn x_forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let mut hops = Vec::new();
    for value in headers.get_all(X_FORWARDED_FOR) {
        match value.to_str() {
            Ok(text) => hops.extend(text.split(',').map(node)),
            Err(_) => hops.push(None),
        }
    }
    hops
}

/// The `for` of every element of every `Forwarded` line, in order.
fn forwarded(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let mut hops = Vec::new();
    for value in headers.get_all(FORWARDED) {
        let Ok(text) = value.to_str() else {
            hops.push(None);
            continue;
        };
        for element in split_unquoted(text, ',') {
            let for_value = split_unquoted(element, ';').into_iter().find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| unquote(value.trim()))
            });
            hops.push(for_value.and_then(|v| node(&v)));
        }
    }
    hops
}

/// Splits at `delimiter` outside double-quoted strings (which may escape with `\`).
fn split_unquoted(text: &str, delimiter: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == delimiter && !quoted => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// A token as is, or a quoted string without its quotes and escapes.
fn unquote(value: &str) -> String {
    let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        return value.to_owned();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' {
            chars.next().unwrap_or('\\')
        } else {
            c
        });
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn ip_text_is_what_display_writes() {
        for ip in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.0.9",
            "1.20.100.7",
            "192.168.10.250",
            "::",
            "::1",
            "2001:db8::1",
            "::ffff:192.0.2.1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe80:1234:5678:9abc:def0:1234:5678:9abc",
        ] {
            let ip: IpAddr = ip.parse().expect("an address");
            assert_eq!(super::IpText::new(ip).as_str(), ip.to_string());
        }
    }

    use std::net::{Ipv4Addr, Ipv6Addr};

    use http::HeaderValue;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: &str, values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn behind_proxies() -> ClientIpConfig {
        ClientIpConfig::new().trust(["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()])
    }

    #[test]
    fn a_spoofed_header_from_an_untrusted_peer_changes_nothing() {
        let spoofed = headers("x-forwarded-for", &["1.2.3.4"]);
        let peer = ip("203.0.113.7");
        for config in [ClientIpConfig::new(), behind_proxies()] {
            assert_eq!(config.client_ip(peer, &spoofed), peer);
            assert_eq!(config.client_key(peer, &spoofed), "203.0.113.7");
        }
        let forwarded = headers("forwarded", &["for=1.2.3.4"]);
        let config = behind_proxies().header(ForwardedHeader::Forwarded);
        assert_eq!(config.client_ip(peer, &forwarded), peer);
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client() {
        let config = behind_proxies();
        let peer = ip("10.0.0.1");
        // The client wrote "1.2.3.4"; the first proxy saw 203.0.113.7.
        let chain = headers("x-forwarded-for", &["1.2.3.4, 203.0.113.7, 10.0.0.2"]);
        assert_eq!(config.client_ip(peer, &chain), ip("203.0.113.7"));
        // No header at all: the trusted peer is the client.
        assert_eq!(config.client_ip(peer, &HeaderMap::new()), peer);
    }

    #[test]
    fn several_header_lines_are_one_list_in_order() {
        let config = behind_proxies();
        let chain = headers("x-forwarded-for", &["1.2.3.4", "198.51.100.9, 10.9.9.9"]);
        assert_eq!(config.client_ip(ip("10.0.0.1"), &chain), ip("198.51.100.9"));
    }

    #[test]
    fn garbage_stops_the_walk_at_the_proxy_that_wrote_it() {
        let config = behind_proxies();
        let peer = ip("10.0.0.1");
        for garbage in ["unknown", "", "not an ip", "1.2.3", "10.0.0.300"] {
            let chain = headers("x-forwarded-for", &[&format!("203.0.113.9, {garbage}")]);
            assert_eq!(config.client_ip(peer, &chain), peer, "{garbage:?}");
            let chain = headers(
                "x-forwarded-for",
                &[&format!("203.0.113.9, {garbage}, 10.0.0.7")],
            );
            assert_eq!(
                config.client_ip(peer, &chain),
                ip("10.0.0.7"),
                "{garbage:?}"
            );
        }
        // Garbage to the left of the client is the client's own business.
        let chain = headers("x-forwarded-for", &["garbage, 203.0.113.9"]);
        assert_eq!(config.client_ip(peer, &chain), ip("203.0.113.9"));
        // A header that is not text at all.
        let mut opaque = HeaderMap::new();
        opaque.append(
            X_FORWARDED_FOR,
            HeaderValue::from_bytes(b"203.0.113.9\xff").unwrap(),
        );
        assert_eq!(config.client_ip(peer, &opaque), peer);
    }

    #[test]
    fn an_all_trusted_chain_gives_its_left_most_hop() {
        let config = behind_proxies();
        let chain = headers("x-forwarded-for", &["10.1.1.1, 10.2.2.2"]);
        assert_eq!(config.client_ip(ip("10.0.0.1"), &chain), ip("10.1.1.1"));
    }

    #[test]
    fn ports_and_brackets_are_read() {
        let config = behind_proxies();
        let peer = ip("10.0.0.1");
        for (entry, want) in [
            ("203.0.113.7:5555", "203.0.113.7"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            (" 2001:db8::1 ", "2001:db8::1"),
        ] {
            let chain = headers("x-forwarded-for", &[entry]);
            assert_eq!(config.client_ip(peer, &chain), ip(want), "{entry}");
        }
    }

    #[test]
    fn forwarded_reads_for_including_quoted_ipv6_with_a_port() {
        let config = behind_proxies().header(ForwardedHeader::Forwarded);
        let peer = ip("10.0.0.1");
        let chain = headers(
            "forwarded",
            &[
                r#"for=1.2.3.4;proto=https, For="[2001:db8:cafe::17]:4711";by=10.0.0.9"#,
                "for=10.0.0.2;host=\"a,b;c\"",
            ],
        );
        assert_eq!(config.client_ip(peer, &chain), ip("2001:db8:cafe::17"));
        assert_eq!(config.client_key(peer, &chain), "2001:db8:cafe::/64");

        let hidden = headers("forwarded", &["for=203.0.113.1, for=_hidden, for=10.0.0.3"]);
        assert_eq!(config.client_ip(peer, &hidden), ip("10.0.0.3"));
        let no_for = headers("forwarded", &["proto=http"]);
        assert_eq!(config.client_ip(peer, &no_for), peer);
        let escaped = headers("forwarded", &[r#"for="203.0.113.\4""#]);
        assert_eq!(config.client_ip(peer, &escaped), ip("203.0.113.4"));

        // The header the proxies do not write is ignored, whatever it says.
        let xff = headers("x-forwarded-for", &["203.0.113.50"]);
        assert_eq!(config.client_ip(peer, &xff), peer);
        let reads_xff = behind_proxies();
        assert_eq!(reads_xff.client_ip(peer, &chain), peer);
    }

    #[test]
    fn ipv6_is_keyed_by_its_prefix_and_mapped_ipv4_is_ipv4() {
        let config = ClientIpConfig::new();
        let a = ip("2001:db8:1:2:aaaa::1");
        let b = ip("2001:db8:1:2:bbbb::2");
        assert_eq!(config.key(a), "2001:db8:1:2::/64");
        assert_eq!(config.key(a), config.key(b));
        assert_eq!(config.clone().ipv6_prefix(56).key(a), "2001:db8:1::/56");
        assert_eq!(
            config.clone().ipv6_prefix(200).key(a),
            "2001:db8:1:2:aaaa::1"
        );
        assert_eq!(
            config.clone().ipv4_prefix(24).key(ip("192.0.2.77")),
            "192.0.2.0/24"
        );

        let mapped = IpAddr::V6(Ipv4Addr::new(203, 0, 113, 7).to_ipv6_mapped());
        assert_eq!(config.key(mapped), "203.0.113.7");
        let trusted_mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        let chain = headers("x-forwarded-for", &["::ffff:198.51.100.2"]);
        assert_eq!(
            behind_proxies().client_ip(trusted_mapped, &chain),
            ip("198.51.100.2")
        );
        assert!(!config.is_trusted(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    }
}
