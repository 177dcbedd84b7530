//! Bytes per idle key at 1M keys, ours beside governor's keyed limiter, and
//! memory returning once the keys go cold. `cargo bench --bench footprint`.
//!
//! Counts live heap bytes with a wrapping global allocator, so the figure is
//! exact and independent of the allocator's caching of freed pages.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use governor::{Quota, RateLimiter};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const KEYS: u32 = 1_000_000;

fn main() {
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|i| format!("user:{i:08}").into_bytes())
        .collect();

    let clock = ManualClock::new();
    let before = live();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build();
    let policy = Policy::cell(4, 5, Duration::from_secs(1)).unwrap();
    for k in &keys {
        black_box(store.check_sync(Charge::new(k, &policy, 1)).unwrap());
    }
    let ours = live() - before;
    clock.advance(Duration::from_secs(2));
    let swept = store.sweep();
    let ours_after = live() - before;

    let before = live();
    let quota = Quota::per_second(NonZeroU32::new(5).unwrap());
    let gov = RateLimiter::keyed(quota);
    for k in &keys {
        let _ = black_box(gov.check_key(k));
    }
    let governor = live() - before;
    std::thread::sleep(Duration::from_millis(1100));
    gov.retain_recent();
    gov.shrink_to_fit();
    let governor_after = live() - before;

    let per = |b: isize| b as f64 / f64::from(KEYS);
    println!("| store | bytes per idle GCRA key at 1M keys | after the keys go cold |");
    println!("|---|---|---|");
    println!(
        "| tower-throttle MemoryStore | {:.1} | {:.0} bytes total ({swept} keys swept) |",
        per(ours),
        ours_after
    );
    println!(
        "| governor keyed (DashMap, Vec<u8> keys) | {:.1} | {:.0} bytes total (retain_recent + shrink_to_fit) |",
        per(governor),
        governor_after
    );
    println!(
        "ratio ours / governor: {:.2}",
        ours as f64 / governor as f64
    );
}
