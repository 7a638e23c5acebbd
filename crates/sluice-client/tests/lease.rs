//! `LeaseClient` against a real `sluice_server` HTTP shell started in this process on
//! 127.0.0.1 (wall time, 1 s leases refreshed every 333 ms). Every test is bounded.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice_client::{LeaseClient, LeaseConfig};
use sluice_server::lease::{self, Leases};
use sluice_server::{Config, Descriptor, Engine};
use tokio::sync::oneshot;

const BOUND: Duration = Duration::from_secs(30);
const RULES: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit: { unit: second, requests_per_unit: 1000 }
";

struct Server {
    addr: SocketAddr,
    leases: Arc<Leases>,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), sluice_server::http::ServeError>>,
}

impl Server {
    async fn start() -> Self {
        let engine = Arc::new(Engine::new(Config::from_yaml("t.yaml", RULES).unwrap()));
        let leases =
            Arc::new(Leases::new(lease::LeaseConfig::with_lease(Duration::from_secs(1))).unwrap());
        let state =
            sluice_server::http::HttpState::new(engine, None).with_leases(Arc::clone(&leases));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(sluice_server::http::run(listener, state, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            leases,
            stop,
            done,
        }
    }

    fn config(&self, client: &str, wants: f64) -> LeaseConfig {
        LeaseConfig::new(
            format!("http://{}", self.addr),
            "api",
            [("tenant", "acme")],
            client,
            wants,
        )
        .timeout(Duration::from_secs(2))
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
    }

    fn outstanding(&self) -> f64 {
        lease::per_second(
            self.leases
                .outstanding("api", &Descriptor::new([("tenant", "acme")])),
        )
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.done.await.unwrap().unwrap();
    }
}

/// Polls `acquire` for `span`, draining what it admits every millisecond; returns how many
/// were admitted and over how long, on the client's clock.
async fn admitted_over(client: &LeaseClient, span: Duration) -> (u64, f64) {
    let start = client.now();
    let mut admitted = 0u64;
    while client.now() - start < span.as_nanos() as u64 {
        while client.try_acquire(1) {
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (admitted, (client.now() - start) as f64 / 1e9)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_share_max_min_and_the_survivor_takes_over() {
    tokio::time::timeout(BOUND, async {
        let s = Server::start().await;
        let a = LeaseClient::start(s.config("a", 300.0)).unwrap();
        let la = a.wait_for_lease(Duration::from_secs(5)).await.unwrap();
        let b = LeaseClient::start(s.config("b", 900.0)).unwrap();
        let lb = b.wait_for_lease(Duration::from_secs(5)).await.unwrap();
        // Seed 000 §7 Alg. 2 on 1,000/s: (300, 700).
        assert_eq!(la.rate, 300.0);
        assert_eq!(lb.rate, 700.0);
        assert_eq!(lb.share, Some(1000.0));
        assert!(
            s.outstanding() <= 1000.0,
            "granted {} > 1000",
            s.outstanding()
        );

        // The local limiter admits the leased rate: at most rate·t + burst (GCRA), and
        // not much less while demand always exceeds it.
        let (n, t) = admitted_over(&a, Duration::from_millis(1500)).await;
        let burst = 30.0; // 100 ms of 300/s
        assert!(
            n as f64 <= 300.0 * t + burst + 1.0,
            "{n} admitted in {t:.3} s"
        );
        assert!(n as f64 >= 0.8 * 300.0 * t, "{n} admitted in {t:.3} s");
        assert!(s.outstanding() <= 1000.0);

        // `a` stops refreshing (its refresher ends with it). After its lease expires (1 s)
        // `b`'s next refresh gets the capacity it wants.
        drop(a);
        let mut rate = b.rate();
        for _ in 0..20 {
            if rate == 900.0 {
                break;
            }
            rate = b.next_lease(Duration::from_secs(2)).await.unwrap().rate;
            assert!(s.outstanding() <= 1000.0);
        }
        assert_eq!(rate, 900.0);
        assert_eq!(b.lease().unwrap().clients, 1);

        // Closing hands the lease back at once.
        b.close().await;
        assert_eq!(s.outstanding(), 0.0);
        s.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_node_the_last_rate_holds_until_expiry_then_the_fallback() {
    tokio::time::timeout(BOUND, async {
        let s = Server::start().await;
        let c = LeaseClient::start(s.config("c", 200.0).fallback_rate(5.0)).unwrap();
        let lease = c.wait_for_lease(Duration::from_secs(5)).await.unwrap();
        assert_eq!(lease.rate, 200.0);
        s.stop().await;
        // Refreshes now fail; the grant stays in force until its own expiry...
        let expires_at = c.lease().unwrap().expires_at;
        loop {
            let rate = c.rate();
            let after = c.now();
            if after >= expires_at {
                break;
            }
            assert_eq!(rate, 200.0);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // ...and never past it: then the fallback.
        assert!(!c.has_lease());
        assert_eq!(c.rate(), 5.0);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(c.last_error().is_some());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn bad_configurations_are_refused() {
    let cfg = |server: &str, wants: f64| {
        LeaseConfig::new(server, "api", [("tenant", "acme")], "c", wants)
    };
    assert!(LeaseClient::start(cfg("ftp://x", 1.0)).is_err());
    assert!(LeaseClient::start(cfg("http://127.0.0.1:1", f64::NAN)).is_err());
    assert!(LeaseClient::start(cfg("http://127.0.0.1:1", -1.0)).is_err());
}
