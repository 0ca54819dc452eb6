//! The client's metrics (through the `metrics` facade: the application
//! installs the recorder it exports with).

/// Calls granted without a server (fail-open), by `op` (`request`,
/// `reserve`).
pub const DEGRADED: &str = "tollgate_client_degraded_total";
/// Rejections turned into grants by the kill switch, by `op`.
pub const OVERRIDDEN: &str = "tollgate_client_overridden_total";
/// Retries after a rejection, by `op`.
pub const RETRIES: &str = "tollgate_client_retries_total";
/// Sessions opened to a server (the first and every reconnection).
pub const SESSIONS: &str = "tollgate_client_sessions_opened_total";
/// Whether the client's last call reached a server (1) or failed open (0).
pub const SERVING: &str = "tollgate_client_serving";
