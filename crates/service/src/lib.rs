//! tollgate's service layer: requests in, plans to a [`Store`], outcomes
//! out.
//!
//! It turns a request (namespace, resource, domain, hits; or Envoy
//! descriptors) into a plan using the compiled config [`View`], applies the
//! namespace flags of Charon §4.3 (`ignore_configured`,
//! `allow_unconfigured`) and shadow mode, and reports Charon §3.1's context.
//! It knows no wire protocol (surfaces adapt to it) and no particular store.
//! [`Sessions`] own hold sets, so that whatever a session holds is released
//! when it ends, and the [`Service`] drives every copy operation to a known
//! outcome whatever its caller does (see [`service`]). The [`Clock`] is the
//! one place a server reads the time.
//!
//! [`Store`]: tollgate_store::Store

#![deny(missing_docs)]

pub mod clock;
mod descriptors;
pub mod error;
pub mod fingerprint;
pub mod limiter;
pub mod service;
pub mod sessions;
pub mod view;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Holding, InLimit, NotHeld, ServiceError};
pub use limiter::{
    Counters, DescriptorOutcome, DescriptorRequest, DescriptorStatus, LimitDetail, LimitedBy,
    Limiter, RateOutcome, RateRequest, ReserveOutcome,
};
pub use service::{Closed, Released, Service, ServiceOptions, Target, MAX_NAMED_GROUPS};
pub use sessions::{Session, SessionId, SessionLimits, Sessions};
pub use view::{Unservable, Unserved, View};
