//! The in-process guard against two limiters counting on the same counters
//! by accident: every live limiter's counter prefixes, per store instance.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError, Weak},
};

use super::Inner;
use crate::ConfigError;

/// (store instance, counter prefix) → the live limiters counting there.
type Registry = HashMap<(usize, String), Vec<Weak<Inner>>>;

static LIVE: Mutex<Option<Registry>> = Mutex::new(None);

/// Registers `inner`'s counter prefixes on store `instance`. Fails, naming
/// the first prefix, if a live limiter already counts under one of them,
/// unless `share` (this limiter opted in to sharing).
pub(super) fn register(
    instance: usize,
    prefixes: &[String],
    share: bool,
    inner: &Arc<Inner>,
) -> Result<(), ConfigError> {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    let live = live.get_or_insert_with(HashMap::new);
    // Dropped limiters free their prefixes.
    live.retain(|_, limiters| {
        limiters.retain(|l| l.strong_count() > 0);
        !limiters.is_empty()
    });
    if !share
        && let Some(taken) = prefixes
            .iter()
            .find(|p| live.contains_key(&(instance, (*p).clone())))
    {
        return Err(ConfigError::SharedCounters(taken.clone()));
    }
    for prefix in prefixes {
        let entry = live.entry((instance, prefix.clone())).or_default();
        entry.push(Arc::downgrade(inner));
    }
    Ok(())
}
