//! The axum extractor for [`RequestRecorder`].

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;

use crate::recorder::RequestRecorder;

/// Rejection when a handler asks for a [`RequestRecorder`] but no
/// [`InferenceTraceLayer`](crate::InferenceTraceLayer) wraps the route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissingRecorder;

impl std::fmt::Display for MissingRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "no RequestRecorder in the request extensions: wrap the route in InferenceTraceLayer",
        )
    }
}

impl std::error::Error for MissingRecorder {}

impl IntoResponse for MissingRecorder {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

/// `RequestRecorder` is an axum extractor: `async fn handler(rec: RequestRecorder, …)`.
impl<S: Send + Sync> FromRequestParts<S> for RequestRecorder {
    type Rejection = MissingRecorder;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<RequestRecorder>()
            .cloned()
            .ok_or(MissingRecorder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finds_the_recorder_or_rejects_with_500() {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        let missing = RequestRecorder::from_request_parts(&mut parts, &()).await;
        assert_eq!(missing.err(), Some(MissingRecorder));
        assert_eq!(
            MissingRecorder.into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let rec = RequestRecorder::new();
        parts.extensions.insert(rec.clone());
        let found = RequestRecorder::from_request_parts(&mut parts, &())
            .await
            .unwrap();
        found.tokens(3);
        assert_eq!(rec.snapshot().tokens_seen, 3, "same recorder, not a copy");
    }
}
