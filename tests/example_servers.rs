//! The example servers (`examples/axum.rs`, `hyper.rs`, `actix.rs`, and
//! `tonic.rs` with the `tonic` feature) driven through their variables:
//! `RATE_LIMIT_TIERS` with `RATE_LIMIT_TIER_HEADER`, `RATE_LIMIT_SKIP` and
//! `RATE_LIMIT_REFUND`, on the memory store; and bad values stopping them
//! with exit status 2 and the variable's name.
//!
//! The binaries are built first, with this test's own features, by the
//! `cargo` that runs the test.

mod support;

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use support::http::{Caller, Reply, get_forwarded, get_with};

const EXAMPLES: [&str; 3] = ["axum", "hyper", "actix"];

/// Builds the examples once, with the features this test was built with,
/// and returns their directory.
fn examples_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let features: Vec<&str> = [
            ("axum", cfg!(feature = "axum")),
            ("actix", cfg!(feature = "actix")),
            ("metrics", cfg!(feature = "metrics")),
            ("cluster", cfg!(feature = "cluster")),
            ("tonic", cfg!(feature = "tonic")),
            ("tls", cfg!(feature = "tls")),
            ("sentinel", cfg!(feature = "sentinel")),
        ]
        .into_iter()
        .filter_map(|(f, on)| on.then_some(f))
        .collect();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "build",
            "--no-default-features",
            "--features",
            &features.join(","),
        ]);
        for name in EXAMPLES {
            cmd.args(["--example", name]);
        }
        if cfg!(feature = "tonic") {
            cmd.args(["--example", "tonic"]);
        }
        let out = cmd.output().expect("run cargo build");
        assert!(
            out.status.success(),
            "cargo build of the examples failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // target/debug/deps/<this test> -> target/debug/examples
        let exe = std::env::current_exe().unwrap();
        exe.parent().unwrap().parent().unwrap().join("examples")
    })
}

/// A running example server, killed on drop.
struct Example {
    child: Child,
    url: String,
    /// Told once the server has logged that a stop signal came.
    stopping: std::sync::mpsc::Receiver<()>,
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Example `name`'s command, without any of the examples' variables this
/// process has (a shell that exported `REDIS_URL` or `FORWARDED_HEADER`
/// would change what a test starts).
fn example(name: &str) -> Command {
    let mut cmd = Command::new(examples_dir().join(name));
    for (k, _) in std::env::vars() {
        let ours = [
            "RATE_LIMIT",
            "REDIS_",
            "TRUSTED_",
            "FORWARDED_HEADER",
            "BIND",
        ];
        if ours.iter().any(|prefix| k.starts_with(prefix)) {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Starts example `name` on a free port with `vars` (and only those of the
/// examples' variables), and waits for its "listening on" line.
fn start(name: &str, vars: &[(&str, &str)]) -> Example {
    let mut cmd = example(name);
    cmd.env("BIND", "127.0.0.1:0")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stopping) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("finishing open requests, then exiting") {
                let _ = stop_tx.send(());
            }
            if let Some(rest) = line.split("listening on ").nth(1) {
                let addr = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let _ = tx.send(addr);
            }
        }
    });
    // Held before the wait, so that a server that never says where it
    // listens is killed by the panic's unwinding, not left running.
    let mut example = Example {
        child,
        url: String::new(),
        stopping,
    };
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{name} did not start with {vars:?}"));
    example.url = format!("http://{addr}");
    example
}

async fn get(url: &str, headers: &[(&str, &str)]) -> Reply {
    get_with(&Caller::with_key(None).client(), url, headers).await
}

async fn statuses(url: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(get(url, headers).await.status.as_u16());
    }
    out
}

#[tokio::test]
async fn every_example_answers_status_paths() {
    for name in EXAMPLES {
        let ex = start(name, &[("RATE_LIMIT", "100/60s")]);
        let ok = get(&format!("{}/", ex.url), &[]).await;
        assert_eq!(
            (ok.status.as_u16(), ok.body.as_str()),
            (200, "ok"),
            "{name}"
        );
        for (path, status) in [
            ("503", 503),
            ("404", 404),
            ("201", 201),
            ("abc", 400),
            ("700", 400),
        ] {
            let r = get(&format!("{}/status/{path}", ex.url), &[]).await;
            assert_eq!(r.status.as_u16(), status, "{name} /status/{path}: {r:?}");
        }
        // Any other path is a 404 on every example: hyper's answered 200
        // `ok` (or 400), so a refund by status charged other requests there.
        for path in ["/nope", "/status/500/x", "/status/"] {
            let r = get(&format!("{}{path}", ex.url), &[]).await;
            assert_eq!(r.status.as_u16(), 404, "{name} {path}: {r:?}");
        }
        // HEAD as GET; another method a 405 (actix-web answered HEAD 405).
        let client = Caller::with_key(None).client();
        for (method, path, status) in [
            (http::Method::HEAD, "/", 200),
            (http::Method::HEAD, "/status/201", 201),
            (http::Method::POST, "/", 405),
            (http::Method::POST, "/status/201", 405),
        ] {
            let req = http::Request::builder()
                .method(method.clone())
                .uri(format!("{}{path}", ex.url))
                .body(http_body_util::Empty::new())
                .unwrap();
            let r = client.request(req).await.unwrap();
            assert_eq!(r.status().as_u16(), status, "{name} {method} {path}");
        }
    }
}

/// `GET /status/<code>` percent-decodes the code on every example, as
/// axum's `Path` and actix-web's router do: hyper's matched the raw
/// segment, so `/status/%35%30%30` was a 400 there and a 500 on the
/// others (a refund by status charged different requests). A segment that
/// decodes to no status (invalid UTF-8, an encoded `/`, a malformed
/// escape) is a 400, as on axum; a real `/` still ends the segment.
#[tokio::test]
async fn every_example_percent_decodes_the_status_code() {
    for name in EXAMPLES {
        let ex = start(name, &[("RATE_LIMIT", "100/60s")]);
        for (code, status) in [
            ("%35%30%30", 500),
            ("5%300", 500),
            ("%32%301", 201),
            ("%ff", 400),
            ("%FF%FE", 400),
            ("5%2F0", 400),
            ("%2F", 400),
            ("%35%30%30%2F", 400),
            ("%zz", 400),
            ("%", 400),
            ("%3", 400),
            ("%20500", 400),
            ("%35%30%30/", 404),
        ] {
            let r = get(&format!("{}/status/{code}", ex.url), &[]).await;
            assert_eq!(r.status.as_u16(), status, "{name} /status/{code}: {r:?}");
        }
    }
}

/// `BIND=[::]:port` takes IPv4 clients on a system whose sockets default to
/// IPv6 only (`net.ipv6.bindv6only=1`, set in a network namespace of the
/// test's own, `unshare -n`, which needs root): the examples turn
/// `IPV6_V6ONLY` off themselves. Each example is asked `GET /` over IPv4
/// from inside the namespace (bash's `/dev/tcp`).
#[test]
fn bind_ipv6_wildcard_takes_ipv4_clients_whatever_the_system_default() {
    const SCRIPT: &str = r#"
        ip link set lo up && sysctl -qw net.ipv6.bindv6only=1 || exit 97
        BIND='[::]:3000' RATE_LIMIT=100/60s "$0" >/dev/null 2>&1 &
        for _ in $(seq 300); do
            if exec 3<>/dev/tcp/127.0.0.1/3000; then
                printf 'GET / HTTP/1.0\r\nHost: t\r\n\r\n' >&3
                head -n 1 <&3
                kill $!
                exit 0
            fi 2>/dev/null
            sleep 0.1
        done
        kill $!
        echo "no IPv4 connection to [::]:3000 in 30 s"
    "#;
    for name in EXAMPLES {
        let out = Command::new("unshare")
            .args(["-n", "bash", "-c", SCRIPT])
            .arg(examples_dir().join(name))
            .output()
            .unwrap_or_else(|e| {
                panic!("run unshare: {e} (util-linux's unshare: apt-get install util-linux)")
            });
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_ne!(
            out.status.code(),
            Some(97),
            "this test needs root, `unshare -n`, iproute2's `ip` and `sysctl` \
             (apt-get install iproute2 procps): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.starts_with("HTTP/1.") && stdout.contains(" 200"),
            "{name}: {stdout:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn rate_limit_tiers_pick_the_tier_by_header() {
    let vars = [
        ("RATE_LIMIT", "1/60s"),
        ("RATE_LIMIT_TIERS", "free=3/60s;pro=8/60s"),
        ("RATE_LIMIT_TIER_HEADER", "x-plan"),
        ("RATE_LIMIT_KEY", "header:x-api-key"),
    ];
    for name in EXAMPLES {
        let ex = start(name, &vars);
        let url = format!("{}/", ex.url);
        let pro = [("x-api-key", "a"), ("x-plan", "pro")];
        let first = get(&url, &pro).await;
        assert_eq!(
            first.header("ratelimit-policy"),
            Some(r#""pro";q=8;w=60"#),
            "{name}: {first:?}"
        );
        let mut want = vec![200; 7];
        want.push(429);
        assert_eq!(statuses(&url, &pro, 8).await, want, "{name}");
        let free = [("x-api-key", "a"), ("x-plan", "free")];
        assert_eq!(
            statuses(&url, &free, 4).await,
            [200, 200, 200, 429],
            "{name}"
        );
        // No header, or an unknown tier: RATE_LIMIT.
        let none = get(&url, &[("x-api-key", "b")]).await;
        assert_eq!(
            none.header("ratelimit-policy"),
            Some(r#""default";q=1;w=60"#),
            "{name}"
        );
        let gold = get(&url, &[("x-api-key", "b"), ("x-plan", "gold")]).await;
        assert_eq!(gold.status, 429, "{name}: {gold:?}");
    }
}

#[tokio::test]
async fn rate_limit_skip_never_limits_those_clients() {
    for name in EXAMPLES {
        let ex = start(
            name,
            &[
                ("RATE_LIMIT", "1/60s"),
                ("RATE_LIMIT_SKIP", "127.0.0.2/32,::1"),
            ],
        );
        let url = format!("{}/", ex.url);
        let internal = Caller::from_ip([127, 0, 0, 2]);
        for r in internal.get_n(&url, 4).await {
            assert_eq!(r.status, 200, "{name}: {r:?}");
            assert!(!r.has_ratelimit_headers(), "{name}: {r:?}");
        }
        let other = Caller::from_ip([127, 0, 0, 3]);
        assert_eq!(other.statuses(&url, 2).await, [200, 429], "{name}");
        // client-ip: the client behind the trusted proxy, never a spoofer's header.
        let ex = start(
            name,
            &[
                ("RATE_LIMIT", "1/60s"),
                ("RATE_LIMIT_KEY", "client-ip"),
                ("TRUSTED_PROXIES", "127.0.0.4"),
                ("RATE_LIMIT_SKIP", "10.0.0.0/8"),
            ],
        );
        let url = format!("{}/", ex.url);
        let via = |ip, xff: &'static str| {
            let url = url.clone();
            async move { get_forwarded(ip, &url, xff).await }
        };
        for _ in 0..3 {
            let r = via([127, 0, 0, 4], "10.1.2.3").await;
            assert!(
                r.status == 200 && !r.has_ratelimit_headers(),
                "{name}: {r:?}"
            );
        }
        let spoofed = [
            via([127, 0, 0, 5], "10.1.2.3").await,
            via([127, 0, 0, 5], "10.1.2.3").await,
        ];
        let spoofed: Vec<u16> = spoofed.iter().map(|r| r.status.as_u16()).collect();
        assert_eq!(spoofed, [200, 429], "{name}");
    }
}

#[tokio::test]
async fn rate_limit_refund_gives_server_errors_back() {
    let vars = [
        ("RATE_LIMIT", "2/60s"),
        ("RATE_LIMIT_KEY", "header:x-api-key"),
        ("RATE_LIMIT_REFUND", "server-errors"),
    ];
    for name in EXAMPLES {
        let ex = start(name, &vars);
        let key = [("x-api-key", "k")];
        for _ in 0..5 {
            let r = get(&format!("{}/status/500", ex.url), &key).await;
            assert_eq!(r.status, 500, "{name}: {r:?}");
            // The refund runs after the response, in process: far quicker.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let after = statuses(&format!("{}/status/404", ex.url), &key, 3).await;
        assert_eq!(after, [404, 404, 429], "{name}");
    }
}

/// `RATE_LIMIT_RESERVE` (with `RATE_LIMIT_RESERVE_KEYS`): a hot key's units
/// are reserved a few at a call, and the quota is still exact (one
/// instance: nothing under-admitted).
#[tokio::test]
async fn rate_limit_reserve_admits_exactly_the_quota_in_few_calls() {
    let server = support::RedisServer::start();
    let url = server.url();
    let vars = [
        ("REDIS_URL", url.as_str()),
        ("RATE_LIMIT", "20/60s"),
        ("RATE_LIMIT_KEY", "header:x-api-key"),
        ("RATE_LIMIT_RESERVE", "10"),
        ("RATE_LIMIT_RESERVE_KEYS", "1000"),
    ];
    let mut conn = server.conn().await;
    for name in EXAMPLES {
        let ex = start(name, &vars);
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
        let key = [("x-api-key", name)];
        let got = statuses(&format!("{}/", ex.url), &key, 25).await;
        let expected: Vec<u16> = [200; 20].into_iter().chain([429; 5]).collect();
        assert_eq!(got, expected, "{name}");
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        let calls = |cmd: &str| -> u64 {
            let line = stats
                .lines()
                .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")));
            let field = line.and_then(|l| l.split("calls=").nth(1));
            field
                .and_then(|f| f.split(',').next()?.parse().ok())
                .unwrap_or(0)
        };
        // Two reservations of 10, a refused one, and at most a few more
        // (a denial's retry after the deny cache's age, the script loads).
        let scripts = calls("evalsha") + calls("eval");
        assert!(
            (2..=6).contains(&scripts),
            "{name}: {scripts} script calls\n{stats}"
        );
    }
}

/// `RATE_LIMIT_REFUND=successes` on the tonic example: a served call's
/// `grpc-status` comes in its trailers, which the example's
/// `refund::TrailersLayer` reads, so served calls are all refunded and
/// only failed ones count.
#[cfg(feature = "tonic")]
#[tokio::test]
async fn rate_limit_refund_successes_on_the_tonic_example() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };

    let ex = start(
        "tonic",
        &[("RATE_LIMIT", "2/60s"), ("RATE_LIMIT_REFUND", "successes")],
    );
    let channel = tonic::transport::Channel::from_shared(ex.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for i in 0..6 {
        // The refund runs as a task once the trailers pass, so the next
        // call may come first and find the quota spent: such a denial spends
        // nothing, and the call is tried again until its refund has landed
        // (10 s at most; without refunds the third call never passes).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let res = health.check(HealthCheckRequest::default()).await;
            match res.map(|r| r.into_inner().status()).map_err(|s| s.code()) {
                Err(tonic::Code::ResourceExhausted) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                status => {
                    assert_eq!(status, Ok(ServingStatus::Serving), "call {i}");
                    break;
                }
            }
        }
    }
    let unknown = || HealthCheckRequest {
        service: "no.such.Service".into(),
    };
    for i in 0..2 {
        let status = health.check(unknown()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound, "call {i}");
    }
    let status = health.check(unknown()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
}

#[test]
fn bad_values_stop_the_server_naming_the_variable() {
    for (var, value) in [
        ("RATE_LIMIT_TIERS", "free"),
        ("RATE_LIMIT_TIERS", "free=3/60s;free=5/60s"),
        ("RATE_LIMIT_TIERS", "a b=3/60s"),
        ("RATE_LIMIT_TIERS", "default=3/60s"),
        // The counters of the default limiter (RATE_LIMIT=100/1s, unnamed).
        ("RATE_LIMIT_TIERS", "default.100-1000=3/60s"),
        ("RATE_LIMIT_TIER_HEADER", "x-plan"),
        ("RATE_LIMIT_SKIP", "10.0.0.0/33"),
        // A list that names nothing is a typo, not "none".
        ("RATE_LIMIT_SKIP", " , "),
        ("RATE_LIMIT_REFUND", "5xx"),
        ("RATE_LIMIT_RESERVE", "0"),
        ("RATE_LIMIT_RESERVE", "ten"),
        ("RATE_LIMIT_RESERVE_KEYS", "0"),
        ("RATE_LIMIT_RESERVE_KEYS", "lots"),
        // A size for reservations that are not on.
        ("RATE_LIMIT_RESERVE_KEYS", "200000"),
    ] {
        for name in EXAMPLES {
            let stderr = refused(name, &[(var, value)]);
            assert!(stderr.contains(var), "{name} {var}={value}: {stderr}");
        }
    }
    // `off` still reads every other variable; a reservation needs Redis.
    for vars in [
        &[("RATE_LIMIT", "off"), ("RATE_LIMIT_SHADOW", "maybe")][..],
        &[("RATE_LIMIT", "off"), ("RATE_LIMIT_RESERVE", "ten")][..],
        &[("RATE_LIMIT_RESERVE", "50")][..],
        // No hop trusted: every client behind the proxy would share its key.
        &[
            ("RATE_LIMIT_KEY", "client-ip"),
            ("TRUSTED_PROXIES", "10.0.0.0/8"),
            ("TRUSTED_HOPS", "0"),
        ][..],
        // No proxy named: trusting none is leaving it unset.
        &[("RATE_LIMIT_KEY", "client-ip"), ("TRUSTED_PROXIES", ",")][..],
        // A skip list over the proxies skips whoever hides behind them.
        &[
            ("RATE_LIMIT_KEY", "client-ip"),
            ("TRUSTED_PROXIES", "10.0.0.0/8"),
            ("RATE_LIMIT_SKIP", "10.1.0.0/16"),
        ][..],
        // So does one written as IPv4-mapped IPv6, which the crate reads as
        // the IPv4 address it maps, either way round.
        &[
            ("RATE_LIMIT_KEY", "client-ip"),
            ("TRUSTED_PROXIES", "10.0.0.0/8"),
            ("RATE_LIMIT_SKIP", "::ffff:10.0.0.7"),
        ][..],
        &[
            ("RATE_LIMIT_KEY", "client-ip"),
            ("TRUSTED_PROXIES", "::ffff:10.0.0.0/104"),
            ("RATE_LIMIT_SKIP", "10.1.0.0/16"),
        ][..],
    ] {
        let var = vars.last().unwrap().0;
        for name in EXAMPLES {
            let stderr = refused(name, vars);
            assert!(stderr.contains(var), "{name} {vars:?}: {stderr}");
        }
    }
    // With `off`, a setting of how to limit would be ignored: a tier's
    // clients, meant to be limited, went unlimited. Refused, naming it.
    for (var, value) in [
        ("RATE_LIMIT_TIERS", "pro=1/60s"),
        ("RATE_LIMIT_SKIP", "10.0.0.0/8"),
        ("RATE_LIMIT_REFUND", "successes"),
        ("RATE_LIMIT_ALGORITHM", "gcra"),
        ("RATE_LIMIT_SHADOW", "on"),
    ] {
        for name in EXAMPLES {
            let stderr = refused(name, &[("RATE_LIMIT", "off"), (var, value)]);
            assert!(
                stderr.contains(var) && stderr.contains("RATE_LIMIT=off"),
                "{name} {var}={value}: {stderr}"
            );
        }
    }
    // GCRA's errors name the variable at fault: the burst's own, or the
    // quota's (one unit per µs at most), with the burst it took.
    let gcra = [
        (&[("RATE_LIMIT_BURST", "0")][..], "RATE_LIMIT_BURST=\"0\""),
        (&[("RATE_LIMIT", "2000/1ms")][..], "RATE_LIMIT=2000/1ms"),
        (
            &[("RATE_LIMIT", "2000/1ms"), ("RATE_LIMIT_BURST", "5")][..],
            "RATE_LIMIT_BURST=5",
        ),
    ];
    for (vars, names) in gcra {
        for name in EXAMPLES {
            let mut vars = vars.to_vec();
            vars.push(("RATE_LIMIT_ALGORITHM", "gcra"));
            let stderr = refused(name, &vars);
            assert!(stderr.contains(names), "{name} {vars:?}: {stderr}");
            assert!(!stderr.contains("None"), "{name} {vars:?}: {stderr}");
        }
    }
    // Seed or sentinel lists that no Redis could take are bad values (exit
    // status 2), refused before any connection: they were caught only when
    // the store connected, with status 1, as if Redis were down. Nothing
    // listens at these addresses.
    let mut lists = Vec::new();
    if cfg!(feature = "cluster") {
        lists.push(vec![("REDIS_CLUSTER_URLS", "unix:///tmp/no-such.sock")]);
        lists.push(vec![(
            "REDIS_CLUSTER_URLS",
            "redis://:a@127.0.0.1:1,redis://:b@127.0.0.1:2",
        )]);
    }
    if cfg!(all(feature = "sentinel", feature = "tls")) {
        lists.push(vec![
            (
                "REDIS_SENTINEL_URLS",
                "rediss://127.0.0.1:1,redis://127.0.0.1:2",
            ),
            ("REDIS_SENTINEL_MASTER", "m"),
        ]);
    }
    for vars in lists {
        for name in EXAMPLES {
            let stderr = refused(name, &vars);
            assert!(stderr.contains(vars[0].0), "{name} {vars:?}: {stderr}");
        }
    }
    // A tier's quota too fast for GCRA is the tier's fault, not RATE_LIMIT's
    // (left at its default).
    for name in EXAMPLES {
        let vars = [
            ("RATE_LIMIT_ALGORITHM", "gcra"),
            ("RATE_LIMIT_TIERS", "pro=2000/1ms"),
        ];
        let stderr = refused(name, &vars);
        assert!(
            stderr.contains("RATE_LIMIT_TIERS") && !stderr.contains("RATE_LIMIT="),
            "{name} {vars:?}: {stderr}"
        );
    }
    // A reservation needs one fixed-window quota.
    for (var, value) in [
        ("RATE_LIMIT", "10/1s;100/1m"),
        ("RATE_LIMIT_ALGORITHM", "gcra"),
    ] {
        for name in EXAMPLES {
            let stderr = refused(name, &[("RATE_LIMIT_RESERVE", "10"), (var, value)]);
            assert!(stderr.contains("RATE_LIMIT_RESERVE"), "{name}: {stderr}");
        }
    }
    // A reservation above MAX_LIMIT (no window holds more) is refused when
    // read, naming RATE_LIMIT_RESERVE, as the other bad values: it was
    // taken, then the limiter's build failed (exit status 1) without naming
    // it, or blaming RATE_LIMIT_TIERS. No Redis listens on port 1: the
    // value is refused before any connection. MAX_LIMIT itself is taken,
    // and the server goes on to connect (status 1: no Redis there).
    let max = redis_ratelimit::quota::MAX_LIMIT;
    let (over, max) = ((max + 1).to_string(), max.to_string());
    for tiers in [None, Some("pro=8/60s")] {
        let mut vars = vec![("REDIS_URL", "redis://127.0.0.1:1")];
        vars.extend(tiers.map(|t| ("RATE_LIMIT_TIERS", t)));
        for name in EXAMPLES {
            let mut vars = vars.clone();
            vars.push(("RATE_LIMIT_RESERVE", over.as_str()));
            let stderr = refused(name, &vars);
            assert!(
                stderr.contains(&format!("RATE_LIMIT_RESERVE={over:?}")),
                "{name} {vars:?}: {stderr}"
            );
            vars.pop();
            vars.push(("RATE_LIMIT_RESERVE", max.as_str()));
            let (status, stderr) = run_to_exit(name, &vars);
            assert!(
                status == Some(1) && stderr.contains("127.0.0.1:1 (REDIS_URL)"),
                "{name} {vars:?}: {status:?} {stderr}"
            );
        }
    }
}

/// Runs example `name` with `vars`, which it must refuse (exit status 2):
/// what it wrote to stderr.
fn refused(name: &str, vars: &[(&str, &str)]) -> String {
    let (status, stderr) = run_to_exit(name, vars);
    assert_eq!(status, Some(2), "{name} {vars:?}: {stderr}");
    stderr
}

/// Runs example `name` with `vars`, which must stop it before it listens:
/// its exit status and what it wrote to stderr. One that starts is stopped
/// once it listens, and fails the test.
fn run_to_exit(name: &str, vars: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = example(name)
        .env("BIND", "127.0.0.1:0")
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let started = stdout
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains("listening on"));
        let _ = tx.send(started);
    });
    // One that neither listens nor exits (a connection that hangs) is
    // killed, and fails the test, rather than hanging the suite.
    let started = rx.recv_timeout(Duration::from_secs(60));
    if started != Ok(false) {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let started = started.unwrap_or_else(|_| {
        panic!(
            "{name} {vars:?} neither listened nor exited in 60 s: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!started, "{name} {vars:?} started: {stderr}");
    (out.status.code(), stderr)
}

/// Every example stops alike on SIGTERM (what a service manager or an
/// orchestrator sends) and on ctrl-c: it handles the signal, and exits with
/// status 0 (a process the signal killed has no exit status). axum, hyper
/// and tonic watched ctrl-c alone, so SIGTERM killed them. That the
/// examples' graceful shutdown finishes open requests is the frameworks'
/// own, and not tested here.
#[cfg(unix)]
#[tokio::test]
async fn every_example_exits_cleanly_on_sigterm_and_ctrl_c() {
    let mut names = EXAMPLES.to_vec();
    if cfg!(feature = "tonic") {
        names.push("tonic");
    }
    for signal in ["-TERM", "-INT"] {
        for name in &names {
            let mut ex = start(name, &[]);
            kill(&ex.child, signal);
            let status = exit_within(&mut ex.child, Duration::from_secs(10), name).await;
            assert_eq!(status.code(), Some(0), "{name} {signal}: {status}");
        }
    }
}

/// Sends `signal` (`-TERM`, `-INT`) to `child`.
fn kill(child: &Child, signal: &str) {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args([signal, &pid]).status().unwrap();
    assert!(sent.success(), "kill {signal} {pid}");
}

/// Waits up to `within` for `child` to exit, and returns its status.
async fn exit_within(child: &mut Child, within: Duration, name: &str) -> std::process::ExitStatus {
    let until = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < until,
            "{name}: still running after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The examples' drain once signalled (`DRAIN` in `examples/support`).
const DRAIN: Duration = Duration::from_secs(10);

/// Once signalled, every HTTP example stops taking connections while it
/// drains the ones it holds: a new connection is refused (or closed, or
/// served), never taken in and left unanswered. The hyper example kept its
/// listener open through the drain (up to 10 s), so a client that
/// connected then sat in the backlog with no answer until the process
/// exited; axum and actix drop theirs at the signal. (The tonic example
/// speaks gRPC only, over HTTP/2, so this HTTP/1 connection cannot hold
/// its drain; tonic drops its listener at the signal too.)
///
/// And the drain is bounded: a connection whose answers are never read
/// cannot keep an example from exiting. axum waited for it for ever, and
/// actix-web for its default 30 s.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn every_example_refuses_new_connections_once_signalled() {
    use std::{
        io::{ErrorKind, Read, Write},
        net::{SocketAddr, TcpStream},
    };
    for name in EXAMPLES {
        let mut ex = start(name, &[("RATE_LIMIT", "off")]);
        let addr: SocketAddr = ex.url.trim_start_matches("http://").parse().unwrap();
        // A connection that holds the drain: pipelined requests whose
        // answers are never read, into a small receive buffer, so that the
        // server is soon blocked writing an answer it cannot finish.
        let busy =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        busy.set_recv_buffer_size(2048).unwrap();
        busy.connect(&addr.into()).unwrap();
        let mut busy = TcpStream::from(busy);
        let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::spawn({
            let written = written.clone();
            move || {
                let requests = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n".repeat(100);
                while busy.write_all(&requests).is_ok() {
                    written.fetch_add(requests.len(), std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
        // Until the writes stall: the server has stopped reading, blocked
        // writing answers nobody reads.
        let until = std::time::Instant::now() + Duration::from_secs(20);
        let mut seen = usize::MAX;
        loop {
            let now = written.load(std::sync::atomic::Ordering::SeqCst);
            if now == seen {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "{name}: writes never stalled"
            );
            seen = now;
            std::thread::sleep(Duration::from_millis(200));
        }
        kill(&ex.child, "-TERM");
        ex.stopping
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{name} never logged the stop signal"));
        assert!(
            ex.child.try_wait().unwrap().is_none(),
            "{name} exited at once: the busy connection did not hold its drain, so nothing is tested"
        );
        // Refused means the listener is closed.
        if let Ok(mut client) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            client
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            // A write may fail on a connection already closed: that is fine.
            let _ = client.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            let mut answer = [0u8; 64];
            match client.read(&mut answer) {
                // Closed, reset or answered.
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
                Err(e) => panic!("{name}: a connection made during the drain: {e}"),
            }
        }
        let status = exit_within(&mut ex.child, DRAIN + Duration::from_secs(10), name).await;
        assert_eq!(status.code(), Some(0), "{name}: {status}");
    }
}

/// The tonic example's drain is bounded too: a `Health/Watch` stream, which
/// never ends, does not keep it from exiting once signalled (it waited for
/// the stream for ever).
#[cfg(all(unix, feature = "tonic"))]
#[tokio::test]
async fn the_tonic_example_exits_within_its_drain_while_a_stream_is_open() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let mut ex = start("tonic", &[("RATE_LIMIT", "off")]);
    let channel = tonic::transport::Channel::from_shared(ex.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    // The stream is open and served: its first message came.
    assert!(watch.message().await.unwrap().is_some());
    let signalled = std::time::Instant::now();
    kill(&ex.child, "-TERM");
    let status = exit_within(&mut ex.child, DRAIN + Duration::from_secs(10), "tonic").await;
    assert_eq!(status.code(), Some(0), "tonic: {status}");
    assert!(
        signalled.elapsed() > DRAIN / 2,
        "tonic exited after {:?}: the stream did not hold its drain, so nothing is tested",
        signalled.elapsed()
    );
}
