//! The fan's seat picker: one page (picking, the hold, checkout, the order until paid), plain HTML, CSS and
//! JavaScript with no build step, compiled into the binary. The gateway sends a browser without an admission
//! proof to the waiting room instead, which brings it back here once admitted; the page then calls the API with
//! the proof's cookie.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ApiPath};

const PAGE: &str = include_str!("../../pages/buy.html");
const SCRIPT: &str = include_str!("../../pages/buy.js");
const STYLE: &str = include_str!("../../pages/buy.css");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut res = body.into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // A new build may change the page: a browser checks again after five minutes.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    res
}

/// `GET /events/{id}/buy`: the seat picker.
pub async fn page(ApiPath(_event): ApiPath<i64>) -> Response {
    let mut res = asset("text/html; charset=utf-8", PAGE);
    // Scripts, styles and calls from this origin only; nothing from elsewhere.
    res.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        ),
    );
    res
}

/// `GET /events/{id}/buy/{asset}`: the page's script and style.
pub async fn page_asset(ApiPath((_event, name)): ApiPath<(i64, String)>) -> Result<Response, ApiError> {
    match name.as_str() {
        "buy.js" => Ok(asset("text/javascript; charset=utf-8", SCRIPT)),
        "buy.css" => Ok(asset("text/css; charset=utf-8", STYLE)),
        _ => Err(ApiError::not_found("not_found", "no such file")),
    }
}
