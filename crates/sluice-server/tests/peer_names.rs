//! Peers given by host name (`--peers 1=sluice-1.sluice-peers:8082`): a name that does not
//! resolve yet does not stop the node, is shown as unresolved, and is used as soon as it
//! resolves; when the name moves to another address (a restarted pod), messages follow it.
//! The names are answered by a resolver the test controls, the datagrams travel on real UDP
//! sockets on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test: failing loudly is the point

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_server::cluster::{Cluster, ClusterSpec, PeerAddr, Resolver, parse_peers};
use sluice_server::peer::{PeerKey, open};
use sluice_server::status::ClusterInfo;
use sluice_server::{Config, Engine};
use tokio::net::UdpSocket;
use tokio::sync::watch;

/// Answers names from a table the test edits; a name not in it does not resolve.
#[derive(Debug, Default)]
struct Table(Mutex<HashMap<String, SocketAddr>>);

impl Table {
    fn point(&self, host: &str, addr: SocketAddr) {
        self.0.lock().unwrap().insert(host.to_owned(), addr);
    }
}

impl Resolver for Table {
    fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        match self.0.lock().unwrap().get(host) {
            Some(a) => Ok(vec![SocketAddr::new(a.ip(), port)]),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{host}: no such name (yet)"),
            )),
        }
    }
}

fn key() -> PeerKey {
    PeerKey::from_text("test-names-key-0123456789abcdef").unwrap()
}

/// Waits (at most `within`) for a datagram from node 0 to node 1 on `socket`.
async fn hears_node_0(socket: &UdpSocket, within: Duration) -> bool {
    let mut buf = vec![0u8; 2048];
    let k = key();
    tokio::time::timeout(within, async {
        loop {
            let (n, _) = socket.recv_from(&mut buf).await.unwrap();
            if open(&k, 1, &buf[..n]).is_ok_and(|(from, _)| from == 0) {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// Drops whatever `socket` has received so far.
fn drain(socket: &UdpSocket) {
    let mut buf = vec![0u8; 2048];
    while socket.try_recv_from(&mut buf).is_ok() {}
}

#[tokio::test]
async fn a_name_that_resolves_later_is_used_and_a_moved_name_is_followed() {
    // Peer 1's port is fixed by the name's entry; the test moves its IP among loopback
    // addresses (127.0.0.0/8 is all loopback on Linux), as a restarted pod moves.
    let first = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = first.local_addr().unwrap().port();
    let Ok(second) = UdpSocket::bind(("127.0.0.2", port)).await else {
        eprintln!("skipped: cannot bind 127.0.0.2:{port}");
        return;
    };
    let peers = parse_peers(&format!("1=peer-1.test:{port}")).unwrap();
    assert!(matches!(peers[0].addr, PeerAddr::Name { .. }));
    let table = Arc::new(Table::default());
    let mut spec = ClusterSpec::new(0, peers, key());
    spec.cycle = Duration::from_millis(20);
    spec.lease = Duration::from_millis(200);
    spec.resolver = table.clone();
    spec.resolve_every = Duration::from_millis(50);
    let engine = Engine::new(
        Config::from_yaml(
            "c.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, \
             requests_per_unit: 10, coordination: cluster }\n",
        )
        .unwrap(),
    );
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // The name does not resolve: the node starts all the same.
    let cluster = Cluster::new(&spec, socket, &engine).unwrap();
    let (stop, mut rx) = watch::channel(false);
    let task = tokio::spawn(cluster.clone().run(async move {
        let _ = rx.wait_for(|s| *s).await;
    }));

    // Unresolved: shown, counted, and nothing is sent anywhere.
    assert!(!hears_node_0(&first, Duration::from_millis(300)).await);
    let s = cluster.status(usize::MAX);
    assert_eq!(s.peers_unresolved, 1, "{s:?}");
    let m = &s.members[0];
    assert_eq!(m.addr, None, "{m:?}");
    assert_eq!(
        m.host.as_deref(),
        Some(format!("peer-1.test:{port}").as_str())
    );
    assert!(
        m.resolve_error
            .as_deref()
            .is_some_and(|e| e.contains("no such name"))
    );
    assert!(s.peer.unaddressed > 0, "{:?}", s.peer);

    // It resolves: messages go there within a few lookups.
    table.point("peer-1.test", first.local_addr().unwrap());
    assert!(hears_node_0(&first, Duration::from_secs(2)).await);
    let s = cluster.status(usize::MAX);
    assert_eq!(s.peers_unresolved, 0);
    assert_eq!(
        s.members[0].addr,
        Some(first.local_addr().unwrap().to_string())
    );
    assert_eq!(s.members[0].resolve_error, None);

    // It moves: messages follow, and no longer go to the old address.
    table.point("peer-1.test", second.local_addr().unwrap());
    assert!(hears_node_0(&second, Duration::from_secs(2)).await);
    drain(&first);
    assert!(!hears_node_0(&first, Duration::from_millis(300)).await);
    assert_eq!(
        cluster.status(usize::MAX).members[0].addr,
        Some(second.local_addr().unwrap().to_string())
    );

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
