//! Reading a request body on purpose: after the caller was authenticated, up to a size, within
//! a deadline.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::FromRequestParts;
use bytes::Bytes;
use http::request::Parts;
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// How long a handler may take to read a request body, counted from when it starts reading.
/// [`super::serve`] puts its limit on every request; an extractor (the default when absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyReadTimeout(pub Duration);

impl Default for BodyReadTimeout {
    fn default() -> Self {
        Self(super::ServerLimits::default().body_read_timeout)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for BodyReadTimeout {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get().copied().unwrap_or_default())
    }
}

/// Why a body was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Longer than the limit (announced or sent).
    TooLarge,
    /// Not complete within the [`BodyReadTimeout`].
    TimedOut,
    /// The connection failed or the framing was invalid.
    Unreadable,
}

/// Reads `body` whole: at most `limit` bytes (a larger `Content-Length` is refused before
/// anything is read), within `timeout`.
pub async fn read_body(
    body: Body,
    limit: usize,
    timeout: BodyReadTimeout,
) -> Result<Bytes, BodyError> {
    if HttpBody::size_hint(&body).lower() > limit as u64 {
        return Err(BodyError::TooLarge);
    }
    match tokio::time::timeout(timeout.0, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<LengthLimitError>() => Err(BodyError::TooLarge),
        Ok(Err(_)) => Err(BodyError::Unreadable),
        Err(_) => Err(BodyError::TimedOut),
    }
}

#[cfg(test)]
mod tests {
    use futures_util::stream;

    use super::*;

    const SECOND: BodyReadTimeout = BodyReadTimeout(Duration::from_secs(1));

    #[tokio::test]
    async fn reads_a_body_within_its_limits() {
        let body = Body::from("hello");
        assert_eq!(read_body(body, 5, SECOND).await, Ok(Bytes::from("hello")));
    }

    #[tokio::test]
    async fn refuses_a_body_longer_than_the_limit() {
        assert_eq!(
            read_body(Body::from("hello!"), 5, SECOND).await,
            Err(BodyError::TooLarge)
        );
        let chunks = stream::iter(["abc", "def"].map(|c| Ok::<_, Infallible>(Bytes::from(c))));
        assert_eq!(
            read_body(Body::from_stream(chunks), 5, SECOND).await,
            Err(BodyError::TooLarge)
        );
    }

    #[tokio::test]
    async fn gives_up_on_a_body_that_does_not_arrive() {
        let never = stream::pending::<Result<Bytes, Infallible>>();
        let short = BodyReadTimeout(Duration::from_millis(20));
        assert_eq!(
            read_body(Body::from_stream(never), 5, short).await,
            Err(BodyError::TimedOut)
        );
    }
}
