//! The server's time helpers. Surfaces read the time from the app's
//! injected [`tollgate_service::Clock`] (`App::now`); these free functions
//! remain for callers outside a server (the config API, the gossip
//! runtime's setup).

pub use tollgate_service::clock::{ms, system_now as now};
