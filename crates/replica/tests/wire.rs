#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The gossip wire format (`tollgate_replica::wire`): every body kind
//! round-trips, large queues split over datagrams and merge back whole,
//! the layout and the encryption match the documented spec byte for byte
//! (recomputed here with the `chacha20poly1305` crate directly), limit keys
//! are not visible on the wire, nonces are fresh, any tampering is
//! refused, no input panics the decoder (also past the AEAD, with bodies
//! sealed by hand), and the replay guard accepts each datagram exactly
//! once.

use std::collections::{BTreeMap, BTreeSet};

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{Tag, XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use proptest::prelude::*;
use sha2::Sha256;
use tollgate_core::replicated::counter::CounterBucketState;
use tollgate_core::replicated::epoch::EpochReport;
use tollgate_core::replicated::queue::{Element, ElementId, QueueState};
use tollgate_core::replicated::strategy::Payload;
use tollgate_core::replicated::{Generation, NodeId};
use tollgate_core::Nanos;
use tollgate_replica::wire::{
    cluster_tag, decode, encode, encode_items, unauthenticated_header, Admission, Batch, Body,
    ClusterKey, Header, Message, Packed, ReplayGuard, WireError, ANYONE, MAX_DATAGRAM, MAX_DOMAIN,
    MAX_MEMBERSHIP, SALT_LEN, TAG_LEN, VERSION,
};
use tollgate_store::{Key, LimitId};

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

const SECRET: &[u8] = b"correct horse battery staple";
const NAME: &str = "prod";
const CLUSTER: u64 = cluster_tag(NAME);
/// A plausible wall clock: late 2023, in nanoseconds.
const BASE: u64 = 1_700_000_000_000_000_000;

fn key() -> ClusterKey {
    ClusterKey::new(SECRET, NAME)
}

fn header(seq: u64) -> Header {
    Header {
        cluster: CLUSTER,
        from: NodeId(1),
        incarnation: 3,
        seq,
        sent_at: Nanos::new(BASE),
        to: NodeId(2),
        to_incarnation: 4,
    }
}

/// The largest header there is: every varint ten bytes long.
fn max_header() -> Header {
    Header {
        cluster: CLUSTER,
        from: NodeId(u64::MAX),
        incarnation: u64::MAX,
        seq: u64::MAX,
        sent_at: Nanos::new(u64::MAX),
        to: NodeId(u64::MAX),
        to_incarnation: u64::MAX,
    }
}

fn round_trip(h: &Header, body: &Body) -> Message {
    let bytes = encode(&key(), h, body).unwrap();
    assert!(bytes.len() <= MAX_DATAGRAM);
    decode(&key(), CLUSTER, &bytes).unwrap()
}

/// A steadily fed queue of `n` elements from `nodes` nodes: one grant every
/// `gap` ns, deaths one `interval` apart once the bucket is empty.
fn steady_queue(n: usize, nodes: u64, gap: u64, interval: u64) -> QueueState {
    let start = BASE - n as u64 * gap;
    QueueState::from_elements(
        Nanos::new(interval),
        (0..n).map(|i| {
            let birth = start + i as u64 * gap;
            Element {
                id: ElementId {
                    birth: Nanos::new(birth),
                    node: NodeId(i as u64 % nodes + 1),
                    seq: 0,
                },
                death: Nanos::new(birth + interval),
            }
        }),
    )
}

/// Items per key, merged in order: what a receiver ends up with.
fn merged(items: impl IntoIterator<Item = (Key, Payload)>) -> BTreeMap<Key, Payload> {
    let mut map: BTreeMap<Key, Payload> = BTreeMap::new();
    for (k, p) in items {
        match map.get_mut(&k) {
            Some(old) => {
                old.merge(&p);
            }
            None => {
                map.insert(k, p);
            }
        }
    }
    map
}

/// Decodes every datagram of `packed`, checking size and sequence numbers
/// (consecutive from `first_seq`) and, for a full transfer, the chunks'
/// numbering; returns all items in order.
fn unpack(packed: &Packed, first_seq: u64, batch: Batch) -> Vec<(Key, Payload)> {
    let mut items = Vec::new();
    let total = packed.datagrams.len();
    for (i, d) in packed.datagrams.iter().enumerate() {
        assert!(d.len() <= MAX_DATAGRAM, "datagram {i} is {} bytes", d.len());
        let m = decode(&key(), CLUSTER, d).unwrap();
        assert_eq!(m.header.seq, first_seq + i as u64);
        match (batch, m.body) {
            (Batch::Delta, Body::Delta { items: got }) => items.extend(got),
            (
                Batch::Full { stream },
                Body::Full {
                    stream: s,
                    index,
                    last,
                    items: got,
                },
            ) => {
                assert_eq!(s, stream);
                assert_eq!(index as usize, i);
                assert_eq!(last, i + 1 == total);
                items.extend(got);
            }
            (batch, body) => panic!("{batch:?} produced {body:?}"),
        }
    }
    items
}

// --- The spec, written out independently of the module ---------------------

fn spec_key(secret: &[u8], name: &str) -> [u8; 32] {
    let mut kdf = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    kdf.update(b"tollgate gossip v2");
    kdf.update(name.as_bytes());
    kdf.finalize().into_bytes().into()
}

fn spec_aead(secret: &[u8], name: &str) -> XChaCha20Poly1305 {
    <XChaCha20Poly1305 as chacha20poly1305::KeyInit>::new(&spec_key(secret, name).into())
}

fn spec_nonce(salt: &[u8], seq: u64) -> XNonce {
    let mut nonce = salt.to_vec();
    nonce.extend_from_slice(&seq.to_le_bytes());
    XNonce::try_from(&nonce[..]).unwrap()
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The clear header: magic, version 3, cluster, six varints.
fn spec_header(h: &Header) -> Vec<u8> {
    let mut out = b"TG\x03".to_vec();
    out.extend_from_slice(&h.cluster.to_le_bytes());
    for v in [
        h.from.0,
        h.incarnation,
        h.seq,
        h.sent_at.as_u64(),
        h.to.0,
        h.to_incarnation,
    ] {
        varint(&mut out, v);
    }
    out
}

/// A datagram of `h` with `plaintext` (kind and body) sealed under the
/// given secret and cluster name with `salt`, as the spec says.
fn spec_seal(secret: &[u8], name: &str, h: &Header, salt: &[u8], plaintext: &[u8]) -> Vec<u8> {
    let mut clear = spec_header(h);
    clear.extend_from_slice(salt);
    let mut sealed = plaintext.to_vec();
    let tag = spec_aead(secret, name)
        .encrypt_inout_detached(
            &spec_nonce(salt, h.seq),
            &clear,
            sealed.as_mut_slice().into(),
        )
        .unwrap();
    let mut out = clear;
    out.extend_from_slice(&sealed);
    out.extend_from_slice(&tag);
    out
}

/// The salt of a datagram of `h`.
fn salt_of<'a>(h: &Header, datagram: &'a [u8]) -> &'a [u8] {
    let at = spec_header(h).len();
    &datagram[at..at + SALT_LEN]
}

/// Opens a datagram of `h` with the spec's key: its plaintext (kind and
/// body), or `None` if it does not authenticate.
fn spec_open(secret: &[u8], name: &str, h: &Header, datagram: &[u8]) -> Option<Vec<u8>> {
    let clear_len = spec_header(h).len() + SALT_LEN;
    let (clear, rest) = datagram.split_at(clear_len);
    let (sealed, tag) = rest.split_at(rest.len() - TAG_LEN);
    let mut plain = sealed.to_vec();
    spec_aead(secret, name)
        .decrypt_inout_detached(
            &spec_nonce(salt_of(h, datagram), h.seq),
            clear,
            plain.as_mut_slice().into(),
            &Tag::try_from(tag).unwrap(),
        )
        .ok()?;
    Some(plain)
}

/// A datagram of `kind` with any `body` bytes, sealed under the test key:
/// gets arbitrary bytes past the AEAD, into the body parser.
fn sealed(h: &Header, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut plaintext = vec![kind];
    plaintext.extend_from_slice(body);
    spec_seal(SECRET, NAME, h, &[0x5a; SALT_LEN], &plaintext)
}

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// Mostly a handful of small node ids; sometimes any (a hashed id).
fn node() -> impl Strategy<Value = NodeId> {
    prop_oneof![4 => 0u64..6, 1 => any::<u64>()].prop_map(NodeId)
}

/// Mostly within a minute of `BASE`; sometimes any time at all.
fn time() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        6 => (BASE - 60_000_000_000)..(BASE + 60_000_000_000),
        1 => any::<u64>(),
    ]
    .prop_map(Nanos::new)
}

fn counter() -> impl Strategy<Value = CounterBucketState> {
    (
        prop::collection::vec((node(), any::<u64>()), 0..6),
        prop_oneof![0u64..1000, any::<u64>()],
        prop::option::of(time()),
    )
        .prop_map(|(entries, limit, refill)| CounterBucketState::from_parts(entries, limit, refill))
}

/// A queue of up to `max` elements: births near each other (bursts with
/// repeated births and sequence numbers) or anywhere.
fn queue(max: usize) -> impl Strategy<Value = QueueState> {
    (
        prop_oneof![
            3 => 1u64..100_000_000,
            1 => Just(0u64),
            1 => any::<u64>(),
        ],
        time(),
        prop::collection::vec(
            (
                prop_oneof![3 => 0u64..5_000_000, 1 => Just(0u64), 1 => any::<u64>()],
                node(),
                prop_oneof![3 => 0u32..3, 1 => any::<u32>()],
                prop_oneof![3 => 0u64..1_000_000_000, 1 => any::<u64>()],
            ),
            0..=max,
        ),
    )
        .prop_map(|(interval, start, raw)| {
            let mut birth = start.as_u64();
            let elements: Vec<Element> = raw
                .into_iter()
                .map(|(gap, node, seq, life)| {
                    birth = birth.wrapping_add(gap);
                    Element {
                        id: ElementId {
                            birth: Nanos::new(birth),
                            node,
                            seq,
                        },
                        death: Nanos::new(birth.saturating_add(life)),
                    }
                })
                .collect();
            QueueState::from_elements(Nanos::new(interval), elements)
        })
}

fn epoch() -> impl Strategy<Value = EpochReport> {
    (
        prop_oneof![0u64..100, any::<u64>()],
        prop::collection::vec((node(), any::<u64>()), 0..6),
    )
        .prop_map(|(epoch, traffic)| EpochReport::from_parts(epoch, traffic))
}

/// Mostly a key never reset; sometimes one reset (by any node, at any
/// time).
fn generation() -> impl Strategy<Value = Generation> {
    prop_oneof![
        2 => Just(Generation::ZERO),
        1 => (time(), node()).prop_map(|(at, node)| Generation { at, node }),
    ]
}

fn payload(max_queue: usize) -> impl Strategy<Value = Payload> {
    (
        prop_oneof![
            counter().prop_map(Payload::Counter),
            queue(max_queue).prop_map(Payload::Queue),
            epoch().prop_map(Payload::Epoch),
        ],
        generation(),
    )
        .prop_map(|(p, g)| match p {
            Payload::Counter(c) => Payload::Counter(c.with_generation(g)),
            Payload::Queue(q) => Payload::Queue(q.with_generation(g)),
            Payload::Epoch(r) => Payload::Epoch(r.with_generation(g)),
        })
}

/// Few limits and domains, so interning is exercised; sometimes long or
/// non-ASCII domains.
fn key_of_limit() -> impl Strategy<Value = Key> {
    (
        prop_oneof![3 => 0u64..4, 1 => any::<u64>()],
        prop_oneof![
            3 => prop::sample::select(vec!["", "acme", "user:42", "ünïcødé"]).prop_map(String::from),
            2 => "[a-z0-9:.-]{0,40}",
            1 => "[a-zé∂]{100,170}",
        ],
    )
        .prop_map(|(limit, domain)| Key::new(LimitId(limit), &domain))
}

fn items(max_items: usize, max_queue: usize) -> impl Strategy<Value = Vec<(Key, Payload)>> {
    prop::collection::vec((key_of_limit(), payload(max_queue)), 0..=max_items)
}

fn any_header() -> impl Strategy<Value = Header> {
    (
        node(),
        any::<u64>(),
        any::<u64>(),
        time(),
        node(),
        any::<u64>(),
    )
        .prop_map(
            |(from, incarnation, seq, sent_at, to, to_incarnation)| Header {
                cluster: CLUSTER,
                from,
                incarnation,
                seq,
                sent_at,
                to,
                to_incarnation,
            },
        )
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

proptest! {
    #[test]
    fn delta_round_trips(h in any_header(), items in items(4, 24)) {
        let body = Body::Delta { items };
        match encode(&key(), &h, &body) {
            Ok(bytes) => {
                prop_assert!(bytes.len() <= MAX_DATAGRAM);
                let m = decode(&key(), CLUSTER, &bytes).unwrap();
                prop_assert_eq!(m.header, h);
                prop_assert_eq!(m.body, body);
            }
            // Far-flung random times can make a few items too large for one
            // datagram; that is an error, not a corrupt datagram.
            Err(WireError::Oversized(len)) => prop_assert!(len > MAX_DATAGRAM),
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    #[test]
    fn full_round_trips(
        h in any_header(),
        stream in any::<u64>(),
        index in any::<u32>(),
        last in any::<bool>(),
        items in items(3, 16),
    ) {
        let body = Body::Full { stream, index, last, items };
        match encode(&key(), &h, &body) {
            Ok(bytes) => prop_assert_eq!(decode(&key(), CLUSTER, &bytes).unwrap().body, body),
            Err(WireError::Oversized(len)) => prop_assert!(len > MAX_DATAGRAM),
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    #[test]
    fn each_payload_round_trips_alone(
        h in any_header(),
        k in (any::<u64>(), "[a-z]{0,20}").prop_map(|(l, d)| Key::new(LimitId(l), &d)),
        p in payload(20),
    ) {
        // Twenty elements of the worst kind (every field a 10-byte varint)
        // still fit: 20 × 36 bytes.
        let body = Body::Delta { items: vec![(k, p.clone())] };
        let m = round_trip(&h, &body);
        let Body::Delta { items } = m.body else { panic!("not a delta") };
        prop_assert_eq!(items.len(), 1);
        if let (Payload::Queue(got), Payload::Queue(want)) = (&items[0].1, &p) {
            prop_assert_eq!(got.interval(), want.interval());
            prop_assert!(got.elements().eq(want.elements()));
        }
        prop_assert_eq!(&items[0].1, &p);
    }

    #[test]
    fn small_bodies_round_trip(
        h in any_header(),
        t in (any::<u64>(), any::<u64>(), any::<u64>()),
        membership in prop::collection::vec(any::<u8>(), 0..=MAX_MEMBERSHIP),
    ) {
        let (t1, t2, t3) = (Nanos::new(t.0), Nanos::new(t.1), Nanos::new(t.2));
        for body in [
            Body::FullRequest,
            Body::Ping { t1 },
            Body::Pong { t1, t2, t3 },
            Body::Membership(membership.clone()),
            Body::Delta { items: vec![] },
            Body::Full { stream: t.0, index: 0, last: true, items: vec![] },
        ] {
            let m = round_trip(&h, &body);
            prop_assert_eq!(m.header, h);
            prop_assert_eq!(m.body, body);
        }
    }

    #[test]
    fn encode_items_delivers_everything(
        h in any_header(),
        seq in 0u64..1_000_000,
        full in any::<bool>(),
        items in items(12, 400),
    ) {
        let batch = if full { Batch::Full { stream: 9 } } else { Batch::Delta };
        let mut next = seq;
        let packed = encode_items(&key(), &h, &mut next, batch, &items);
        prop_assert_eq!(packed.dropped, 0);
        prop_assert_eq!(next, seq + packed.datagrams.len() as u64);
        let got = unpack(&packed, seq, batch);
        prop_assert_eq!(merged(got), merged(items));
    }
}

#[test]
fn every_body_kind_round_trips_at_the_header_extremes() {
    let k = Key::new(LimitId(u64::MAX), "x");
    let q = steady_queue(3, 2, 1_000, 10_000);
    for h in [header(0), max_header()] {
        for body in [
            Body::Membership(b"foca".to_vec()),
            Body::Delta {
                items: vec![(k.clone(), Payload::Queue(q.clone()))],
            },
            Body::FullRequest,
            Body::Full {
                stream: u64::MAX,
                index: u32::MAX,
                last: false,
                items: vec![(k.clone(), Payload::Queue(QueueState::default()))],
            },
            Body::Ping { t1: Nanos::new(0) },
            Body::Pong {
                t1: Nanos::new(u64::MAX),
                t2: Nanos::new(1),
                t3: Nanos::new(2),
            },
            Body::Outdated {
                incarnation: u64::MAX,
                seq: 0,
            },
            Body::Unauthenticated,
            Body::Digest {
                at: Nanos::new(u64::MAX),
                buckets: vec![(0, 1), (17, u64::MAX), (63, 0x0123_4567_89ab_cdef)],
            },
            Body::Digest {
                at: Nanos::new(0),
                buckets: Vec::new(),
            },
            Body::Pull { buckets: u64::MAX },
            Body::Repair {
                items: vec![(k.clone(), Payload::Queue(q.clone()))],
            },
            Body::Graft {
                except: vec![NodeId(1), NodeId(u64::MAX)],
            },
            Body::Graft { except: Vec::new() },
        ] {
            let m = round_trip(&h, &body);
            assert_eq!(m, Message { header: h, body });
        }
    }
}

#[test]
fn the_largest_membership_message_fits_the_largest_header() {
    // 1,200 less a 71-byte header, the salt, the kind, a 2-byte length
    // and the tag.
    assert_eq!(MAX_MEMBERSHIP, 1200 - 71 - 16 - 1 - 2 - 16);
    assert_eq!((SALT_LEN, TAG_LEN), (16, 16));
    let h = max_header();
    let fits = encode(&key(), &h, &Body::Membership(vec![7; MAX_MEMBERSHIP])).unwrap();
    assert_eq!(fits.len(), MAX_DATAGRAM);
    assert_eq!(
        encode(&key(), &h, &Body::Membership(vec![7; MAX_MEMBERSHIP + 1])),
        Err(WireError::Oversized(MAX_DATAGRAM + 1))
    );
}

// ---------------------------------------------------------------------------
// Packing
// ---------------------------------------------------------------------------

#[test]
fn a_big_queue_splits_over_datagrams_and_merges_back_whole() {
    let big = Key::new(LimitId(7), "big");
    let q = steady_queue(5_000, 3, 1_000_000, 1_000_000);
    let small = |i: u64| {
        (
            Key::new(LimitId(7), &format!("small-{i}")),
            Payload::Counter(CounterBucketState::from_parts(
                [(NodeId(1), i + 1)],
                i + 10,
                Some(Nanos::new(BASE)),
            )),
        )
    };
    let items = vec![small(0), (big.clone(), Payload::Queue(q.clone())), small(1)];
    for batch in [Batch::Delta, Batch::Full { stream: 42 }] {
        let mut seq = 100;
        let packed = encode_items(&key(), &header(0), &mut seq, batch, &items);
        assert_eq!(packed.dropped, 0);
        assert!(
            packed.datagrams.len() > 10,
            "{} datagrams",
            packed.datagrams.len()
        );
        assert_eq!(seq, 100 + packed.datagrams.len() as u64);
        let got = unpack(&packed, 100, batch);

        // The parts are runs of the queue, in order, each a queue of its own.
        let parts: Vec<&QueueState> = got
            .iter()
            .filter(|(k, _)| *k == big)
            .map(|(_, p)| match p {
                Payload::Queue(part) => part,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(parts.len() > 10);
        assert!(parts
            .iter()
            .all(|p| p.interval() == q.interval() && !p.is_empty()));
        let elements: Vec<Element> = parts.iter().flat_map(|p| p.elements().copied()).collect();
        assert!(elements.iter().eq(q.elements()));
        let whole = QueueState::from_elements(q.interval(), elements);
        assert_eq!(whole, q);
        assert_eq!(merged(got), merged(items.clone()));

        // The runs fill their datagrams: the budget is exact, framing and
        // encryption included, to within an element (about 6 bytes).
        let n = packed.datagrams.len();
        for d in &packed.datagrams[1..n - 2] {
            assert!(d.len() > MAX_DATAGRAM - 8, "a run of {} bytes", d.len());
        }

        // Steady traffic is compact: under 8 bytes per element all told.
        let bytes: usize = packed.datagrams.iter().map(Vec::len).sum();
        assert!(bytes < 8 * 5_000, "{bytes} bytes for 5,000 elements");
    }
}

#[test]
fn small_items_are_never_split() {
    let items: Vec<(Key, Payload)> = (0..400u64)
        .map(|i| {
            (
                Key::new(LimitId(i % 3), &format!("tenant-{i:04}")),
                Payload::Epoch(EpochReport::from_parts(
                    i,
                    [(NodeId(1), i + 1), (NodeId(u64::MAX - i), 5)],
                )),
            )
        })
        .collect();
    let mut seq = 0;
    let packed = encode_items(&key(), &header(0), &mut seq, Batch::Delta, &items);
    assert!(packed.datagrams.len() > 1);
    let got = unpack(&packed, 0, Batch::Delta);
    // Each item arrives exactly once, whole, in order.
    assert_eq!(got, items);
}

#[test]
fn a_queue_that_fits_alone_moves_to_a_fresh_datagram_rather_than_splitting() {
    // Fill most of a datagram (a key keeps at most 128 bytes of domain, so
    // the bulk is a report of many nodes), then a queue that fits one on
    // its own.
    let filler = (
        Key::new(LimitId(1), &"f".repeat(128)),
        Payload::Epoch(EpochReport::from_parts(
            1,
            (0..34u64).map(|i| (NodeId(u64::MAX - i), 1)),
        )),
    );
    let q = steady_queue(120, 1, 1_000_000, 1_000_000);
    let items = vec![
        filler.clone(),
        (Key::new(LimitId(2), "q"), Payload::Queue(q.clone())),
    ];
    let mut seq = 0;
    let packed = encode_items(&key(), &header(0), &mut seq, Batch::Delta, &items);
    assert_eq!(packed.datagrams.len(), 2);
    assert_eq!(unpack(&packed, 0, Batch::Delta), items);
}

#[test]
fn items_that_cannot_be_sent_are_dropped_and_counted() {
    // A key keeps a domain longer than 128 bytes as a 33-byte digest:
    // whatever a client sends, it fits.
    let digested = Key::new(LimitId(1), &"d".repeat(MAX_DOMAIN + 1));
    assert_eq!(digested.scope().len(), 33);
    let longest = Key::new(LimitId(1), &"d".repeat(MAX_DOMAIN));
    // One entry per node of a huge cluster: ~21 bytes each.
    let huge_counter = CounterBucketState::from_parts(
        (0..100u64).map(|i| (NodeId(u64::MAX - i), u64::MAX - i)),
        1,
        None,
    );
    let ok = Payload::Epoch(EpochReport::from_parts(3, [(NodeId(2), 2)]));
    let items = vec![
        (Key::new(LimitId(2), "a"), Payload::Counter(huge_counter)),
        (longest.clone(), ok.clone()),
    ];
    let mut seq = 0;
    let packed = encode_items(&key(), &header(0), &mut seq, Batch::Delta, &items);
    assert_eq!(packed.dropped, 1);
    assert_eq!(
        unpack(&packed, 0, Batch::Delta),
        vec![(longest, ok.clone())]
    );
}

#[test]
fn empty_batches() {
    let mut seq = 5;
    let delta = encode_items(&key(), &header(0), &mut seq, Batch::Delta, &[]);
    assert!(delta.datagrams.is_empty());
    assert_eq!(seq, 5);

    // A full transfer of nothing still tells the joiner it is over.
    let full = encode_items(&key(), &header(0), &mut seq, Batch::Full { stream: 1 }, &[]);
    assert_eq!(full.datagrams.len(), 1);
    assert_eq!(seq, 6);
    assert_eq!(
        decode(&key(), CLUSTER, &full.datagrams[0]).unwrap().body,
        Body::Full {
            stream: 1,
            index: 0,
            last: true,
            items: vec![]
        }
    );
}

#[test]
fn encode_refuses_a_body_too_large_for_one_datagram() {
    let body = Body::Delta {
        items: vec![(
            Key::new(LimitId(1), "a"),
            Payload::Queue(steady_queue(1_000, 1, 1_000, 1_000)),
        )],
    };
    assert!(matches!(
        encode(&key(), &header(0), &body),
        Err(WireError::Oversized(len)) if len > MAX_DATAGRAM
    ));
}

// ---------------------------------------------------------------------------
// The spec, byte for byte
// ---------------------------------------------------------------------------

#[test]
fn cluster_tag_is_fnv1a_64() {
    // The FNV reference vectors.
    assert_eq!(cluster_tag(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(cluster_tag("a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(cluster_tag("foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn the_layout_and_encryption_are_as_documented() {
    let h = Header {
        cluster: CLUSTER,
        from: NodeId(1),
        incarnation: 2,
        seq: 3,
        sent_at: Nanos::new(300),
        to: NodeId(4),
        to_incarnation: 5,
    };
    assert_eq!(VERSION, 3);
    let bytes = encode(&key(), &h, &Body::Ping { t1: Nanos::new(5) }).unwrap();
    // The clear header: magic, version, cluster, from, incarnation, seq,
    // sent_at (300 = 0xac 0x02), to and to_incarnation; no kind, which is
    // encrypted.
    let mut header = b"TG\x03".to_vec();
    header.extend_from_slice(&CLUSTER.to_le_bytes());
    header.extend_from_slice(&[1, 2, 3, 0xac, 0x02, 4, 5]);
    assert_eq!(header, spec_header(&h));
    assert_eq!(&bytes[..header.len()], &header[..]);
    // Then the salt, the sealed kind (5) and body (t1 = 5), and the tag.
    assert_eq!(bytes.len(), header.len() + SALT_LEN + 2 + TAG_LEN);
    let salt = salt_of(&h, &bytes);
    assert_eq!(bytes, spec_seal(SECRET, NAME, &h, salt, &[5, 5]));

    // A delta: new limit, new domain, a counter of the sender's own node
    // (a reference to `from`, 1) and a new node (0, id 9), refill 2 ns
    // before `sent_at`.
    let counter =
        CounterBucketState::from_parts([(NodeId(1), 4), (NodeId(9), 1)], 6, Some(Nanos::new(298)));
    let body = Body::Delta {
        items: vec![(Key::new(LimitId(300), "ab"), Payload::Counter(counter))],
    };
    let bytes = encode(&key(), &h, &body).unwrap();
    let plaintext = [
        2, // kind: delta
        0,
        0xac,
        0x02,
        0,
        2,
        b'a',
        b'b',
        1,
        2 << 1 | 1,
        1,
        4,
        0,
        9,
        1,
        6,
        3,
    ];
    assert_eq!(
        spec_open(SECRET, NAME, &h, &bytes).as_deref(),
        Some(&plaintext[..])
    );
    let salt = salt_of(&h, &bytes);
    assert_eq!(bytes, spec_seal(SECRET, NAME, &h, salt, &plaintext));
}

#[test]
fn the_key_is_derived_as_documented_for_any_secret_length() {
    for len in [0usize, 1, 31, 32, 63, 64, 65, 200] {
        let secret: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
        let h = header(1);
        let bytes = encode(&ClusterKey::new(&secret, "edge"), &h, &Body::FullRequest).unwrap();
        let salt = salt_of(&h, &bytes);
        assert_eq!(
            bytes,
            spec_seal(&secret, "edge", &h, salt, &[3]),
            "secret of {len} bytes"
        );
    }
}

#[test]
fn limit_keys_and_node_ids_are_not_visible_on_the_wire() {
    const DOMAIN: &[u8] = b"visible-user-id-12345";
    let node = NodeId(0x0123_4567_89ab_cdef);
    let mut node_varint = Vec::new();
    varint(&mut node_varint, node.0);
    let limit = LimitId(0x00fe_dcba_9876_5432);
    let mut limit_varint = Vec::new();
    varint(&mut limit_varint, limit.0);
    let k = Key::new(limit, std::str::from_utf8(DOMAIN).unwrap());
    let items = vec![
        (
            k.clone(),
            Payload::Counter(CounterBucketState::from_parts([(node, 7)], 10, None)),
        ),
        (
            k.clone(),
            Payload::Epoch(EpochReport::from_parts(4, [(node, 2)])),
        ),
    ];
    let contains = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    let mut datagrams = vec![encode(
        &key(),
        &header(1),
        &Body::Delta {
            items: items.clone(),
        },
    )
    .unwrap()];
    let mut seq = 0;
    datagrams.extend(
        encode_items(
            &key(),
            &header(0),
            &mut seq,
            Batch::Full { stream: 1 },
            &items,
        )
        .datagrams,
    );
    for d in &datagrams {
        assert!(!contains(d, DOMAIN), "the domain is in the clear");
        // Not even a fragment of it.
        assert!(
            !contains(d, b"user-id"),
            "part of the domain is in the clear"
        );
        assert!(!contains(d, &node_varint), "the node id is in the clear");
        assert!(!contains(d, &limit_varint), "the limit id is in the clear");
        // And yet it is all there.
        let m = decode(&key(), CLUSTER, d).unwrap();
        let (Body::Delta { items: got } | Body::Full { items: got, .. }) = m.body else {
            panic!("{:?}", m.body)
        };
        assert_eq!(got, items);
    }
}

#[test]
fn every_datagram_has_a_fresh_nonce() {
    // The same message twice: different bytes, both authentic, same message.
    let body = Body::Ping {
        t1: Nanos::new(BASE),
    };
    let a = encode(&key(), &header(4), &body).unwrap();
    let b = encode(&key(), &header(4), &body).unwrap();
    assert_eq!(a.len(), b.len());
    assert_ne!(salt_of(&header(4), &a), salt_of(&header(4), &b));
    // The ciphertexts differ too, not only the salts.
    let clear = spec_header(&header(4)).len() + SALT_LEN;
    assert_ne!(a[clear..], b[clear..]);
    assert_eq!(decode(&key(), CLUSTER, &a), decode(&key(), CLUSTER, &b));
    assert_eq!(decode(&key(), CLUSTER, &a).unwrap().body, body);

    // Many datagrams of a batch and of repeated encodings: no salt twice.
    let items: Vec<(Key, Payload)> = (0..300u64)
        .map(|i| {
            (
                Key::new(LimitId(1), &format!("tenant-{i:04}")),
                Payload::Epoch(EpochReport::from_parts(i, [(NodeId(2), i + 1)])),
            )
        })
        .collect();
    let mut salts = BTreeSet::new();
    for _ in 0..20 {
        let mut seq = 0;
        let packed = encode_items(&key(), &header(0), &mut seq, Batch::Delta, &items);
        assert!(packed.datagrams.len() > 1);
        for (i, d) in packed.datagrams.iter().enumerate() {
            assert!(salts.insert(salt_of(&header(i as u64), d).to_vec()));
        }
    }
}

#[test]
fn cluster_key_debug_shows_no_key() {
    let shown = format!("{:?}", ClusterKey::new(b"hunter2", NAME));
    assert_eq!(shown, "ClusterKey { .. }");
}

// ---------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------

fn sample_datagram() -> Vec<u8> {
    let items = vec![
        (
            Key::new(LimitId(1), "acme"),
            Payload::Queue(steady_queue(20, 2, 1_000_000, 2_000_000)),
        ),
        (
            Key::new(LimitId(2), "acme"),
            Payload::Counter(CounterBucketState::from_parts(
                [(NodeId(1), 3), (NodeId(2), 4)],
                9,
                Some(Nanos::new(BASE - 5)),
            )),
        ),
        (
            Key::new(LimitId(1), "other"),
            Payload::Epoch(EpochReport::from_parts(12, [(NodeId(2), 8)])),
        ),
    ];
    encode(&key(), &header(7), &Body::Delta { items }).unwrap()
}

#[test]
fn flipping_any_byte_is_refused() {
    let good = sample_datagram();
    assert!(decode(&key(), CLUSTER, &good).is_ok());
    // The regions: the header's varints, salt, ciphertext and tag all lie
    // past byte 10, and the ciphertext is not empty.
    let clear = spec_header(&header(7)).len() + SALT_LEN;
    assert!(good.len() > clear + TAG_LEN + 100);
    for i in 0..good.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[i] ^= mask;
            let err = decode(&key(), CLUSTER, &bad).unwrap_err();
            // Past the cluster tag, every region fails the AEAD alike: the
            // rest of the header, the salt, the ciphertext and the tag.
            let want = match i {
                0 | 1 => WireError::BadMagic,
                2 => WireError::Version(VERSION ^ mask),
                3..=10 => {
                    WireError::ForeignCluster(u64::from_le_bytes(bad[3..11].try_into().unwrap()))
                }
                _ => WireError::BadMac,
            };
            assert_eq!(err, want, "byte {i} ^ {mask:#x}");
        }
    }
}

#[test]
fn every_truncation_is_refused() {
    let good = sample_datagram();
    for len in 0..good.len() {
        assert!(
            decode(&key(), CLUSTER, &good[..len]).is_err(),
            "cut at {len}"
        );
    }
    let mut longer = good.clone();
    longer.push(0);
    assert_eq!(decode(&key(), CLUSTER, &longer), Err(WireError::BadMac));
    // Cut anywhere past the cluster tag, it fails authentication.
    for len in 11..good.len() {
        assert_eq!(
            decode(&key(), CLUSTER, &good[..len]),
            Err(WireError::BadMac),
            "cut at {len}"
        );
    }
}

#[test]
fn swapping_salts_or_headers_between_datagrams_is_refused() {
    let a = encode(&key(), &header(5), &Body::FullRequest).unwrap();
    let b = encode(&key(), &header(5), &Body::FullRequest).unwrap();
    let at = spec_header(&header(5)).len();
    let mut spliced = a.clone();
    spliced[at..at + SALT_LEN].copy_from_slice(&b[at..at + SALT_LEN]);
    assert_eq!(decode(&key(), CLUSTER, &spliced), Err(WireError::BadMac));
    // Another header of the same length on the same ciphertext.
    let mut renumbered = spec_header(&header(6));
    renumbered.extend_from_slice(&a[at..]);
    assert_eq!(decode(&key(), CLUSTER, &renumbered), Err(WireError::BadMac));
}

#[test]
fn another_secret_is_a_bad_mac() {
    let theirs = ClusterKey::new(b"another secret", NAME);
    let bytes = encode(&theirs, &header(1), &Body::FullRequest).unwrap();
    assert_eq!(decode(&key(), CLUSTER, &bytes), Err(WireError::BadMac));
    assert_eq!(WireError::BadMac.reason(), "bad_mac");
}

#[test]
fn another_cluster_is_foreign_even_with_the_same_secret() {
    let staging = ClusterKey::new(SECRET, "staging");
    let their_header = Header {
        cluster: cluster_tag("staging"),
        ..header(1)
    };
    let bytes = encode(&staging, &their_header, &Body::FullRequest).unwrap();
    assert_eq!(
        decode(&key(), CLUSTER, &bytes),
        Err(WireError::ForeignCluster(cluster_tag("staging")))
    );
    // Claiming our cluster's tag does not help: the name is in the MAC key.
    let forged = encode(&staging, &header(1), &Body::FullRequest).unwrap();
    assert_eq!(decode(&key(), CLUSTER, &forged), Err(WireError::BadMac));
}

#[test]
fn oversized_magic_and_version() {
    let e = decode(&key(), CLUSTER, &[0u8; MAX_DATAGRAM + 1]).unwrap_err();
    assert_eq!(e, WireError::Oversized(MAX_DATAGRAM + 1));
    assert_eq!(e.reason(), "oversized");
    assert_eq!(decode(&key(), CLUSTER, b"XX\x02"), Err(WireError::BadMagic));
    assert_eq!(decode(&key(), CLUSTER, b""), Err(WireError::BadMagic));
    assert_eq!(
        decode(&key(), CLUSTER, b"TG\x04rest"),
        Err(WireError::Version(4))
    );
    assert_eq!(
        decode(&key(), CLUSTER, b"TG"),
        Err(WireError::Malformed("truncated"))
    );
    // A version 1 (authenticated, unencrypted) datagram is refused as such.
    let mut v1 = sample_datagram();
    v1[2] = 1;
    assert_eq!(decode(&key(), CLUSTER, &v1), Err(WireError::Version(1)));
    assert_eq!(WireError::Version(1).reason(), "version");
    // So is one of version 2, which named no recipient.
    let mut v2 = sample_datagram();
    v2[2] = 2;
    assert_eq!(decode(&key(), CLUSTER, &v2), Err(WireError::Version(2)));
    // A bare header, no salt or tag: it cannot be authentic.
    let bare = spec_header(&header(1));
    assert_eq!(decode(&key(), CLUSTER, &bare), Err(WireError::BadMac));
    assert_eq!(decode(&key(), CLUSTER, &bare[..11]), Err(WireError::BadMac));
}

#[test]
fn reasons_are_stable_labels() {
    let labels = [
        (WireError::Oversized(1), "oversized"),
        (WireError::BadMagic, "bad_magic"),
        (WireError::Version(9), "version"),
        (WireError::ForeignCluster(1), "foreign_cluster"),
        (WireError::BadMac, "bad_mac"),
        (WireError::Malformed("x"), "malformed"),
        (WireError::Replayed, "replayed"),
        (WireError::Misaddressed, "misaddressed"),
        (WireError::DomainTooLong(600), "domain_too_long"),
    ];
    for (e, label) in labels {
        assert_eq!(e.reason(), label);
    }
}

#[test]
fn authentic_but_malformed_bodies_are_refused_by_the_parser() {
    let h = header(1);
    let cases: &[(u8, &[u8], &str)] = &[
        (0, b"", "unknown message kind"),
        (99, b"", "unknown message kind"),
        (3, b"\x00", "trailing bytes"),
        (5, b"", "truncated"),
        (5, b"\x80\x00", "overlong varint"),
        (
            5,
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02",
            "varint overflows 64 bits",
        ),
        (1, b"\x05abc", "truncated"),
        (4, b"\x01\x00\x02", "bad last-chunk flag"),
        (
            4,
            b"\x01\x80\x80\x80\x80\x10\x01",
            "chunk index out of range",
        ),
        // Delta items: limit, domain, payload kind, payload.
        (2, b"\x05", "bad limit reference"),
        (2, b"\x00\x01\x03", "bad domain reference"),
        (2, b"\x00\x01\x00\x02\xff\xfe", "domain is not UTF-8"),
        (2, b"\x00\x01\x00\x81\x04", "domain too long"),
        (2, b"\x00\x01\x00\x00\x07", "unknown payload kind"),
        // Queue: a count the datagram could not hold.
        (
            2,
            b"\x00\x01\x00\x00\x02\x01\x7f",
            "too many queue elements",
        ),
        (
            2,
            b"\x00\x01\x00\x00\x02\x05\x00",
            "empty queue with an interval",
        ),
        // Queue: two elements, the second not after the first.
        (
            2,
            b"\x00\x01\x00\x00\x02\x01\x02\x00\x01\x00\x00\x00\x01\x00\x00",
            "queue elements out of order",
        ),
        // Queue: a node reference past the table (only `from` is in it).
        (
            2,
            b"\x00\x01\x00\x00\x02\x01\x01\x00\x02\x00\x00",
            "bad node reference",
        ),
        (
            2,
            b"\x00\x01\x00\x00\x02\x01\x01\x00\x01\x80\x80\x80\x80\x10\x00",
            "element sequence out of range",
        ),
        // Counter: unsorted, zero, too many.
        (
            2,
            b"\x00\x01\x00\x00\x01\x04\x00\x05\x01\x01\x01\x00",
            "entries out of order",
        ),
        (2, b"\x00\x01\x00\x00\x01\x02\x01\x00\x00", "zero entry"),
        (
            2,
            b"\x00\x01\x00\x00\x01\x7e\x00",
            "too many counter entries",
        ),
        (
            2,
            b"\x00\x01\x00\x00\x03\x01\x09\x01",
            "too many epoch entries",
        ),
    ];
    // Authentic, but without even a kind.
    assert_eq!(
        decode(
            &key(),
            CLUSTER,
            &spec_seal(SECRET, NAME, &h, &[0; SALT_LEN], &[])
        ),
        Err(WireError::Malformed("truncated"))
    );
    for &(kind, body, why) in cases {
        assert_eq!(
            decode(&key(), CLUSTER, &sealed(&h, kind, body)),
            Err(WireError::Malformed(why)),
            "kind {kind}, body {body:02x?}"
        );
    }
    // And the hand-sealed well-formed ones decode.
    let ok = decode(
        &key(),
        CLUSTER,
        &sealed(&h, 2, b"\x00\x01\x00\x00\x02\x00\x00"),
    )
    .unwrap();
    assert_eq!(
        ok.body,
        Body::Delta {
            items: vec![(
                Key::new(LimitId(1), ""),
                Payload::Queue(QueueState::default())
            )]
        }
    );
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1300)) {
        let _ = decode(&key(), CLUSTER, &bytes);
        // The same with a plausible start, to reach the cluster check.
        let mut framed = b"TG\x03".to_vec();
        framed.extend_from_slice(&CLUSTER.to_le_bytes());
        framed.extend_from_slice(&bytes);
        prop_assert!(decode(&key(), CLUSTER, &framed).is_err());
    }

    #[test]
    fn authentic_garbage_never_panics(
        h in any_header(),
        kind in prop_oneof![4 => Just(2u8), 2 => Just(4u8), 2 => 1u8..=6, 1 => any::<u8>()],
        // Small bytes are valid tags, references and short varints, so
        // the parser gets deep before it trips.
        body in prop::collection::vec(prop_oneof![4 => 0u8..4, 1 => any::<u8>()], 0..400),
    ) {
        match decode(&key(), CLUSTER, &sealed(&h, kind, &body)) {
            Ok(m) => prop_assert_eq!(m.header, h),
            Err(WireError::Malformed(_)) => {}
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    #[test]
    fn authentic_mutations_of_valid_datagrams_never_panic(
        items in items(4, 12),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..5),
    ) {
        let h = header(1);
        let Ok(good) = encode(&key(), &h, &Body::Delta { items }) else { return Ok(()) };
        let plaintext = spec_open(SECRET, NAME, &h, &good).unwrap();
        prop_assert_eq!(plaintext[0], 2);
        let mut body = plaintext[1..].to_vec();
        for (at, byte, op) in edits {
            let i = if body.is_empty() { 0 } else { at.index(body.len()) };
            match op {
                0 if !body.is_empty() => body[i] = byte,
                1 => body.insert(i, byte),
                _ if !body.is_empty() => { body.remove(i); }
                _ => {}
            }
        }
        match decode(&key(), CLUSTER, &sealed(&h, 2, &body)) {
            // What decodes is a valid message, and encodes again.
            Ok(m) => {
                if let Ok(again) = encode(&key(), &h, &m.body) {
                    prop_assert_eq!(decode(&key(), CLUSTER, &again).unwrap(), m);
                }
            }
            Err(WireError::Malformed(_)) => {}
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Replays
// ---------------------------------------------------------------------------

#[test]
fn replay_guard_refuses_duplicates() {
    let mut g = ReplayGuard::default();
    assert!(g.accept(NodeId(1), 1, 5));
    assert!(!g.accept(NodeId(1), 1, 5));
    // Another sender's numbers are its own.
    assert!(g.accept(NodeId(2), 1, 5));
    let h = Header {
        from: NodeId(2),
        incarnation: 1,
        seq: 5,
        ..header(0)
    };
    assert_eq!(g.check(&h), Err(WireError::Replayed));
    assert_eq!(WireError::Replayed.reason(), "replayed");
}

#[test]
fn replay_guard_accepts_late_datagrams_in_the_window_once() {
    let mut g = ReplayGuard::new(8);
    assert!(g.accept(NodeId(1), 1, 100));
    assert!(g.accept(NodeId(1), 1, 50));
    assert!(!g.accept(NodeId(1), 1, 50));
    assert!(g.accept(NodeId(1), 1, 37)); // 63 behind: the window's edge
    assert!(!g.accept(NodeId(1), 1, 36)); // 64 behind: too old
    assert!(g.accept(NodeId(1), 1, 101));
    assert!(!g.accept(NodeId(1), 1, 37)); // now 64 behind, and seen
                                          // A jump past the window forgets it whole.
    assert!(g.accept(NodeId(1), 1, 1_000));
    assert!(!g.accept(NodeId(1), 1, 101));
    assert!(g.accept(NodeId(1), 1, 999));
    assert!(g.accept(NodeId(1), 1, u64::MAX));
    assert!(!g.accept(NodeId(1), 1, u64::MAX));
}

#[test]
fn replay_guard_follows_incarnations() {
    let mut g = ReplayGuard::new(8);
    assert!(g.accept(NodeId(1), 1, 500));
    // A restart: sequence numbers start over.
    assert!(g.accept(NodeId(1), 2, 0));
    assert!(!g.accept(NodeId(1), 2, 0));
    assert!(g.accept(NodeId(1), 2, 1));
    // The old life is over.
    assert!(!g.accept(NodeId(1), 1, 501));
}

#[test]
fn replay_guard_tells_a_duplicate_from_an_earlier_life() {
    let mut g = ReplayGuard::new(8);
    assert_eq!(g.admit(NodeId(1), 5, 100), Admission::Fresh);
    assert_eq!(g.admit(NodeId(1), 5, 100), Admission::Duplicate);
    assert_eq!(g.admit(NodeId(1), 5, 90), Admission::Fresh);
    // Below the window: as likely a restart within one stamp as a replay.
    assert_eq!(
        g.admit(NodeId(1), 5, 1),
        Admission::Outdated {
            incarnation: 5,
            top: 100
        }
    );
    // An older incarnation, whatever its sequence number.
    assert_eq!(
        g.admit(NodeId(1), 4, 1_000),
        Admission::Outdated {
            incarnation: 5,
            top: 100
        }
    );
    // Nothing of the above moved the window.
    assert_eq!(g.admit(NodeId(1), 5, 101), Admission::Fresh);
    assert_eq!(g.admit(NodeId(1), 6, 0), Admission::Fresh);
    assert_eq!(
        g.admit(NodeId(1), 5, 102),
        Admission::Outdated {
            incarnation: 6,
            top: 0
        }
    );
}

#[test]
fn a_datagram_names_its_recipient_in_the_clear_and_authenticated() {
    let h = header(9);
    assert!(h.is_for(NodeId(2), 4));
    assert!(!h.is_for(NodeId(2), 5) && !h.is_for(NodeId(3), 4));
    assert!(!h.is_for_anyone());
    let anyone = Header {
        to: ANYONE,
        to_incarnation: 0,
        ..h
    };
    assert!(anyone.is_for_anyone());
    let bytes = encode(&key(), &h, &Body::FullRequest).unwrap();
    assert_eq!(unauthenticated_header(&bytes), Some(h));
    // Readable by anyone, so only a hint: another secret's datagram
    // parses alike, and readdressing one fails authentication.
    let theirs = encode(
        &ClusterKey::new(b"another secret", NAME),
        &anyone,
        &Body::FullRequest,
    )
    .unwrap();
    assert_eq!(unauthenticated_header(&theirs), Some(anyone));
    let mut readdressed = spec_header(&Header { to: NodeId(3), ..h });
    readdressed.extend_from_slice(&bytes[spec_header(&h).len()..]);
    assert_eq!(
        decode(&key(), CLUSTER, &readdressed),
        Err(WireError::BadMac)
    );
    let mut old = bytes.clone();
    old[2] = 2;
    assert_eq!(unauthenticated_header(&old), None);
    assert_eq!(unauthenticated_header(b"TG"), None);
}

#[test]
fn replay_guard_is_bounded_and_evicts_the_least_recently_heard() {
    let mut g = ReplayGuard::new(2);
    assert!(g.accept(NodeId(1), 1, 1));
    assert!(g.accept(NodeId(2), 1, 1));
    assert!(g.accept(NodeId(1), 1, 2)); // 1 is now the more recent
    assert!(g.accept(NodeId(3), 1, 1)); // evicts 2
    assert_eq!(g.len(), 2);
    assert!(!g.accept(NodeId(1), 1, 2), "1 is still remembered");
    assert!(g.accept(NodeId(2), 1, 1), "2 was forgotten");
    assert_eq!(g.len(), 2);
    g.forget(NodeId(2));
    assert_eq!(g.len(), 1);
    // A bound of zero still remembers one sender.
    let mut one = ReplayGuard::new(0);
    assert!(one.is_empty());
    assert!(one.accept(NodeId(1), 1, 1));
    assert!(one.accept(NodeId(2), 1, 1));
    assert_eq!(one.len(), 1);
}

proptest! {
    /// Against a model that remembers every sequence number: accepted iff
    /// the incarnation is newer, or it is the current one and the number
    /// is new and fewer than 64 below the highest accepted.
    #[test]
    fn replay_guard_matches_a_model(ops in prop::collection::vec((0u64..3, 0u64..200), 1..300)) {
        let mut g = ReplayGuard::new(4);
        let mut incarnation: Option<u64> = None;
        let mut seen = std::collections::BTreeSet::new();
        for (inc, seq) in ops {
            let want = match incarnation {
                None => true,
                Some(cur) if inc > cur => true,
                Some(cur) if inc < cur => false,
                Some(_) => {
                    let top = *seen.iter().next_back().unwrap();
                    !seen.contains(&seq) && seq + ReplayGuard::WINDOW > top
                }
            };
            if want {
                if incarnation != Some(inc) {
                    seen.clear();
                }
                incarnation = Some(inc);
                seen.insert(seq);
            }
            prop_assert_eq!(g.accept(NodeId(9), inc, seq), want, "inc {} seq {}", inc, seq);
        }
    }
}

/// A digest is parsed strictly: buckets in range, in increasing order, no
/// more of them than a digest has, every hash whole.
#[test]
fn a_digest_out_of_order_or_range_is_refused() {
    let h = header(9);
    let digest = |entries: &[(u8, u64)], count: u64| {
        let mut body = Vec::new();
        varint(&mut body, 5); // at
        varint(&mut body, count);
        for (b, hash) in entries {
            body.push(*b);
            body.extend_from_slice(&hash.to_le_bytes());
        }
        sealed(&h, 9, &body)
    };
    let ok = digest(&[(1, 7), (2, 8)], 2);
    assert!(matches!(
        decode(&key(), h.cluster, &ok),
        Ok(Message {
            body: Body::Digest { .. },
            ..
        })
    ));
    for (why, bytes) in [
        ("out of order", digest(&[(2, 7), (1, 8)], 2)),
        ("repeated", digest(&[(2, 7), (2, 8)], 2)),
        ("out of range", digest(&[(64, 7)], 1)),
        ("too many", digest(&[(1, 7)], 65)),
        ("short hash", {
            let mut body = Vec::new();
            varint(&mut body, 5);
            varint(&mut body, 1);
            body.extend_from_slice(&[3, 1, 2, 3]);
            sealed(&h, 9, &body)
        }),
        ("short pull", sealed(&h, 10, &[1, 2, 3])),
        ("graft with trailing bytes", sealed(&h, 12, &[0, 0])),
        ("too many nodes in a graft", sealed(&h, 12, &[101])),
    ] {
        assert!(
            matches!(
                decode(&key(), h.cluster, &bytes),
                Err(WireError::Malformed(_))
            ),
            "{why}: {:?}",
            decode(&key(), h.cluster, &bytes)
        );
    }
}

// ---------------------------------------------------------------------------
// Reset generations (issue 18: resetting counters in a gossip cluster)
// ---------------------------------------------------------------------------

/// The zig-zag varint of `to − from` modulo 2^64, as the format writes
/// times.
fn zz(to: u64, from: u64) -> Vec<u8> {
    let d = to.wrapping_sub(from) as i64;
    let mut v = ((d << 1) ^ (d >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// A key never reset is written exactly as before resets existed (payload
/// kind 1, no generation), so nodes of either version read it; a reset one
/// sets the kind's high bit and writes its generation after it.
#[test]
fn a_generation_is_written_only_for_a_key_that_was_reset() {
    let state = CounterBucketState::from_parts([(NodeId(1), 3)], 5, None);
    let k = Key::new(LimitId(1), "a");
    let plain = encode_items(
        &key(),
        &header(1),
        &mut 1,
        Batch::Delta,
        &[(k.clone(), Payload::Counter(state.clone()))],
    );
    let body = open_body(&plain.datagrams[0]);
    // kind, limit (new, 1), domain (new, "a"), payload kind 1.
    assert_eq!(&body[..6], &[2, 0, 1, 0, 1, b'a']);
    assert_eq!(body[6], 1);
    let g = Generation {
        at: Nanos::new(BASE + 7),
        node: NodeId(9),
    };
    let reset = Payload::Counter(state.with_generation(g));
    let packed = encode_items(
        &key(),
        &header(2),
        &mut 2,
        Batch::Delta,
        &[(k.clone(), reset.clone())],
    );
    let body = open_body(&packed.datagrams[0]);
    assert_eq!(body[6], 0x81);
    // zz(+7) = 14, then node 9 written in full (0, 9).
    assert_eq!(&body[7..10], &[14, 0, 9]);
    let m = decode(&key(), CLUSTER, &packed.datagrams[0]).unwrap();
    let Body::Delta { items } = m.body else {
        panic!("not a delta")
    };
    assert_eq!(items, vec![(k, reset)]);
}

/// A generation flag followed by the zero generation (a second encoding
/// of "never reset"), or by nothing, is refused; no payload kind past the
/// flag is accepted either.
#[test]
fn a_malformed_generation_is_refused() {
    let h = header(5);
    let item = |kind: u8, generation: &[u8], rest: &[u8]| {
        let mut body = vec![0, 1, 0, 1, b'a', kind];
        body.extend_from_slice(generation);
        body.extend_from_slice(rest);
        body
    };
    // A counter payload of no entries, limit 0, no refill.
    let counter = [0u8, 0];
    let mut zero = zz(0, BASE);
    zero.extend_from_slice(&[0, 0]);
    assert_eq!(
        decode(
            &key(),
            CLUSTER,
            &sealed(&h, 2, &item(0x81, &zero, &counter))
        ),
        Err(WireError::Malformed("zero reset generation"))
    );
    assert_eq!(
        decode(&key(), CLUSTER, &sealed(&h, 2, &item(0x81, &[], &[]))),
        Err(WireError::Malformed("truncated"))
    );
    let mut fine = zz(BASE + 1, BASE);
    fine.extend_from_slice(&[1]);
    assert!(decode(
        &key(),
        CLUSTER,
        &sealed(&h, 2, &item(0x81, &fine, &counter))
    )
    .is_ok());
    assert_eq!(
        decode(
            &key(),
            CLUSTER,
            &sealed(&h, 2, &item(0x84, &fine, &counter))
        ),
        Err(WireError::Malformed("unknown payload kind"))
    );
}

/// The plaintext (kind and body) of a datagram sealed under the test key
/// with [`header`]'s values.
fn open_body(datagram: &[u8]) -> Vec<u8> {
    let m = decode(&key(), CLUSTER, datagram).unwrap();
    spec_open(SECRET, NAME, &m.header, datagram).unwrap()
}
