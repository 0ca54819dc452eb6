//! Reading the scripts' replies back into the core's types.

use smallvec::SmallVec;
use tollgate_core::{Decision, Nanos, PlanDecision, PlanError, TierInfo};
use tollgate_store::{Plan, StoreError};

/// Numbers per item in a `decide` reply (see `lua/decide.lua`).
pub(crate) const PER_ITEM: usize = 12;
/// Numbers before the items.
pub(crate) const HEADER: usize = 5;

fn nonneg(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn bad(what: &str) -> StoreError {
    StoreError::Unavailable(format!("the Redis script answered malformed data: {what}"))
}

/// A `decide` reply for a plan of `items` items.
pub(crate) fn plan_decision(reply: &[i64], items: usize) -> Result<PlanDecision, StoreError> {
    if reply.len() != HEADER + items * PER_ITEM {
        return Err(bad(&format!("{} numbers for {items} items", reply.len())));
    }
    let mut decisions = SmallVec::with_capacity(items);
    let mut rooms = SmallVec::with_capacity(items);
    for d in reply[HEADER..].chunks_exact(PER_ITEM) {
        let tier = (d[7] >= 0).then(|| TierInfo {
            index: u32::try_from(d[7]).unwrap_or(u32::MAX),
            limit: nonneg(d[8]),
            hits: nonneg(d[9]),
            burst: d[10] != 0,
        });
        decisions.push(Decision {
            granted: nonneg(d[0]),
            allowed: d[1] != 0,
            limit: nonneg(d[2]),
            remaining: nonneg(d[3]),
            reset_after: Nanos::new(nonneg(d[4])),
            retry_after: (d[5] >= 0).then(|| Nanos::new(nonneg(d[5]))),
            wait: Nanos::new(nonneg(d[6])),
            tier,
        });
        rooms.push(nonneg(d[11]));
    }
    Ok(PlanDecision {
        granted: nonneg(reply[0]),
        allowed: reply[1] != 0,
        wait: Nanos::new(nonneg(reply[2])),
        limited_by: usize::try_from(reply[3]).ok(),
        shadow_limited: reply[4] != 0,
        decisions,
        rooms,
    })
}

/// One plan's part of a `decide` reply (status first): its decision, or
/// the error the script found before changing anything.
pub(crate) fn plan_outcome(
    part: &[i64],
    plan: &Plan,
    hits: u64,
) -> Result<PlanDecision, StoreError> {
    let items = plan.len();
    match part {
        [0, rest @ ..] => plan_decision(rest, items),
        [status, index] => {
            let index = usize::try_from(*index).map_err(|_| bad("a negative item index"))?;
            let item = plan
                .items()
                .get(index)
                .ok_or_else(|| bad(&format!("item {index} of {items}")))?;
            Err(match status {
                1 => StoreError::Plan(PlanError::CannotSchedule {
                    index,
                    algorithm: item.limit.algorithm_name(),
                }),
                2 => StoreError::Plan(PlanError::NeverAdmits { index, hits }),
                3 => StoreError::Unsupported(format!(
                    "acquiring {hits} hits would wait 52 days or more, which the Redis store cannot count exactly"
                )),
                other => return Err(bad(&format!("status {other}"))),
            })
        }
        _ => Err(bad(&format!("{} numbers for {items} items", part.len()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_of_the_wrong_length_is_an_error_not_a_panic() {
        assert!(plan_decision(&[1, 1, 0, -1, 0], 1).is_err());
        assert!(plan_decision(&[], 0).is_err());
    }

    #[test]
    fn decodes_never_and_tiers() {
        let reply = [2, 1, 0, -1, 0, 2, 1, 10, 8, 5, -1, 0, 3, 10, 4, 1, 7];
        let pd = plan_decision(&reply, 1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pd.granted, 2);
        assert_eq!(pd.limited_by, None);
        let d = pd.decisions[0];
        assert_eq!(d.retry_after, None);
        assert_eq!(
            d.tier.map(|t| (t.index, t.limit, t.hits, t.burst)),
            Some((3, 10, 4, true))
        );
        assert_eq!(pd.rooms[0], 7);
    }
}
