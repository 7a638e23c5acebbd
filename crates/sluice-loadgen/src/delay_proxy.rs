//! A TCP proxy that adds a fixed one-way delay in each direction: `sluice delay-proxy`, for
//! benchmarks that put a service (Redis) at an emulated network distance on one machine,
//! where the kernel has no `netem`.
//!
//! The delay is added **without serialising** the traffic: a client that pipelines many
//! requests over one connection (as the Redis client does) sees each of them arrive `delay`
//! after it was sent, as on a real link, not one round trip after the previous answer. Each
//! direction has a reader that stamps every chunk with its arrival time and queues it, and
//! a writer that sends the chunk at arrival + `delay`; the two run concurrently, so reading
//! never waits for the delay. Bytes keep their order. An end of stream (a half-close) is
//! passed on after the delay too, so a request/response protocol that closes its sending
//! side still gets its answers. A delay of zero copies directly.
//!
//! tokio's timer ticks in whole milliseconds, coarser than the delays of interest (0.1 to
//! 0.5 ms), so on Linux the writer waits on its own `timerfd` (nanosecond resolution);
//! elsewhere it falls back to tokio's timer.
//!
//! ```no_run
//! # async fn example() -> Result<(), sluice_loadgen::delay_proxy::ProxyError> {
//! use std::time::Duration;
//! use sluice_loadgen::delay_proxy::DelayProxy;
//!
//! let proxy = DelayProxy::bind("127.0.0.1:16380", "127.0.0.1:6379", Duration::from_micros(250)).await?;
//! proxy.run(|peer, end| if let Err(e) = end { eprintln!("{peer}: {e}") }).await?;
//! # Ok(()) }
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::timer::Timer;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Bytes read at most per chunk.
const CHUNK: usize = 64 * 1024;

/// Chunks queued at most per direction; a full queue stops reading (TCP's own back
/// pressure), which only happens when the receiving side does not keep up.
const QUEUE: usize = 4096;

/// Why the proxy, or one of its connections, stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The listening address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// As given.
        addr: String,
        /// The bind error.
        source: io::Error,
    },
    /// Accepting a connection failed.
    #[error("cannot accept a connection: {0}")]
    Accept(#[source] io::Error),
    /// The upstream did not accept a connection.
    #[error("cannot connect to the upstream {addr}: {source}")]
    Connect {
        /// As given.
        addr: String,
        /// The connection error.
        source: io::Error,
    },
    /// Reading or writing one side of a connection failed.
    #[error("{direction}: {source}")]
    Io {
        /// Which side and which way: "reading from the client", "writing to the upstream"…
        direction: &'static str,
        /// The I/O error.
        source: io::Error,
    },
    /// The delay timer could not be created or armed.
    #[error("the delay timer failed: {0}")]
    Timer(#[source] io::Error),
}

/// A bound proxy, not yet accepting; [`DelayProxy::run`] serves it.
#[derive(Debug)]
pub struct DelayProxy {
    listener: TcpListener,
    upstream: String,
    delay: Duration,
}

impl DelayProxy {
    /// Listens on `listen` (host:port; port 0 picks one, see [`DelayProxy::local_addr`]);
    /// every connection accepted will be relayed to `upstream` (host:port), each direction
    /// delayed by `delay`.
    ///
    /// # Errors
    /// [`ProxyError::Listen`] if `listen` cannot be bound.
    pub async fn bind(listen: &str, upstream: &str, delay: Duration) -> Result<Self, ProxyError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ProxyError::Listen {
                addr: listen.to_owned(),
                source,
            })?;
        Ok(Self {
            listener,
            upstream: upstream.to_owned(),
            delay,
        })
    }

    /// The address it listens on.
    ///
    /// # Errors
    /// [`ProxyError::Listen`] if the socket has no local address (it always has once bound).
    pub fn local_addr(&self) -> Result<SocketAddr, ProxyError> {
        self.listener
            .local_addr()
            .map_err(|source| ProxyError::Listen {
                addr: "?".to_owned(),
                source,
            })
    }

    /// Accepts connections and relays each on its own task until accepting fails; `on_end`
    /// is called with the client's address when a connection ends, cleanly (both sides
    /// closed) or not. Runs until an accept error or until dropped.
    ///
    /// # Errors
    /// [`ProxyError::Accept`] when accepting a connection fails.
    pub async fn run<F>(self, on_end: F) -> Result<(), ProxyError>
    where
        F: Fn(SocketAddr, Result<(), ProxyError>) + Send + Sync + 'static,
    {
        let on_end = Arc::new(on_end);
        let upstream: Arc<str> = self.upstream.into();
        loop {
            let (client, peer) = self.listener.accept().await.map_err(ProxyError::Accept)?;
            let on_end = Arc::clone(&on_end);
            let upstream = Arc::clone(&upstream);
            let delay = self.delay;
            tokio::spawn(async move { on_end(peer, relay(client, &upstream, delay).await) });
        }
    }
}

/// Relays one client connection to a new upstream connection until both directions end.
async fn relay(client: TcpStream, upstream: &str, delay: Duration) -> Result<(), ProxyError> {
    let server = TcpStream::connect(upstream)
        .await
        .map_err(|source| ProxyError::Connect {
            addr: upstream.to_owned(),
            source,
        })?;
    // Small writes (one request, one answer) must leave at their deadline, not wait for
    // Nagle's algorithm to fill a segment.
    for s in [&client, &server] {
        s.set_nodelay(true).map_err(|source| ProxyError::Io {
            direction: "setting TCP_NODELAY",
            source,
        })?;
    }
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // An error either way ends both (the halves are dropped: both sockets close).
    tokio::try_join!(
        one_way(
            client_read,
            server_write,
            delay,
            ["reading from the client", "writing to the upstream"]
        ),
        one_way(
            server_read,
            client_write,
            delay,
            ["reading from the upstream", "writing to the client"]
        ),
    )?;
    Ok(())
}

/// Copies `from` to `to`, every byte `delay` after it was read, then closes `to`'s sending
/// side once `from` has ended (and the last bytes are out). `names`: the read and the write
/// side, for errors.
async fn one_way<R, W>(
    mut from: R,
    mut to: W,
    delay: Duration,
    names: [&'static str; 2],
) -> Result<(), ProxyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let [read_name, write_name] = names;
    let write_err = |source| ProxyError::Io {
        direction: write_name,
        source,
    };
    if delay.is_zero() {
        tokio::io::copy(&mut from, &mut to)
            .await
            .map_err(|source| ProxyError::Io {
                direction: "copying",
                source,
            })?;
        return to.shutdown().await.map_err(write_err);
    }
    let (queue, mut queued) = mpsc::channel::<(Instant, Bytes)>(QUEUE);
    let read = async move {
        loop {
            let mut buf = BytesMut::with_capacity(CHUNK);
            let n = from
                .read_buf(&mut buf)
                .await
                .map_err(|source| ProxyError::Io {
                    direction: read_name,
                    source,
                })?;
            if n == 0 {
                return Ok(()); // end of stream: dropping `queue` tells the writer
            }
            if queue
                .send((Instant::now() + delay, buf.freeze()))
                .await
                .is_err()
            {
                return Ok(()); // the writer stopped: its error is the one reported
            }
        }
    };
    let write = async {
        let mut timer = Timer::new().map_err(ProxyError::Timer)?;
        while let Some((due, bytes)) = queued.recv().await {
            timer.sleep_until(due).await.map_err(ProxyError::Timer)?;
            to.write_all(&bytes).await.map_err(write_err)?;
        }
        to.shutdown().await.map_err(write_err)
    };
    tokio::try_join!(read, write)?;
    Ok(())
}

#[cfg(test)]
#[path = "delay_proxy_tests.rs"]
mod tests;
