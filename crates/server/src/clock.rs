//! Nothing of the server reads the time here any more: surfaces read it
//! from the app's injected [`tollgate_service::Clock`] (`App::now`).
//!
//! What is left is for the config API alone, until it stops depending on
//! this crate (issue 20); delete this module then.

#[doc(hidden)]
pub use tollgate_service::clock::system_now as now;
