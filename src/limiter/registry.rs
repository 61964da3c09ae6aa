//! The in-process guard against two limiters counting on the same counters
//! by accident: every live limiter's counter prefixes, per store instance.
//! Rate limiters ([`Limiter`](crate::Limiter)) and concurrency limiters
//! ([`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter)) both
//! register here, in one map, so a prefix either kind already uses is
//! refused to the other too (`{prefix}:cc:{name}:` for the latter,
//! `{prefix}:{fw|sw|gcra}:{name}:` for the former: they meet only where a
//! prefix or a name spells the other's form).

use std::{
    any::Any,
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError, Weak},
};

use crate::ConfigError;

/// (store instance, counter prefix) → the live limiters counting there.
type Registry = HashMap<(usize, String), Vec<Weak<dyn Any + Send + Sync>>>;

static LIVE: Mutex<Option<Registry>> = Mutex::new(None);

/// Registers `inner`'s counter prefixes on store `instance`. Fails, naming
/// the first prefix, if a live limiter already counts under one of them,
/// unless `share` (this limiter opted in to sharing).
pub(crate) fn register<T: Any + Send + Sync>(
    instance: usize,
    prefixes: &[String],
    share: bool,
    inner: &Arc<T>,
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
        let weak: Weak<dyn Any + Send + Sync> = Arc::downgrade(inner) as Weak<T>;
        entry.push(weak);
    }
    Ok(())
}
