//! Reading a request body on purpose: after the caller was authenticated, up to a size, within
//! a deadline; and, for large bodies, within a memory budget shared by the whole server.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::FromRequestParts;
use bytes::Bytes;
use http::request::Parts;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// Granularity of a [`BodyBudget`].
const BUDGET_UNIT: usize = 1024;

/// Memory a server may spend on request bodies buffered at once: each read reserves its
/// announced `Content-Length` (the read's limit when the length is not announced) before
/// reading a byte, and holds it while the caller keeps the [`Reservation`]. Bodies that do not
/// fit wait for room, up to the read's [`BodyReadTimeout`]. With per-request limits alone,
/// memory would grow with the number of connections times the limit.
#[derive(Clone, Debug)]
pub struct BodyBudget {
    units: Arc<Semaphore>,
    total_units: usize,
    /// Bytes reserved now.
    reserved: Gauge,
}

/// Room held in a [`BodyBudget`] until dropped.
#[derive(Debug)]
pub struct Reservation {
    _permit: OwnedSemaphorePermit,
    bytes: i64,
    reserved: Gauge,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.reserved.dec_by(self.bytes);
    }
}

/// No room in the budget came free within the body read timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetExhausted;

impl BodyBudget {
    /// A budget of `bytes` (at least one unit); `reserved` follows the bytes reserved.
    pub fn new(bytes: usize, reserved: Gauge) -> Self {
        let total_units = bytes.div_ceil(BUDGET_UNIT).clamp(1, Semaphore::MAX_PERMITS);
        Self {
            units: Arc::new(Semaphore::new(total_units)),
            total_units,
            reserved,
        }
    }

    /// Reserves room for `body` (read later with [`read_body`] under the same `limit`). Only
    /// the body's announced length is looked at, before the returned future is polled.
    pub fn reserve(
        &self,
        body: &Body,
        limit: usize,
        timeout: BodyReadTimeout,
    ) -> impl Future<Output = Result<Reservation, BudgetExhausted>> + Send + 'static {
        let announced = HttpBody::size_hint(body).exact();
        let bytes = announced.map_or(limit, |n| usize::try_from(n).unwrap_or(limit).min(limit));
        let units = bytes.div_ceil(BUDGET_UNIT).clamp(1, self.total_units);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        let acquire = self.units.clone().acquire_many_owned(units);
        let reserved = self.reserved.clone();
        async move {
            match tokio::time::timeout(timeout.0, acquire).await {
                Ok(Ok(permit)) => {
                    let bytes = i64::from(units) * BUDGET_UNIT as i64;
                    reserved.inc_by(bytes);
                    Ok(Reservation {
                        _permit: permit,
                        bytes,
                        reserved,
                    })
                }
                Ok(Err(_)) | Err(_) => Err(BudgetExhausted),
            }
        }
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

    #[tokio::test]
    async fn a_budget_holds_announced_lengths_until_released() {
        let reserved = Gauge::default();
        let budget = BodyBudget::new(4 * BUDGET_UNIT, reserved.clone());
        let short = BodyReadTimeout(Duration::from_millis(20));
        let three = Body::from(vec![0u8; 3 * BUDGET_UNIT]);
        let held = budget
            .reserve(&three, 8 * BUDGET_UNIT, SECOND)
            .await
            .unwrap();
        let two = Body::from(vec![0u8; 2 * BUDGET_UNIT]);
        assert_eq!(
            budget.reserve(&two, 8 * BUDGET_UNIT, short).await.err(),
            Some(BudgetExhausted)
        );
        // An unannounced length reserves the limit (clamped to the whole budget).
        let never = Body::from_stream(stream::pending::<Result<Bytes, Infallible>>());
        assert_eq!(reserved.get(), 3 * BUDGET_UNIT as i64);
        drop(held);
        assert_eq!(reserved.get(), 0);
        let whole = budget
            .reserve(&never, 8 * BUDGET_UNIT, SECOND)
            .await
            .unwrap();
        assert_eq!(
            budget.reserve(&Body::from("x"), 8, short).await.err(),
            Some(BudgetExhausted)
        );
        drop(whole);
        assert!(budget.reserve(&two, 8 * BUDGET_UNIT, SECOND).await.is_ok());
    }
}
