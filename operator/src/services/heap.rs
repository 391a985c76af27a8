//! The operator's heap in use, counted by its allocator: what its caches and records really keep,
//! which resident memory (RSS) blurs with what the C allocator holds back after a burst. The
//! binary installs [`Counting`] as its global allocator; `/metrics` exports the count as
//! `gpuval_operator_heap_bytes` (the scale bench reads it per node).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static IN_USE: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting the bytes it has handed out and not yet been given back.
pub struct Counting;

// SAFETY: every method forwards to `System` with the caller's own arguments, so `System`'s
// guarantees carry over unchanged; the counter is a relaxed atomic that no allocation depends on.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract (non-zero size), passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with this `layout`.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; `new_size` is the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            IN_USE.fetch_add(new_size, Ordering::Relaxed);
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

/// Bytes allocated and not freed, when [`Counting`] is the global allocator (0 otherwise).
pub fn in_use() -> usize {
    IN_USE.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_follows_allocations_through_growth_and_freeing() {
        // The test binary's global allocator is `System`: only these calls move the count.
        let before = in_use();
        let small = Layout::from_size_align(1000, 8).expect("a valid layout");
        // SAFETY: a non-zero size; each pointer is freed below with the layout it has then.
        unsafe {
            let p = Counting.alloc(small);
            assert!(!p.is_null());
            assert_eq!(in_use() - before, 1000);
            let p = Counting.realloc(p, small, 5000);
            assert!(!p.is_null());
            assert_eq!(in_use() - before, 5000);
            Counting.dealloc(p, Layout::from_size_align(5000, 8).expect("a valid layout"));
        }
        assert_eq!(in_use(), before);
    }
}
