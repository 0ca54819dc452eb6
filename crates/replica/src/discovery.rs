//! Seed peers by DNS: `--peers dns:NAME:PORT` and the task that keeps a
//! running node's seed list in step with what the name lists.
//!
//! A Kubernetes headless Service (`clusterIP: None`) answers a look-up of
//! its name with one A (or AAAA) record per pod it selects, so the name is
//! the cluster's member list as the orchestrator knows it. [`Discovery`]
//! resolves every `dns:` seed's A and AAAA records, adds the port it was
//! given and the plain `IP:PORT` seeds, and hands the union to the node
//! ([`crate::Node::set_seeds`] through the runtime) whenever it changes;
//! it asks again every refresh interval. The node announces itself to
//! seeds it does not know yet, so a pod that started before its peers
//! were listed joins them on the first refresh that lists them.
//!
//! A name that lists nothing, or whose look-up fails, is not fatal: the
//! node keeps the seeds it had and the look-up is retried at the next
//! refresh. Each change of a name's outcome (addresses found, none, a
//! failure) is logged once, not at every refresh.
//!
//! Resolution is hickory's stub resolver on tokio, configured from the
//! system (`/etc/resolv.conf`: servers, search domains, `ndots`) unless a
//! server is named ([`DnsResolver::server`], `--dns-server`). Answers are
//! cached for at most a second ([`MAX_CACHE`]), whatever their TTL: the
//! refresh interval is the cache that matters, and a node that is still
//! joining must see a new answer within its join timeout.
//!
//! While the node may still be joining (the first join timeout after
//! start, [`Discovery::joining`]), the names are asked about every sixth
//! of that timeout rather than every refresh: pods of a StatefulSet that
//! start together are listed within moments of each other, and a node
//! that saw only itself in the first answer would otherwise decide alone
//! until the next refresh.
//!
//! Parsing ([`Seed`]'s `FromStr`) is separate from resolving, so bad
//! flags are refused at startup with an error naming the problem and the
//! expected form, before anything touches the network.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use tokio::sync::watch;

/// Longest DNS name, in bytes (RFC 1035 §2.3.4, without the final dot).
const MAX_NAME: usize = 253;

/// Longest label of a DNS name, in bytes (RFC 1035 §2.3.4).
const MAX_LABEL: usize = 63;

/// The form a DNS seed is written in, for error messages.
const DNS_FORM: &str = "dns:NAME:PORT, e.g. dns:tollgate-peers.default.svc.cluster.local:7946";

/// One `--peers` entry: a gossip address, or a DNS name whose A and AAAA
/// records are the addresses (all at one port).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Seed {
    /// `IP:PORT`.
    Addr(SocketAddr),
    /// `dns:NAME:PORT`.
    Dns(DnsSeed),
}

/// A seed found by DNS: every address `name` resolves to, at `port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DnsSeed {
    /// The DNS name, as given (a final dot makes it fully qualified: the
    /// resolver's search domains are then not tried).
    pub name: String,
    /// The gossip port of every address the name lists.
    pub port: u16,
}

/// Why a `--peers` entry is not a seed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SeedError {
    /// Nothing between two commas.
    #[error("an empty peer; expected IP:PORT or {DNS_FORM}")]
    Empty,
    /// Neither `IP:PORT` nor `dns:...`.
    #[error(
        "`{given}` is not an address (IP:PORT, e.g. 10.0.0.2:7946); a DNS name is written \
         {DNS_FORM}"
    )]
    NotAnAddress {
        /// The entry as given.
        given: String,
    },
    /// `dns:NAME` without `:PORT`.
    #[error("`{given}` has no port; expected {DNS_FORM}")]
    NoPort {
        /// The entry as given.
        given: String,
    },
    /// The port is not a number from 1 to 65535.
    #[error("`{given}`: `{port}` is not a port (1 to 65535); expected {DNS_FORM}")]
    BadPort {
        /// The entry as given.
        given: String,
        /// The port as given.
        port: String,
    },
    /// The name is not a DNS name.
    #[error("`{given}`: {reason}; expected {DNS_FORM}")]
    BadName {
        /// The entry as given.
        given: String,
        /// What is wrong with the name.
        reason: String,
    },
}

impl FromStr for Seed {
    type Err = SeedError;

    fn from_str(s: &str) -> Result<Seed, SeedError> {
        let given = s.trim();
        if given.is_empty() {
            return Err(SeedError::Empty);
        }
        let Some(rest) = given.strip_prefix("dns:") else {
            return given.parse::<SocketAddr>().map(Seed::Addr).map_err(|_| {
                SeedError::NotAnAddress {
                    given: given.to_owned(),
                }
            });
        };
        let Some((name, port)) = rest.rsplit_once(':') else {
            return Err(SeedError::NoPort {
                given: given.to_owned(),
            });
        };
        if port.is_empty() {
            return Err(SeedError::NoPort {
                given: given.to_owned(),
            });
        }
        let bad_port = || SeedError::BadPort {
            given: given.to_owned(),
            port: port.to_owned(),
        };
        let port: u16 = port.parse().map_err(|_| bad_port())?;
        if port == 0 {
            return Err(bad_port());
        }
        check_name(name).map_err(|reason| SeedError::BadName {
            given: given.to_owned(),
            reason,
        })?;
        Ok(Seed::Dns(DnsSeed {
            name: name.to_owned(),
            port,
        }))
    }
}

/// Whether `name` is a host name a resolver can look up: dot-separated
/// labels of letters, digits, `-` and `_`, within DNS's lengths. An IP
/// address is refused: it is written as a plain seed.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return Err(format!(
            "`{name}` is an IP address, not a name: give it as IP:PORT, without dns:"
        ));
    }
    let fqdn = name.strip_suffix('.').unwrap_or(name);
    if fqdn.len() > MAX_NAME {
        return Err(format!(
            "the name is {} bytes long; DNS allows {MAX_NAME}",
            fqdn.len()
        ));
    }
    for label in fqdn.split('.') {
        if label.is_empty() {
            return Err("the name has an empty label (a leading dot or two dots in a row)".into());
        }
        if label.len() > MAX_LABEL {
            return Err(format!(
                "the label `{label}` is {} bytes long; DNS allows {MAX_LABEL}",
                label.len()
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!(
                "`{c}` cannot be in a DNS name (letters, digits, `-` and `_` in dot-separated \
                 labels)"
            ));
        }
    }
    Ok(())
}

impl fmt::Display for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Seed::Addr(addr) => write!(f, "{addr}"),
            Seed::Dns(DnsSeed { name, port }) => write!(f, "dns:{name}:{port}"),
        }
    }
}

/// Why DNS discovery cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// The system's resolver configuration could not be read.
    #[error("cannot read the system's DNS configuration (/etc/resolv.conf)")]
    SystemConfig(#[source] hickory_resolver::net::NetError),
    /// The resolver could not be built from its configuration.
    #[error("cannot build a DNS resolver")]
    Build(#[source] hickory_resolver::net::NetError),
}

/// A DNS stub resolver for seed names: A and AAAA records, over UDP (and
/// TCP for answers too large for a datagram).
#[derive(Clone)]
pub struct DnsResolver {
    inner: TokioResolver,
}

impl fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DnsResolver").finish_non_exhaustive()
    }
}

/// The longest an answer is reused: see the [module docs](self).
pub const MAX_CACHE: Duration = Duration::from_secs(1);

/// Answers kept for at most [`MAX_CACHE`], positive or negative.
fn cap_cache(options: &mut hickory_resolver::config::ResolverOpts) {
    options.positive_max_ttl = Some(MAX_CACHE);
    options.negative_max_ttl = Some(MAX_CACHE);
}

impl DnsResolver {
    /// The resolver the system is configured with (`/etc/resolv.conf`:
    /// its servers, search domains and options).
    pub fn system() -> Result<DnsResolver, DiscoveryError> {
        let mut builder = TokioResolver::builder_tokio().map_err(DiscoveryError::SystemConfig)?;
        builder.options_mut().ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        cap_cache(builder.options_mut());
        let inner = builder.build().map_err(DiscoveryError::Build)?;
        Ok(DnsResolver { inner })
    }

    /// A resolver that asks only the server at `server` (UDP, then TCP for
    /// truncated answers), with no search domains and without the hosts
    /// file: names are looked up as given.
    pub fn server(server: SocketAddr) -> Result<DnsResolver, DiscoveryError> {
        let connections = [ConnectionConfig::udp(), ConnectionConfig::tcp()]
            .into_iter()
            .map(|mut c| {
                c.port = server.port();
                c
            })
            .collect();
        let config = ResolverConfig::from_name_servers(vec![NameServerConfig::new(
            server.ip(),
            true,
            connections,
        )]);
        let mut builder =
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
        let options = builder.options_mut();
        options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        options.use_hosts_file = ResolveHosts::Never;
        cap_cache(options);
        let inner = builder.build().map_err(DiscoveryError::Build)?;
        Ok(DnsResolver { inner })
    }

    /// The addresses `name` resolves to (A and AAAA), sorted, without
    /// duplicates; empty when the name exists without addresses or does
    /// not exist.
    pub async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, LookupError> {
        match self.inner.lookup_ip(name).await {
            Ok(found) => {
                let mut ips: Vec<IpAddr> = found.iter().collect();
                ips.sort_unstable();
                ips.dedup();
                Ok(ips)
            }
            Err(e) if e.is_no_records_found() => Ok(Vec::new()),
            Err(e) => Err(LookupError(e)),
        }
    }
}

/// A look-up that failed (no answer, a server error): retried at the next
/// refresh.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct LookupError(hickory_resolver::net::NetError);

/// What one look-up of a name gave, as compared from one refresh to the
/// next (a change is logged).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Found(Vec<IpAddr>),
    Nothing,
    Failed(String),
}

/// Keeps a node's seeds in step with DNS; see the [module docs](self).
#[derive(Debug)]
pub struct Discovery {
    seeds: Vec<Seed>,
    resolver: DnsResolver,
    refresh: Duration,
    /// How long after start the node may still be joining: names are
    /// asked about more often until then.
    joining: Duration,
    /// Each name's last outcome: a change is logged.
    outcome: HashMap<DnsSeed, Outcome>,
    /// Each name's last addresses found, kept while look-ups fail.
    found: HashMap<DnsSeed, Vec<IpAddr>>,
}

impl Discovery {
    /// Discovery of `seeds` (plain addresses are passed through) with
    /// `resolver`, asking again every `refresh`.
    pub fn new(seeds: Vec<Seed>, resolver: DnsResolver, refresh: Duration) -> Discovery {
        Discovery {
            seeds,
            resolver,
            refresh,
            joining: Duration::ZERO,
            outcome: HashMap::new(),
            found: HashMap::new(),
        }
    }

    /// Asks more often during the first `join_timeout` after start (every
    /// sixth of it, at least every 50 ms, at most every refresh), while
    /// the node may still be joining; see the [module docs](self).
    pub fn joining(mut self, join_timeout: Duration) -> Discovery {
        self.joining = join_timeout;
        self
    }

    /// How long to wait before the next round, `elapsed` after start.
    fn interval(&self, elapsed: Duration) -> Duration {
        if elapsed < self.joining {
            (self.joining / 6)
                .max(Duration::from_millis(50))
                .min(self.refresh)
        } else {
            self.refresh
        }
    }

    /// Whether any seed is a DNS name (otherwise there is nothing to
    /// discover).
    pub fn has_names(seeds: &[Seed]) -> bool {
        seeds.iter().any(|s| matches!(s, Seed::Dns(_)))
    }

    /// The plain addresses among `seeds`: what a node starts with before
    /// any name is resolved.
    pub fn addresses(seeds: &[Seed]) -> Vec<SocketAddr> {
        seeds
            .iter()
            .filter_map(|s| match s {
                Seed::Addr(a) => Some(*a),
                Seed::Dns(_) => None,
            })
            .collect()
    }

    /// One round: every name looked up, with the plain addresses, sorted
    /// and without duplicates. A name whose look-up fails contributes the
    /// addresses it had last (a DNS server that is briefly unreachable
    /// does not make the node forget its seeds); one that lists nothing
    /// contributes nothing.
    pub async fn resolve(&mut self) -> Vec<SocketAddr> {
        let mut all = Discovery::addresses(&self.seeds);
        let names: Vec<DnsSeed> = self
            .seeds
            .iter()
            .filter_map(|s| match s {
                Seed::Dns(d) => Some(d.clone()),
                Seed::Addr(_) => None,
            })
            .collect();
        for seed in names {
            let outcome = match self.resolver.lookup(&seed.name).await {
                Ok(ips) if ips.is_empty() => Outcome::Nothing,
                Ok(ips) => Outcome::Found(ips),
                Err(e) => Outcome::Failed(e.to_string()),
            };
            if self.outcome.get(&seed) != Some(&outcome) {
                self.log_change(&seed, &outcome);
            }
            match &outcome {
                Outcome::Found(ips) => {
                    self.found.insert(seed.clone(), ips.clone());
                }
                Outcome::Nothing => {
                    self.found.remove(&seed);
                }
                Outcome::Failed(_) => {}
            }
            if let Some(ips) = self.found.get(&seed) {
                all.extend(ips.iter().map(|ip| SocketAddr::new(*ip, seed.port)));
            }
            self.outcome.insert(seed, outcome);
        }
        all.sort_unstable();
        all.dedup();
        all
    }

    fn log_change(&self, seed: &DnsSeed, outcome: &Outcome) {
        let refresh_ms = self.refresh.as_millis();
        match outcome {
            Outcome::Found(ips) => tracing::info!(
                name = %seed.name,
                port = seed.port,
                addresses = ?ips,
                "peers found in DNS"
            ),
            Outcome::Nothing => tracing::warn!(
                name = %seed.name,
                refresh_ms,
                "DNS lists no address for the peers' name: asking again every refresh \
                 (a node listed before its peers joins them when they are listed)"
            ),
            Outcome::Failed(error) => tracing::warn!(
                name = %seed.name,
                refresh_ms,
                error = %error,
                "DNS look-up of the peers' name failed: keeping the addresses found last and \
                 asking again every refresh"
            ),
        }
    }

    /// Resolves every refresh interval (more often while joining) and sends the seeds to `seeds`
    /// whenever they change, until every receiver is gone (the node
    /// stopped; a look-up in flight is abandoned). The first round runs at
    /// once.
    pub async fn run(mut self, seeds: watch::Sender<Vec<SocketAddr>>) {
        let started = tokio::time::Instant::now();
        loop {
            let found = tokio::select! {
                found = self.resolve() => found,
                () = seeds.closed() => return,
            };
            seeds.send_if_modified(|current| {
                if *current == found {
                    false
                } else {
                    *current = found;
                    true
                }
            });
            tokio::select! {
                () = tokio::time::sleep(self.interval(started.elapsed())) => {}
                () = seeds.closed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn dns(name: &str, port: u16) -> Seed {
        Seed::Dns(DnsSeed {
            name: name.into(),
            port,
        })
    }

    fn error(s: &str) -> String {
        s.parse::<Seed>().unwrap_err().to_string()
    }

    #[test]
    fn addresses_and_names_parse() {
        assert_eq!(
            "10.0.0.2:7946".parse::<Seed>().unwrap(),
            Seed::Addr("10.0.0.2:7946".parse().unwrap())
        );
        assert_eq!(
            "[::1]:7946".parse::<Seed>().unwrap(),
            Seed::Addr("[::1]:7946".parse().unwrap())
        );
        assert_eq!(
            "dns:peers.test:7946".parse::<Seed>().unwrap(),
            dns("peers.test", 7946)
        );
        assert_eq!(
            " dns:tollgate-peers.default.svc.cluster.local.:1 "
                .parse::<Seed>()
                .unwrap(),
            dns("tollgate-peers.default.svc.cluster.local.", 1)
        );
        assert_eq!(
            "dns:_gossip.peers:65535".parse::<Seed>().unwrap(),
            dns("_gossip.peers", 65535)
        );
        assert_eq!(
            "dns:localhost:7946".parse::<Seed>().unwrap(),
            dns("localhost", 7946)
        );
    }

    /// While joining, names are asked about every sixth of the join
    /// timeout (within 50 ms and the refresh), then every refresh.
    #[test]
    fn names_are_asked_about_more_often_while_joining() {
        let resolver = DnsResolver::server("127.0.0.1:53".parse().unwrap()).unwrap();
        let ms = Duration::from_millis;
        let d =
            Discovery::new(vec![dns("peers.test", 7946)], resolver, ms(10_000)).joining(ms(3_000));
        assert_eq!(d.interval(ms(0)), ms(500));
        assert_eq!(d.interval(ms(2_999)), ms(500));
        assert_eq!(d.interval(ms(3_000)), ms(10_000));
        let resolver = DnsResolver::server("127.0.0.1:53".parse().unwrap()).unwrap();
        let fast = Discovery::new(vec![], resolver, ms(200)).joining(ms(60));
        assert_eq!(fast.interval(ms(0)), ms(50));
        let resolver = DnsResolver::server("127.0.0.1:53".parse().unwrap()).unwrap();
        let short = Discovery::new(vec![], resolver, ms(100)).joining(ms(30_000));
        assert_eq!(short.interval(ms(0)), ms(100));
        let resolver = DnsResolver::server("127.0.0.1:53".parse().unwrap()).unwrap();
        let never = Discovery::new(vec![], resolver, ms(10_000));
        assert_eq!(never.interval(ms(0)), ms(10_000));
    }

    #[test]
    fn a_seed_displays_as_it_is_written() {
        for s in ["10.0.0.2:7946", "[::1]:7946", "dns:peers.test:7946"] {
            assert_eq!(s.parse::<Seed>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn bad_seeds_say_what_is_wrong_and_the_expected_form() {
        let cases: &[(&str, &str)] = &[
            ("", "an empty peer"),
            ("  ", "an empty peer"),
            (
                "peers.test:7946",
                "`peers.test:7946` is not an address (IP:PORT",
            ),
            ("10.0.0.2", "`10.0.0.2` is not an address"),
            ("DNS:peers.test:7946", "is not an address"),
            ("dns:peers.test", "`dns:peers.test` has no port"),
            ("dns:peers.test:", "`dns:peers.test:` has no port"),
            ("dns:", "`dns:` has no port"),
            ("dns::7946", "the name is empty"),
            ("dns:peers.test:http", "`http` is not a port (1 to 65535)"),
            ("dns:peers.test:0", "`0` is not a port (1 to 65535)"),
            ("dns:peers.test:65536", "`65536` is not a port"),
            ("dns:peers.test:-1", "`-1` is not a port"),
            (
                "dns:10.0.0.2:7946",
                "is an IP address, not a name: give it as IP:PORT",
            ),
            ("dns:[::1]:7946", "is an IP address, not a name"),
            ("dns:a..b:7946", "empty label"),
            ("dns:.a:7946", "empty label"),
            (
                "dns:a b:7946",
                "`dns:a b:7946`: ` ` cannot be in a DNS name",
            ),
            ("dns:a:b:7946", "`:` cannot be in a DNS name"),
            ("dns:peers/x:7946", "`/` cannot be in a DNS name"),
        ];
        for (given, want) in cases {
            let got = error(given);
            assert!(got.contains(want), "{given:?}: {got:?} lacks {want:?}");
            if !given.trim().is_empty() && given.starts_with("dns:") {
                assert!(got.contains("expected dns:NAME:PORT"), "{given:?}: {got:?}");
            }
        }
        assert!(error("peers.test:7946").contains("dns:NAME:PORT"));
        let label = "a".repeat(64);
        assert!(error(&format!("dns:{label}.test:1")).contains("is 64 bytes long; DNS allows 63"));
        let long = vec!["a".repeat(63); 4].join(".");
        assert!(error(&format!("dns:{long}:1")).contains("is 255 bytes long; DNS allows 253"));
        // A final dot does not count.
        let longest = format!("{}.{}", vec!["a".repeat(63); 3].join("."), "a".repeat(61));
        assert_eq!(longest.len(), 253);
        assert!(format!("dns:{longest}.:1").parse::<Seed>().is_ok());
    }

    #[test]
    fn plain_addresses_pass_through_and_names_are_noticed() {
        let seeds: Vec<Seed> = ["10.0.0.2:7946", "dns:peers.test:7946", "10.0.0.3:7946"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert!(Discovery::has_names(&seeds));
        assert_eq!(
            Discovery::addresses(&seeds),
            vec![
                "10.0.0.2:7946".parse::<SocketAddr>().unwrap(),
                "10.0.0.3:7946".parse().unwrap()
            ]
        );
        assert!(!Discovery::has_names(&seeds[..1]));
    }
}
