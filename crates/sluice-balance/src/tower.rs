//! A tower [`Service`] that balances requests over backend services with a [`Policy`]
//! (feature `tower`).
//!
//! The balancer is one load balancer b of seed 001 §II; its backends are the servers S_b.
//! Several balancers over the same farm share one [`FarmHandle`]. A request is a job of
//! mean size 1: N_s counts the untagged requests in flight at backend s (eq. 16, with
//! completions as departures), and the virtual queues Y_s advance once per `slot` of the
//! injected clock (eq. 21). Tagged requests carry the [`Tag`] as a request extension and, for
//! HTTP, the header [`OVERFLOW_HEADER`]` = tagged`, so backends can shed them first.
//!
//! `poll_ready` asks the policy for a server and waits for that backend only (while it waits,
//! each wake-up asks the policy again); `call` sends the request there and tags it by the
//! server's state at that moment.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use sluice_limits::{Clock, Nanos};
use tower::Service;

use crate::{BalanceError, Policy, ServerQueues, Tag};

/// Boxed error returned by the balancer (backend errors pass through boxed).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// HTTP header set to `tagged` on overflow requests (and removed from untagged ones, so a
/// client cannot forge it).
pub const OVERFLOW_HEADER: &str = "sluice-overflow";

/// After a long idle period at most this many slots are replayed; the rest are skipped
/// (the virtual queues have long drained by then).
const MAX_CATCH_UP_SLOTS: u64 = 100_000;

/// A request that can carry its tag to the backend.
pub trait MarkTag {
    /// Records the tag on the request.
    fn mark(&mut self, tag: Tag);
}

impl<B> MarkTag for http::Request<B> {
    fn mark(&mut self, tag: Tag) {
        self.extensions_mut().insert(tag);
        match tag {
            Tag::Tagged => {
                self.headers_mut()
                    .insert(OVERFLOW_HEADER, http::HeaderValue::from_static("tagged"));
            }
            Tag::Untagged => {
                self.headers_mut().remove(OVERFLOW_HEADER);
            }
        }
    }
}

#[derive(Debug)]
struct FarmState<P> {
    policy: P,
    slot: Nanos,
    next_slot_end: Nanos,
}

/// The shared state of a farm: the policy, its clock and slot length. Cheap to clone.
pub struct FarmHandle<P> {
    state: Arc<Mutex<FarmState<P>>>,
    clock: Arc<dyn Clock>,
}

impl<P> Clone for FarmHandle<P> {
    fn clone(&self) -> Self {
        Self {
            state: Arc::clone(&self.state),
            clock: Arc::clone(&self.clock),
        }
    }
}

impl<P> std::fmt::Debug for FarmHandle<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarmHandle").finish_non_exhaustive()
    }
}

impl<P: Policy> FarmHandle<P> {
    /// A farm driven by `policy`, whose virtual queues advance every `slot` of `clock`.
    pub fn new(policy: P, clock: Arc<dyn Clock>, slot: Duration) -> Result<Self, BalanceError> {
        let slot = u64::try_from(slot.as_nanos()).unwrap_or(u64::MAX);
        if slot == 0 {
            return Err(BalanceError::BadParameter {
                name: "slot",
                value: 0.0,
            });
        }
        let next_slot_end = clock.now().saturating_add(slot);
        Ok(Self {
            state: Arc::new(Mutex::new(FarmState {
                policy,
                slot,
                next_slot_end,
            })),
            clock,
        })
    }

    /// Runs `f` on the policy after bringing its slots up to date.
    fn with<R>(&self, f: impl FnOnce(&mut P) -> R) -> R {
        let now = self.clock.now();
        let mut st = self.state.lock();
        let mut replayed = 0;
        while st.next_slot_end <= now && replayed < MAX_CATCH_UP_SLOTS {
            st.policy.end_slot();
            st.next_slot_end = st.next_slot_end.saturating_add(st.slot);
            replayed += 1;
        }
        if st.next_slot_end <= now {
            st.next_slot_end = now.saturating_add(st.slot);
        }
        f(&mut st.policy)
    }

    /// The queues of every server (N_s, Y_s, y_s), for metrics.
    #[must_use]
    pub fn queues(&self) -> Vec<ServerQueues> {
        self.with(|p| p.queues())
    }
}

/// Balancer b: a [`Service`] over the backends of S_b. See the module documentation.
pub struct Balancer<S, P> {
    farm: FarmHandle<P>,
    balancer: usize,
    /// Indexed by server; `None` for servers outside S_b.
    backends: Vec<Option<S>>,
    ready: Option<usize>,
}

impl<S, P> std::fmt::Debug for Balancer<S, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer")
            .field("balancer", &self.balancer)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl<S, P: Policy> Balancer<S, P> {
    /// Balancer `balancer` of the farm, with one backend per server of its S_b: a backend for
    /// a server outside S_b, a duplicate, or a missing one is an error.
    pub fn new(
        farm: FarmHandle<P>,
        balancer: usize,
        backends: Vec<(usize, S)>,
    ) -> Result<Self, BalanceError> {
        let (servers, reach) = farm.with(|p| {
            let f = p.farm();
            (
                f.servers(),
                if balancer < f.balancers() {
                    Some(f.reach(balancer).to_vec())
                } else {
                    None
                },
            )
        });
        let reach = reach.ok_or(BalanceError::OutOfRange {
            what: "balancer",
            index: balancer,
            len: servers,
        })?;
        let mut slots: Vec<Option<S>> = (0..servers).map(|_| None).collect();
        for (s, svc) in backends {
            match slots.get_mut(s) {
                Some(slot @ None) if reach.contains(&s) => *slot = Some(svc),
                _ => return Err(BalanceError::BadReach { balancer, servers }),
            }
        }
        if reach.iter().any(|&s| slots[s].is_none()) {
            return Err(BalanceError::BadReach { balancer, servers });
        }
        Ok(Self {
            farm,
            balancer,
            backends: slots,
            ready: None,
        })
    }

    /// The shared farm handle (for metrics).
    #[must_use]
    pub fn farm(&self) -> &FarmHandle<P> {
        &self.farm
    }
}

impl<S, P, Req> Service<Req> for Balancer<S, P>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    P: Policy + Send + 'static,
    Req: MarkTag,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, P>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.ready.is_some() {
            // A backend is already reserved for the next call (tower's readiness contract).
            return Poll::Ready(Ok(()));
        }
        let route = self
            .farm
            .with(|p| p.route(self.balancer))
            .map_err(BoxError::from)?;
        let backend = self.backends.get_mut(route.server).and_then(Option::as_mut);
        let Some(backend) = backend else {
            // The policy only picks servers of S_b, and `new` has a backend for each.
            return Poll::Ready(Err(BalanceError::OutOfRange {
                what: "server",
                index: route.server,
                len: self.backends.len(),
            }
            .into()));
        };
        match backend.poll_ready(cx) {
            Poll::Ready(Ok(())) => {
                self.ready = Some(route.server);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e.into())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let Some(server) = self.ready.take() else {
            return ResponseFuture {
                inner: Inner::Failed(Some(BalanceError::NotReady.into())),
            };
        };
        let Some(backend) = self.backends.get_mut(server).and_then(Option::as_mut) else {
            return ResponseFuture {
                inner: Inner::Failed(Some(BalanceError::NotReady.into())),
            };
        };
        let tag = self.farm.with(|p| {
            let tag = p.tag_at(server);
            p.on_arrival(server, 1, tag);
            tag
        });
        req.mark(tag);
        let guard = InFlight {
            farm: self.farm.clone(),
            server,
            tag,
        };
        ResponseFuture {
            inner: Inner::Pending {
                future: Box::pin(backend.call(req)),
                _guard: guard,
            },
        }
    }
}

/// Reports the request's completion (or cancellation) to the policy when dropped.
struct InFlight<P: Policy> {
    farm: FarmHandle<P>,
    server: usize,
    tag: Tag,
}

impl<P: Policy> Drop for InFlight<P> {
    fn drop(&mut self) {
        let (server, tag) = (self.server, self.tag);
        self.farm.with(|p| p.on_complete(server, tag));
    }
}

enum Inner<F, P: Policy> {
    Pending {
        future: Pin<Box<F>>,
        _guard: InFlight<P>,
    },
    Failed(Option<BoxError>),
}

/// The response of a balanced request; N_s drops when it completes or is dropped.
pub struct ResponseFuture<F, P: Policy> {
    inner: Inner<F, P>,
}

impl<F, P: Policy> std::fmt::Debug for ResponseFuture<F, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, T, E, P> Future for ResponseFuture<F, P>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    P: Policy,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is Unpin (the inner future is boxed), so the future is Unpin.
        match &mut self.get_mut().inner {
            Inner::Pending { future, .. } => future.as_mut().poll(cx).map_err(Into::into),
            Inner::Failed(err) => Poll::Ready(Err(err
                .take()
                .unwrap_or_else(|| BalanceError::NotReady.into()))),
        }
    }
}
