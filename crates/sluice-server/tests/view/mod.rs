//! What the tests that run live engines share: the wall clock engines decide on, and
//! `GET /v1/cluster` of an engine's HTTP API, for the tests that check what it shows.
#![allow(clippy::unwrap_used)]
#![allow(dead_code)] // each test target uses its own part

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_server::Engine;

/// Now on the wall clock, in nanoseconds since the unix epoch (windows aligned to it).
pub(crate) fn unix_now() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

/// `GET /v1/cluster` of `engine`'s HTTP API (served on 127.0.0.1 for this call), as JSON.
pub(crate) async fn cluster_view(engine: &Arc<Engine>) -> serde_json::Value {
    use http_body_util::{BodyExt, Empty};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let state = sluice_server::http::HttpState::new(engine.clone(), None);
    let served = tokio::spawn(sluice_server::http::run(listener, state, async move {
        let _ = stopped.await;
    }));
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = http::Request::get("/v1/cluster")
        .header(http::header::HOST, "localhost")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    drop(sender);
    let _ = stop.send(());
    served.await.unwrap().unwrap();
    serde_json::from_slice(&body).unwrap()
}
