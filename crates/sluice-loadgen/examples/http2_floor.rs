//! What serving `ShouldRateLimit` costs without an HTTP/2 library's machinery: a measuring
//! stick for `scripts/bench-daemon.sh` (`TESTS=floor`), **not a server**.
//!
//! Each connection is one task that reads everything the socket has, takes every whole
//! frame, and writes all its answers with one `write`. A call is what `sluice serve` does
//! for it minus HTTP/2's bookkeeping: the gRPC message decoded with prost, the engine's
//! decision (`Engine::should_rate_limit`, the clock read once), the answer encoded with
//! prost and sent as HEADERS, DATA and trailers. Left out, because h2load needs none of it:
//! the header block's decoding (h2load sends `:path` as a Huffman-coded literal in every
//! request, 43 bytes to decode), flow control of what is sent (h2load opens windows of
//! 1 GiB), stream limits and states, CONTINUATION, padding, validation of anything, errors.
//! So its CPU per call is a floor for an HTTP/2 path of the daemon's own, not a figure for
//! one.
//!
//!     cargo run --release -p sluice-loadgen --example http2_floor -- 127.0.0.1:18571 limits.yaml
#![allow(clippy::unwrap_used, clippy::expect_used)] // a measuring stick: it fails loudly

use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message as _;
use sluice_server::{Code, Config, Descriptor, Engine, Request};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn frame(out: &mut Vec<u8>, ty: u8, flags: u8, stream: u32, payload: &[u8]) {
    let n = payload.len();
    out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8, ty, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

fn now() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(d.as_nanos()).unwrap()
}

/// The answer of one call: the gRPC frame of its `RateLimitResponse`.
fn decide(engine: &Engine, message: &[u8]) -> Vec<u8> {
    let pb = RateLimitRequest::decode(message.get(5..).unwrap_or_default()).unwrap();
    let request = Request::new(
        pb.domain,
        pb.descriptors
            .into_iter()
            .map(|d| Descriptor::new(d.entries.into_iter().map(|e| (e.key, e.value)))),
    );
    let response = engine.should_rate_limit(now(), &request).unwrap();
    let code = |c: Code| match c {
        Code::Ok => 1,
        Code::OverLimit => 2,
    };
    let answer = RateLimitResponse {
        overall_code: code(response.overall_code),
        ..RateLimitResponse::default()
    };
    let len = answer.encoded_len();
    let mut out = Vec::with_capacity(5 + len);
    out.push(0);
    out.extend_from_slice(&u32::try_from(len).unwrap().to_be_bytes());
    answer.encode(&mut out).unwrap();
    out
}

async fn serve(mut socket: tokio::net::TcpStream, engine: &Engine) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    // SETTINGS: 200 streams, 1 MiB stream windows; the connection's window to 1 MiB too.
    let mut out = Vec::with_capacity(64 << 10);
    frame(
        &mut out,
        4,
        0,
        0,
        &[0, 3, 0, 0, 0, 200, 0, 4, 0, 0x10, 0, 0],
    );
    frame(&mut out, 8, 0, 0, &((1u32 << 20) - 65_535).to_be_bytes());
    socket.write_all(&out).await?;
    out.clear();
    // The answer's headers (`:status 200` indexed, `content-type` a literal without
    // indexing on the static table's name) and trailers (`grpc-status: 0`, a literal).
    let mut headers = vec![0x88, 0x0f, 0x10, 16];
    headers.extend_from_slice(b"application/grpc");
    let mut trailers = vec![0x00, 11];
    trailers.extend_from_slice(b"grpc-status");
    trailers.extend_from_slice(&[1, b'0']);
    let mut buf = vec![0u8; 64 << 10];
    let (mut have, mut preface, mut unacked) = (0usize, false, 0usize);
    // Each stream's message, collected until END_STREAM (h2load sends it in one frame).
    let mut bodies: std::collections::HashMap<u32, Vec<u8>> = std::collections::HashMap::new();
    loop {
        let n = socket.read(&mut buf[have..]).await?;
        if n == 0 {
            return Ok(());
        }
        have += n;
        let mut at = 0;
        if !preface {
            if have < 24 {
                continue;
            }
            (at, preface) = (24, true);
        }
        while have - at >= 9 {
            let b = &buf[at..have];
            let len = usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]);
            if b.len() < 9 + len {
                break;
            }
            let (ty, flags) = (b[3], b[4]);
            let stream = u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff;
            let payload = &b[9..9 + len];
            match ty {
                // HEADERS: a stream opens (its header block is not read).
                1 => {
                    bodies.insert(stream, Vec::new());
                }
                // DATA
                0 => {
                    unacked += len;
                    let body = bodies.get_mut(&stream).unwrap();
                    body.extend_from_slice(payload);
                    if flags & 1 != 0 {
                        let message = bodies.remove(&stream).unwrap();
                        let answer = decide(engine, &message);
                        frame(&mut out, 1, 4, stream, &headers);
                        frame(&mut out, 0, 0, stream, &answer);
                        frame(&mut out, 1, 5, stream, &trailers);
                    }
                }
                // SETTINGS and PING: acknowledged.
                4 if flags & 1 == 0 => frame(&mut out, 4, 1, 0, &[]),
                6 if flags & 1 == 0 => {
                    let ping = payload.to_vec();
                    frame(&mut out, 6, 1, 0, &ping);
                }
                _ => {}
            }
            at += 9 + len;
        }
        // The connection's window back to the client, half a window at a time.
        if unacked >= 1 << 19 {
            frame(
                &mut out,
                8,
                0,
                0,
                &u32::try_from(unacked).unwrap().to_be_bytes(),
            );
            unacked = 0;
        }
        buf.copy_within(at..have, 0);
        have -= at;
        if have == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        if !out.is_empty() {
            socket.write_all(&out).await?;
            out.clear();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, config] = &args[..] else {
        panic!("usage: http2_floor ADDR CONFIG");
    };
    let text = std::fs::read_to_string(config).unwrap();
    let engine: &'static Engine = Box::leak(Box::new(Engine::new(
        Config::from_yaml(config, &text).unwrap(),
    )));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let _ = serve(socket, engine).await;
            });
        }
    });
}
