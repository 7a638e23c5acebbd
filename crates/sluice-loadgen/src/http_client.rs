//! The load generator's HTTP client: `POST {base}/json` (envoyproxy/ratelimit's JSON form
//! of the request; 200 is OK, 429 is OVER_LIMIT) on HTTP/1.1 keep-alive connections.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use super::{LoadError, Outcome, error_chain};

/// A parsed HTTP base URL.
#[derive(Debug)]
pub(super) struct HttpBase {
    /// `host:port`, for connecting and for the `Host` header.
    pub(super) authority: String,
    /// `{prefix}/json`.
    pub(super) path: http::Uri,
}

impl HttpBase {
    pub(super) fn parse(address: &str) -> Result<Arc<Self>, LoadError> {
        let bad = |reason: String| LoadError::BadAddress {
            address: address.to_owned(),
            reason,
        };
        let url = if address.contains("://") {
            address.to_owned()
        } else {
            format!("http://{address}")
        };
        let uri: http::Uri = url.parse().map_err(|e| bad(format!("{e}")))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "only http:// is supported (no TLS in the load generator)".to_owned(),
            ));
        }
        let Some(authority) = uri.authority() else {
            return Err(bad("no host".to_owned()));
        };
        if uri.query().is_some() {
            return Err(bad("a base URL takes no query".to_owned()));
        }
        let authority = match authority.port_u16() {
            Some(_) => authority.as_str().to_owned(),
            None => format!("{}:80", authority.host()),
        };
        let prefix = uri.path().trim_end_matches('/');
        let path = format!("{prefix}/json")
            .parse()
            .map_err(|e| bad(format!("{e}")))?;
        Ok(Arc::new(Self { authority, path }))
    }
}

/// One HTTP/1.1 keep-alive connection, reopened after a failure.
pub(super) struct HttpConn {
    pub(super) base: Arc<HttpBase>,
    pub(super) sender: Option<SendRequest<Full<Bytes>>>,
    pub(super) timeout: Duration,
}

impl HttpConn {
    pub(super) async fn connect(&mut self) -> Result<(), String> {
        let connecting = async {
            let stream = tokio::net::TcpStream::connect(&self.base.authority)
                .await
                .map_err(|e| e.to_string())?;
            // Tiny requests: don't let Nagle hold them back.
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| error_chain(&e))?;
            // Drives the connection; ends when the sender is dropped or the peer closes.
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok::<_, String>(sender)
        };
        let sender = tokio::time::timeout(self.timeout, connecting)
            .await
            .map_err(|_| format!("no connection within {:?}", self.timeout))??;
        self.sender = Some(sender);
        Ok(())
    }

    pub(super) async fn call(&mut self, body: Bytes) -> Outcome {
        if self.sender.is_none()
            && let Err(e) = self.connect().await
        {
            return Outcome::Error(format!("connect: {e}"));
        }
        let Some(sender) = self.sender.as_mut() else {
            return Outcome::Error("no connection".to_owned());
        };
        let outcome = async {
            sender.ready().await.map_err(|e| error_chain(&e))?;
            let request = http::Request::post(self.base.path.clone())
                .header(http::header::HOST, self.base.authority.as_str())
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(body))
                .map_err(|e| e.to_string())?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| error_chain(&e))?;
            let status = response.status();
            // Read the whole body so that the connection can carry the next request.
            response
                .into_body()
                .collect()
                .await
                .map_err(|e| error_chain(&e))?;
            Ok::<_, String>(status)
        }
        .await;
        match outcome {
            Ok(http::StatusCode::OK) => Outcome::Ok,
            Ok(http::StatusCode::TOO_MANY_REQUESTS) => Outcome::OverLimit,
            Ok(status) => Outcome::Error(format!("HTTP {status}")),
            Err(e) => {
                // The connection is in an unknown state: open a new one next time.
                self.sender = None;
                Outcome::Error(e)
            }
        }
    }
}
