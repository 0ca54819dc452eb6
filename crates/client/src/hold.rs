//! A hold of copies: a guard that releases what it still holds when
//! dropped (Charon §3.2's implicit release), also when a panic unwinds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_proto::v1::{self, session_request::Op, session_response::Result as Answer};

use crate::client::Via;
use crate::error::Error;
use crate::outage::Outage;
use crate::session::{Failure, Session};

/// Copies of one resource held for one domain.
///
/// Dropping it releases the copies it still holds (without waiting for
/// the answer: `Drop` cannot wait); [`Hold::release_all`] does the same
/// and waits. If the client process dies, its session ends and the server
/// releases everything the session held.
#[derive(Debug)]
#[must_use = "dropping a hold releases it at once"]
pub struct Hold {
    namespace: String,
    resource: String,
    domain: String,
    groups: Vec<String>,
    /// Copies held, shared with the session task, which puts back what a
    /// refused release or transfer took from it.
    held: Arc<AtomicU64>,
    via: Via,
    /// The session holding the copies (`None` for degraded and overridden
    /// holds, which hold nothing on a server).
    session: Option<Arc<Session>>,
    response: Option<v1::ReserveResponse>,
    attempts: u32,
    waited: Duration,
    /// Why no server answered, for a degraded hold.
    outage: Option<Outage>,
}

/// How long a hold's own calls (release, transfer) wait for an answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

impl Hold {
    pub(crate) fn on_server(
        session: Arc<Session>,
        namespace: String,
        resource: String,
        domain: String,
        held: u64,
        groups: Vec<String>,
        reserved: Option<(v1::ReserveResponse, u32, Duration)>,
    ) -> Hold {
        let (response, attempts, waited) = match reserved {
            Some((r, a, w)) => (Some(r), a, w),
            None => (None, 1, Duration::ZERO),
        };
        Hold {
            namespace,
            resource,
            domain,
            groups,
            held: Arc::new(AtomicU64::new(held)),
            via: Via::Server,
            session: Some(session),
            response,
            attempts,
            waited,
            outage: None,
        }
    }

    pub(crate) fn local(
        namespace: &str,
        resource: &str,
        domain: &str,
        held: u64,
        via: Via,
        attempts: u32,
        waited: Duration,
    ) -> Hold {
        Hold {
            namespace: namespace.to_owned(),
            resource: resource.to_owned(),
            domain: domain.to_owned(),
            groups: Vec::new(),
            held: Arc::new(AtomicU64::new(held)),
            via,
            session: None,
            response: None,
            attempts,
            waited,
            outage: None,
        }
    }

    /// The hold, with why no server answered (a degraded hold's).
    pub(crate) fn with_outage(mut self, outage: Option<Outage>) -> Hold {
        self.outage = outage;
        self
    }

    /// Copies still held.
    pub fn copies(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// Who granted it: a server, degraded mode, or the kill switch.
    pub fn via(&self) -> Via {
        self.via
    }

    /// Granted without a server (degraded mode): it holds nothing anywhere.
    pub fn is_degraded(&self) -> bool {
        self.via == Via::Degraded
    }

    /// Why no server answered, for a degraded hold: every server tried,
    /// each with its error. `None` otherwise.
    pub fn outage(&self) -> Option<&Outage> {
        self.outage.as_ref()
    }

    /// The server's answer to the reserve (limits and holds at that time);
    /// `None` for a seized, degraded or overridden hold.
    pub fn response(&self) -> Option<&v1::ReserveResponse> {
        self.response.as_ref()
    }

    /// Reserves sent, the first included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time the reserve took, sleeps included.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The resource's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The resource.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The domain holding the copies.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The domain groups the copies count against.
    pub fn groups(&self) -> &[String] {
        &self.groups
    }

    /// Whether the session holding the copies ended (its server went
    /// away, which released them).
    pub fn is_lost(&self) -> bool {
        self.session.as_ref().is_some_and(|s| !s.is_alive())
    }

    /// Takes `copies` off the count before the operation is sent: a
    /// release on drop meanwhile asks only for what is left. The session
    /// task puts them back if the server refuses.
    fn take(&self, copies: u64, what: &str) -> Result<(), Error> {
        let held = self.copies();
        if copies == 0 || copies > held {
            return Err(Error::Invalid(format!(
                "cannot {what} {copies} of the {held} copies held"
            )));
        }
        self.held.fetch_sub(copies, Ordering::AcqRel);
        Ok(())
    }

    /// Sends `op`, which took `copies` off the count, on the hold's
    /// session; a session that ended makes the hold lost.
    async fn call(&mut self, session: &Arc<Session>, op: Op, copies: u64) -> Result<Answer, Error> {
        let restore = Some((Arc::clone(&self.held), copies));
        match session.call(op, restore, CALL_TIMEOUT).await {
            Ok(delivered) => Ok(delivered.claim()),
            Err(Failure::Unreachable(_)) if !session.is_alive() => {
                self.held.store(0, Ordering::Release);
                Err(Error::HoldLost)
            }
            // Failures do not name their server; the hold's is this one.
            Err(f @ (Failure::Unreachable(_) | Failure::Tls(_))) => {
                Err(Outage::one(&session.endpoint, f).into())
            }
            Err(f) => Err(crate::client::refused(f)),
        }
    }

    /// Releases `copies` of those held; returns how many are still held.
    pub async fn release(&mut self, copies: u64) -> Result<u64, Error> {
        let Some(session) = self.session.clone() else {
            self.take(copies, "release")?;
            return Ok(self.copies());
        };
        self.take(copies, "release")?;
        let op = Op::Release(self.release_request(copies));
        match self.call(&session, op, copies).await? {
            Answer::Release(_) => Ok(self.copies()),
            _ => Err(crate::client::wrong_kind()),
        }
    }

    /// Releases everything still held and waits for the server's answer.
    pub async fn release_all(mut self) -> Result<(), Error> {
        let held = self.copies();
        if held > 0 {
            self.release(held).await?;
        }
        Ok(())
    }

    /// Stages `copies` for another client, who takes them with
    /// [`Client::seize`](crate::Client::seize) and the returned id before
    /// `ttl` ends; otherwise the server releases them then (Charon §3.1).
    pub async fn transfer(&mut self, copies: u64, ttl: Duration) -> Result<String, Error> {
        let Some(session) = self.session.clone() else {
            return Err(Error::NotOnServer);
        };
        self.take(copies, "transfer")?;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let op = Op::Transfer(v1::TransferRequest {
            namespace: self.namespace.clone(),
            resource: self.resource.clone(),
            domain: self.domain.clone(),
            copies,
            groups: self.groups.clone(),
            ttl_ms,
            hold_id: String::new(),
        });
        match self.call(&session, op, copies).await? {
            Answer::Transfer(t) => Ok(t.transfer_id),
            _ => Err(crate::client::wrong_kind()),
        }
    }

    fn release_request(&self, copies: u64) -> v1::ReleaseRequest {
        v1::ReleaseRequest {
            namespace: self.namespace.clone(),
            resource: self.resource.clone(),
            domain: self.domain.clone(),
            copies,
            groups: self.groups.clone(),
            hold_id: String::new(),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let held = self.held.swap(0, Ordering::AcqRel);
        if held == 0 {
            return;
        }
        if let Some(session) = &self.session {
            session.send(Op::Release(self.release_request(held)));
        }
    }
}
