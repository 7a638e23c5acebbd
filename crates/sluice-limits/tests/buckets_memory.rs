//! Bytes of state per key in the keyed GCRA store, measured with a counting allocator.
//!
//! Target: at most 64 bytes per key beyond the key itself. One test only in this binary, so
//! no other test allocates while it counts.
// A global allocator can only be written with `unsafe impl GlobalAlloc`; it forwards to the
// system allocator unchanged and only counts.
#![allow(unsafe_code, clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use sluice_limits::{KeyedGcra, Limit};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments, so `System`'s
// guarantees are ours; the counter has no effect on the memory returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

#[test]
fn state_per_key_is_at_most_64_bytes_and_eviction_gives_it_back() {
    let limit: Limit = "10/1s".parse().unwrap();
    let before = live();
    let store: KeyedGcra<u64> = KeyedGcra::new();
    let empty = live() - before;
    let mut worst = 0.0f64;
    let mut last = 0.0f64;
    // Measure at several sizes: the figure depends on where each table is in its growth.
    for &n in &[100_000u64, 250_000, 500_000, 1_000_000] {
        let start = store.len() as u64;
        for k in start..n {
            assert!(store.check(&k, &limit, 0, 1).allowed);
        }
        let bytes = (live() - before - empty) as f64;
        // The key is a u64 (8 bytes); everything else is state.
        let per_key = bytes / n as f64 - 8.0;
        // The test harness may allocate a little on its own thread meanwhile.
        let diff = (store.table_bytes() as isize - (live() - before - empty)).abs();
        assert!(
            diff < 16 * 1024,
            "table_bytes disagrees with the allocator by {diff} bytes"
        );
        println!("{n} keys: {per_key:.1} bytes per key beyond the key");
        worst = worst.max(per_key);
        last = per_key;
    }
    println!(
        "state per key beyond the key: {last:.1} bytes at 1M keys, worst {worst:.1}; fixed overhead {empty} bytes"
    );
    assert!(worst <= 64.0, "{worst} bytes per key");

    // Every bucket is full again one second later: evicting gives the memory back.
    assert_eq!(store.retain_recent(1_000_000_000), 1_000_000);
    assert!(
        live() - before - empty < 64 * 1024,
        "{} bytes left",
        live() - before - empty
    );
}
