//! Two-stage pipeline for one file over a few buffers: while one buffer is in a system call,
//! another is being filled with the pattern (writes) or checked (reads), so pattern work hides
//! behind the I/O instead of adding to it. A spare buffer absorbs scheduling jitter on a busy
//! CPU.

use std::sync::mpsc::sync_channel;

use super::buffer::AlignedBuf;

/// Buffers per worker.
pub const DEPTH: usize = 3;

/// `(offset, length)` of each block of a file of `size` bytes in blocks of `block` bytes.
pub fn blocks(size: u64, block: usize) -> impl Iterator<Item = (u64, usize)> + Send {
    let block = block.max(1) as u64;
    (0..size.div_ceil(block)).map(move |i| {
        let offset = i * block;
        (offset, (size - offset).min(block) as usize)
    })
}

/// Runs `first` on each block in order on a helper thread and `then` on the same block on the
/// calling thread, with `bufs` passed between them. The first error of either stage
/// ends both and is returned.
pub fn run<E: Send>(
    bufs: &mut [AlignedBuf],
    blocks: impl Iterator<Item = (u64, usize)> + Send,
    first: impl Fn(u64, &mut [u8]) -> Result<(), E> + Sync,
    mut then: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<(), E> {
    let n = bufs.len().max(1);
    let (empty_tx, empty_rx) = sync_channel::<&mut AlignedBuf>(n);
    let (full_tx, full_rx) = sync_channel::<Result<(u64, usize, &mut AlignedBuf), E>>(n);
    for b in bufs.iter_mut() {
        // capacity for every buffer, receiver alive: cannot fail
        let _ = empty_tx.send(b);
    }
    std::thread::scope(|s| {
        let first = &first;
        s.spawn(move || {
            for (offset, len) in blocks {
                let Ok(buf) = empty_rx.recv() else {
                    return; // the second stage ended
                };
                let r = first(offset, &mut buf.as_mut()[..len]).map(|()| (offset, len, buf));
                let failed = r.is_err();
                if full_tx.send(r).is_err() || failed {
                    return;
                }
            }
        });
        // Ends when the helper has sent every block (it drops `full_tx`) or on an error; the
        // channels drop when this closure returns, which unblocks the helper.
        let (empty_tx, full_rx) = (empty_tx, full_rx);
        for msg in full_rx.iter() {
            let (offset, len, buf) = msg?;
            then(offset, &mut buf.as_mut()[..len])?;
            let _ = empty_tx.send(buf);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn bufs() -> Vec<AlignedBuf> {
        (0..DEPTH).map(|_| AlignedBuf::new(4096)).collect()
    }

    #[test]
    fn blocks_cover_the_file() {
        let b: Vec<_> = blocks(10_000, 4096).collect();
        assert_eq!(b, vec![(0, 4096), (4096, 4096), (8192, 1808)]);
        assert_eq!(blocks(0, 4096).count(), 0);
    }

    #[test]
    fn every_block_passes_both_stages_in_order() {
        let mut seen = Vec::new();
        let r: Result<(), ()> = run(
            &mut bufs(),
            blocks(5 * 4096 + 8, 4096),
            |off, b| {
                b.fill((off / 4096) as u8);
                Ok(())
            },
            |off, b| {
                assert!(b.iter().all(|&x| x == (off / 4096) as u8));
                seen.push((off, b.len()));
                Ok(())
            },
        );
        assert_eq!(r, Ok(()));
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[5], (5 * 4096, 8));
    }

    #[test]
    fn an_error_in_either_stage_ends_both() {
        let produced = Mutex::new(0);
        let r = run(
            &mut bufs(),
            blocks(100 * 4096, 4096),
            |off, _| {
                *produced.lock().unwrap() += 1;
                if off == 3 * 4096 {
                    Err("first")
                } else {
                    Ok(())
                }
            },
            |_, _| Ok(()),
        );
        assert_eq!(r, Err("first"));
        assert_eq!(*produced.lock().unwrap(), 4);

        let produced = Mutex::new(0);
        let r = run(
            &mut bufs(),
            blocks(100 * 4096, 4096),
            |_, _| {
                *produced.lock().unwrap() += 1;
                Ok(())
            },
            |off, _| if off == 2 * 4096 { Err("then") } else { Ok(()) },
        );
        assert_eq!(r, Err("then"));
        // at most DEPTH blocks ahead of the failed one
        assert!(*produced.lock().unwrap() <= 3 + DEPTH);
    }
}
