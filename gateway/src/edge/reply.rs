//! What the gateway answers itself (a refusal, a queue answer, the waiting-room page), and how it is written on
//! pingora's session.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde_json::{Value, json};

/// A whole response: status, headers (repeatable, e.g. `set-cookie`), body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Bytes,
}

impl Reply {
    pub fn json(status: u16, body: &Value) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".into()), ("cache-control", "no-store".into())],
            body: Bytes::from(body.to_string()),
        }
    }

    /// The contract's error body, `{"error", "message"}`.
    pub fn error(status: u16, code: &str, message: &str) -> Self {
        Self::error_with(status, code, message, Value::Null)
    }

    /// An error with extra detail fields (an object; anything else adds nothing).
    pub fn error_with(status: u16, code: &str, message: &str, details: Value) -> Self {
        let mut body = json!({ "error": code, "message": message });
        if let (Some(b), Value::Object(d)) = (body.as_object_mut(), details) {
            b.extend(d);
        }
        Self::json(status, &body)
    }

    /// 503 with `Retry-After`: the queue's store is not answering.
    pub fn unavailable() -> Self {
        Self::error(503, "queue_unavailable", "the waiting room cannot reach its queue; retry shortly")
            .header("retry-after", "1".into())
    }

    pub fn header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }
}

impl Reply {
    /// Writes the whole answer on the client's session (no body to a HEAD request: pingora knows).
    pub async fn write(self, session: &mut Session) -> pingora::Result<()> {
        let mut head = ResponseHeader::build(self.status, Some(self.headers.len() + 2))?;
        for (name, value) in self.headers {
            head.append_header(name, value)?;
        }
        head.insert_header("content-length", self.body.len().to_string())?;
        session.write_response_header(Box::new(head), false).await?;
        session.write_response_body(Some(self.body), true).await
    }
}
