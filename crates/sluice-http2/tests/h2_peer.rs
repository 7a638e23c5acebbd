//! The server connection against a real HTTP/2 client, the `h2` crate, over an in-memory
//! pipe: a tiny shell reads bytes into a buffer, hands them to `poll_event`, answers each
//! request with its body reversed (`:status 200`, then trailers `grpc-status: 0`) and
//! writes `output()`. Flow control matters both ways: bodies exceed the windows.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::client::SendRequest;
use proptest::prelude::*;
use sluice_http2::hpack;
use sluice_http2::server::{Connection, Event, Settings};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};
use tokio::sync::oneshot;

/// What the shell saw.
#[derive(Debug, Default)]
struct Served {
    requests: usize,
    answered: usize,
    resets: usize,
}

/// When to call `go_away`, and whom to tell once its GOAWAY is written.
struct GoAwayAfter {
    requests: usize,
    done: oneshot::Sender<()>,
}

/// The server's shell: until the peer closes or the connection is done.
async fn serve(
    mut io: DuplexStream,
    settings: Settings,
    mut go_away: Option<GoAwayAfter>,
) -> Served {
    let mut conn = Connection::new(settings);
    let mut input = BytesMut::with_capacity(64 << 10);
    let mut bodies: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut served = Served::default();
    let mut trailers = Vec::new();
    hpack::encode_literal(&mut trailers, 0, b"grpc-status", b"0");
    loop {
        let out = std::mem::take(conn.output());
        if !out.is_empty() && io.write_all(&out).await.is_err() {
            break;
        }
        if go_away
            .as_ref()
            .is_some_and(|g| served.requests >= g.requests)
        {
            // Written above: the client has it (or will, before anything later).
            let g = go_away.take().unwrap();
            conn.go_away();
            let out = std::mem::take(conn.output());
            io.write_all(&out).await.unwrap();
            g.done.send(()).unwrap();
        }
        if conn.is_done() {
            break;
        }
        match io.read_buf(&mut input).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        loop {
            let (stream, end) = match conn.poll_event(&mut input) {
                Ok(None) => break,
                Err(e) => panic!("the server failed: {e}"),
                Ok(Some(Event::Request { stream, end_stream })) => {
                    let r = conn.request();
                    assert_eq!((r.method(), r.path()), (&b"POST"[..], &b"/echo"[..]));
                    assert_eq!(r.authority(), Some(&b"sluice.test"[..]));
                    served.requests += 1;
                    bodies.insert(stream, Vec::new());
                    (stream, end_stream)
                }
                Ok(Some(Event::Data {
                    stream,
                    data,
                    end_stream,
                })) => {
                    bodies.get_mut(&stream).unwrap().extend_from_slice(&data);
                    (stream, end_stream)
                }
                Ok(Some(Event::Trailers { stream })) => (stream, true),
                Ok(Some(Event::Reset { stream, .. })) => {
                    bodies.remove(&stream);
                    served.resets += 1;
                    continue;
                }
            };
            if end {
                let mut body = bodies.remove(&stream).unwrap();
                body.reverse();
                conn.send_headers(stream, &[0x88], false);
                conn.send_data(stream, &body, false);
                conn.send_trailers(stream, &trailers);
                served.answered += 1;
            }
        }
    }
    served
}

/// One call: `body` sent in pieces of at most `piece` bytes; the answer checked.
async fn call(send: SendRequest<Bytes>, body: Vec<u8>, piece: usize) -> Result<(), h2::Error> {
    let mut send = send.ready().await?;
    let req = http::Request::post("http://sluice.test/echo")
        .body(())
        .unwrap();
    let (response, mut stream) = send.send_request(req, body.is_empty())?;
    let mut pieces = body.chunks(piece).peekable();
    while let Some(p) = pieces.next() {
        stream.send_data(Bytes::copy_from_slice(p), pieces.peek().is_none())?;
    }
    let response = response.await?;
    assert_eq!(response.status(), 200);
    let mut recv = response.into_body();
    let mut got = Vec::with_capacity(body.len());
    while let Some(data) = recv.data().await {
        let data = data?;
        recv.flow_control().release_capacity(data.len())?;
        got.extend_from_slice(&data);
    }
    let trailers = recv.trailers().await?.expect("trailers");
    assert_eq!(trailers["grpc-status"], "0");
    let mut want = body;
    want.reverse();
    assert!(
        got == want,
        "a body of {} answered with {}",
        want.len(),
        got.len()
    );
    Ok(())
}

/// The client's settings.
#[derive(Debug, Clone, Copy)]
struct Client {
    window: u32,
    connection_window: u32,
    max_frame: u32,
}

const DEFAULT_CLIENT: Client = Client {
    window: 65_535,
    connection_window: 65_535,
    max_frame: 16_384,
};

/// A client connected to a served connection: its handle, the shell's task, and the
/// client connection's task.
async fn connect(
    client: Client,
    settings: Settings,
    go_away: Option<GoAwayAfter>,
) -> (
    SendRequest<Bytes>,
    tokio::task::JoinHandle<Served>,
    tokio::task::JoinHandle<()>,
) {
    // Large enough that neither side's writes wait on the other's reads: each direction
    // carries at most a window's data (≤ 1 MiB) beyond what the reader took.
    let (a, b) = tokio::io::duplex(8 << 20);
    let server = tokio::spawn(serve(b, settings, go_away));
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(client.window)
        .initial_connection_window_size(client.connection_window)
        .max_frame_size(client.max_frame)
        .handshake::<_, Bytes>(a)
        .await
        .unwrap();
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, server, conn)
}

/// `n` calls with bodies of `sizes`, concurrently; every one must be answered right.
async fn echo_all(client: Client, settings: Settings, sizes: Vec<usize>, piece: usize) -> Served {
    let (send, server, conn) = connect(client, settings, None).await;
    let mut calls = tokio::task::JoinSet::new();
    for (i, n) in sizes.iter().enumerate() {
        let body: Vec<u8> = (0..*n).map(|j| (j * 31 + i) as u8).collect();
        calls.spawn(call(send.clone(), body, piece));
    }
    drop(send);
    while let Some(r) = calls.join_next().await {
        r.unwrap().unwrap();
    }
    conn.await.unwrap();
    server.await.unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Sizes from 0 to `max`, from a seed (xorshift: no dependency for a few numbers).
fn sizes(n: usize, max: usize, mut seed: u64) -> Vec<usize> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % (max as u64 + 1)) as usize
        })
        .collect()
}

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn many_concurrent_requests_are_answered() {
    let sizes = sizes(64, 200 << 10, 0x5eed);
    let served = runtime().block_on(async {
        tokio::time::timeout(
            LIMIT,
            echo_all(DEFAULT_CLIENT, Settings::default(), sizes, 20_000),
        )
        .await
        .unwrap()
    });
    assert_eq!(
        (served.requests, served.answered, served.resets),
        (64, 64, 0)
    );
}

#[test]
fn small_server_windows() {
    // Our receive windows at their smallest sensible: the client waits on our updates.
    let settings = Settings {
        initial_window_size: 16_384,
        connection_window_size: 65_535,
        ..Settings::default()
    };
    let sizes = sizes(16, 200 << 10, 7);
    let served = runtime().block_on(async {
        tokio::time::timeout(LIMIT, echo_all(DEFAULT_CLIENT, settings, sizes, 50_000))
            .await
            .unwrap()
    });
    assert_eq!(served.answered, 16);
}

#[test]
fn client_resets_some_streams_and_the_rest_complete() {
    let served = runtime().block_on(async {
        tokio::time::timeout(LIMIT, async {
            let (send, server, conn) = connect(DEFAULT_CLIENT, Settings::default(), None).await;
            let mut calls = tokio::task::JoinSet::new();
            for (i, n) in sizes(24, 100 << 10, 99).into_iter().enumerate() {
                let send = send.clone();
                if i % 3 == 0 {
                    // Half a body, then CANCEL: never answered.
                    calls.spawn(async move {
                        let mut send = send.ready().await?;
                        let req = http::Request::post("http://sluice.test/echo")
                            .body(())
                            .unwrap();
                        let (_response, mut stream) = send.send_request(req, false)?;
                        stream.send_data(Bytes::from(vec![1; n / 2 + 1]), false)?;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        stream.send_reset(h2::Reason::CANCEL);
                        Ok(())
                    });
                } else {
                    calls.spawn(call(send, vec![i as u8; n], 16_384));
                }
            }
            drop(send);
            while let Some(r) = calls.join_next().await {
                r.unwrap().unwrap();
            }
            conn.await.unwrap();
            server.await.unwrap()
        })
        .await
        .unwrap()
    });
    assert_eq!(
        (served.requests, served.answered, served.resets),
        (24, 16, 8)
    );
}

#[test]
fn graceful_go_away_lets_in_flight_streams_finish() {
    runtime().block_on(async {
        tokio::time::timeout(LIMIT, async {
            let (done, going) = oneshot::channel();
            let go_away = GoAwayAfter { requests: 4, done };
            let (send, server, conn) =
                connect(DEFAULT_CLIENT, Settings::default(), Some(go_away)).await;
            let (release, released) = tokio::sync::watch::channel(false);
            let mut calls = tokio::task::JoinSet::new();
            for i in 0..4u8 {
                let (send, mut released) = (send.clone(), released.clone());
                // Half the body before GOAWAY, the rest after: in flight across it.
                calls.spawn(async move {
                    let mut send = send.ready().await?;
                    let req = http::Request::post("http://sluice.test/echo")
                        .body(())
                        .unwrap();
                    let (response, mut stream) = send.send_request(req, false)?;
                    stream.send_data(Bytes::from(vec![i; 30_000]), false)?;
                    released.wait_for(|r| *r).await.unwrap();
                    stream.send_data(Bytes::from(vec![i + 1; 30_000]), true)?;
                    let mut recv = response.await?.into_body();
                    let mut got = Vec::new();
                    while let Some(d) = recv.data().await {
                        let d = d?;
                        recv.flow_control().release_capacity(d.len())?;
                        got.extend_from_slice(&d);
                    }
                    assert_eq!(got.len(), 60_000);
                    assert_eq!((got[0], got[59_999]), (i + 1, i));
                    Ok::<_, h2::Error>(())
                });
            }
            going.await.unwrap();
            release.send(true).unwrap();
            while let Some(r) = calls.join_next().await {
                r.unwrap().unwrap();
            }
            // After GOAWAY no new stream is answered.
            let late = call(send, b"late".to_vec(), 16_384).await;
            assert!(late.is_err(), "{late:?}");
            let served = server.await.unwrap();
            conn.await.unwrap();
            assert_eq!((served.requests, served.answered), (4, 4));
        })
        .await
        .unwrap();
    });
}

fn client() -> impl Strategy<Value = Client> {
    (
        prop_oneof![Just(1_000u32), Just(16_384), Just(65_535), Just(300_000)],
        prop_oneof![Just(65_535u32), Just(1 << 20)],
        prop_oneof![Just(16_384u32), Just(40_000), Just(1 << 20)],
    )
        .prop_map(|(window, connection_window, max_frame)| Client {
            window,
            connection_window,
            max_frame,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Any mix of request counts, body sizes and client windows: every answer right.
    #[test]
    fn echo_with_any_windows(
        client in client(),
        sizes in proptest::collection::vec(0usize..=200 << 10, 1..10),
        piece in 1_000usize..70_000,
    ) {
        let n = sizes.len();
        let served = runtime().block_on(async {
            tokio::time::timeout(LIMIT, echo_all(client, Settings::default(), sizes, piece))
                .await
                .unwrap()
        });
        prop_assert_eq!((served.requests, served.answered), (n, n));
    }
}
