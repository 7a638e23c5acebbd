//! Token bucket / GCRA / keyed store against governor 0.10, side by side in one run.
//!
//! Fairness: every limiter reads the same time source, governor's `QuantaClock` (TSC-based,
//! read synchronously on every call): governor through its own `Clock` trait, ours through a
//! small adapter returning nanoseconds since the bench started — the same two steps (`now()`,
//! `duration_since(start)`) governor performs inside `check`. Every limit admits every
//! request (10⁹/s with burst 1000; keyed: 1000/s per key), so every check takes the
//! compare-and-swap path, the slower one for both. Ours gets the limit prepared once
//! (`GcraLimit`, read in place by `AtomicGcra::check_prepared`; `TokenBucketLimit` for the
//! token bucket), as governor's `Quota` is. Two-thread cases report wall time divided by the
//! total number of checks. The token bucket's state is three words owned by the caller
//! (`&mut`), so it has no CAS; governor's state is one atomic word.
//!
//! Two measurements of the same cases, in one run:
//! 1. *paired*: each pair of cases is run alternately in short slices (0.3–2 ms), 201 rounds,
//!    and the median of the per-round ratios is printed. On a shared, noisy machine this is
//!    the figure to trust: both sides of a ratio see the same background load.
//! 2. *criterion*: the usual per-case statistics.
//!
//! Run: `cargo bench -p sluice-limits --bench buckets -- --warm-up-time 1 --measurement-time 3`
//! A filter (criterion's positional argument, matched as a substring of `group/case`, e.g.
//! `one_hot_key_2_threads/`) restricts both passes; `SLUICE_PAIRED_ONLY=1` skips criterion.
#![allow(clippy::unwrap_used, clippy::print_stderr, missing_docs)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use governor::clock::{Clock as _, QuantaClock, QuantaInstant, Reference as _};
use governor::middleware::StateInformationMiddleware;
use governor::{Quota, RateLimiter};
use sluice_limits::token_bucket::TokenBucketLimit;
use sluice_limits::{Algorithm, AtomicGcra, Gcra, GcraLimit, KeyedGcra, Limit, Nanos, TokenBucket};

/// Governor's clock, read as our `Nanos`.
#[derive(Clone)]
struct SameClock {
    clock: QuantaClock,
    start: QuantaInstant,
}

impl SameClock {
    fn new() -> Self {
        let clock = QuantaClock::default();
        let start = clock.now();
        Self { clock, start }
    }

    #[inline]
    fn now(&self) -> Nanos {
        self.clock.now().duration_since(self.start).as_u64()
    }
}

fn ours_fast() -> Limit {
    Limit::from_nanos(1_000_000_000, 1_000_000_000)
        .unwrap()
        .with_burst(1000)
        .unwrap()
}

fn governor_fast() -> Quota {
    Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap())
        .allow_burst(NonZeroU32::new(1000).unwrap())
}

/// Runs `work(thread, iters)` on two threads at once; returns wall time per check.
fn two_threads<F: Fn(usize, u64) + Sync>(iters: u64, work: F) -> Duration {
    let barrier = Barrier::new(3);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (barrier, work) = (&barrier, &work);
            s.spawn(move || {
                barrier.wait();
                work(t, iters);
            });
        }
        barrier.wait();
        // The scope joins both threads before returning.
        Instant::now()
    })
    .elapsed()
        / 2
}

fn timed(iters: u64, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed()
}

/// A case: runs `iters` checks, returns the time they took (per check × iters).
type Case<'a> = Box<dyn FnMut(u64) -> Duration + 'a>;

fn single_key_cases(clock: &SameClock) -> Vec<(&'static str, Case<'_>)> {
    let limit = ours_fast();
    let prepared = GcraLimit::new(&limit);
    let floor_word = AtomicU64::new(0);
    let key = AtomicGcra::new();
    let key2 = AtomicGcra::new();
    let key3 = AtomicGcra::new();
    let mut gcra = Gcra.new_state(&limit, 0);
    let mut tb = TokenBucket.new_state(&limit, 0);
    let tb_limit = TokenBucketLimit::new(&limit);
    let mut tb2 = TokenBucket.new_state(&limit, 0);
    let gov = RateLimiter::direct_with_clock(governor_fast(), clock.clock.clone());
    let gov_info = RateLimiter::direct_with_clock(governor_fast(), clock.clock.clone())
        .with_middleware::<StateInformationMiddleware>();
    vec![
        (
            "floor_clock_plus_cas",
            Box::new(move |n| {
                timed(n, || {
                    let now = clock.now();
                    let cur = floor_word.load(Ordering::Relaxed);
                    let new = cur.max(now) + 1;
                    let _ = black_box(floor_word.compare_exchange_weak(
                        cur,
                        new,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ));
                })
            }) as Case<'_>,
        ),
        (
            "sluice_atomic_gcra",
            Box::new(move |n| {
                timed(n, || {
                    let _ = black_box(key.check_prepared(&prepared, clock.now(), 1));
                })
            }),
        ),
        (
            // The caller reads only `allowed`, as governor's callers read only Ok/Err: the
            // compiler drops the rest of the decision (remaining, reset).
            "sluice_atomic_gcra_allowed_only",
            Box::new(move |n| {
                timed(n, || {
                    black_box(key3.check_prepared(&prepared, clock.now(), 1).allowed);
                })
            }),
        ),
        (
            "sluice_atomic_gcra_limit_prepared_per_call",
            Box::new(move |n| {
                timed(n, || {
                    let _ = black_box(key2.check(&limit, clock.now(), 1));
                })
            }),
        ),
        (
            "sluice_gcra_plain",
            Box::new(move |n| {
                timed(n, || {
                    let _ = black_box(Gcra.check(&mut gcra, &limit, clock.now(), 1));
                })
            }),
        ),
        (
            "sluice_token_bucket_plain",
            Box::new(move |n| {
                timed(n, || {
                    let _ = black_box(TokenBucket.check(&mut tb, &limit, clock.now(), 1));
                })
            }),
        ),
        (
            "sluice_token_bucket_prepared",
            Box::new(move |n| {
                timed(n, || {
                    let _ =
                        black_box(TokenBucket.check_prepared(&mut tb2, &tb_limit, clock.now(), 1));
                })
            }),
        ),
        (
            "governor_direct",
            Box::new(move |n| {
                timed(n, || {
                    let _ = black_box(gov.check());
                })
            }),
        ),
        (
            // Governor's way to answer `RateLimit-Remaining`: its state-information
            // middleware, read as a caller building headers reads it.
            "governor_direct_remaining",
            Box::new(move |n| {
                timed(n, || {
                    let _ = black_box(gov_info.check().map(|s| s.remaining_burst_capacity()));
                })
            }),
        ),
    ]
}

fn hot_key_cases(clock: &SameClock) -> Vec<(&'static str, Case<'_>)> {
    let prepared = GcraLimit::new(&ours_fast());
    let floor_word = AtomicU64::new(0);
    let key = AtomicGcra::new();
    let key2 = AtomicGcra::new();
    let gov = RateLimiter::direct_with_clock(governor_fast(), clock.clock.clone());
    let gov_info = RateLimiter::direct_with_clock(governor_fast(), clock.clock.clone())
        .with_middleware::<StateInformationMiddleware>();
    vec![
        (
            "floor_clock_plus_cas",
            Box::new(move |n| {
                two_threads(n, |_, n| {
                    for _ in 0..n {
                        let now = clock.now();
                        let mut cur = floor_word.load(Ordering::Relaxed);
                        // One successful CAS per check, as a limiter needs.
                        while let Err(x) = floor_word.compare_exchange_weak(
                            cur,
                            cur.max(now) + 1,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        ) {
                            cur = x;
                        }
                    }
                })
            }) as Case<'_>,
        ),
        (
            "sluice_atomic_gcra",
            Box::new(move |n| {
                two_threads(n, |_, n| {
                    for _ in 0..n {
                        black_box(key.check_prepared(&prepared, clock.now(), 1));
                    }
                })
            }),
        ),
        (
            "sluice_atomic_gcra_allowed_only",
            Box::new(move |n| {
                two_threads(n, |_, n| {
                    for _ in 0..n {
                        black_box(key2.check_prepared(&prepared, clock.now(), 1).allowed);
                    }
                })
            }),
        ),
        (
            "governor_direct",
            Box::new(move |n| {
                two_threads(n, |_, n| {
                    for _ in 0..n {
                        let _ = black_box(gov.check());
                    }
                })
            }),
        ),
        (
            "governor_direct_remaining",
            Box::new(move |n| {
                two_threads(n, |_, n| {
                    for _ in 0..n {
                        let _ = black_box(gov_info.check().map(|s| s.remaining_burst_capacity()));
                    }
                })
            }),
        ),
    ]
}

const KEY_BITS: u32 = 20; // 1 048 576 keys

/// The i-th key of thread `t`: a cheap scramble, the same for every store.
#[inline]
fn key_of(t: usize, i: u64) -> u64 {
    (i.wrapping_add(t as u64 * 0x5555_5555)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15))
        >> (64 - KEY_BITS)
}

fn many_keys_cases(clock: &SameClock) -> Vec<(&'static str, Case<'_>)> {
    let limit = GcraLimit::new(&"1000/1s".parse().unwrap());
    let quota = Quota::per_second(NonZeroU32::new(1000).unwrap());
    let ours: KeyedGcra<u64> = KeyedGcra::new();
    let gov_default = RateLimiter::dashmap_with_clock(quota, clock.clock.clone());
    // Governor with our hasher: how much of the difference is the hash function.
    let gov_foldhash = RateLimiter::dashmap_with_clock_and_hasher(
        quota,
        clock.clock.clone(),
        foldhash::fast::RandomState::default(),
    );
    for k in 0..(1u64 << KEY_BITS) {
        ours.check(&k, &limit, clock.now(), 1);
        let _ = gov_default.check_key(&k);
        let _ = gov_foldhash.check_key(&k);
    }
    let (mut r1, mut r2, mut r3) = (0u64, 0u64, 0u64);
    vec![
        (
            "sluice_keyed_gcra",
            Box::new(move |n| {
                let from = r1;
                r1 += n;
                two_threads(n, |t, n| {
                    for i in from..from + n {
                        black_box(ours.check(&key_of(t, i), &limit, clock.now(), 1));
                    }
                })
            }) as Case<'_>,
        ),
        (
            "governor_dashmap_default",
            Box::new(move |n| {
                let from = r2;
                r2 += n;
                two_threads(n, |t, n| {
                    for i in from..from + n {
                        let _ = black_box(gov_default.check_key(&key_of(t, i)));
                    }
                })
            }),
        ),
        (
            "governor_dashmap_foldhash",
            Box::new(move |n| {
                let from = r3;
                r3 += n;
                two_threads(n, |t, n| {
                    for i in from..from + n {
                        let _ = black_box(gov_foldhash.check_key(&key_of(t, i)));
                    }
                })
            }),
        ),
    ]
}

/// The benchmark filter given on the command line (criterion's positional argument), if any.
fn filter() -> Option<String> {
    // Criterion's options that take a value: their value is not the filter.
    const VALUED: [&str; 12] = [
        "--warm-up-time",
        "--measurement-time",
        "--sample-size",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--save-baseline",
        "--baseline",
        "--load-baseline",
        "--profile-time",
        "--output-format",
    ];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if VALUED.contains(&a.as_str()) {
            args.next();
        } else if !a.starts_with('-') {
            return Some(a);
        }
    }
    None
}

/// Whether the filter selects anything of `group` (`case`: one case of it).
fn selected(group: &str, case: Option<&str>) -> bool {
    filter().is_none_or(|f| {
        let name = format!("{group}/{}", case.unwrap_or_default());
        // A group is built unless the filter names another group.
        name.contains(&f) || (case.is_none() && (!f.contains('/') || f.starts_with(group)))
    })
}

/// Runs cases `a` and `b` alternately, `rounds` times, `iters` checks per slice; prints the
/// median time per check of each and the median of the per-round ratios `a / b`.
fn paired(group: &str, cases: &mut [(&'static str, Case<'_>)], a: usize, b: usize, iters: u64) {
    const ROUNDS: usize = 201;
    if !selected(group, Some(cases[a].0)) && !selected(group, Some(cases[b].0)) {
        return;
    }
    // Warm up both (caches, branch predictors, page faults).
    for i in [a, b] {
        (cases[i].1)(iters);
    }
    let (mut ta, mut tb, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 { [a, b] } else { [b, a] };
        let mut t = [0.0f64; 2];
        for i in order {
            let ns = (cases[i].1)(iters).as_secs_f64() * 1e9 / iters as f64;
            t[usize::from(i == b)] = ns;
        }
        ta.push(t[0]);
        tb.push(t[1]);
        ratio.push(t[0] / t[1]);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "paired {group}: {} {:.1} ns | {} {:.1} ns | ratio {:.2}",
        cases[a].0,
        median(&mut ta),
        cases[b].0,
        median(&mut tb),
        median(&mut ratio)
    );
}

fn index(cases: &[(&'static str, Case<'_>)], name: &str) -> usize {
    cases.iter().position(|(n, _)| *n == name).unwrap()
}

fn paired_report(clock: &SameClock) {
    if selected("single_key_1_thread", None) {
        let mut c = single_key_cases(clock);
        let (ours, gov, floor) = (
            index(&c, "sluice_atomic_gcra"),
            index(&c, "governor_direct"),
            index(&c, "floor_clock_plus_cas"),
        );
        let (tb, tbp, plain) = (
            index(&c, "sluice_token_bucket_plain"),
            index(&c, "sluice_token_bucket_prepared"),
            index(&c, "sluice_gcra_plain"),
        );
        paired("single_key_1_thread", &mut c, ours, gov, 30_000);
        let gov_info = index(&c, "governor_direct_remaining");
        paired("single_key_1_thread", &mut c, ours, gov_info, 30_000);
        paired("single_key_1_thread", &mut c, ours, floor, 30_000);
        let lean = index(&c, "sluice_atomic_gcra_allowed_only");
        paired("single_key_1_thread", &mut c, lean, gov, 30_000);
        paired("single_key_1_thread", &mut c, plain, gov, 30_000);
        paired("single_key_1_thread", &mut c, tb, gov, 30_000);
        paired("single_key_1_thread", &mut c, tbp, gov, 30_000);
    }
    if selected("one_hot_key_2_threads", None) {
        let mut c = hot_key_cases(clock);
        let (ours, gov, floor) = (
            index(&c, "sluice_atomic_gcra"),
            index(&c, "governor_direct"),
            index(&c, "floor_clock_plus_cas"),
        );
        paired("one_hot_key_2_threads", &mut c, ours, gov, 30_000);
        let gov_info = index(&c, "governor_direct_remaining");
        paired("one_hot_key_2_threads", &mut c, ours, gov_info, 30_000);
        paired("one_hot_key_2_threads", &mut c, ours, floor, 30_000);
        let lean = index(&c, "sluice_atomic_gcra_allowed_only");
        paired("one_hot_key_2_threads", &mut c, lean, gov, 30_000);
    }
    if selected("1M_keys_2_threads", None) {
        let mut c = many_keys_cases(clock);
        let (ours, def, fold) = (
            index(&c, "sluice_keyed_gcra"),
            index(&c, "governor_dashmap_default"),
            index(&c, "governor_dashmap_foldhash"),
        );
        paired("1M_keys_2_threads", &mut c, ours, def, 5_000);
        paired("1M_keys_2_threads", &mut c, ours, fold, 5_000);
    }
}

fn criterion_group(c: &mut Criterion, name: &str, cases: Vec<(&'static str, Case<'_>)>) {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(1));
    for (case, mut run) in cases {
        g.bench_function(case, |b| b.iter_custom(&mut run));
    }
    g.finish();
}

fn main() {
    let clock = SameClock::new();
    paired_report(&clock);
    // `SLUICE_PAIRED_ONLY=1`: the paired figures only, no criterion pass.
    if std::env::var_os("SLUICE_PAIRED_ONLY").is_some() {
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    if selected("single_key_1_thread", None) {
        criterion_group(&mut c, "single_key_1_thread", single_key_cases(&clock));
    }
    if selected("one_hot_key_2_threads", None) {
        criterion_group(&mut c, "one_hot_key_2_threads", hot_key_cases(&clock));
    }
    let mut c = c.sample_size(30);
    if selected("1M_keys_2_threads", None) {
        criterion_group(&mut c, "1M_keys_2_threads", many_keys_cases(&clock));
    }
    c.final_summary();
}
