//! The addresses a fetch never goes to unless the operator allowed the origin: the IANA
//! IPv4 and IPv6 Special-Purpose Address Registries, row for row, as one table.
//!
//! Every row of both registries is refused, whatever its "Globally Reachable" column
//! says. The rows marked reachable are anycast service addresses (PCP, TURN, DNS-SD SRP,
//! AS112, AMT) and identifiers that are not locators at all (ORCHIDv2, DRIP): no job's
//! bytes live at any of them, so refusing them costs nothing and keeps the table a plain
//! copy of the registry, without carve-outs to get wrong. Three blocks the registries do
//! not list are added: multicast (224.0.0.0/4 and ff00::/8, which have registries of their
//! own), fec0::/10 (site-local, deprecated by RFC 3879 but still routed by old networks),
//! and ::/96 (IPv4-compatible, deprecated by RFC 4291).
//!
//! Two IPv6 rows carry an IPv4 address in their last 32 bits and send packets there:
//! IPv4-mapped (::ffff:0:0/96) and the well-known NAT64 prefix (64:ff9b::/96). They are
//! judged as that IPv4 address, so `64:ff9b::808:808` is 8.8.8.8 and admitted while
//! `::ffff:127.0.0.1` is loopback. Every other form that embeds an IPv4 address is refused
//! whole: IPv4-compatible (::/96) because no stack should use it; 6to4 (2002::/16) and
//! Teredo (2001::/32) because where they go depends on relays and the host's tunnel
//! configuration, not on the address alone.
//!
//! A lookup takes the longest matching prefix, as routing does, so a row nested in
//! another (192.0.0.170/32 in 192.0.0.0/24) names the more specific block, and the
//! order of the table does not matter.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The kinds of address that stay unreachable unless their origin is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Unspecified,
    Loopback,
    Private,
    /// 100.64.0.0/10: carrier-grade NAT, and where some clouds put their metadata
    /// service (100.100.100.200).
    Shared,
    LinkLocal,
    /// IETF protocol assignments: 192.0.0.0/24 and 2001::/23, less their more specific
    /// rows.
    ProtocolAssignment,
    /// Service addresses announced from many places: PCP, TURN, DNS-SD SRP, AS112, AMT,
    /// the former 6to4 relay.
    Anycast,
    Documentation,
    Benchmarking,
    Reserved,
    Broadcast,
    Multicast,
    /// 64:ff9b:1::/48, NAT64 inside one network: where it goes is that network's choice.
    Nat64Local,
    Discard,
    Teredo,
    SixToFour,
    /// ORCHIDv2 and DRIP entity tags: identifiers, never locators.
    Identifier,
    SegmentRouting,
    SiteLocal,
    Ipv4Compatible,
}

impl AddressClass {
    /// "a" or "an", so the class reads as English in a message.
    pub(crate) fn article(self) -> &'static str {
        match self.to_string().chars().next() {
            Some('a' | 'e' | 'i' | 'o' | 'u' | 'A' | 'E' | 'I' | 'O' | 'U') => "an",
            _ => "a",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressClass::Unspecified => "unspecified",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private",
            AddressClass::Shared => "shared (carrier-grade NAT)",
            AddressClass::LinkLocal => "link-local",
            AddressClass::ProtocolAssignment => "IETF protocol assignment",
            AddressClass::Anycast => "anycast service",
            AddressClass::Documentation => "documentation",
            AddressClass::Benchmarking => "benchmarking",
            AddressClass::Reserved => "reserved",
            AddressClass::Broadcast => "broadcast",
            AddressClass::Multicast => "multicast",
            AddressClass::Nat64Local => "local-use NAT64",
            AddressClass::Discard => "discard-only",
            AddressClass::Teredo => "Teredo",
            AddressClass::SixToFour => "6to4",
            AddressClass::Identifier => "non-routable identifier",
            AddressClass::SegmentRouting => "segment-routing SID",
            AddressClass::SiteLocal => "deprecated site-local",
            AddressClass::Ipv4Compatible => "deprecated IPv4-compatible",
        })
    }
}

/// One block of the table: a prefix and the registry's name for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressBlock {
    pub network: IpAddr,
    pub prefix_len: u8,
    pub name: &'static str,
}

impl AddressBlock {
    fn contains(&self, ip: IpAddr) -> bool {
        // A /0 would shift by the whole width, which `checked_shl` refuses: its mask is
        // empty, and every address matches.
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix_len));
                (u32::from(net) ^ u32::from(ip)) & mask.unwrap_or(0) == 0
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix_len));
                (u128::from(net) ^ u128::from(ip)) & mask.unwrap_or(0) == 0
            }
            _ => false,
        }
    }
}

impl fmt::Display for AddressBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}, {}", self.network, self.prefix_len, self.name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Refuse(AddressClass),
    /// The block carries an IPv4 address in its last 32 bits, and packets go there.
    JudgeEmbeddedV4,
}

struct Row {
    block: AddressBlock,
    rule: Rule,
}

const fn v4(octets: [u8; 4], prefix_len: u8, class: AddressClass, name: &'static str) -> Row {
    let [a, b, c, d] = octets;
    Row {
        block: AddressBlock {
            network: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix_len,
            name,
        },
        rule: Rule::Refuse(class),
    }
}

/// IPv6 rows take a rule rather than a class: only they can carry an IPv4 address.
const fn v6(segments: [u16; 8], prefix_len: u8, rule: Rule, name: &'static str) -> Row {
    let [a, b, c, d, e, f, g, h] = segments;
    Row {
        block: AddressBlock {
            network: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix_len,
            name,
        },
        rule,
    }
}

use AddressClass::*;
use Rule::{JudgeEmbeddedV4, Refuse};

/// The registries as IANA publishes them (names kept), then the additions the module doc
/// gives reasons for. One row a line, so the table can be read against the registry.
#[rustfmt::skip]
const TABLE: &[Row] = &[
    // IPv4 Special-Purpose Address Registry.
    v4([0, 0, 0, 0], 8, Unspecified, "This network"),
    v4([0, 0, 0, 0], 32, Unspecified, "This host on this network"),
    v4([10, 0, 0, 0], 8, Private, "Private-Use"),
    v4([100, 64, 0, 0], 10, Shared, "Shared Address Space"),
    v4([127, 0, 0, 0], 8, Loopback, "Loopback"),
    v4([169, 254, 0, 0], 16, LinkLocal, "Link Local"),
    v4([172, 16, 0, 0], 12, Private, "Private-Use"),
    v4([192, 0, 0, 0], 24, ProtocolAssignment, "IETF Protocol Assignments"),
    v4([192, 0, 0, 0], 29, ProtocolAssignment, "IPv4 Service Continuity Prefix"),
    v4([192, 0, 0, 8], 32, ProtocolAssignment, "IPv4 dummy address"),
    v4([192, 0, 0, 9], 32, Anycast, "Port Control Protocol Anycast"),
    v4([192, 0, 0, 10], 32, Anycast, "Traversal Using Relays around NAT Anycast"),
    v4([192, 0, 0, 170], 32, ProtocolAssignment, "NAT64/DNS64 Discovery"),
    v4([192, 0, 0, 171], 32, ProtocolAssignment, "NAT64/DNS64 Discovery"),
    v4([192, 0, 2, 0], 24, Documentation, "Documentation (TEST-NET-1)"),
    v4([192, 31, 196, 0], 24, Anycast, "AS112-v4"),
    v4([192, 52, 193, 0], 24, Anycast, "AMT"),
    v4([192, 88, 99, 0], 24, Anycast, "Deprecated (6to4 Relay Anycast)"),
    v4([192, 168, 0, 0], 16, Private, "Private-Use"),
    v4([192, 175, 48, 0], 24, Anycast, "Direct Delegation AS112 Service"),
    v4([198, 18, 0, 0], 15, Benchmarking, "Benchmarking"),
    v4([198, 51, 100, 0], 24, Documentation, "Documentation (TEST-NET-2)"),
    v4([203, 0, 113, 0], 24, Documentation, "Documentation (TEST-NET-3)"),
    v4([240, 0, 0, 0], 4, Reserved, "Reserved"),
    v4([255, 255, 255, 255], 32, Broadcast, "Limited Broadcast"),
    // IPv6 Special-Purpose Address Registry.
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, Refuse(Loopback), "Loopback Address"),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, Refuse(Unspecified), "Unspecified Address"),
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, JudgeEmbeddedV4, "IPv4-mapped Address"),
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96, JudgeEmbeddedV4, "IPv4-IPv6 Translat."),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, Refuse(Nat64Local), "IPv4-IPv6 Translat."),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, Refuse(Discard), "Discard-Only Address Block"),
    v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64, Refuse(Reserved), "Dummy IPv6 Prefix"),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, Refuse(ProtocolAssignment), "IETF Protocol Assignments"),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, Refuse(Teredo), "TEREDO"),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128, Refuse(Anycast), "Port Control Protocol Anycast"),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128, Refuse(Anycast), "Traversal Using Relays around NAT Anycast"),
    v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128, Refuse(Anycast), "DNS-SD Service Registration Protocol Anycast"),
    v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48, Refuse(Benchmarking), "Benchmarking"),
    v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32, Refuse(Anycast), "AMT"),
    v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48, Refuse(Anycast), "AS112-v6"),
    v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28, Refuse(Identifier), "Deprecated (previously ORCHID)"),
    v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28, Refuse(Identifier), "ORCHIDv2"),
    v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28, Refuse(Identifier), "Drone Remote ID Protocol Entity Tags (DETs) Prefix"),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, Refuse(Documentation), "Documentation"),
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, Refuse(SixToFour), "6to4"),
    v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48, Refuse(Anycast), "Direct Delegation AS112 Service"),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, Refuse(Documentation), "Documentation"),
    v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, Refuse(SegmentRouting), "Segment Routing (SRv6) SIDs"),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, Refuse(Private), "Unique-Local"),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, Refuse(LinkLocal), "Link-Local Unicast"),
    // Not in the special-purpose registries.
    v4([224, 0, 0, 0], 4, Multicast, "Multicast"),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, Refuse(Multicast), "Multicast"),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, Refuse(SiteLocal), "Site-Local (deprecated)"),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 96, Refuse(Ipv4Compatible), "IPv4-Compatible (deprecated)"),
];

/// Why `ip` may not be fetched from, or `None` for an address with no special purpose.
pub fn forbidden(ip: IpAddr) -> Option<(AddressClass, AddressBlock)> {
    let row = TABLE
        .iter()
        .filter(|row| row.block.contains(ip))
        .max_by_key(|row| row.block.prefix_len)?;
    match (row.rule, ip) {
        (Refuse(class), _) => Some((class, row.block)),
        (JudgeEmbeddedV4, IpAddr::V6(v6)) => {
            forbidden(IpAddr::V4(Ipv4Addr::from_bits(v6.to_bits() as u32)))
        }
        (JudgeEmbeddedV4, IpAddr::V4(_)) => unreachable!("only IPv6 rows embed an IPv4 address"),
    }
}

/// Every block of the table, for tests that check the lookup against it.
#[cfg(test)]
pub(crate) fn table_blocks() -> impl Iterator<Item = AddressBlock> {
    TABLE.iter().map(|row| row.block)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address from every row, chosen near the end of its block where one is bigger
    /// than an address, so a prefix length written too short shows here.
    const REFUSED: &[(&str, &str, AddressClass)] = &[
        ("0.1.2.3", "0.0.0.0/8", Unspecified),
        ("0.0.0.0", "0.0.0.0/32", Unspecified),
        ("10.255.255.254", "10.0.0.0/8", Private),
        ("100.127.255.254", "100.64.0.0/10", Shared),
        ("100.100.100.200", "100.64.0.0/10", Shared),
        ("127.255.255.254", "127.0.0.0/8", Loopback),
        ("169.254.169.254", "169.254.0.0/16", LinkLocal),
        ("172.31.255.254", "172.16.0.0/12", Private),
        ("192.0.0.255", "192.0.0.0/24", ProtocolAssignment),
        ("192.0.0.7", "192.0.0.0/29", ProtocolAssignment),
        ("192.0.0.8", "192.0.0.8/32", ProtocolAssignment),
        ("192.0.0.9", "192.0.0.9/32", Anycast),
        ("192.0.0.10", "192.0.0.10/32", Anycast),
        ("192.0.0.170", "192.0.0.170/32", ProtocolAssignment),
        ("192.0.0.171", "192.0.0.171/32", ProtocolAssignment),
        ("192.0.2.255", "192.0.2.0/24", Documentation),
        ("192.31.196.1", "192.31.196.0/24", Anycast),
        ("192.52.193.255", "192.52.193.0/24", Anycast),
        ("192.88.99.2", "192.88.99.0/24", Anycast),
        ("192.168.255.255", "192.168.0.0/16", Private),
        ("192.175.48.42", "192.175.48.0/24", Anycast),
        ("198.18.0.1", "198.18.0.0/15", Benchmarking),
        ("198.19.255.254", "198.18.0.0/15", Benchmarking),
        ("198.51.100.7", "198.51.100.0/24", Documentation),
        ("203.0.113.254", "203.0.113.0/24", Documentation),
        ("224.0.0.1", "224.0.0.0/4", Multicast),
        ("239.255.255.255", "224.0.0.0/4", Multicast),
        ("240.0.0.1", "240.0.0.0/4", Reserved),
        ("255.255.255.254", "240.0.0.0/4", Reserved),
        ("255.255.255.255", "255.255.255.255/32", Broadcast),
        ("::1", "::1/128", Loopback),
        ("::", "::/128", Unspecified),
        ("::127.0.0.1", "::/96", Ipv4Compatible),
        ("::8.8.8.8", "::/96", Ipv4Compatible),
        ("64:ff9b:1:ffff::1", "64:ff9b:1::/48", Nat64Local),
        ("100::ffff:ffff:ffff:ffff", "100::/64", Discard),
        ("100:0:0:1::1", "100:0:0:1::/64", Reserved),
        ("2001:1ff:ffff::1", "2001::/23", ProtocolAssignment),
        ("2001:0:ffff::1", "2001::/32", Teredo),
        ("2001:1::1", "2001:1::1/128", Anycast),
        ("2001:1::2", "2001:1::2/128", Anycast),
        ("2001:1::3", "2001:1::3/128", Anycast),
        ("2001:1::4", "2001::/23", ProtocolAssignment),
        ("2001:2:0:ffff::1", "2001:2::/48", Benchmarking),
        ("2001:3:ffff::1", "2001:3::/32", Anycast),
        ("2001:4:112:ffff::1", "2001:4:112::/48", Anycast),
        ("2001:1f::1", "2001:10::/28", Identifier),
        ("2001:2f:ffff::1", "2001:20::/28", Identifier),
        ("2001:3f::1", "2001:30::/28", Identifier),
        ("2001:db8:ffff::1", "2001:db8::/32", Documentation),
        ("2002:7f00:1::1", "2002::/16", SixToFour),
        ("2002:808:808::1", "2002::/16", SixToFour),
        ("2620:4f:8000:ffff::1", "2620:4f:8000::/48", Anycast),
        ("3fff:fff::1", "3fff::/20", Documentation),
        ("5f00:ffff::1", "5f00::/16", SegmentRouting),
        ("fc00::1", "fc00::/7", Private),
        ("fdff:ffff::1", "fc00::/7", Private),
        ("fe80::1", "fe80::/10", LinkLocal),
        ("febf::1", "fe80::/10", LinkLocal),
        ("fec0::1", "fec0::/10", SiteLocal),
        ("feff::1", "fec0::/10", SiteLocal),
        ("ff02::1", "ff00::/8", Multicast),
        ("ffff::1", "ff00::/8", Multicast),
    ];

    /// Public addresses, many just outside a refused block.
    const ADMITTED: &[&str] = &[
        "93.184.216.34",
        "1.1.1.1",
        "9.255.255.255",
        "11.0.0.0",
        "100.63.255.255",
        "100.128.0.0",
        "126.255.255.255",
        "128.0.0.0",
        "169.253.255.255",
        "169.255.0.0",
        "172.15.255.255",
        "172.32.0.1",
        "192.0.1.0",
        "192.0.3.0",
        "192.88.98.255",
        "192.169.0.0",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
        "2606:4700::1111",
        "2001:4860:4860::8888",
        "2001:200::1",
        "2003::1",
        "2620:4f:8001::1",
        "3fff:1000::1",
        "64:ff9b::808:808",
        "64:ff9b::5db8:d822",
        "::ffff:8.8.8.8",
        "64:ff9b:2::1",
    ];

    fn block_text(block: &AddressBlock) -> String {
        format!("{}/{}", block.network, block.prefix_len)
    }

    #[test]
    fn an_address_from_every_row_is_refused_with_its_row() {
        for &(ip, expected_block, expected_class) in REFUSED {
            let Some((class, block)) = forbidden(ip.parse().unwrap()) else {
                panic!("{ip} was admitted");
            };
            assert_eq!(block_text(&block), expected_block, "{ip}");
            assert_eq!(class, expected_class, "{ip}");
        }
        // Every row is exercised above, except the two judged by the IPv4 they carry,
        // which the next test covers.
        for row in TABLE {
            let text = block_text(&row.block);
            match row.rule {
                Refuse(_) => assert!(
                    REFUSED.iter().any(|(_, b, _)| *b == text),
                    "no address of {text} is tested"
                ),
                JudgeEmbeddedV4 => {
                    assert!(["::ffff:0.0.0.0/96", "64:ff9b::/96"].contains(&text.as_str()))
                }
            }
        }
    }

    #[test]
    fn mapped_and_nat64_forms_are_judged_as_their_ipv4_and_compatible_ones_refused() {
        for &(ip, _, class) in REFUSED {
            let Ok(v4) = ip.parse::<Ipv4Addr>() else {
                continue;
            };
            let bits = u128::from(v4.to_bits());
            let mapped = Ipv6Addr::from_bits(0xffff_0000_0000 | bits);
            let nat64 = Ipv6Addr::from_bits((0x64_ff9b_u128 << 96) | bits);
            let compatible = Ipv6Addr::from_bits(bits);
            for form in [mapped, nat64] {
                assert_eq!(
                    forbidden(IpAddr::V6(form)),
                    forbidden(IpAddr::V4(v4)),
                    "{form} carries {ip}"
                );
                assert_eq!(forbidden(IpAddr::V6(form)).unwrap().0, class);
            }
            assert!(forbidden(IpAddr::V6(compatible)).is_some(), "{compatible}");
        }
    }

    #[test]
    fn public_addresses_are_admitted() {
        for ip in ADMITTED {
            assert_eq!(forbidden(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn every_row_is_a_network_address() {
        // A host bit set past the prefix (192.0.0.170/24) would be a typo for another
        // block; `contains` would still work, which is why only this test can tell.
        for row in TABLE {
            let len = u32::from(row.block.prefix_len);
            let zeroed = match row.block.network {
                IpAddr::V4(ip) => {
                    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                    IpAddr::V4(Ipv4Addr::from_bits(ip.to_bits() & mask))
                }
                IpAddr::V6(ip) => {
                    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                    IpAddr::V6(Ipv6Addr::from_bits(ip.to_bits() & mask))
                }
            };
            assert_eq!(zeroed, row.block.network, "{}", row.block);
        }
    }

    #[test]
    fn a_refusal_reads_as_english() {
        assert_eq!(Unspecified.article(), "an");
        assert_eq!(ProtocolAssignment.article(), "an");
        assert_eq!(Loopback.article(), "a");
        assert_eq!(SixToFour.article(), "a");
    }
}
