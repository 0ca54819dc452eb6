//! The Lua sources, assembled into the scripts tollgate loads into Redis.
//!
//! Each script is one chunk: `lua/prelude.lua` (time and exact
//! arithmetic), the shared hit log, every algorithm, then the entry file.
//! Redis caches a script by its SHA1; [`redis::Script`] calls it by SHA
//! with `EVALSHA` and loads it again when Redis answers `NOSCRIPT` (after a
//! restart or a `SCRIPT FLUSH`).

/// The algorithms, in the order the chunk defines them.
macro_rules! algorithms {
    () => {
        concat!(
            include_str!("../lua/hit_log.lua"),
            "\n",
            include_str!("../lua/algorithms/gcra.lua"),
            "\n",
            include_str!("../lua/algorithms/token_bucket.lua"),
            "\n",
            include_str!("../lua/algorithms/fixed_window.lua"),
            "\n",
            include_str!("../lua/algorithms/sliding_window.lua"),
            "\n",
            include_str!("../lua/algorithms/sliding_log.lua"),
            "\n",
            include_str!("../lua/algorithms/burst_tiers.lua"),
            "\n",
            include_str!("../lua/algorithms/smooth.lua"),
            "\n",
        )
    };
}

/// `decide`: one plan, all or nothing (`lua/decide.lua`).
pub(crate) const DECIDE: &str = concat!(
    include_str!("../lua/prelude.lua"),
    "\n",
    algorithms!(),
    include_str!("../lua/decide.lua"),
);

/// `copies`: the copy log's operations (`lua/copies.lua`).
pub(crate) const COPIES: &str = concat!(
    include_str!("../lua/prelude.lua"),
    "\n",
    include_str!("../lua/copies.lua"),
);

/// `servers`: heartbeats, registration and cleanup leases
/// (`lua/servers.lua`).
pub(crate) const SERVERS: &str = include_str!("../lua/servers.lua");
