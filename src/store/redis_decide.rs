//! The decide scripts' calls: a batch of requests encoded as `KEYS` and
//! `ARGV` (`lua/decide.lua`, or its fixed-window fast path
//! `lua/decide_fixed.lua`), and their packed reply read back.

use redis::{FromRedisValue, ParsingError, Value, aio::ConnectionLike};

use super::super::{LimitCheck, LimitState, call::Call, scripts};
use smallvec::SmallVec;

use crate::{
    Algorithm, Error,
    decision::{Answered, Ends, States},
};

/// One request of a decide call: its limits and cost.
pub(in crate::store) struct Request<'a> {
    pub(in crate::store) checks: &'a [LimitCheck],
    pub(in crate::store) cost: u64,
}

impl Request<'_> {
    /// Whether every limit is a fixed window: the fast path's.
    pub(in crate::store) fn fixed(&self) -> bool {
        (self.checks.iter()).all(|check| check.quota.algorithm() == Algorithm::FixedWindow)
    }
}

/// Every limit's key of a batch, request by request: the call's `KEYS`.
fn batch_keys<'a>(requests: &'a [Request<'_>]) -> SmallVec<[&'a str; 16]> {
    let checks = requests.iter().flat_map(|r| r.checks);
    checks.map(|check| check.key.as_str()).collect()
}

/// The decide script's call for a batch of requests (often one): `KEYS` are
/// every limit's key, `ARGV` the batch (see `lua/decide.lua`). A call whose
/// limits are all fixed windows goes to the fast path instead.
pub(in crate::store) fn decide_invocation(requests: &[Request<'_>]) -> Call {
    if requests.iter().all(Request::fixed) {
        return fixed_invocation(requests, false);
    }
    if let Some(call) = compact_invocation(requests, false) {
        return call;
    }
    general_invocation(&scripts::DECIDE, requests)
}

/// decide.lua's compact form, when every request of the batch has one
/// limit, the same sliding-window or GCRA quota, and the same cost above 0
/// (one limiter's requests, nearly always): the quota and cost once, then
/// the keys, or with `spread` (a cluster node's batch of several slots) the
/// first key declared and the others carried after the cost. Its reply is
/// decide.lua's.
fn compact_invocation(requests: &[Request<'_>], spread: bool) -> Option<Call> {
    let first = requests.first()?;
    let [check] = first.checks else {
        return None;
    };
    let quota = check.quota;
    let burst = match quota.algorithm() {
        Algorithm::Gcra { burst } => burst,
        Algorithm::SlidingWindow => 0,
        _ => return None,
    };
    let alike =
        |r: &Request<'_>| matches!(r.checks, [c] if c.quota == quota) && r.cost == first.cost;
    if first.cost == 0 || !requests.iter().all(alike) {
        return None;
    }
    let keys = batch_keys(requests);
    let declared = if spread { 1 } else { keys.len() };
    let carried = &keys[declared..];
    let carried_bytes: usize = carried.iter().map(|k| k.len()).sum();
    let mut call = Call::with_room(
        &scripts::DECIDE,
        &keys[..declared],
        6 + carried.len(),
        6 * 20 + carried_bytes,
    );
    call.arg(0)
        .arg(quota.algorithm().code())
        .arg(quota.limit())
        .arg(quota.window_ms())
        .arg(burst)
        .arg(first.cost);
    for key in carried {
        call.arg(*key);
    }
    Some(call)
}

/// decide.lua's call (or its peek's, with `script` [`scripts::PEEK`]).
pub(in crate::store) fn general_invocation(
    script: &'static redis::Script,
    requests: &[Request<'_>],
) -> Call {
    let mut call = Call::new(script, &batch_keys(requests));
    call.arg(requests.len());
    for request in requests {
        call.arg(request.cost).arg(request.checks.len());
        for check in request.checks {
            let quota = check.quota;
            let burst = match quota.algorithm() {
                Algorithm::Gcra { burst } => burst,
                _ => 0,
            };
            call.arg(quota.algorithm().code())
                .arg(quota.limit())
                .arg(quota.window_ms())
                .arg(burst)
                .arg(u8::from(check.shadow));
        }
    }
    call
}

/// The fixed-window fast path's call (see `lua/decide_fixed.lua`): the
/// batch's distinct policies once, then its requests as runs of alike ones
/// (the same cost and policies, as one limiter's requests are), each run
/// sent once: a request of a run costs Redis one argument, its key. A batch
/// that is one run of requests with one limit and a cost above 0 (nearly
/// every batch) goes in the script's compact form instead: its limit, window
/// and cost, and the keys. Its reply is read with [`Layout::Fixed`].
fn fixed_invocation(requests: &[Request<'_>], spread: bool) -> Call {
    // Inline, for the batches that nearly every call carries: one policy,
    // one run, a few requests (a call is built for each batch).
    let mut policies: SmallVec<[(u64, u64, bool); 2]> = SmallVec::new();
    let mut numbers: SmallVec<[usize; 16]> =
        SmallVec::with_capacity(requests.iter().map(|r| r.checks.len()).sum());
    for check in requests.iter().flat_map(|r| r.checks) {
        let policy = (check.quota.limit(), check.quota.window_ms(), check.shadow);
        let number = match policies.iter().position(|p| *p == policy) {
            Some(i) => i + 1,
            None => {
                policies.push(policy);
                policies.len()
            }
        };
        numbers.push(number);
    }
    // Each run: its first request's index and policy numbers, its length.
    let mut runs: SmallVec<[(usize, &[usize], usize); 2]> = SmallVec::new();
    let mut at = 0;
    for (i, request) in requests.iter().enumerate() {
        let mine = &numbers[at..at + request.checks.len()];
        at += request.checks.len();
        match runs.last_mut() {
            Some((first, theirs, len))
                if requests[*first].cost == request.cost && *theirs == mine =>
            {
                *len += 1;
            }
            _ => runs.push((i, mine, 1)),
        }
    }
    let keys = batch_keys(requests);
    // Declared: every key, or on a cluster batch of several slots the first
    // request's (they route the call; the rest follow the runs).
    let declared = match spread {
        true => requests.first().map_or(0, |r| r.checks.len()),
        false => keys.len(),
    };
    let compact = match (&runs[..], &policies[..]) {
        ([(first, [_], _)], [(limit, window_ms, _)]) if requests[*first].cost > 0 => {
            Some((*limit, *window_ms, requests[*first].cost))
        }
        _ => None,
    };
    // Room for the rest: each number at most 20 digits, the carried keys.
    let more = match compact {
        Some(_) => 4,
        None => 2 + 3 * policies.len() + runs.iter().map(|r| 3 + r.1.len()).sum::<usize>(),
    };
    let carried = &keys[declared..];
    let carried_bytes: usize = carried.iter().map(|k| k.len()).sum();
    let mut call = Call::with_room(
        &scripts::DECIDE_FIXED,
        &keys[..declared],
        more + carried.len(),
        20 * more + carried_bytes,
    );
    if let Some((limit, window_ms, cost)) = compact {
        // Whether the limit is a shadow's is the caller's to read.
        call.arg(0).arg(limit).arg(window_ms).arg(cost);
    } else {
        call.arg(policies.len());
        for (limit, window_ms, shadow) in policies {
            call.arg(limit).arg(window_ms).arg(u8::from(shadow));
        }
        call.arg(runs.len());
        for (first, numbers, len) in runs {
            call.arg(len).arg(requests[first].cost).arg(numbers.len());
            for number in numbers {
                call.arg(*number);
            }
        }
    }
    for key in carried {
        call.arg(*key);
    }
    call
}

/// The decide scripts' reply: a flat array of integers that the script packs
/// with `cmsgpack.pack`. It arrives as one bulk string, taken whole; an
/// array reply is parsed by redis-rs element by element, which cost the
/// server about 4,500 instructions per request on the 100k-key benchmark.
pub(in crate::store) struct Packed(pub(in crate::store) Vec<i64>);

impl FromRedisValue for Packed {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::BulkString(bytes) = v else {
            return Err(format!("decide replied {v:?}, not MessagePack").into());
        };
        let bad = || ParsingError::from(format!("decide replied bad MessagePack: {bytes:?}"));
        let mut rd = bytes.as_slice();
        let len = rmp::decode::read_array_len(&mut rd).map_err(|_| bad())?;
        // Each integer takes a byte at least: a length beyond that is a bad reply.
        let mut values = Vec::with_capacity((len as usize).min(bytes.len()));
        for _ in 0..len {
            values.push(rmp::decode::read_int(&mut rd).map_err(|_| bad())?);
        }
        if !rd.is_empty() {
            return Err(bad());
        }
        Ok(Packed(values))
    }
}

/// How a decide call's reply lays out a request's states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) enum Layout {
    /// decide.lua's: allowed, then per limit allowed, remaining, reset_ms,
    /// retry_ms.
    General,
    /// decide_fixed.lua's: a request with one limit and a cost above 0 in
    /// two numbers (remaining, or -1 - remaining if denied; reset_ms), any
    /// other as [`General`](Self::General).
    Fixed,
}

impl Layout {
    /// The layout of `call`'s reply.
    pub(in crate::store) fn of(call: &Call) -> Self {
        match call.runs(&scripts::DECIDE_FIXED) {
            true => Layout::Fixed,
            false => Layout::General,
        }
    }
}

/// Splits a batch's flat reply into each request's answer, in order: after
/// Redis's clock, first in decide.lua's reply (decide_fixed.lua's has none
/// and decides no GCRA limit), each request's states, and where each GCRA
/// limit's state resets on that clock.
pub(in crate::store) fn parse_batch(
    reply: &[i64],
    requests: &[Request<'_>],
    layout: Layout,
) -> Result<Vec<Answered>, Error> {
    let bad = || Error::UnexpectedReply(format!("decide returned {reply:?}"));
    let (now_us, mut rest) = match (layout, reply) {
        (Layout::Fixed, _) => (0, reply),
        (Layout::General, [now, rest @ ..]) => (u64::try_from(*now).map_err(|_| bad())?, rest),
        (Layout::General, []) => return Err(bad()),
    };
    let mut out = Vec::with_capacity(requests.len());
    for request in requests {
        let pair = layout == Layout::Fixed && request.checks.len() == 1 && request.cost > 0;
        let len = match pair {
            true => 2,
            false => 1 + 4 * request.checks.len(),
        };
        if rest.len() < len {
            break;
        }
        out.push(match pair {
            true => (
                smallvec::smallvec![parse_pair(rest[0], rest[1])?],
                Ends::none(),
            ),
            false => parse_reply(&rest[..len], request.checks, now_us)?,
        });
        rest = &rest[len..];
    }
    if out.len() != requests.len() || !rest.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// Runs a batch on one connection: one call, one round trip.
pub(in crate::store) async fn decide<C: ConnectionLike>(
    conn: &mut C,
    requests: &[Request<'_>],
) -> Result<Vec<Answered>, Error> {
    let call = decide_invocation(requests);
    let Packed(reply) = call.invoke(conn).await?;
    parse_batch(&reply, requests, Layout::of(&call))
}

/// Runs a batch of one Redis Cluster node's requests, whose keys may be of
/// several hash slots of that node, as one call: the first request's keys
/// declared, the others carried in `ARGV` (see `lua/decide_fixed.lua`'s "A
/// batch per node"). The batch is fixed-window requests, or alike requests
/// of one sliding-window or GCRA limit (decide.lua's compact form), as the
/// cluster groups them; any other goes spelled out with every key declared,
/// which Redis refuses across slots, a store error like any other.
pub(in crate::store) async fn decide_spread<C: ConnectionLike>(
    conn: &mut C,
    requests: &[Request<'_>],
) -> Result<Vec<Answered>, Error> {
    let call = match requests.iter().all(Request::fixed) {
        true => fixed_invocation(requests, true),
        false => compact_invocation(requests, true)
            .unwrap_or_else(|| general_invocation(&scripts::DECIDE, requests)),
    };
    let Packed(reply) = call.invoke(conn).await?;
    parse_batch(&reply, requests, Layout::of(&call))
}

/// decide_fixed.lua's two numbers for a request of one limit: `r`, what
/// remains (`-1 - ` what remains when the limit denied), and `reset_ms`.
fn parse_pair(r: i64, reset_ms: i64) -> Result<LimitState, Error> {
    let bad = || Error::UnexpectedReply(format!("decide returned [{r}, {reset_ms}]"));
    let reset_ms = u64::try_from(reset_ms).map_err(|_| bad())?;
    let allowed = r >= 0;
    let remaining = match allowed {
        true => r,
        false => -1 - r,
    };
    Ok(LimitState {
        allowed,
        remaining: u64::try_from(remaining).map_err(|_| bad())?,
        reset_ms,
        retry_ms: if allowed { 0 } else { reset_ms },
    })
}

/// `{ allowed, then per limit: allowed, remaining, reset, retry_ms }`, where
/// a GCRA limit's reset is in µs: its state's `reset_ms` rounded up, and its
/// end on Redis's clock (`now_us` after it, when the call read the clock).
fn parse_reply(reply: &[i64], checks: &[LimitCheck], now_us: u64) -> Result<Answered, Error> {
    let bad = || Error::UnexpectedReply(format!("decide returned {reply:?}"));
    // Flags are 0 or 1: anything else is no answer, not a denial.
    let flag = |v: i64| match v {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    };
    if reply.len() != 1 + 4 * checks.len() || flag(reply[0]).is_none() {
        return Err(bad());
    }
    let mut ends = SmallVec::<[u64; 1]>::new();
    let states = (reply[1..].chunks_exact(4).zip(checks)).map(|(s, check)| {
        let n = |i: usize| u64::try_from(s[i]).ok();
        let gcra = matches!(check.quota.algorithm(), Algorithm::Gcra { .. });
        let reset_ms = match gcra {
            true => n(2)?.div_ceil(1000),
            false => n(2)?,
        };
        ends.push(match gcra && now_us > 0 {
            true => now_us.checked_add(n(2)?)?,
            false => 0,
        });
        Some(LimitState {
            allowed: flag(s[0])?,
            remaining: n(1)?,
            reset_ms,
            retry_ms: n(3)?,
        })
    });
    let states: States = states.collect::<Option<States>>().ok_or_else(bad)?;
    let ends = match ends[..] {
        [one] => Ends::One(one),
        _ if ends.iter().all(|end| *end == 0) => Ends::none(),
        _ => Ends::Each(ends.into_vec().into_boxed_slice()),
    };
    Ok((states, ends))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(values: &[i64], extra: &[u8]) -> Value {
        let mut bytes = Vec::new();
        rmp::encode::write_array_len(&mut bytes, values.len() as u32).unwrap();
        for v in values {
            rmp::encode::write_sint(&mut bytes, *v).unwrap();
        }
        bytes.extend_from_slice(extra);
        Value::BulkString(bytes)
    }

    fn check(key: &str, quota: &str) -> LimitCheck {
        LimitCheck {
            key: key.into(),
            quota: quota.parse().unwrap(),
            shadow: false,
        }
    }

    #[test]
    fn the_fixed_layout_reads_a_lone_limit_in_two_numbers() {
        let one = [check("a", "5/1s")];
        let two = [check("b", "5/1s"), check("c", "9/1m")];
        let requests = [
            Request {
                checks: &one,
                cost: 1,
            },
            Request {
                checks: &one,
                cost: 0,
            },
            Request {
                checks: &two,
                cost: 1,
            },
            Request {
                checks: &one,
                cost: 2,
            },
        ];
        let reply = [
            3, 900, // allowed, 3 left
            1, 1, 4, 900, 0, // a peek: decide.lua's layout
            0, 1, 2, 900, 0, 0, 0, 60_000, 60_000, // two limits, the second denied
            -2, 400, // denied, 1 left, retry in 400 ms
        ];
        let answers = parse_batch(&reply, &requests, Layout::Fixed).unwrap();
        assert!(answers.iter().all(|(_, ends)| *ends == Ends::none()));
        let states: Vec<States> = answers.into_iter().map(|(states, _)| states).collect();
        let state = |allowed, remaining, reset_ms, retry_ms| LimitState {
            allowed,
            remaining,
            reset_ms,
            retry_ms,
        };
        assert_eq!(states[0][..], [state(true, 3, 900, 0)]);
        assert_eq!(states[1][..], [state(true, 4, 900, 0)]);
        assert_eq!(
            states[2][..],
            [state(true, 2, 900, 0), state(false, 0, 60_000, 60_000)]
        );
        assert_eq!(states[3][..], [state(false, 1, 400, 400)]);
        // The general layout reads the same numbers otherwise, and a reply
        // that does not fit its requests exactly is an error.
        assert!(parse_batch(&reply, &requests, Layout::General).is_err());
        assert!(parse_batch(&reply[..reply.len() - 1], &requests, Layout::Fixed).is_err());
        let mut longer = reply.to_vec();
        longer.push(0);
        assert!(parse_batch(&longer, &requests, Layout::Fixed).is_err());
        // A negative reset is a bad reply, never a state.
        assert!(parse_batch(&[3, -1], &requests[..1], Layout::Fixed).is_err());
        // decide.lua's reply starts with Redis's clock, in µs, and gives a
        // GCRA limit's reset in µs: its end on that clock.
        let gcra = [LimitCheck {
            quota: "5/1s".parse::<crate::Quota>().unwrap().gcra(3).unwrap(),
            ..check("g", "1/1s")
        }];
        let mixed = [check("a", "5/1s"), gcra[0].clone()];
        let general = [
            Request {
                checks: &one,
                cost: 0,
            },
            Request {
                checks: &gcra,
                cost: 1,
            },
            Request {
                checks: &mixed,
                cost: 1,
            },
        ];
        let now = 1_800_000_000_123_456;
        let reply = [
            now, 1, 1, 4, 900, 0, // a fixed window: ms
            1, 1, 2, 200_001, 0, // GCRA: 200,001 µs, 201 ms
            0, 1, 4, 900, 0, 0, 0, 599_999, 600, // fixed, then GCRA denied
        ];
        let answers = parse_batch(&reply, &general, Layout::General).unwrap();
        assert_eq!(
            answers[0],
            (smallvec::smallvec![state(true, 4, 900, 0)], Ends::none())
        );
        assert_eq!(
            answers[1],
            (
                smallvec::smallvec![state(true, 2, 201, 0)],
                Ends::One(now as u64 + 200_001)
            )
        );
        let ends = Ends::Each([0, now as u64 + 599_999].into());
        let states = smallvec::smallvec![state(true, 4, 900, 0), state(false, 0, 600, 600)];
        assert_eq!(answers[2], (states, ends));
        assert!(parse_batch(&reply[1..], &general, Layout::General).is_err());
        let mut negative = reply;
        negative[0] = -1;
        assert!(parse_batch(&negative, &general, Layout::General).is_err());
        assert!(parse_batch(&[], &general, Layout::General).is_err());
    }

    #[test]
    fn one_limiters_lone_sliding_or_gcra_limits_go_in_decide_luas_compact_form() {
        let gcra = |key: &str, quota: &str, burst| LimitCheck {
            quota: quota.parse::<crate::Quota>().unwrap().gcra(burst).unwrap(),
            ..check(key, "1/1s")
        };
        let (a, b) = ([gcra("a", "5/1s", 3)], [gcra("b", "5/1s", 3)]);
        let shadow = [LimitCheck {
            shadow: true,
            ..gcra("c", "5/1s", 3)
        }];
        let other_burst = [gcra("d", "5/1s", 2)];
        let two = [gcra("e", "5/1s", 3), gcra("f", "5/1s", 3)];
        let request = |checks, cost| Request { checks, cost };
        let words = |requests: &[Request<'_>]| {
            let call = decide_invocation(requests);
            assert!(call.runs(&scripts::DECIDE));
            call.words()
        };
        // KEYS, then 0, the algorithm, the limit, the window, the burst and
        // the cost.
        let alike = [request(&a, 2), request(&b, 2), request(&a, 2)];
        assert_eq!(
            words(&alike),
            ["3", "a", "b", "a", "0", "3", "5", "1000", "3", "2"]
        );
        // A cluster node's batch: the first key declared, the others carried.
        let spread = compact_invocation(&alike, true).unwrap();
        assert_eq!(
            spread.words(),
            ["1", "a", "0", "3", "5", "1000", "3", "2", "b", "a"]
        );
        let shadows = [request(&shadow, 1), request(&a, 1)];
        assert_eq!(
            words(&shadows),
            ["2", "c", "a", "0", "3", "5", "1000", "3", "1"]
        );
        let sliding = [LimitCheck {
            quota: "5/1s".parse::<crate::Quota>().unwrap().sliding_window(),
            ..check("s", "1/1s")
        }];
        assert_eq!(
            words(&[request(&sliding, 1), request(&sliding, 1)]),
            ["2", "s", "s", "0", "2", "5", "1000", "0", "1"]
        );
        // Anything else spelled out: the requests' count first.
        for batch in [
            &[request(&a, 1), request(&b, 2)][..],
            &[request(&a, 1), request(&other_burst, 1)],
            &[request(&two, 1)],
            &[request(&a, 0)],
        ] {
            assert_eq!(
                words(batch)[0],
                batch
                    .iter()
                    .map(|r| r.checks.len())
                    .sum::<usize>()
                    .to_string()
            );
            let keys = words(batch)[0].parse::<usize>().unwrap();
            assert_eq!(words(batch)[1 + keys], batch.len().to_string());
        }
    }

    #[test]
    fn one_run_of_lone_limits_goes_in_the_compact_form() {
        let a = [check("a", "5/1s")];
        let b = [check("b", "5/1s")];
        let shadow = [LimitCheck {
            shadow: true,
            ..check("c", "5/1s")
        }];
        let other = [check("d", "9/1m")];
        let two = [check("e", "5/1s"), check("f", "9/1m")];
        let request = |checks, cost| Request { checks, cost };
        let words = |requests: &[Request<'_>], spread| {
            let call = fixed_invocation(requests, spread);
            assert!(Layout::of(&call) == Layout::Fixed);
            call.words()
        };
        // KEYS, then 0, the limit, the window and the cost.
        let one_run = [request(&a, 2), request(&b, 2), request(&a, 2)];
        assert_eq!(
            words(&one_run, false),
            ["3", "a", "b", "a", "0", "5", "1000", "2"]
        );
        // A cluster node's batch: the first key declared, the others carried.
        assert_eq!(
            words(&one_run, true),
            ["1", "a", "0", "5", "1000", "2", "b", "a"]
        );
        // A shadow limit's requests alike: the caller reads their denials.
        let shadows = [request(&shadow, 1), request(&shadow, 1)];
        assert_eq!(
            words(&shadows, false),
            ["2", "c", "c", "0", "5", "1000", "1"]
        );
        // Anything else is spelled out: two costs, two policies, a look, two
        // limits in one request.
        let spelled = |requests: &[Request<'_>]| {
            let w = words(requests, false);
            w[1 + requests.iter().map(|r| r.checks.len()).sum::<usize>()] != "0"
        };
        assert!(spelled(&[request(&a, 1), request(&b, 2)]));
        assert!(spelled(&[request(&a, 1), request(&other, 1)]));
        assert!(spelled(&[request(&a, 1), request(&shadow, 1)]));
        assert!(spelled(&[request(&a, 0)]));
        assert!(spelled(&[request(&two, 1)]));
        assert_eq!(
            words(&[request(&a, 1), request(&b, 2)], false),
            [
                "2", "a", "b", "1", "5", "1000", "0", "2", "1", "1", "1", "1", "1", "2", "1", "1"
            ]
        );
    }

    #[test]
    fn packed_replies_are_read_whole_and_nothing_else_is() {
        let values = [1, 0, 4, 3_600_000, 0, 1 << 40];
        let Packed(read) = Packed::from_redis_value(packed(&values, b"")).unwrap();
        assert_eq!(read, values);
        // Trailing bytes, a float, an array reply, a truncated array.
        assert!(Packed::from_redis_value(packed(&values, b"\x01")).is_err());
        let mut float = Vec::new();
        rmp::encode::write_array_len(&mut float, 1).unwrap();
        rmp::encode::write_f64(&mut float, 1.5).unwrap();
        assert!(Packed::from_redis_value(Value::BulkString(float)).is_err());
        let array = Value::Array(vec![Value::Int(1)]);
        assert!(Packed::from_redis_value(array).is_err());
        assert!(Packed::from_redis_value(Value::BulkString(vec![0x93, 0x01])).is_err());
        // A length of 2^32 - 1 in five bytes: refused, without making room
        // for it first.
        let huge = vec![0xdd, 0xff, 0xff, 0xff, 0xff];
        assert!(Packed::from_redis_value(Value::BulkString(huge)).is_err());
    }

    /// A flag of the general layout (the request's, each limit's) is 0 or
    /// 1; any other number is a reply this client does not understand, a
    /// store error, not a denial.
    #[test]
    fn a_flag_other_than_0_or_1_is_no_answer() {
        let checks = [check("a", "5/1s")];
        assert!(parse_reply(&[1, 1, 4, 900, 0], &checks, 0).is_ok());
        assert!(parse_reply(&[0, 0, 0, 900, 900], &checks, 0).is_ok());
        for reply in [[1, 2, 4, 900, 0], [1, -1, 4, 900, 0], [2, 1, 4, 900, 0]] {
            let err = parse_reply(&reply, &checks, 0).unwrap_err();
            assert!(
                matches!(err, Error::UnexpectedReply(_)),
                "{reply:?}: {err:?}"
            );
        }
    }
}
