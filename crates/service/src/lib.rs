//! tollgate's service layer: requests in, plans to a [`Store`], outcomes
//! out.
//!
//! It turns a request (namespace, resource, domain, hits; or Envoy
//! descriptors) into a plan using the compiled config [`View`], applies the
//! namespace flags of Charon §4.3 (`ignore_configured`,
//! `allow_unconfigured`) and shadow mode, and reports Charon §3.1's context.
//! It knows no wire protocol (surfaces adapt to it) and no particular store.
//! [`Sessions`] own hold sets, so that whatever a session holds is released
//! when it ends.
//!
//! [`Store`]: tollgate_store::Store

#![deny(missing_docs)]

pub mod error;
pub mod fingerprint;
pub mod limiter;
pub mod sessions;
pub mod view;

pub use error::ServiceError;
pub use limiter::{
    DescriptorOutcome, DescriptorRequest, DescriptorStatus, LimitedBy, Limiter, RateOutcome,
    RateRequest, ReserveOutcome,
};
pub use sessions::{Released, Session, SessionId, SessionLimits, Sessions};
pub use view::View;
