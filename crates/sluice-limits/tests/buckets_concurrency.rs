//! Concurrency of the lock-free GCRA (one `AtomicU64`, CAS loop) and of the keyed store.
//!
//! Property (seed 002 §3.4's token bucket, shared by threads): at one fixed `now`, N threads
//! hammering one key admit exactly what one thread would, i.e. `⌊burst / cost⌋` requests; no
//! admission is lost (the state advanced once per admission: `TAT = Σ cost·T` over admitted
//! requests) nor doubled (each admitted request saw a distinct state: the `remaining` values
//! of the admitted decisions are exactly `burst/cost − 1, …, 1, 0`).
//!
//! Checked under `shuttle` (the same CAS loop as production, run on shuttle's atomic through
//! the `Word` trait: exhaustively for a small case, randomly and with PCT for larger ones)
//! and under real threads.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use sluice_limits::atomic::Word;
use sluice_limits::{AtomicGcra, Decision, KeyedGcra, KeyedStore, Limit, TokenBucket};

/// shuttle's atomic, seen through the crate's `Word` trait.
struct ShuttleWord(shuttle::sync::atomic::AtomicU64);

impl Word for ShuttleWord {
    fn new(v: u64) -> Self {
        Self(shuttle::sync::atomic::AtomicU64::new(v))
    }
    fn load(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn compare_exchange_weak(&self, current: u64, new: u64) -> Result<u64, u64> {
        use std::sync::atomic::Ordering::Relaxed;
        self.0.compare_exchange_weak(current, new, Relaxed, Relaxed)
    }
}

fn limit(count: u64, period: u64, burst: u64) -> Limit {
    Limit::from_nanos(count, period)
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// Asserts the property on the decisions of all threads, for requests of cost `cost`.
fn assert_exact(decisions: &[Decision], final_tat: u64, l: &Limit, cost: u64) {
    let admitted: Vec<&Decision> = decisions.iter().filter(|d| d.allowed).collect();
    let expected = usize::try_from(l.burst() / cost)
        .unwrap()
        .min(decisions.len());
    assert_eq!(
        admitted.len(),
        expected,
        "admitted count differs from one thread's"
    );
    assert_eq!(
        final_tat,
        admitted.len() as u64 * cost * l.emission_interval(),
        "an admission was lost or doubled"
    );
    let mut remaining: Vec<u64> = admitted.iter().map(|d| d.remaining).collect();
    remaining.sort_unstable();
    let fresh = l.burst() / cost;
    let want: Vec<u64> = (0..admitted.len() as u64)
        .map(|i| (fresh - 1 - i) * cost + l.burst() % cost)
        .rev()
        .collect();
    assert_eq!(remaining, want, "two admissions saw the same state");
}

#[test]
fn shuttle_exhaustive_two_threads() {
    // Every interleaving of 2 threads × 3 checks, burst 4: 6 requests, exactly 4 admitted.
    shuttle::check_dfs(|| shuttle_hammer_at_zero(2, 3, limit(4, 40, 4), 1), None);
}

/// `threads` × `per_thread` checks of `cost` at `now = 0` (so the final TAT is Σ cost·T).
fn shuttle_hammer_at_zero(threads: usize, per_thread: usize, l: Limit, cost: u64) {
    let key: Arc<AtomicGcra<ShuttleWord>> = Arc::new(AtomicGcra::default());
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let key = Arc::clone(&key);
            shuttle::thread::spawn(move || {
                (0..per_thread)
                    .map(|_| key.check(&l, 0, cost))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let all: Vec<Decision> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert_exact(&all, key.state().tat(), &l, cost);
}

#[test]
fn shuttle_random_and_pct_three_threads() {
    shuttle::check_random(|| shuttle_hammer_at_zero(3, 5, limit(7, 70, 7), 1), 2_000);
    shuttle::check_pct(
        || shuttle_hammer_at_zero(3, 5, limit(10, 100, 10), 3),
        2_000,
        3,
    );
}

#[test]
fn shuttle_later_now_same_count() {
    // A key that starts full admits the same count at any `now`.
    shuttle::check_random(
        || {
            let l = limit(5, 50, 5);
            let key: Arc<AtomicGcra<ShuttleWord>> = Arc::new(AtomicGcra::default());
            let hs: Vec<_> = (0..3)
                .map(|_| {
                    let key = Arc::clone(&key);
                    shuttle::thread::spawn(move || {
                        (0..3).filter(|_| key.check(&l, 1_000, 1).allowed).count()
                    })
                })
                .collect();
            let n: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
            assert_eq!(n, 5);
            assert_eq!(key.state().tat(), 1_000 + 50);
        },
        1_000,
    );
    shuttle::check_random(|| shuttle_hammer_count_only(2, 4, limit(3, 30, 3)), 500);
}

fn shuttle_hammer_count_only(threads: usize, per_thread: usize, l: Limit) {
    let key: Arc<AtomicGcra<ShuttleWord>> = Arc::new(AtomicGcra::default());
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let key = Arc::clone(&key);
            shuttle::thread::spawn(move || {
                (0..per_thread)
                    .filter(|_| key.check(&l, 1_000, 1).allowed)
                    .count()
            })
        })
        .collect();
    let n: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(n as u64, l.burst().min((threads * per_thread) as u64));
}

#[test]
fn shuttle_limit_changes_lose_nothing() {
    // Two threads use different limits on one key at once (a limit change racing with
    // checks): whatever the interleaving, the state advanced by exactly Σ cost·T over the
    // admitted requests, each with its own limit's T.
    shuttle::check_random(
        || {
            let a = limit(4, 40, 4); // T = 10
            let b = limit(4, 120, 6); // T = 30
            let key: Arc<AtomicGcra<ShuttleWord>> = Arc::new(AtomicGcra::default());
            let hs: Vec<_> = [a, b]
                .into_iter()
                .map(|l| {
                    let key = Arc::clone(&key);
                    shuttle::thread::spawn(move || {
                        (0..4).filter(|_| key.check(&l, 0, 1).allowed).count() as u64
                            * l.emission_interval()
                    })
                })
                .collect();
            let advanced: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
            assert_eq!(key.state().tat(), advanced);
        },
        2_000,
    );
}

#[test]
fn real_threads_admit_exactly_burst() {
    let l = limit(20_000, 20_000_000, 20_000);
    let key = Arc::new(AtomicGcra::new());
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let key = Arc::clone(&key);
            std::thread::spawn(move || (0..10_000).map(|_| key.check(&l, 0, 1)).collect::<Vec<_>>())
        })
        .collect();
    let all: Vec<Decision> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    assert_exact(&all, key.state().tat(), &l, 1);
}

#[test]
fn real_threads_keyed_store_admits_exactly_burst_per_key() {
    // Many threads, overlapping keys, most of them new: the insert race (two threads see a
    // key missing at once) must not admit a burst twice.
    let l = limit(10, 1_000, 10);
    let store: Arc<KeyedGcra<u64>> = Arc::new(KeyedGcra::new());
    let keys = 2_000u64;
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut admitted = vec![0u64; keys as usize];
                for round in 0..8 {
                    for i in 0..keys {
                        // Each thread walks the keys in its own order.
                        let k = (i * (2 * t + 1) + round) % keys;
                        if store.check(&k, &l, 0, 1).allowed {
                            admitted[k as usize] += 1;
                        }
                    }
                }
                admitted
            })
        })
        .collect();
    let mut total = vec![0u64; keys as usize];
    for h in hs {
        for (k, n) in h.join().unwrap().into_iter().enumerate() {
            total[k] += n;
        }
    }
    // 4 threads × 8 rounds = 32 requests per key, burst 10.
    assert!(
        total.iter().all(|&n| n == 10),
        "{:?}",
        total.iter().filter(|&&n| n != 10).count()
    );
    assert_eq!(store.len(), keys as usize);
    for k in 0..keys {
        assert_eq!(store.state(&k).tat(), 10 * l.emission_interval());
    }
}

#[test]
fn real_threads_generic_store_admits_exactly_burst_per_key() {
    let l = limit(10, 1_000, 10);
    let store: Arc<KeyedStore<u64, TokenBucket>> = Arc::new(KeyedStore::new(TokenBucket, 8));
    let keys = 1_000u64;
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut n = 0;
                for round in 0..8 {
                    for i in 0..keys {
                        let k = (i * (2 * t + 1) + round) % keys;
                        n += u64::from(store.check(&k, &l, 0, 1).allowed);
                    }
                }
                n
            })
        })
        .collect();
    let total: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(total, 10 * keys);
    assert_eq!(store.len(), keys as usize);
}

/// Largest number of permits admitted in a closed interval, minus the GCRA bound
/// `B + ⌊L/T⌋`, over all intervals whose ends are admission times (seed 002 §3.4).
fn worst_excess(mut admitted: Vec<u64>, l: &Limit) -> i64 {
    admitted.sort_unstable();
    let mut worst = i64::MIN;
    for a in 0..admitted.len() {
        for b in a..admitted.len() {
            let bound = l.burst() + (admitted[b] - admitted[a]) / l.emission_interval();
            worst = worst.max((b - a + 1) as i64 - bound as i64);
        }
    }
    worst
}

#[test]
fn shuttle_moving_clock_keeps_the_bound() {
    // Threads read a shared clock that they advance themselves, so the times they pass to
    // `check` interleave and may go backwards from the key's point of view. Whatever the
    // schedule, the admissions obey the GCRA bound on their own timestamps.
    shuttle::check_random(
        || {
            let l = limit(2, 20, 2); // T = 10, B = 2
            let key: Arc<AtomicGcra<ShuttleWord>> = Arc::new(AtomicGcra::default());
            let clock = Arc::new(shuttle::sync::atomic::AtomicU64::new(0));
            let hs: Vec<_> = (0..3)
                .map(|_| {
                    let (key, clock) = (Arc::clone(&key), Arc::clone(&clock));
                    shuttle::thread::spawn(move || {
                        let mut admitted = Vec::new();
                        for _ in 0..4 {
                            let now = clock.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
                            if key.check(&l, now, 1).allowed {
                                admitted.push(now);
                            }
                        }
                        admitted
                    })
                })
                .collect();
            let all: Vec<u64> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
            assert!(worst_excess(all, &l) <= 0);
        },
        3_000,
    );
}

#[test]
fn real_threads_moving_clock_keep_the_bound() {
    let l = limit(1_000, 1_000_000, 50); // T = 1000 ns, B = 50
    let key = Arc::new(AtomicGcra::new());
    let clock = Arc::new(sluice_limits::ManualClock::new(0));
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let (key, clock) = (Arc::clone(&key), Arc::clone(&clock));
            std::thread::spawn(move || {
                use sluice_limits::Clock;
                let mut admitted = Vec::new();
                for _ in 0..5_000 {
                    clock.advance(std::time::Duration::from_nanos(97));
                    let now = clock.now();
                    if key.check(&l, now, 1).allowed {
                        admitted.push(now);
                    }
                }
                admitted
            })
        })
        .collect();
    let all: Vec<u64> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    // 20 000 calls 97 ns apart ≈ 1.94 ms: about 50 + 1940 admitted; never more than the bound.
    assert!(all.len() > 1_900, "{} admitted", all.len());
    assert!(worst_excess(all, &l) <= 0);
}
