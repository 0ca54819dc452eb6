//! The items of gossip bodies (delta, full state, repair): a key and a
//! replicated payload (counter, queue or epoch report) each.
//!
//! Apart because this is where the format spends its effort on size:
//! limit ids, domains and nodes are interned per datagram, and times are
//! written as differences from a time the reader already knows (a queue
//! element's death from the death Equation 4.2 predicts). The writer packs
//! to a byte budget and can take back an item that did not fit; the reader
//! refuses anything out of order. See the parent module's "Layout".

use tollgate_core::replicated::counter::CounterBucketState;
use tollgate_core::replicated::epoch::EpochReport;
use tollgate_core::replicated::queue::{Element, ElementId, QueueState};
use tollgate_core::replicated::strategy::Payload;
use tollgate_core::replicated::{Generation, NodeId};
use tollgate_core::Nanos;
use tollgate_store::{Key, LimitId};

use super::bytes::{apply_delta, bounded_count, put_varint, varint_len, zigzag_delta, Reader};
#[cfg(doc)]
use super::encode;
use super::header::Header;
use super::{WireError, MAX_DOMAIN};

const PAYLOAD_COUNTER: u8 = 1;
const PAYLOAD_QUEUE: u8 = 2;
const PAYLOAD_EPOCH: u8 = 3;
/// Set in a payload kind when the key's reset generation follows it (a
/// key never reset is written as before resets existed).
const WITH_GENERATION: u8 = 0x80;

/// The fewest bytes a queue element takes (four one-byte varints).
const MIN_ELEMENT: usize = 4;
/// The fewest bytes a counter or epoch entry takes (node and count).
const MIN_ENTRY: usize = 2;

/// The death the queue would give an element born at `birth` after
/// `prev` (Equation 4.2): what an element's death is written relative to.
fn predicted_death(prev: Option<&Element>, birth: Nanos, interval: Nanos) -> Nanos {
    let start = match prev {
        Some(p) => birth.max(p.death),
        None => birth,
    };
    start.saturating_add(interval)
}

pub(super) fn check_key(key: &Key) -> Result<(), WireError> {
    let len = key.scope().len();
    if len > MAX_DOMAIN {
        return Err(WireError::DomainTooLong(len));
    }
    Ok(())
}

/// Writes every item, whatever its size (for [`encode`], which checks the
/// total).
pub(super) fn put_all_items(
    out: &mut Vec<u8>,
    header: &Header,
    items: &[(Key, Payload)],
) -> Result<(), WireError> {
    let mut w = ItemWriter::new(header, usize::MAX);
    for (key, payload) in items {
        check_key(key)?;
        // Without a budget every item fits; `encode` checks the total.
        let fitted = w.put_item(key, payload);
        debug_assert!(fitted);
    }
    out.extend_from_slice(&w.buf);
    Ok(())
}

/// Writes a node as a reference into the datagram's node table, adding it
/// on first use.
fn put_node(out: &mut Vec<u8>, nodes: &mut Vec<NodeId>, node: NodeId) {
    match nodes.iter().position(|&n| n == node) {
        Some(i) => put_varint(out, i as u64 + 1),
        None => {
            out.push(0);
            put_varint(out, node.0);
            nodes.push(node);
        }
    }
}

/// The items of one datagram being written, with its intern tables and
/// the bytes it may hold.
pub(super) struct ItemWriter<'a> {
    pub(super) buf: Vec<u8>,
    /// Reused for a queue's elements, written before their count.
    scratch: Vec<u8>,
    limits: Vec<LimitId>,
    domains: Vec<&'a str>,
    nodes: Vec<NodeId>,
    from: NodeId,
    sent_at: Nanos,
    budget: usize,
}

/// Where an [`ItemWriter`] stood, to take back an item that did not fit.
#[derive(Copy, Clone)]
struct Mark {
    buf: usize,
    limits: usize,
    domains: usize,
    nodes: usize,
}

impl<'a> ItemWriter<'a> {
    pub(super) fn new(header: &Header, budget: usize) -> ItemWriter<'a> {
        ItemWriter {
            buf: Vec::new(),
            scratch: Vec::new(),
            limits: Vec::new(),
            domains: Vec::new(),
            nodes: vec![header.from],
            from: header.from,
            sent_at: header.sent_at,
            budget,
        }
    }

    /// Starts the next datagram (its buffer was taken).
    pub(super) fn reset(&mut self, budget: usize) {
        self.buf.clear();
        self.limits.clear();
        self.domains.clear();
        self.nodes.clear();
        self.nodes.push(self.from);
        self.budget = budget;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn mark(&self) -> Mark {
        Mark {
            buf: self.buf.len(),
            limits: self.limits.len(),
            domains: self.domains.len(),
            nodes: self.nodes.len(),
        }
    }

    fn rollback(&mut self, m: Mark) {
        self.buf.truncate(m.buf);
        self.limits.truncate(m.limits);
        self.domains.truncate(m.domains);
        self.nodes.truncate(m.nodes);
    }

    /// Writes the key (its domain already checked against MAX_DOMAIN).
    fn put_key(&mut self, key: &'a Key) {
        match self.limits.iter().position(|&l| l == key.limit) {
            Some(i) => put_varint(&mut self.buf, i as u64 + 1),
            None => {
                self.buf.push(0);
                put_varint(&mut self.buf, key.limit.0);
                self.limits.push(key.limit);
            }
        }
        let domain = key.scope();
        match self.domains.iter().position(|&d| d == domain) {
            Some(i) => put_varint(&mut self.buf, i as u64 + 1),
            None => {
                self.buf.push(0);
                put_varint(&mut self.buf, domain.len() as u64);
                self.buf.extend_from_slice(domain.as_bytes());
                self.domains.push(domain);
            }
        }
    }

    /// Writes one whole item; `false`, writing nothing, if it does not fit.
    pub(super) fn put_item(&mut self, key: &'a Key, payload: &Payload) -> bool {
        let m = self.mark();
        match payload {
            Payload::Queue(q) => {
                let elements: Vec<Element> = q.elements().copied().collect();
                return self
                    .put_queue(key, q.generation(), q.interval(), &elements, false)
                    .is_some();
            }
            Payload::Counter(s) => {
                self.put_key(key);
                self.put_kind(PAYLOAD_COUNTER, s.generation());
                let entries = s.token_counter();
                let refill = s.refill_timestamp();
                put_varint(
                    &mut self.buf,
                    ((entries.len() as u64) << 1) | u64::from(refill.is_some()),
                );
                self.put_entries(entries);
                put_varint(&mut self.buf, s.limit());
                if let Some(t) = refill {
                    put_varint(
                        &mut self.buf,
                        zigzag_delta(t.as_u64(), self.sent_at.as_u64()),
                    );
                }
            }
            Payload::Epoch(r) => {
                self.put_key(key);
                self.put_kind(PAYLOAD_EPOCH, r.generation());
                put_varint(&mut self.buf, r.epoch());
                put_varint(&mut self.buf, r.traffic().len() as u64);
                self.put_entries(r.traffic());
            }
        }
        if self.buf.len() > self.budget {
            self.rollback(m);
            return false;
        }
        true
    }

    /// Writes a payload kind, and the reset generation after it unless it
    /// is zero.
    fn put_kind(&mut self, kind: u8, generation: Generation) {
        if generation.is_zero() {
            self.buf.push(kind);
            return;
        }
        self.buf.push(kind | WITH_GENERATION);
        put_varint(
            &mut self.buf,
            zigzag_delta(generation.at.as_u64(), self.sent_at.as_u64()),
        );
        put_node(&mut self.buf, &mut self.nodes, generation.node);
    }

    fn put_entries(&mut self, entries: &[(NodeId, u64)]) {
        for &(node, count) in entries {
            put_node(&mut self.buf, &mut self.nodes, node);
            put_varint(&mut self.buf, count);
        }
    }

    /// Writes a queue item of `key` with the leading run of `elements`
    /// that fits: all of them unless `partial`. Answers how many were
    /// written, or `None`, writing nothing, when not even one (or, unless
    /// `partial`, not all) fit.
    pub(super) fn put_queue(
        &mut self,
        key: &'a Key,
        generation: Generation,
        interval: Nanos,
        elements: &[Element],
        partial: bool,
    ) -> Option<usize> {
        let m = self.mark();
        self.put_key(key);
        self.put_kind(PAYLOAD_QUEUE, generation);
        put_varint(&mut self.buf, interval.as_u64());
        let head = self.buf.len();
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let mut prev: Option<&Element> = None;
        let mut n = 0;
        for e in elements {
            let (at, nodes) = (scratch.len(), self.nodes.len());
            let base = prev.map_or(self.sent_at, |p| p.id.birth);
            put_varint(
                &mut scratch,
                zigzag_delta(e.id.birth.as_u64(), base.as_u64()),
            );
            put_node(&mut scratch, &mut self.nodes, e.id.node);
            put_varint(&mut scratch, u64::from(e.id.seq));
            let predicted = predicted_death(prev, e.id.birth, interval);
            put_varint(
                &mut scratch,
                zigzag_delta(e.death.as_u64(), predicted.as_u64()),
            );
            if head + varint_len(n as u64 + 1) + scratch.len() > self.budget {
                scratch.truncate(at);
                self.nodes.truncate(nodes);
                break;
            }
            n += 1;
            prev = Some(e);
        }
        let fits = head + varint_len(n as u64) + scratch.len() <= self.budget;
        // A run of no elements is written only for a reset queue that has
        // none (its generation is the news).
        let nothing = n == 0 && !elements.is_empty();
        let written = if !fits || (n < elements.len() && (!partial || nothing)) {
            self.rollback(m);
            None
        } else {
            put_varint(&mut self.buf, n as u64);
            self.buf.extend_from_slice(&scratch);
            Some(n)
        };
        self.scratch = scratch;
        written
    }
}

/// A datagram's intern tables, as read so far.
struct Tables<'a> {
    limits: Vec<LimitId>,
    domains: Vec<&'a str>,
    nodes: Vec<NodeId>,
}

/// Resolves a reference `k ≥ 1` into `table`.
fn lookup<T: Copy>(table: &[T], k: u64, what: &'static str) -> Result<T, WireError> {
    k.checked_sub(1)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| table.get(i).copied())
        .ok_or(WireError::Malformed(what))
}

impl<'a> Tables<'a> {
    fn node(&mut self, r: &mut Reader<'a>) -> Result<NodeId, WireError> {
        match r.varint()? {
            0 => {
                let node = NodeId(r.varint()?);
                self.nodes.push(node);
                Ok(node)
            }
            k => lookup(&self.nodes, k, "bad node reference"),
        }
    }

    fn key(&mut self, r: &mut Reader<'a>) -> Result<Key, WireError> {
        let limit = match r.varint()? {
            0 => {
                let limit = LimitId(r.varint()?);
                self.limits.push(limit);
                limit
            }
            k => lookup(&self.limits, k, "bad limit reference")?,
        };
        let domain = match r.varint()? {
            0 => {
                let len = r.varint()?;
                if len > MAX_DOMAIN as u64 {
                    return Err(WireError::Malformed("domain too long"));
                }
                let domain = std::str::from_utf8(r.take(len)?)
                    .map_err(|_| WireError::Malformed("domain is not UTF-8"))?;
                self.domains.push(domain);
                domain
            }
            k => lookup(&self.domains, k, "bad domain reference")?,
        };
        Ok(Key::new(limit, domain))
    }

    /// `(node, count)` entries, strictly increasing by node, no zeros.
    fn entries(&mut self, r: &mut Reader<'a>, n: usize) -> Result<Vec<(NodeId, u64)>, WireError> {
        let mut entries: Vec<(NodeId, u64)> = Vec::with_capacity(n);
        for _ in 0..n {
            let node = self.node(r)?;
            let count = r.varint()?;
            if count == 0 {
                return Err(WireError::Malformed("zero entry"));
            }
            if entries.last().is_some_and(|&(prev, _)| node <= prev) {
                return Err(WireError::Malformed("entries out of order"));
            }
            entries.push((node, count));
        }
        Ok(entries)
    }
}

/// Items up to the end of the body.
pub(super) fn read_items<'a>(
    r: &mut Reader<'a>,
    header: &Header,
) -> Result<Vec<(Key, Payload)>, WireError> {
    let mut t = Tables {
        limits: Vec::new(),
        domains: Vec::new(),
        nodes: vec![header.from],
    };
    let sent_at = header.sent_at.as_u64();
    let mut items = Vec::new();
    while r.remaining() > 0 {
        let key = t.key(r)?;
        let kind = r.u8()?;
        let generation = if kind & WITH_GENERATION != 0 {
            let at = Nanos::new(apply_delta(sent_at, r.varint()?));
            let generation = Generation {
                at,
                node: t.node(r)?,
            };
            if generation.is_zero() {
                // Written without the flag: one encoding per value.
                return Err(WireError::Malformed("zero reset generation"));
            }
            generation
        } else {
            Generation::ZERO
        };
        let payload = match kind & !WITH_GENERATION {
            PAYLOAD_COUNTER => {
                let head = r.varint()?;
                let n = bounded_count(head >> 1, r.remaining(), MIN_ENTRY)
                    .ok_or(WireError::Malformed("too many counter entries"))?;
                let entries = t.entries(r, n)?;
                let limit = r.varint()?;
                let refill = if head & 1 == 1 {
                    Some(Nanos::new(apply_delta(sent_at, r.varint()?)))
                } else {
                    None
                };
                Payload::Counter(
                    CounterBucketState::from_parts(entries, limit, refill)
                        .with_generation(generation),
                )
            }
            PAYLOAD_QUEUE => {
                let interval = Nanos::new(r.varint()?);
                let n = r.count(MIN_ELEMENT, "too many queue elements")?;
                if n == 0 && !interval.is_zero() {
                    return Err(WireError::Malformed("empty queue with an interval"));
                }
                let mut elements: Vec<Element> = Vec::with_capacity(n);
                for _ in 0..n {
                    let prev = elements.last();
                    let base = prev.map_or(sent_at, |p| p.id.birth.as_u64());
                    let birth = Nanos::new(apply_delta(base, r.varint()?));
                    let node = t.node(r)?;
                    let seq = u32::try_from(r.varint()?)
                        .map_err(|_| WireError::Malformed("element sequence out of range"))?;
                    let id = ElementId { birth, node, seq };
                    if prev.is_some_and(|p| id <= p.id) {
                        return Err(WireError::Malformed("queue elements out of order"));
                    }
                    let predicted = predicted_death(prev, birth, interval);
                    let death = Nanos::new(apply_delta(predicted.as_u64(), r.varint()?));
                    elements.push(Element { id, death });
                }
                Payload::Queue(
                    QueueState::from_elements(interval, elements).with_generation(generation),
                )
            }
            PAYLOAD_EPOCH => {
                let epoch = r.varint()?;
                let n = r.count(MIN_ENTRY, "too many epoch entries")?;
                let traffic = t.entries(r, n)?;
                Payload::Epoch(EpochReport::from_parts(epoch, traffic).with_generation(generation))
            }
            _ => return Err(WireError::Malformed("unknown payload kind")),
        };
        items.push((key, payload));
    }
    Ok(items)
}
