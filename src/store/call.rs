//! [`Call`]: one Lua script call, built straight into a `redis::Cmd`.
//!
//! redis-rs's `ScriptInvocation` keeps every key and argument in a `Vec` of
//! its own and copies them into a fresh command at each call; for a batch of
//! decisions that was about 3,000 instructions per decision on our server.
//! A `Call` writes `EVALSHA <sha> <numkeys> <keys...> <args...>` once, into
//! the command's single buffer.

use redis::{
    Cmd, ErrorKind, FromRedisValue, Script, ServerErrorKind, ToRedisArgs, aio::ConnectionLike,
};

use super::scripts;
use crate::Error;

/// A script call: its keys first (they fix the Redis Cluster slot), then
/// its arguments.
pub(super) struct Call {
    /// The script to load on `NOSCRIPT`; `None` for a plain command.
    script: Option<&'static Script>,
    cmd: Cmd,
}

impl Call {
    /// A call of `script` on `keys`; arguments follow with [`arg`](Self::arg).
    pub(super) fn new(script: &'static Script, keys: &[&str]) -> Self {
        Self::with_room(script, keys, 0, 0)
    }

    /// As [`new`](Self::new), with room for `args` more arguments of `bytes`
    /// in all, so that the command is written without growing its buffers.
    pub(super) fn with_room(
        script: &'static Script,
        keys: &[&str],
        args: usize,
        bytes: usize,
    ) -> Self {
        let hash = script.get_hash();
        let key_bytes: usize = keys.iter().map(|k| k.len()).sum();
        let mut cmd = Cmd::with_capacity(
            3 + keys.len() + args,
            "EVALSHA".len() + hash.len() + 20 + key_bytes + bytes,
        );
        cmd.arg("EVALSHA").arg(hash).arg(keys.len()).arg(keys);
        Self {
            script: Some(script),
            cmd,
        }
    }

    /// A plain command, such as `PING` or `SCRIPT LOAD`, sent as it is.
    pub(super) fn command(cmd: Cmd) -> Self {
        Self { script: None, cmd }
    }

    /// Whether this is a call of `script`.
    pub(super) fn runs(&self, script: &Script) -> bool {
        self.script.is_some_and(|mine| std::ptr::eq(mine, script))
    }

    /// The command's words after `EVALSHA` and the SHA1, as text (tests).
    #[cfg(test)]
    pub(super) fn words(&self) -> Vec<String> {
        let arg = |a: redis::Arg<&[u8]>| match a {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => "<not a word>".into(),
        };
        self.cmd.args_iter().skip(2).map(arg).collect()
    }

    /// Appends an argument (`ARGV[n]`).
    pub(super) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// `EVALSHA`; on `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`),
    /// the same call as `EVAL` of the script's source, which runs it and
    /// loads it for the next `EVALSHA`. Not `SCRIPT LOAD` first, as
    /// redis-rs's own invocation does: on a Redis Cluster that goes to every
    /// node and fails unless every one answers, so one frozen replica failed
    /// every call to a healthy master that had lost its scripts. `EVAL` goes
    /// where `EVALSHA` went, by its first key. A user whose ACL allows
    /// `EVALSHA` and `SCRIPT LOAD` but not `EVAL` gets `SCRIPT LOAD` and
    /// `EVALSHA` again, as before.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> Result<T, Error> {
        match (self.cmd.query_async(conn).await, self.script) {
            (Err(e), Some(script)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                if let Some(source) = scripts::source_of(script) {
                    match self.eval(source).query_async(conn).await {
                        // `EVAL` itself refused: by the user's ACL (a refusal
                        // inside a script is `ERR ACL failure in script`), or
                        // renamed away (`rename-command`). The script did
                        // not run.
                        Err(e) if refused(&e) => {}
                        result => return Ok(result?),
                    }
                }
                script.prepare_invoke().load_async(conn).await?;
                Ok(self.cmd.query_async(conn).await?)
            }
            (result, _) => Ok(result?),
        }
    }

    /// This call as `EVAL <source> <numkeys> <keys...> <args...>`.
    fn eval(&self, source: &str) -> Cmd {
        let mut eval = redis::cmd("EVAL");
        eval.arg(source);
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                eval.arg(bytes);
            }
        }
        eval
    }
}

/// Whether `e` is Redis refusing the command itself: not allowed to this
/// user, or unknown (renamed).
fn refused(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || (e.code() == Some("ERR") && e.detail().is_some_and(|d| d.starts_with("unknown command")))
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use super::*;

    static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new("return 1"));

    #[test]
    fn a_call_as_eval_carries_the_source_and_the_same_words() {
        let mut call = Call::new(&scripts::RENEW, &["a"]);
        call.arg(7u64).arg("x");
        let mut expected = redis::cmd("EVAL");
        expected
            .arg(scripts::RENEW_LUA)
            .arg(1)
            .arg("a")
            .arg(7u64)
            .arg("x");
        let eval = call.eval(scripts::RENEW_LUA);
        assert_eq!(eval.get_packed_command(), expected.get_packed_command());
    }

    #[test]
    fn a_call_is_the_evalsha_redis_rs_would_send() {
        let mut call = Call::new(&SCRIPT, &["a", "b"]);
        call.arg(7u64).arg("x");
        let mut expected = redis::cmd("EVALSHA");
        expected
            .arg(SCRIPT.get_hash())
            .arg(2)
            .arg("a")
            .arg("b")
            .arg(7u64)
            .arg("x");
        assert_eq!(call.cmd.get_packed_command(), expected.get_packed_command());
    }
}
