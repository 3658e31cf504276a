use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::{forwarded_for, hex_id};

#[test]
fn forwarded_for_writes_the_addresses_at_the_edges_of_each_width() {
    for ip in ["0.0.0.0", "9.10.99.100", "255.255.255.255", "127.0.0.1", "::1", "2001:db8::8a2e:370:7334"] {
        let ip: IpAddr = ip.parse().expect("address");
        assert_eq!(forwarded_for(ip).to_str().map(str::to_owned).ok(), Some(ip.to_string()));
    }
}

proptest! {
    #[test]
    fn a_request_id_is_its_number_in_32_lowercase_hex_digits(n in any::<u128>()) {
        prop_assert_eq!(hex_id(n).to_str().map(str::to_owned).ok(), Some(format!("{n:032x}")));
    }

    #[test]
    fn forwarded_for_writes_an_address_as_the_standard_library_does(bits in any::<u32>(), v6 in any::<u128>()) {
        for ip in [IpAddr::V4(Ipv4Addr::from_bits(bits)), IpAddr::V6(Ipv6Addr::from_bits(v6))] {
            prop_assert_eq!(forwarded_for(ip).to_str().map(str::to_owned).ok(), Some(ip.to_string()));
        }
    }
}
