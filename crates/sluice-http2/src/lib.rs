//! HTTP/2 without I/O (RFC 9113, RFC 7541): [`frame`]s parsed from and written to byte
//! buffers, an [`hpack`] decoder (and the literal encoding a fixed block needs), and a
//! server's side of a connection, [`server::Connection`], as a state machine: bytes in,
//! requests out; answers in, bytes to write out. The daemon's gRPC connections and `sluice
//! bench`'s client are shells around these, each owning its socket.
//!
//! ```
//! use bytes::BytesMut;
//! use sluice_http2::{frame, hpack, server};
//!
//! let mut conn = server::Connection::new(server::Settings::default());
//! // A client's preface, its SETTINGS, and a POST with its body.
//! let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
//! hpack::encode_literal(&mut block, 4, b":path", b"/hello");
//! let mut input = BytesMut::from(server::PREFACE);
//! let mut wire = Vec::new();
//! frame::put_settings(&mut wire, &[]);
//! frame::put_headers(&mut wire, 1, &block, 16_384, false);
//! frame::put_data(&mut wire, 1, b"hi", 16_384);
//! input.extend_from_slice(&wire);
//!
//! let Some(server::Event::Request { stream: 1, end_stream: false }) =
//!     conn.poll_event(&mut input).unwrap()
//! else {
//!     panic!("a request")
//! };
//! assert_eq!(conn.request().path(), b"/hello");
//! let Some(server::Event::Data { data, end_stream: true, .. }) =
//!     conn.poll_event(&mut input).unwrap()
//! else {
//!     panic!("its body")
//! };
//! assert_eq!(&data[..], b"hi");
//!
//! // The answer: `:status 200`, a body, the end.
//! conn.send_headers(1, &[0x88], false);
//! conn.send_data(1, b"hello", true);
//! let written = std::mem::take(conn.output());
//! assert!(written.ends_with(b"hello"));
//! assert!(conn.poll_event(&mut input).unwrap().is_none());
//! ```

pub mod frame;
pub mod hpack;
pub mod server;
