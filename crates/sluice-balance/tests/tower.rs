//! The tower balancer routes by the policy (seed 001 §IV-A), never to a server outside S_b,
//! and marks tagged requests. Backends are tower-test mocks; time is a manual clock.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use proptest::prelude::*;
use sluice_balance::tower::{Balancer, FarmHandle, MarkTag, OVERFLOW_HEADER};
use sluice_balance::{AlphaFair, AnyPolicy, DriftParams, Farm, Jsq, Jsqt, Policy, Tag};
use sluice_limits::{Clock, ManualClock};
use tower_test::mock;

type Req = http::Request<()>;
type Mock = mock::Mock<Req, &'static str>;
type Handle = mock::Handle<Req, &'static str>;

const SLOT: Duration = Duration::from_millis(1);

/// Three servers; balancer 0 reaches {1, 3} (0-based {0, 2}), balancer 1 reaches {2}.
fn farm() -> Farm {
    Farm::new(vec![1.0, 5.0, 2.0], vec![vec![0, 2], vec![1]]).unwrap()
}

fn jsqt(v: f64) -> AnyPolicy<AlphaFair> {
    let pens = AlphaFair::per_server(1.0, &[1.0, 1.0, 0.5]).unwrap();
    AnyPolicy::Jsqt(Jsqt::new(farm(), pens, DriftParams::new(v, 3.0, 1.0).unwrap()).unwrap())
}

#[derive(Debug, Clone)]
enum Op {
    Send,
    Complete(usize),
    Slot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![4 => Just(Op::Send), 2 => any::<usize>().prop_map(Op::Complete), 1 => Just(Op::Slot)]
}

struct Pending {
    server: usize,
    tag: Tag,
    response: tokio_test::task::Spawn<
        sluice_balance::tower::ResponseFuture<
            mock::future::ResponseFuture<&'static str>,
            AnyPolicy<AlphaFair>,
        >,
    >,
    reply: mock::SendResponse<&'static str>,
}

/// Drives balancer 0 and a reference copy of the same policy through the same operations and
/// checks that every request goes where the policy says, with the policy's tag.
fn run_against_reference(policy: AnyPolicy<AlphaFair>, ops: &[Op]) {
    let clock = Arc::new(ManualClock::new(0));
    let handle =
        FarmHandle::new(policy.clone(), Arc::clone(&clock) as Arc<dyn Clock>, SLOT).unwrap();
    let mut reference = policy;
    let (m0, mut h0): (Mock, Handle) = mock::pair();
    let (m2, mut h2): (Mock, Handle) = mock::pair();
    h0.allow(u64::MAX);
    h2.allow(u64::MAX);
    let mut svc =
        mock::Spawn::new(Balancer::new(handle.clone(), 0, vec![(0, m0), (2, m2)]).unwrap());
    let mut pending: Vec<Pending> = Vec::new();
    for op in ops {
        match op {
            Op::Send => {
                let expected = reference.route(0).unwrap();
                assert_ne!(expected.server, 1, "the reference never picks outside S_b");
                assert!(svc.poll_ready().is_ready());
                let fut = svc.call(http::Request::new(()));
                reference.on_arrival(expected.server, 1, expected.tag);
                let got = match expected.server {
                    0 => h0.poll_request(),
                    _ => h2.poll_request(),
                };
                let other = if expected.server == 0 {
                    h2.poll_request()
                } else {
                    h0.poll_request()
                };
                assert!(
                    other.is_pending(),
                    "request reached a backend the policy did not choose"
                );
                let Poll::Ready(Some((req, reply))) = got else {
                    panic!("chosen backend got no request")
                };
                assert_eq!(req.extensions().get::<Tag>(), Some(&expected.tag));
                assert_eq!(
                    req.headers().contains_key(OVERFLOW_HEADER),
                    expected.tag == Tag::Tagged
                );
                let response = tokio_test::task::spawn(fut);
                pending.push(Pending {
                    server: expected.server,
                    tag: expected.tag,
                    response,
                    reply,
                });
            }
            Op::Complete(i) if !pending.is_empty() => {
                let mut p = pending.swap_remove(i % pending.len());
                p.reply.send_response("ok");
                assert!(matches!(p.response.poll(), Poll::Ready(Ok("ok"))));
                drop(p.response);
                reference.on_complete(p.server, p.tag);
            }
            Op::Complete(_) => {}
            Op::Slot => {
                clock.advance(SLOT);
                reference.end_slot();
            }
        }
        assert_eq!(handle.queues(), reference.queues());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Seed 001 §IV-A steps 1–3, event by event: route = argmin_{S_b} min{N_s, Y_s}, tag iff
    /// N_s > Y_s, completions leave N_s, slot ends advance Y_s by eq. (21).
    #[test]
    fn jsqt_balancer_routes_by_the_policy(ops in prop::collection::vec(op(), 1..120), v in 0.5f64..20.0) {
        run_against_reference(jsqt(v), &ops);
    }

    #[test]
    fn jsq_balancer_routes_by_the_policy(ops in prop::collection::vec(op(), 1..120)) {
        run_against_reference(AnyPolicy::Jsq(Jsq::new(farm())), &ops);
    }
}

#[test]
fn tags_requests_once_untagged_backlog_exceeds_virtual_queue() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
    let handle = FarmHandle::new(jsqt(10.0), clock, SLOT).unwrap();
    let (m0, mut h0): (Mock, Handle) = mock::pair();
    let (m2, mut h2): (Mock, Handle) = mock::pair();
    h0.allow(10);
    h2.allow(10);
    let mut svc =
        mock::Spawn::new(Balancer::new(handle.clone(), 0, vec![(0, m0), (2, m2)]).unwrap());
    let mut futs = Vec::new();
    for _ in 0..4 {
        assert!(svc.poll_ready().is_ready());
        futs.push(svc.call(http::Request::new(())));
    }
    // First request: N = Y = 0, untagged. Afterwards N_0 = 1 > Y_0 = 0: tagged (and Y_0 only
    // grows at the slot end), so the following requests all go to server 1 tagged.
    let (r, _) = match h0.poll_request() {
        Poll::Ready(Some(x)) => x,
        _ => panic!(),
    };
    assert_eq!(r.extensions().get::<Tag>(), Some(&Tag::Untagged));
    let (r, _) = match h0.poll_request() {
        Poll::Ready(Some(x)) => x,
        _ => panic!(),
    };
    assert_eq!(r.headers()[OVERFLOW_HEADER], "tagged");
    assert_eq!(handle.queues()[0].untagged, 1);
    drop(futs);
    assert_eq!(
        handle.queues()[0].untagged,
        0,
        "dropping an untagged request frees N_s"
    );
    assert!(h2.poll_request().is_pending());
}

#[test]
fn never_accepts_a_backend_outside_reach() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
    let handle = FarmHandle::new(jsqt(10.0), clock, SLOT).unwrap();
    let b = |backends: Vec<(usize, Mock)>| Balancer::new(handle.clone(), 0, backends).is_err();
    let m = || mock::pair::<Req, &'static str>().0;
    assert!(
        b(vec![(0, m()), (1, m()), (2, m())]),
        "server 2 is not in S_1"
    );
    assert!(b(vec![(0, m())]), "server 3 has no backend");
    assert!(b(vec![(0, m()), (2, m()), (2, m())]), "duplicate backend");
    assert!(b(vec![(0, m()), (7, m())]), "no such server");
    assert!(
        Balancer::new(handle.clone(), 5, Vec::<(usize, Mock)>::new()).is_err(),
        "no such balancer"
    );
    assert!(!b(vec![(2, m()), (0, m())]));
}

#[test]
fn untagged_requests_lose_a_forged_header_and_errors_pass_through() {
    let mut req = http::Request::builder()
        .header(OVERFLOW_HEADER, "tagged")
        .body(())
        .unwrap();
    req.mark(Tag::Untagged);
    assert!(!req.headers().contains_key(OVERFLOW_HEADER));

    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
    let handle = FarmHandle::new(jsqt(10.0), clock, SLOT).unwrap();
    let (m0, mut h0): (Mock, Handle) = mock::pair();
    let (m2, _h2): (Mock, Handle) = mock::pair();
    h0.allow(0);
    let mut svc = mock::Spawn::new(Balancer::new(handle, 0, vec![(0, m0), (2, m2)]).unwrap());
    // Calling without readiness is an error, not a panic.
    let mut early = tokio_test::task::spawn(svc.call(http::Request::new(())));
    assert!(matches!(early.poll(), Poll::Ready(Err(_))));
    // The chosen backend is not ready: the balancer waits.
    assert!(svc.poll_ready().is_pending());
    h0.send_error("backend down");
    assert!(matches!(svc.poll_ready(), Poll::Ready(Err(_))));
}
