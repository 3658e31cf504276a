//! Serves an axum router over HTTP/1.1 with the deadlines `axum::serve` leaves off. Without them a client that
//! sends a head one byte at a time, or a body that trickles, or nothing at all, keeps its connection (and a
//! file descriptor) for as long as it likes. Here:
//!
//! - a request's head must arrive within [`Deadlines::head`] of the server starting to wait for it, which on a
//!   kept-alive connection is also the longest idle time between requests (hyper's `header_read_timeout`);
//! - a request's whole body must arrive within [`Deadlines::body`] of its head, and be at most
//!   [`Deadlines::max_body`] bytes: it is read before the handler runs, answered 408 or 413 otherwise, and the
//!   connection is closed;
//! - at most [`Deadlines::max_connections`] connections are served at once; more wait in the kernel's backlog.
//!
//! Shutdown is graceful: the listener closes, and open connections finish the request in hand.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::serve::Listener;
use bytes::BytesMut;
use http::{HeaderValue, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

/// How long a client may take, and how much it may send.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// From waiting for a request's head to having all of it; also the idle limit between requests.
    pub head: Duration,
    /// From the head to the body's last byte.
    pub body: Duration,
    /// Largest request body read.
    pub max_body: usize,
    /// Most connections served at once.
    pub max_connections: usize,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            head: Duration::from_secs(20),
            body: Duration::from_secs(30),
            max_body: 64 * 1024,
            max_connections: 10_000,
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, under `deadlines`.
pub async fn serve<L>(
    mut listener: L,
    app: Router,
    deadlines: Deadlines,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    L: Listener,
    L::Io: Unpin,
{
    let app = app.layer(middleware::from_fn_with_state(deadlines, whole_body));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(deadlines.head);
    let slots = Arc::new(tokio::sync::Semaphore::new(deadlines.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    loop {
        // A free slot first: while every slot is taken, new connections wait in the backlog, unaccepted.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = &mut shutdown => break,
        };
        let Ok(slot) = slot else { break };
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A refusal in the services' error shape, closing the connection (the rest of the request is not read).
fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": code, "message": message });
    let mut res = (status, axum::Json(body)).into_response();
    res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
}

/// Reads the request's body whole, within the deadline and the size limit, before the handler sees it.
async fn whole_body(State(d): State<Deadlines>, req: Request, next: Next) -> Response {
    let (parts, mut body) = req.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let too_large = || refuse(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", "the request body is too large");
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > d.max_body as u64) {
        return too_large();
    }
    let read = async {
        let mut whole = BytesMut::new();
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            let Ok(data) = frame.map_err(|e| tracing::debug!(error = %e, "request body"))?.into_data() else {
                continue; // trailers
            };
            if whole.len() + data.len() > d.max_body {
                return Ok(None);
            }
            whole.extend_from_slice(&data);
        }
        Ok::<_, ()>(Some(whole.freeze()))
    };
    match tokio::time::timeout(d.body, read).await {
        Ok(Ok(Some(whole))) => next.run(Request::from_parts(parts, Body::from(whole))).await,
        Ok(Ok(None)) => too_large(),
        Ok(Err(())) => refuse(StatusCode::BAD_REQUEST, "invalid_body", "the request body could not be read"),
        Err(_) => refuse(StatusCode::REQUEST_TIMEOUT, "request_timeout", "the request body did not arrive in time"),
    }
}

#[cfg(test)]
mod tests;
