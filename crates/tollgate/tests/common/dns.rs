//! A tiny authoritative DNS server on a free loopback UDP port, for tests
//! of `--peers dns:NAME:PORT`: it answers A and AAAA questions from a
//! table the test changes while servers run, and counts the questions per
//! name (so a test can wait for a server to have asked again instead of
//! sleeping). Messages are parsed and built with `hickory-proto`; every
//! answer has a TTL of 0, so resolvers never serve a stale one.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};

/// What the server answers for a name.
#[derive(Clone, Debug)]
pub enum Answer {
    /// These addresses (A records for the IPv4 ones, AAAA for the IPv6).
    Addrs(Vec<IpAddr>),
    /// The name exists but has no address (NOERROR, no answer).
    Empty,
    /// The name does not exist (NXDOMAIN), as for any name not set.
    NxDomain,
}

#[derive(Default)]
struct Zone {
    answers: HashMap<String, Answer>,
    questions: HashMap<String, usize>,
}

/// The running server; stopped on drop.
pub struct DnsServer {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// A name as the table keys it: lower case, without the final dot.
fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl DnsServer {
    pub fn start() -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Short, so the thread notices `stop` soon.
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let zone = Arc::new(Mutex::new(Zone::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let zone = Arc::clone(&zone);
            let stop = Arc::clone(&stop);
            move || {
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    if let Some(answer) = respond(&zone, &buf[..n]) {
                        let _ = socket.send_to(&answer, from);
                    }
                }
            }
        });
        DnsServer {
            addr,
            zone,
            stop,
            thread: Some(thread),
        }
    }

    /// Answers `answer` for `name` from now on.
    pub fn set(&self, name: &str, answer: Answer) {
        self.zone.lock().unwrap().answers.insert(key(name), answer);
    }

    /// Answers the addresses `ips` for `name` from now on.
    pub fn set_addrs(&self, name: &str, ips: &[&str]) {
        let ips = ips.iter().map(|ip| ip.parse().unwrap()).collect();
        self.set(name, Answer::Addrs(ips));
    }

    /// Questions asked about `name` so far (A and AAAA count apart).
    pub fn questions(&self, name: &str) -> usize {
        let zone = self.zone.lock().unwrap();
        zone.questions.get(&key(name)).copied().unwrap_or(0)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The answer to the query in `bytes`, or `None` for anything that is not
/// one question.
fn respond(zone: &Mutex<Zone>, bytes: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(bytes).ok()?;
    let query = request.queries.first()?.clone();
    let name = key(&query.name().to_ascii());
    let answer = {
        let mut zone = zone.lock().unwrap();
        *zone.questions.entry(name.clone()).or_insert(0) += 1;
        zone.answers.get(&name).cloned().unwrap_or(Answer::NxDomain)
    };
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.authoritative = true;
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.add_query(query.clone());
    if request.edns.is_some() {
        response.set_edns(Edns::new());
    }
    match answer {
        Answer::NxDomain => response.metadata.response_code = ResponseCode::NXDomain,
        Answer::Empty => {}
        Answer::Addrs(ips) => {
            for ip in ips {
                let rdata = match (ip, query.query_type()) {
                    (IpAddr::V4(v4), RecordType::A) => RData::A(A(v4)),
                    (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(v6)),
                    _ => continue,
                };
                response.add_answer(Record::from_rdata(query.name().clone(), 0, rdata));
            }
        }
    }
    response.to_vec().ok()
}
