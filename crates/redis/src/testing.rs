//! Test support (feature `testing`): real redis-server processes of a
//! test's own, on free loopback ports, plain or TLS-only with certificates
//! made fresh for the test. Used by this crate's tests and by the
//! `tollgate` binary's end-to-end tests.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

pub use tollgate_testing::free_port;
use tollgate_testing::KillOnDrop;

/// The redis-server binary: `$TOLLGATE_REDIS_SERVER`, else the one on the
/// PATH. `scripts/test.sh` installs it when missing.
pub fn redis_server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("TOLLGATE_REDIS_SERVER") {
        return PathBuf::from(p);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join("redis-server");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "redis-server not found: install it (scripts/test.sh does) or set TOLLGATE_REDIS_SERVER"
    );
}

/// Certificates for a TLS test server and its clients, made fresh by
/// [`TestCerts::generate`] (rcgen), as PEM text: a CA, a server
/// certificate for `127.0.0.1` and `localhost` and a client certificate,
/// both signed by the CA.
#[derive(Clone)]
pub struct TestCerts {
    /// The CA's certificate: what clients trust, and what the server
    /// checks client certificates against.
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

impl TestCerts {
    /// A new CA and the certificates it signs (ECDSA P-256).
    pub fn generate() -> TestCerts {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "tollgate test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        // rcgen makes names that parse as addresses IP SANs, which is what
        // a client connecting to rediss://127.0.0.1 checks.
        let leaf = |name: &str, sans: &[&str]| {
            let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
            let mut params = CertificateParams::new(sans).unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf("redis", &["127.0.0.1", "localhost"]);
        let (client_cert, client_key) = leaf("tollgate", &["tollgate"]);
        TestCerts {
            ca: ca.pem(),
            server_cert,
            server_key,
            client_cert,
            client_key,
        }
    }

    /// The client certificate and key, as the store takes them.
    pub fn client(&self) -> crate::conn::ClientCert {
        crate::conn::ClientCert {
            cert_pem: self.client_cert.clone().into_bytes(),
            key_pem: self.client_key.clone().into_bytes(),
        }
    }
}

/// How a TLS server was started, to start it again the same way.
struct Tls {
    certs: TestCerts,
    require_client_cert: bool,
}

/// A redis-server process of the test's own, killed when dropped.
pub struct RedisServer {
    /// Declared first, so the process is killed before its directory is
    /// removed.
    child: Option<KillOnDrop>,
    /// The port it listens on: plain TCP, or TLS only for a TLS server.
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    tls: Option<Tls>,
}

impl RedisServer {
    /// Starts a redis-server on a free port, without persistence.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts one with extra arguments (`--cluster-enabled yes`, ...).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start_inner(extra, None)
    }

    /// Starts one that speaks TLS only (`--port 0 --tls-port PORT`), with
    /// certificates made for it: clients must trust the returned CA, and
    /// with `require_client_cert` present a certificate it signed
    /// (`--tls-auth-clients yes`).
    pub fn start_tls(require_client_cert: bool) -> (RedisServer, TestCerts) {
        let certs = TestCerts::generate();
        let tls = Tls {
            certs: certs.clone(),
            require_client_cert,
        };
        (RedisServer::start_inner(&[], Some(tls)), certs)
    }

    fn start_inner(extra: &[&str], tls: Option<Tls>) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        if let Some(tls) = &tls {
            let c = &tls.certs;
            for (file, pem) in [
                ("ca.pem", &c.ca),
                ("server.pem", &c.server_cert),
                ("server.key", &c.server_key),
            ] {
                std::fs::write(dir.path().join(file), pem).unwrap();
            }
        }
        let mut s = RedisServer {
            child: None,
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(redis_server_binary());
        let dir = self.dir.path();
        match &self.tls {
            None => {
                cmd.arg("--port").arg(self.port.to_string());
            }
            Some(tls) => {
                // No plain port at all, so nothing reaches it without TLS.
                cmd.args(["--port", "0", "--tls-port"])
                    .arg(self.port.to_string())
                    .arg("--tls-cert-file")
                    .arg(dir.join("server.pem"))
                    .arg("--tls-key-file")
                    .arg(dir.join("server.key"))
                    .arg("--tls-ca-cert-file")
                    .arg(dir.join("ca.pem"))
                    .arg("--tls-auth-clients")
                    .arg(if tls.require_client_cert { "yes" } else { "no" });
            }
        }
        let mut child = KillOnDrop::spawn(
            cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir)
                .arg("--logfile")
                .arg(dir.join("redis.log"))
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .expect("start redis-server");
        let ready =
            tollgate_testing::wait_ready(&mut child, Duration::from_secs(10), || self.ping());
        self.child = Some(child);
        if let Err(why) = ready {
            let log =
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
            panic!(
                "redis-server on port {} did not start ({why}); its log:\n{log}",
                self.port
            );
        }
    }

    /// Whether it answers PING.
    fn ping(&self) -> bool {
        if self.tls.is_none() {
            return ping(self.port);
        }
        let Ok(mut con) = self
            .redis_client()
            .get_connection_with_timeout(Duration::from_secs(1))
        else {
            return false;
        };
        redis::cmd("PING")
            .query::<String>(&mut con)
            .is_ok_and(|pong| pong == "PONG")
    }

    /// `redis://127.0.0.1:PORT/`, or `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// A redis-rs client for this server; for a TLS one, trusting its CA
    /// and presenting the client certificate.
    fn redis_client(&self) -> redis::Client {
        match &self.tls {
            None => redis::Client::open(self.url()).unwrap(),
            Some(tls) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: Some(redis::ClientTlsConfig {
                        client_cert: tls.certs.client_cert.clone().into_bytes(),
                        client_key: tls.certs.client_key.clone().into_bytes(),
                    }),
                    root_cert: Some(tls.certs.ca.clone().into_bytes()),
                },
            )
            .unwrap(),
        }
    }

    /// Kills the server (SIGKILL): everything in it is lost.
    pub fn kill(&mut self) {
        // Dropping the guard kills and reaps it.
        self.child = None;
    }

    /// Stops the process (SIGSTOP): connections stay open and nothing is
    /// answered, as with a host that hangs, until [`RedisServer::resume`].
    /// Returns once the process is stopped (Linux: its state in
    /// `/proc/PID/stat`), so whatever is sent after reaches it unread.
    pub fn pause(&self) {
        self.signal("STOP");
        let pid = self
            .child
            .as_ref()
            .map(|c| c.id())
            .expect("a running redis-server");
        let stat = format!("/proc/{pid}/stat");
        let stopped = || {
            std::fs::read_to_string(&stat).is_ok_and(|s| {
                // `PID (COMM) STATE ...`: the state follows the last `)`.
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !stopped() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server {pid} did not stop"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Bytes sent to this server that it has not read yet, over all its
    /// TCP connections (the receive queues in `/proc/net/tcp` and
    /// `tcp6`, Linux). While it is [paused](RedisServer::pause), this is
    /// how a test knows a command reached it, in the order sent.
    pub fn unread_bytes(&self) -> u64 {
        let mut unread = 0;
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let (Some(local), Some(state), Some(queues)) =
                    (fields.get(1), fields.get(3), fields.get(4))
                else {
                    continue;
                };
                let port = local
                    .rsplit_once(':')
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
                // 01: established; the queues are `tx:rx`, in hex.
                if port != Some(self.port) || *state != "01" {
                    continue;
                }
                if let Some((_, rx)) = queues.split_once(':') {
                    unread += u64::from_str_radix(rx, 16).unwrap_or(0);
                }
            }
        }
        unread
    }

    /// Waits until more than `bytes` are [unread](RedisServer::unread_bytes)
    /// (a bound of 10 s on a hung test), and returns how many are. Async,
    /// so that the tasks sending run meanwhile on the test's runtime.
    pub async fn await_unread_beyond(&self, bytes: u64) -> u64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.unread_bytes();
            if now > bytes {
                return now;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "nothing more reached redis-server on port {} ({now} bytes unread)",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Like [`RedisServer::unread_bytes`], counting only the connections
    /// of this (the test's) process: a server that sentinels and a
    /// replica talk to too gets their pings and acknowledgements besides
    /// the test's commands (Linux: the sockets in `/proc/self/fd`, found
    /// by inode in `/proc/net/tcp`).
    pub fn unread_bytes_from_this_process(&self) -> u64 {
        let mine: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
            .map(|dir| {
                dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .filter_map(|l| {
                        let l = l.to_string_lossy().into_owned();
                        Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let port_of = |addr: &str| {
            addr.rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
        };
        let mut rows = Vec::new();
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let f: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
                if f.len() > 9 && f[3] == "01" {
                    rows.push(f);
                }
            }
        }
        // This process's ends of connections to the server: their ports.
        let ours: std::collections::HashSet<u16> = rows
            .iter()
            .filter(|f| mine.contains(&f[9]) && port_of(&f[2]) == Some(self.port))
            .filter_map(|f| port_of(&f[1]))
            .collect();
        rows.iter()
            .filter(|f| port_of(&f[1]) == Some(self.port))
            .filter(|f| port_of(&f[2]).is_some_and(|p| ours.contains(&p)))
            .filter_map(|f| f[4].split_once(':'))
            .map(|(_, rx)| u64::from_str_radix(rx, 16).unwrap_or(0))
            .sum()
    }

    /// Waits until more than `bytes` sent by this process are unread
    /// ([`RedisServer::unread_bytes_from_this_process`]; a bound of 10 s
    /// on a hung test), and returns how many are.
    pub async fn await_unread_from_this_process_beyond(&self, bytes: u64) -> u64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.unread_bytes_from_this_process();
            if now > bytes {
                return now;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "nothing more from this process reached redis-server on port {} ({now} bytes unread)",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self
            .child
            .as_ref()
            .map(|c| c.id())
            .expect("a running redis-server");
        assert!(tollgate_testing::signal(pid, name), "kill -{name} {pid}");
    }

    /// Starts it again, empty, on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs redis-cli-like raw commands: sends `cmd` inline and returns the
    /// first reply line. Plain servers only: use [`RedisServer::client`]
    /// or [`RedisServer::connection`] on a TLS one.
    pub fn command(&self, cmd: &str) -> String {
        assert!(
            self.tls.is_none(),
            "command() speaks plain TCP; use connection() on a TLS server"
        );
        raw(self.port, cmd)
    }

    /// A synchronous, non-cluster connection to this server (over TLS with
    /// the client certificate, for a TLS server).
    pub fn connection(&self) -> redis::Connection {
        self.redis_client().get_connection().unwrap()
    }

    /// Every key of this server that starts with `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.client().scan(&format!("{prefix}*"))
    }

    /// A client for reading what the store wrote, for tests that cannot
    /// name the `redis` crate's types.
    pub fn client(&self) -> Client {
        Client(self.connection())
    }

    /// How many `EVALSHA` calls this server has run (`INFO
    /// commandstats`): what reached Redis, for tests of what must not.
    pub fn evalsha_calls(&self) -> u64 {
        let stats = self.client().strings(&["INFO", "commandstats"]);
        stats
            .iter()
            .flat_map(|s| s.lines())
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }
}

/// A synchronous connection to one redis-server, with the reads the
/// tests make.
pub struct Client(redis::Connection);

impl Client {
    /// Every key matching `pattern` (SCAN), sorted.
    pub fn scan(&mut self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .clone()
            .iter(&mut self.0)
            .unwrap()
            .map(|k| k.unwrap())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// A hash's fields and values, read in one command.
    pub fn hgetall(&mut self, key: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        redis::cmd("HGETALL").arg(key).query(&mut self.0).unwrap()
    }

    /// Whether `key` exists.
    pub fn exists(&mut self, key: &str) -> bool {
        redis::cmd("EXISTS").arg(key).query(&mut self.0).unwrap()
    }

    /// `key`'s value, serialized (DUMP), to put back later.
    pub fn dump(&mut self, key: &str) -> Vec<u8> {
        redis::cmd("DUMP").arg(key).query(&mut self.0).unwrap()
    }

    /// Puts back a value [`Client::dump`] took, replacing what `key` holds
    /// now (as if Redis had gone back to an older state).
    pub fn restore(&mut self, key: &str, dumped: &[u8]) {
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(dumped)
            .arg("REPLACE")
            .query(&mut self.0)
            .unwrap();
    }

    /// Any command whose answer is one string (INFO, DEBUG SLEEP's OK...).
    pub fn text(&mut self, args: &[&str]) -> String {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.0).unwrap()
    }

    /// Any command whose answer is a list of strings (ZRANGE, SMEMBERS...).
    pub fn strings(&mut self, args: &[&str]) -> Vec<String> {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.0).unwrap()
    }
}

/// A Redis Cluster of three masters (no replicas) started by the test,
/// each a [`RedisServer`] of its own, slots split evenly. Dropping it
/// kills them all.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, gives each a third of the
    /// 16384 slots, introduces them to each other and waits until every
    /// node reports the cluster healthy and complete.
    pub fn start() -> RedisCluster {
        RedisCluster::start_inner(None)
    }

    /// The same, TLS only (the cluster bus too), every node with the
    /// returned certificates and requiring client certificates.
    pub fn start_tls() -> (RedisCluster, TestCerts) {
        let certs = TestCerts::generate();
        (RedisCluster::start_inner(Some(&certs)), certs)
    }

    fn start_inner(certs: Option<&TestCerts>) -> RedisCluster {
        const SLOTS: u16 = 16384;
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        if certs.is_some() {
            // Nodes meet over TLS, and CLUSTER SLOTS names TLS ports.
            args.extend(["--tls-cluster", "yes"]);
        }
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let tls = certs.map(|c| Tls {
                    certs: c.clone(),
                    require_client_cert: true,
                });
                RedisServer::start_inner(&args, tls)
            })
            .collect();
        let n = nodes.len() as u16;
        for (i, node) in nodes.iter().enumerate() {
            let i = i as u16;
            let (lo, hi) = (SLOTS * i / n, SLOTS * (i + 1) / n);
            let mut addslots = redis::cmd("CLUSTER");
            addslots.arg("ADDSLOTS");
            for slot in lo..hi {
                addslots.arg(slot);
            }
            let _: () = addslots.query(&mut node.connection()).unwrap();
            // Distinct epochs from the start, so no collision has to be
            // resolved before the cluster settles.
            let _: () = redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(i + 1)
                .query(&mut node.connection())
                .unwrap();
        }
        for other in &nodes[1..] {
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(other.port)
                .query(&mut nodes[0].connection())
                .unwrap();
        }
        let cluster = RedisCluster { nodes };
        tollgate_testing::eventually("the test cluster settles", Duration::from_secs(30), || {
            if cluster.settled() {
                Ok(())
            } else {
                Err("CLUSTER INFO is not ok, complete and covering every slot yet".into())
            }
        });
        cluster
    }

    fn settled(&self) -> bool {
        self.nodes.iter().all(|node| {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut node.connection())
                .unwrap_or_default();
            info.contains("cluster_state:ok")
                && info.contains("cluster_known_nodes:3")
                && info.contains("cluster_slots_ok:16384")
        })
    }

    /// `redis-cluster://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C`: every
    /// master as a seed (`rediss-cluster://` for a TLS cluster).
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let tls = self.nodes.iter().any(|n| n.tls.is_some());
        let scheme = if tls { "rediss" } else { "redis" };
        format!("{scheme}-cluster://{}", seeds.join(","))
    }

    /// The keys of each master that start with `prefix`, by node.
    pub fn keys_by_node(&self, prefix: &str) -> Vec<Vec<String>> {
        self.nodes.iter().map(|n| n.keys(prefix)).collect()
    }
}

fn raw(port: u16, cmd: &str) -> String {
    use std::io::{BufRead, BufReader, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("{cmd}\r\n").as_bytes()).is_err() {
        return String::new();
    }
    let mut line = String::new();
    let _ = BufReader::new(s).read_line(&mut line);
    line.trim_end().to_owned()
}

fn ping(port: u16) -> bool {
    raw(port, "PING") == "+PONG"
}

/// A sentinel process of the test's own (`redis-server FILE --sentinel`),
/// killed when dropped.
struct SentinelProcess {
    /// Declared first, so the process is killed before its directory is
    /// removed.
    _child: KillOnDrop,
    port: u16,
    /// `:PASSWORD@` when the sentinel requires a password, else empty.
    auth: String,
    _dir: tempfile::TempDir,
}

/// A master, one replica of it and three sentinels watching it under
/// [`RedisSentinels::MASTER`] (quorum 2), each a process of the test's own
/// on free loopback ports. Dropping it kills them all.
pub struct RedisSentinels {
    /// The two data servers: the first starts as the master, the second
    /// as its replica.
    pub servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
}

impl RedisSentinels {
    /// The name the sentinels know the master by.
    pub const MASTER: &'static str = "tollgate-test";

    /// Starts the master, its replica (waiting until it is in sync) and
    /// three sentinels, and waits until every sentinel knows the master,
    /// the replica and the two other sentinels: from then on a
    /// [`RedisSentinels::failover`] can be forced and every sentinel
    /// learns its outcome.
    pub fn start() -> RedisSentinels {
        Self::start_inner(None)
    }

    /// [`RedisSentinels::start`], with sentinels that require `password`
    /// (`requirepass`; they use it with each other too). The data
    /// servers require none.
    pub fn start_with_sentinel_password(password: &str) -> RedisSentinels {
        Self::start_inner(Some(password))
    }

    fn start_inner(password: Option<&str>) -> RedisSentinels {
        let master = RedisServer::start();
        let port = master.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        tollgate_testing::eventually("the replica syncs", Duration::from_secs(30), || {
            let info = replica.client().text(&["INFO", "replication"]);
            if info.contains("master_link_status:up") {
                Ok(())
            } else {
                Err(info)
            }
        });
        let sentinels = (0..3)
            .map(|_| start_sentinel(master.port, password))
            .collect();
        let s = RedisSentinels {
            servers: vec![master, replica],
            sentinels,
        };
        tollgate_testing::eventually("the sentinels settle", Duration::from_secs(60), || {
            for p in &s.sentinels {
                let mut c = sentinel_connection(p)?;
                let replicas: Vec<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL")
                        .arg("replicas")
                        .arg(Self::MASTER)
                        .query(&mut c)
                        .map_err(|e| e.to_string())?;
                let good = replicas.iter().any(|r| {
                    r.get("flags").is_some_and(|f| f == "slave")
                        && r.get("master-link-status").is_some_and(|l| l == "ok")
                });
                let others: Vec<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
                    .arg("sentinels")
                    .arg(Self::MASTER)
                    .query(&mut c)
                    .map_err(|e| e.to_string())?;
                if !good || others.len() < 2 {
                    return Err(format!(
                        "sentinel {}: replicas {replicas:?}, {} other sentinels",
                        p.port,
                        others.len()
                    ));
                }
            }
            Ok(())
        });
        s
    }

    /// `redis-sentinel://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/tollgate-test`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis-sentinel://{}/{}", hosts.join(","), Self::MASTER)
    }

    /// The port of the master as the first sentinel names it.
    pub fn master_port(&self) -> u16 {
        master_addr(&self.sentinels[0]).expect("the sentinel names a master")
    }

    /// Stops the sentinel that comes `i`th in [`RedisSentinels::url`]
    /// (SIGSTOP): its connections stay open and it answers nothing, as a
    /// hung host would. Returns once the process is stopped.
    pub fn pause_sentinel(&self, i: usize) {
        let pid = self.sentinels[i]._child.id();
        assert!(tollgate_testing::signal(pid, "STOP"), "kill -STOP {pid}");
        let stat = format!("/proc/{pid}/stat");
        tollgate_testing::eventually("the sentinel stops", Duration::from_secs(10), || {
            let s = std::fs::read_to_string(&stat).map_err(|e| e.to_string())?;
            // `PID (COMM) STATE ...`: the state follows the last `)`.
            let stopped = s
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']));
            stopped.then_some(()).ok_or(s)
        });
    }

    /// Commands the sentinels have run, all of them together (`INFO
    /// stats`; a sentinel keeps no `commandstats`): what clients asked
    /// them, plus the pings and hellos they send each other (a few a
    /// second).
    pub fn sentinel_commands(&self) -> u64 {
        self.sentinels
            .iter()
            .map(|p| {
                let info: String = redis::cmd("INFO")
                    .arg("stats")
                    .query(&mut sentinel_connection(p).unwrap())
                    .unwrap();
                info.lines()
                    .find_map(|l| l.strip_prefix("total_commands_processed:"))
                    .map_or(0, |n| n.trim().parse::<u64>().unwrap())
            })
            .sum()
    }

    /// The data server listening on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port == port)
            .expect("one of the test's servers")
    }

    /// Waits until the master has passed every write it took to its
    /// replica (`WAIT 1`), so that a failover loses nothing.
    pub fn sync_replica(&self) {
        let mut c = self.server(self.master_port()).connection();
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(30_000).query(&mut c).unwrap();
        assert_eq!(acked, 1, "the replica did not acknowledge the writes");
    }

    /// Forces a failover (`SENTINEL FAILOVER`, asked of the first
    /// sentinel until it accepts) and waits until every sentinel names
    /// the replica as master, it says it is one (`ROLE`) and the old
    /// master says it is a replica now. Returns the new master's port.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        let new = self
            .servers
            .iter()
            .map(|s| s.port)
            .find(|&p| p != old)
            .unwrap();
        tollgate_testing::eventually("the failover starts", Duration::from_secs(30), || {
            let mut c = sentinel_connection(&self.sentinels[0])?;
            redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(Self::MASTER)
                .query::<String>(&mut c)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        self.await_promotion(old);
        tollgate_testing::eventually(
            "the old master is a replica",
            Duration::from_secs(60),
            || {
                let role = role_of(self.server(old))?;
                if role != "slave" {
                    return Err(format!("{old} is {role}, not a replica yet"));
                }
                Ok(())
            },
        );
        new
    }

    /// Waits until the sentinels fail the master on `old` over by
    /// themselves (it was paused or killed: [`RedisServer::pause`]): every
    /// sentinel names the other server, and it says it is master
    /// (`ROLE`). Returns the new master's port. The sentinels take their
    /// `down-after-milliseconds` (2 s here) and an election: the bound is
    /// generous.
    pub fn await_promotion(&self, old: u16) -> u16 {
        let new = self
            .servers
            .iter()
            .map(|s| s.port)
            .find(|&p| p != old)
            .unwrap();
        tollgate_testing::eventually("the failover completes", Duration::from_secs(90), || {
            for p in &self.sentinels {
                let named = master_addr(p);
                if named != Some(new) {
                    return Err(format!("sentinel {} names {named:?}", p.port));
                }
            }
            let role = role_of(self.server(new))?;
            if role != "master" {
                return Err(format!("{new} is {role}, not master yet"));
            }
            Ok(())
        });
        new
    }
}

/// Starts a sentinel watching the master on `master_port`, with timeouts
/// short enough for a test.
fn start_sentinel(master_port: u16, password: Option<&str>) -> SentinelProcess {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let name = RedisSentinels::MASTER;
    let conf = dir.path().join("sentinel.conf");
    let requirepass = password.map_or(String::new(), |pw| format!("requirepass {pw}\n"));
    // The sentinel rewrites its file as it learns: it must be writable.
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
             {requirepass}\
             sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {name} 2000\n\
             sentinel failover-timeout {name} 10000\n\
             sentinel parallel-syncs {name} 1\n",
            dir = dir.path().display()
        ),
    )
    .unwrap();
    let mut child = KillOnDrop::spawn(
        Command::new(redis_server_binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("start redis-server --sentinel");
    // One that requires a password answers a PING without one with
    // `-NOAUTH ...`: it is up too.
    let ready = tollgate_testing::wait_ready(&mut child, Duration::from_secs(10), || {
        let answer = raw(port, "PING");
        answer == "+PONG" || answer.starts_with("-NOAUTH")
    });
    if let Err(why) = ready {
        let log = std::fs::read_to_string(dir.path().join("sentinel.log")).unwrap_or_default();
        panic!("sentinel on port {port} did not start ({why}); its log:\n{log}");
    }
    SentinelProcess {
        _child: child,
        port,
        auth: password.map_or(String::new(), |pw| format!(":{pw}@")),
        _dir: dir,
    }
}

fn sentinel_connection(p: &SentinelProcess) -> Result<redis::Connection, String> {
    redis::Client::open(format!("redis://{}127.0.0.1:{}/", p.auth, p.port))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .map_err(|e| format!("sentinel {} refused a connection: {e}", p.port))
}

/// The master's port as the sentinel `p` names it.
fn master_addr(p: &SentinelProcess) -> Option<u16> {
    let mut c = sentinel_connection(p).ok()?;
    let addr: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(RedisSentinels::MASTER)
        .query(&mut c)
        .ok()?;
    addr.and_then(|(_, p)| p.parse().ok())
}

/// `master` or `slave`: the first word of `ROLE` asked of `server` on a
/// fresh connection. A server changing role closes its clients' connections
/// (Redis does so on `REPLICAOF`), so a refused or reset connection is an
/// answer to ask again, not a failure: the callers poll.
fn role_of(server: &RedisServer) -> Result<String, String> {
    let mut c = server
        .redis_client()
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| format!("{} refused a connection: {e}", server.port))?;
    let v: redis::Value = redis::cmd("ROLE")
        .query(&mut c)
        .map_err(|e| format!("{} did not answer ROLE: {e}", server.port))?;
    Ok(match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    })
}
