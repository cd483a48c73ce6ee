//! Conventions every operator module follows: the one field manager of its writes, and locks
//! that survive a panic elsewhere.

/// The one field manager of every write the operator makes (status, child objects, ack tables).
pub const FIELD_MANAGER: &str = "lifeguard-operator";

/// Locks `mutex`, also after a panic elsewhere poisoned it: every structure the operator keeps
/// behind a mutex is updated by single inserts and replacements, so it stays consistent.
pub fn locked<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
