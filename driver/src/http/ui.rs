//! The web UI: one static page (HTML, CSS and JS in `ui/index.html`, embedded at build
//! time, no build step) that polls the JSON API and follows the open job's event stream,
//! and shows jobs, a job's tasks and the executors. It reads only what the API already
//! serves, so it needs no state of its own, and it writes every user-given string as
//! text, never as markup.
//!
//! The page itself holds no cluster data, so it is served without the API token (see
//! [`crate::http::auth`]): on a secured driver it asks for the token, keeps it in the tab's
//! sessionStorage and sends it as a bearer header on every request, its event stream
//! and the logs and results it opens included (fetched, not followed as links).

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("ui/index.html");

/// `GET /ui`.
pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page loads nothing from elsewhere and runs only its own inline script;
            // its token form is never submitted (a submission would put the form in a
            // URL), the script reads it.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; form-action 'none'",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}
