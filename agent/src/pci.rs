//! PCI bus ids and the bitmask and range formats that NVML and sysfs use for CPU and NUMA
//! affinity. Pure helpers below both the NVML backend and the topology check.

/// Lower-case PCI bus id with a 4-hex-digit domain (`0000:18:00.0`), the form sysfs uses.
/// NVML writes `00000000:18:00.0`; ids without a domain get `0000:`.
pub fn normalize_bus_id(bus_id: &str) -> String {
    let id = bus_id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => id,
        },
        Some(_) => format!("0000:{id}"),
        None => id,
    }
}

/// Numbers of the set bits of a bitmask given as 64-bit words, lowest word first.
pub fn set_bits(words: &[u64]) -> Vec<u32> {
    let mut out = Vec::new();
    for (w, word) in (0u32..).zip(words) {
        for bit in 0..64 {
            if word >> bit & 1 == 1 {
                out.push(w * 64 + bit);
            }
        }
    }
    out
}

/// `0-31,64-95` from ascending ids; empty for no ids.
pub fn format_ranges(ids: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut iter = ids.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(",")
}

/// Ids listed as `0-3,8,10-11` (the sysfs CPU/node list format); None when malformed.
pub fn parse_ranges(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    if text.is_empty() {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?);
                if a > b {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.trim().parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(normalize_bus_id("00000000:2A:00.0"), "0000:2a:00.0");
        assert_eq!(normalize_bus_id("0000:2a:00.0"), "0000:2a:00.0");
        assert_eq!(normalize_bus_id("2A:00.0"), "0000:2a:00.0");
        assert_eq!(normalize_bus_id("00000001:2A:00.0"), "0001:2a:00.0");
        assert_eq!(normalize_bus_id("FFFFFFFF:FF:FF.0"), "ffffffff:ff:ff.0");
    }

    #[test]
    fn ranges_format_and_parse() {
        assert_eq!(format_ranges(&[0, 1, 2, 3, 64, 65, 70]), "0-3,64-65,70");
        assert_eq!(format_ranges(&[]), "");
        assert_eq!(
            parse_ranges("0-3,64-65,70"),
            Some(vec![0, 1, 2, 3, 64, 65, 70])
        );
        assert_eq!(parse_ranges("0-127\n").map(|v| v.len()), Some(128));
        assert_eq!(parse_ranges("3-1"), None);
        assert_eq!(parse_ranges("x"), None);
        assert_eq!(set_bits(&[0b101, 1]), [0, 2, 64]);
    }
}
