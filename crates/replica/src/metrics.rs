//! Names of the replicated mode's metrics, and their descriptions.

/// Gossip datagrams sent, by kind.
pub const MESSAGES_SENT: &str = "tollgate_gossip_messages_sent_total";
/// Gossip datagrams received and accepted, by kind.
pub const MESSAGES_RECEIVED: &str = "tollgate_gossip_messages_received_total";
/// Gossip bytes sent.
pub const BYTES_SENT: &str = "tollgate_gossip_bytes_sent_total";
/// Gossip bytes received (accepted or not).
pub const BYTES_RECEIVED: &str = "tollgate_gossip_bytes_received_total";
/// Datagrams or payloads dropped, by reason.
pub const DROPPED: &str = "tollgate_gossip_dropped_total";
/// Keys per delta sent.
pub const DELTA_SIZE: &str = "tollgate_gossip_delta_keys";
/// Keys pending over every peer's delta.
pub const DELTA_KEYS: &str = "tollgate_gossip_pending_keys";
/// Updates (elements, entries) pending over every peer's delta.
pub const DELTA_UPDATES: &str = "tollgate_gossip_pending_updates";
/// Eager pushes of frequency analysis.
pub const EAGER_PUSHES: &str = "tollgate_gossip_eager_pushes_total";
/// Received payloads that changed the local state.
pub const MERGES: &str = "tollgate_gossip_merges_total";
/// Keys held by the replica.
pub const STATE_KEYS: &str = "tollgate_replica_keys";
/// Elements (queue) or entries (counter, epoch) held over every key.
pub const STATE_SIZE: &str = "tollgate_replica_state_size";
/// Live peers.
pub const PEERS_ALIVE: &str = "tollgate_cluster_peers_alive";
/// Seed peers the node announces to (given, or found by DNS), other than
/// itself.
pub const SEEDS: &str = "tollgate_cluster_seeds";
/// The largest clock offset measured to a peer, in seconds.
pub const SKEW: &str = "tollgate_cluster_clock_skew_seconds";
/// Whether the clock is within the configured skew (1) or not (0).
pub const HEALTHY: &str = "tollgate_cluster_healthy";
/// Whether the node hears only datagrams it cannot authenticate from its
/// seeds and members (1): another cluster secret, most likely.
pub const KEY_MISMATCH: &str = "tollgate_cluster_key_mismatch";
/// Age of the oldest payload still waiting in a delta, in seconds.
pub const CONVERGENCE_LAG: &str = "tollgate_gossip_convergence_lag_seconds";
/// Full states sent to joining peers, and received.
pub const FULL_STATES: &str = "tollgate_gossip_full_states_total";
/// Anti-entropy digests received, by outcome (`agreed`, `repaired`).
pub const ANTI_ENTROPY: &str = "tollgate_gossip_anti_entropy_total";

/// Registers the descriptions with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, Unit};
    describe_counter!(MESSAGES_SENT, "Gossip datagrams sent, by kind.");
    describe_counter!(MESSAGES_RECEIVED, "Gossip datagrams accepted, by kind.");
    describe_counter!(BYTES_SENT, Unit::Bytes, "Gossip bytes sent.");
    describe_counter!(BYTES_RECEIVED, Unit::Bytes, "Gossip bytes received.");
    describe_counter!(DROPPED, "Gossip datagrams or payloads dropped, by reason.");
    describe_gauge!(DELTA_SIZE, "Keys in the last delta sent.");
    describe_gauge!(DELTA_KEYS, "Keys pending over every peer's delta.");
    describe_gauge!(DELTA_UPDATES, "Updates pending over every peer's delta.");
    describe_counter!(EAGER_PUSHES, "Eager pushes of frequency analysis.");
    describe_counter!(MERGES, "Received payloads that changed the local state.");
    describe_gauge!(STATE_KEYS, "Keys held by the replica.");
    describe_gauge!(STATE_SIZE, "Elements or entries held over every key.");
    describe_gauge!(PEERS_ALIVE, "Live peers.");
    describe_gauge!(
        SEEDS,
        "Seed peers announced to (given, or found by DNS), other than this node."
    );
    describe_gauge!(
        SKEW,
        Unit::Seconds,
        "Largest clock offset measured to a peer."
    );
    describe_gauge!(HEALTHY, "1 when the clock is within the configured skew.");
    describe_gauge!(
        KEY_MISMATCH,
        "1 when every datagram heard from the seeds and members fails authentication \
         (a different cluster secret, most likely)."
    );
    describe_gauge!(
        CONVERGENCE_LAG,
        Unit::Seconds,
        "Age of the oldest pending payload."
    );
    describe_counter!(FULL_STATES, "Full states sent and received, by direction.");
    describe_counter!(
        ANTI_ENTROPY,
        "Anti-entropy digests received, by outcome: agreed, or repaired (the buckets that differ \
         were exchanged)."
    );
}
