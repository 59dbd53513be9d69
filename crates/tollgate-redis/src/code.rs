//! How the store's Lua code runs on the server: as a Redis Function
//! (`FUNCTION LOAD`, `FCALL`) where the server has functions (Redis ≥ 7.0),
//! else as a script (`SCRIPT LOAD`, `EVALSHA`).
//!
//! A script lives in the server's script cache, which a restart, a failover
//! to a replica or `SCRIPT FLUSH` empties: every check in flight at that
//! moment is answered `NOSCRIPT` and must load the script and try again. A
//! function library is part of the dataset: it is replicated to replicas, so a
//! promoted replica has it, and persisted with the data. Either way, a call
//! that finds the code missing (a server restarted without persistence,
//! `FUNCTION FLUSH`) loads it and runs once more.
//!
//! The library's name carries the code's SHA-1, so instances of different
//! Tollgate versions sharing a Redis each call their own code, and loading
//! with `REPLACE` never swaps another version's code under it.

use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind};

use crate::conn::Conn;

/// The code's body: local functions and `run(keys, args)`.
const BODY: &str = include_str!("tollgate.lua");

/// Whether the code runs as a function or a script on this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Function,
    Script,
}

/// The code, ready to be called or loaded either way.
#[derive(Debug)]
pub(crate) struct Code {
    kind: Kind,
    /// The script's text and its SHA-1 (hex), which names the library too.
    script: String,
    sha: String,
    /// The library's text and the function's name.
    library: String,
    function: String,
}

impl Code {
    /// The code for `kind`; [`Code::detect`] picks the kind a server takes.
    pub(crate) fn new(kind: Kind) -> Self {
        let script = format!("{BODY}\nreturn run(KEYS, ARGV)\n");
        let sha = redis::Script::new(&script).get_hash().to_owned();
        let function = format!("tollgate_{}", &sha[..16]);
        let library = format!(
            "#!lua name={function}\n{BODY}\nredis.register_function{{function_name = '{function}', \
                 callback = run, flags = {{ 'allow-cross-slot-keys' }}}}\n"
        );
        Self {
            kind,
            script,
            sha,
            library,
            function,
        }
    }

    /// Loads the code as a function library when `functions` is asked for and
    /// the server takes it (on a cluster, on every primary), else as a
    /// script. A server without functions (before Redis 7.0: an unknown
    /// command) or that refuses them (an ACL) gets scripts; any other error
    /// (unreachable, or code the server refuses) is returned.
    pub(crate) async fn detect(conn: &Conn, functions: bool) -> Result<Self, RedisError> {
        if functions {
            let code = Self::new(Kind::Function);
            match code.load(conn).await {
                Ok(()) => return Ok(code),
                Err(e) if without_functions(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let code = Self::new(Kind::Script);
        code.load(conn).await?;
        Ok(code)
    }

    /// How the code runs here.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// A call of the code with `keys` keys: the caller adds the keys, then the
    /// arguments.
    pub(crate) fn call(&self, keys: usize) -> Cmd {
        let mut cmd = match self.kind {
            Kind::Function => {
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(&self.function);
                cmd
            }
            Kind::Script => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&self.sha);
                cmd
            }
        };
        cmd.arg(keys);
        cmd
    }

    /// A call of the module's `TOLLGATE.CHECK`, the code's entry point run
    /// natively, with `keys` keys: the same keys and arguments as
    /// [`Code::call`]'s, the same reply. It takes the ops `c`, `d` and `l`.
    pub(crate) fn native_call(keys: usize) -> Cmd {
        let mut cmd = redis::cmd("TOLLGATE.CHECK");
        cmd.arg(keys);
        cmd
    }

    /// Loads the code (`FUNCTION LOAD REPLACE` or `SCRIPT LOAD`; a cluster
    /// client sends either to every primary).
    async fn load(&self, conn: &Conn) -> Result<(), RedisError> {
        match self.kind {
            Kind::Function => {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&self.library);
                conn.query::<redis::Value>(&load).await.map(drop)
            }
            Kind::Script => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(&self.script);
                conn.query::<redis::Value>(&load).await.map(drop)
            }
        }
    }

    /// Runs `call` (from [`Code::call`]); when the server answers that the
    /// code is missing, loads it and runs `call` once more.
    pub(crate) async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &Conn,
        call: &Cmd,
    ) -> Result<T, RedisError> {
        match conn.query(call).await {
            Err(e) if self.missing(&e) => {
                self.load(conn).await?;
                conn.query(call).await
            }
            answer => answer,
        }
    }

    /// Whether `e` says the code is not on the server.
    fn missing(&self, e: &RedisError) -> bool {
        match self.kind {
            Kind::Script => e.kind() == ErrorKind::Server(ServerErrorKind::NoScript),
            Kind::Function => {
                e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
                    && e.detail()
                        .is_some_and(|d| d.starts_with("Function not found"))
            }
        }
    }
}

/// Whether `e`, the answer to `FUNCTION LOAD`, says the server has no
/// functions or this user may not load them.
fn without_functions(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || (e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
            && e.detail().is_some_and(|d| d.starts_with("unknown command")))
}

#[cfg(test)]
mod tests {
    use tollgate_core::Algorithm;

    use super::*;

    #[test]
    fn each_lua_algorithm_code_is_the_one_the_core_numbers_it() {
        let named = [
            ("TOKEN_BUCKET", Algorithm::TokenBucket),
            ("GCRA", Algorithm::Gcra),
            ("LEAKY", Algorithm::LeakyBucket),
            ("SHAPING", Algorithm::LeakyBucketShaping { delay_after: 0 }),
            ("FIXED_WINDOW", Algorithm::FixedWindow),
            ("SLIDING_LOG", Algorithm::SlidingLog),
            ("SLIDING_COUNTER", Algorithm::SlidingCounter),
            ("CONCURRENCY", Algorithm::Concurrency),
            ("HIT_COUNTER", Algorithm::HitCounter),
        ];
        for (name, algorithm) in named {
            let line = format!("\nlocal {name} = {}\n", algorithm.index());
            assert!(BODY.contains(&line), "tollgate.lua lacks `{}`", line.trim());
        }
        assert_eq!(named.len(), Algorithm::COUNT, "every algorithm is named");
        for digit in 0..=9 {
            for op in ["==", "~="] {
                let bare = format!("alg {op} {digit}");
                assert!(!BODY.contains(&bare), "tollgate.lua compares `{bare}`");
            }
        }
    }

    #[test]
    fn the_library_is_named_after_the_code_it_holds() {
        let (function, script) = (Code::new(Kind::Function), Code::new(Kind::Script));
        assert_eq!(function.function, script.function);
        assert!(
            function
                .library
                .starts_with(&format!("#!lua name={}\n", function.function))
        );
        assert!(function.function.starts_with("tollgate_"));
        assert_eq!(&function.function["tollgate_".len()..], &script.sha[..16]);
        assert!(script.script.ends_with("return run(KEYS, ARGV)\n"));
    }
}
