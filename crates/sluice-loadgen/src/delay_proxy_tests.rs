//! The proxy on real sockets and the real clock: it adds the delay each way, it does not
//! serialise pipelined requests, it passes a half-close on, and it reports what fails.
#![allow(clippy::unwrap_used)]
use super::*;

/// An echo server on a free port: every connection gets its bytes back, and its sending
/// side closed once the client has closed its own.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut r, mut w) = stream.into_split();
                tokio::io::copy(&mut r, &mut w).await.unwrap();
                w.shutdown().await.unwrap();
            });
        }
    });
    addr
}

/// A proxy with `delay` in front of `upstream`; connection ends go to the receiver.
async fn proxy(
    upstream: SocketAddr,
    delay: Duration,
) -> (SocketAddr, mpsc::UnboundedReceiver<Result<(), ProxyError>>) {
    let p = DelayProxy::bind("127.0.0.1:0", &upstream.to_string(), delay)
        .await
        .unwrap();
    let addr = p.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(p.run(move |_, end| {
        let _ = tx.send(end);
    }));
    (addr, rx)
}

/// Round trips through the proxy, then a half-close: the answers, the end of stream, and a
/// clean end of the connection.
async fn round_trips(delay: Duration) -> Vec<Duration> {
    let (addr, mut ends) = proxy(echo_server().await, delay).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut times = Vec::new();
    for i in 0..5u8 {
        let t0 = Instant::now();
        s.write_all(&[i; 4]).await.unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.unwrap();
        times.push(t0.elapsed());
        assert_eq!(back, [i; 4]);
    }
    // A request sent just before closing the sending side still gets its answer.
    s.write_all(b"last").await.unwrap();
    s.shutdown().await.unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"last");
    assert!(ends.recv().await.unwrap().is_ok());
    times
}

#[tokio::test]
async fn a_round_trip_takes_twice_the_delay() {
    let delay = Duration::from_millis(20);
    for rtt in round_trips(delay).await {
        assert!(rtt >= 2 * delay, "{rtt:?} < 2 × {delay:?}");
        assert!(rtt < 2 * delay + Duration::from_millis(500), "{rtt:?}");
    }
}

#[tokio::test]
async fn a_zero_delay_forwards_directly() {
    for rtt in round_trips(Duration::ZERO).await {
        assert!(rtt < Duration::from_millis(500), "{rtt:?}");
    }
}

/// 20 requests sent 2 ms apart on one connection, each answered by the echo: each answer
/// comes 2 × delay after its request (not after the previous answer), in order, and all of
/// them within about one round trip after the last was sent. Serialised, they would take
/// 20 round trips (1 s).
#[tokio::test]
async fn pipelined_requests_are_not_serialised() {
    const N: u64 = 20;
    let delay = Duration::from_millis(25);
    let gap = Duration::from_millis(2);
    let (addr, _ends) = proxy(echo_server().await, delay).await;
    let s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let (mut r, mut w) = s.into_split();
    let start = Instant::now();
    let send = tokio::spawn(async move {
        let mut sent = Vec::new();
        for i in 0..N {
            sent.push(Instant::now());
            w.write_all(&i.to_be_bytes()).await.unwrap();
            tokio::time::sleep(gap).await;
        }
        sent
    });
    let mut answered = Vec::new();
    for i in 0..N {
        let mut back = [0u8; 8];
        r.read_exact(&mut back).await.unwrap();
        answered.push(Instant::now());
        assert_eq!(u64::from_be_bytes(back), i, "out of order");
    }
    let total = start.elapsed();
    let sent = send.await.unwrap();
    for (s, a) in sent.iter().zip(&answered) {
        assert!(*a - *s >= 2 * delay, "an answer came in {:?}", *a - *s);
    }
    let last_sent = *sent.last().unwrap() - start;
    assert!(
        total < last_sent + 2 * delay + Duration::from_millis(300),
        "{N} pipelined requests took {total:?} (the last sent at {last_sent:?})"
    );
}

#[tokio::test]
async fn an_unreachable_upstream_is_reported() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = closed.local_addr().unwrap();
    drop(closed);
    let (addr, mut ends) = proxy(upstream, Duration::from_millis(1)).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    // The proxy closes the client's connection (EOF, or a reset).
    let _ = s.read_to_end(&mut buf).await;
    assert!(matches!(
        ends.recv().await.unwrap(),
        Err(ProxyError::Connect { .. })
    ));
}

#[tokio::test]
async fn listening_on_a_bad_address_is_an_error() {
    let e = DelayProxy::bind("not an address", "127.0.0.1:1", Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(e, ProxyError::Listen { .. }), "{e}");
}

/// The point of the `timerfd`: a 100 µs wait ends well before tokio's next millisecond
/// tick would. (The median of 51, generous for a loaded machine.)
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_timer_resolves_below_a_millisecond() {
    let mut timer = Timer::new().unwrap();
    let wait = Duration::from_micros(100);
    let mut took: Vec<Duration> = Vec::new();
    for _ in 0..51 {
        let t0 = Instant::now();
        timer.sleep_until(t0 + wait).await.unwrap();
        took.push(t0.elapsed());
    }
    took.sort();
    assert!(took[0] >= wait, "{:?}", took[0]);
    assert!(
        took[25] < Duration::from_micros(450),
        "median {:?}",
        took[25]
    );
}
