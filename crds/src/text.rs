//! Shortening messages for places with a size limit (a status line, a condition, an event, a
//! label-sized summary). A gpuval message ends with what to do (`...; set the Helm value
//! agent.io.hostPath`), so it is shortened in the middle: its start (what is wrong) and its end
//! (what to do) stay, and `…` marks what went. The one helper every message cut goes through;
//! it never splits a UTF-8 character.

/// What marks the cut.
pub const ELLIPSIS: &str = "…";

/// `s` in at most `max` bytes: unchanged when it fits, else its start, [`ELLIPSIS`], and its
/// end. The end keeps up to three fifths of the room and starts at a clause (after `; ` or
/// `: `) where one begins in that window, so the last instruction is kept whole where it fits;
/// the start gets the rest. Below 8 bytes of room only the start is kept.
pub fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let room = max.saturating_sub(ELLIPSIS.len());
    if max < 8 {
        return s[..floor_boundary(s, max)].to_string();
    }
    let tail_room = room * 3 / 5;
    let window_start = ceil_boundary(s, s.len() - tail_room);
    let window = &s[window_start..];
    let clause = ["; ", ": "]
        .iter()
        .filter_map(|sep| window.find(sep).map(|i| i + sep.len()))
        .min()
        .filter(|i| *i < window.len());
    let tail_start = window_start + clause.unwrap_or(0);
    let head_end = floor_boundary(s, room - (s.len() - tail_start));
    format!("{}{ELLIPSIS}{}", s[..head_end].trim_end(), &s[tail_start..])
}

/// The largest character boundary of `s` at or below `i`.
fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest character boundary of `s` at or above `i`.
fn ceil_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    const IO: &str = "GPU1 memory: 2 mismatched words at 0x7f00 and 0x7f08 in pass 2 of the moving-inversion pattern; no directory for the io check: pass --io-dir DIR (or set GPUVAL_IO_DIR); on Kubernetes, set the Helm value agent.io.hostPath inside agent.io.allowedPaths";

    #[test]
    fn a_short_message_is_kept_whole() {
        assert_eq!(shorten("memory: ok", 200), "memory: ok");
        assert_eq!(shorten(IO, IO.len()), IO);
    }

    #[test]
    fn the_start_and_the_instruction_at_the_end_are_kept() {
        let s = shorten(IO, 160);
        assert!(s.len() <= 160, "{} bytes: {s}", s.len());
        assert!(s.starts_with("GPU1 memory: 2 mismatched words"), "{s}");
        assert!(
            s.ends_with("set the Helm value agent.io.hostPath inside agent.io.allowedPaths"),
            "{s}"
        );
        assert!(s.contains(ELLIPSIS), "{s}");
    }

    #[test]
    fn a_message_without_clauses_keeps_both_ends_and_never_splits_a_character() {
        let s = "é".repeat(200);
        for max in [8, 9, 10, 50, 101, 399] {
            let cut = shorten(&s, max);
            assert!(cut.len() <= max, "{max}: {}", cut.len());
            assert!(cut.starts_with('é') && cut.ends_with('é'), "{max}: {cut}");
        }
        assert_eq!(shorten("abcdefghij", 5), "abcde");
    }
}
