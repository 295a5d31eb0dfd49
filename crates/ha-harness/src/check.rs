//! The `check` suite: how a side runs the cases it planned ([`crate::plan`]) and verifies
//! them, and the verdict from both sides' outcomes.
//!
//! Both endpoints run every case at the same time, each sending to and receiving from the
//! other, so both directions of the connection are covered.

use super::conn::{Endpoint, Side};
use super::driver::{self, Buf, Ctl};
pub use super::outcome::Outcome;
use super::pattern;
pub use super::plan::{
    plan, plan_case, verify_slot, Case, CaseKind, CasePlan, Expect, Round, GUARD,
};
use std::sync::atomic::Ordering;

fn register_all(ep: &Endpoint<'_>, send: bool, lens: &[usize]) -> Result<Vec<Buf>, String> {
    let comm = if send { &ep.send } else { &ep.recv };
    let mut bufs = Vec::with_capacity(lens.len());
    for &len in lens {
        match Buf::register(ep.plugin, comm, len) {
            Ok(b) => bufs.push(b),
            Err(e) => {
                // Nothing was posted on these yet: deregistering is safe.
                for b in bufs {
                    let _ = b.deregister(ep.plugin, comm);
                }
                return Err(e);
            }
        }
    }
    Ok(bufs)
}

/// Runs case `idx` on one side.
pub fn run_case(ep: &Endpoint<'_>, side: Side, idx: usize, case: &Case, ctl: &Ctl<'_>) -> Outcome {
    let plan = plan_case(idx, &case.kind, side);
    let mut send_bufs = match register_all(ep, true, &plan.send_buf_lens) {
        Ok(b) => b,
        Err(e) => return Outcome::Fatal(e),
    };
    let mut recv_bufs = match register_all(ep, false, &plan.recv_buf_lens) {
        Ok(b) => b,
        Err(e) => {
            driver::leak(send_bufs);
            return Outcome::Fatal(e);
        }
    };
    let mut failures = Vec::new();
    for (it, round) in plan.rounds.iter().enumerate() {
        for (op, &seed) in round.sends.iter().zip(&round.send_seeds) {
            pattern::fill(
                &mut send_bufs[op.buf].bytes_mut()[op.off..op.off + op.size],
                seed,
            );
        }
        for (op, exp) in round.recvs.iter().zip(&round.expect) {
            for (part, e) in op.parts.iter().zip(exp) {
                let end = part.off + part.size + GUARD;
                pattern::fill_poison(&mut recv_bufs[part.buf].bytes_mut()[part.off..end], e.seed);
            }
        }
        let sizes = match driver::run(
            ep,
            &round.sends,
            &mut send_bufs,
            &round.recvs,
            &mut recv_bufs,
            ctl,
        ) {
            Ok(s) => s,
            Err(e) => {
                driver::leak(send_bufs);
                driver::leak(recv_bufs);
                return Outcome::Fatal(format!("iteration {it}: {e}"));
            }
        };
        for (r, (op, exp)) in round.recvs.iter().zip(&round.expect).enumerate() {
            for (j, (part, e)) in op.parts.iter().zip(exp).enumerate() {
                let slot = &recv_bufs[part.buf].bytes()[part.off..part.off + part.size + GUARD];
                if let Err(why) = verify_slot(slot, sizes[r][j], e) {
                    failures.push(format!(
                        "iteration {it}, recv {r} part {j} (tag {:#x}): {why}",
                        part.tag
                    ));
                }
            }
        }
    }
    for b in send_bufs {
        if let Err(e) = b.deregister(ep.plugin, &ep.send) {
            failures.push(e);
        }
    }
    for b in recv_bufs {
        if let Err(e) = b.deregister(ep.plugin, &ep.recv) {
            failures.push(e);
        }
    }
    match failures.len() {
        0 => Outcome::Pass,
        1 => Outcome::Fail(failures.remove(0)),
        n => Outcome::Fail(format!("{} (and {} more)", failures[0], n - 1)),
    }
}

/// Runs the cases in order on one side, reporting each; stops after a fatal outcome or when
/// aborted. Returns true if the connection is still clean (no fatal outcome, not aborted).
pub fn run_side(
    ep: &Endpoint<'_>,
    side: Side,
    cases: &[Case],
    ctl: &Ctl<'_>,
    report: &mut dyn FnMut(usize, Outcome),
) -> bool {
    for (idx, case) in cases.iter().enumerate() {
        if ctl.abort.load(Ordering::Relaxed) {
            return false;
        }
        let outcome = run_case(ep, side, idx, case, ctl);
        let fatal = matches!(outcome, Outcome::Fatal(_));
        report(idx, outcome);
        if fatal {
            return false;
        }
    }
    true
}

/// The verdict for a case from both sides' outcomes (`None`: that side never reported it).
pub fn combine(a: Option<&Outcome>, b: Option<&Outcome>) -> Result<(), String> {
    if let (Some(Outcome::Pass), Some(Outcome::Pass)) = (a, b) {
        return Ok(());
    }
    if a.is_none() && b.is_none() {
        return Err("not run (an earlier failure stopped the suite)".into());
    }
    let mut why = Vec::new();
    for (side, o) in [(Side::A, a), (Side::B, b)] {
        match o {
            Some(Outcome::Pass) => {}
            Some(Outcome::Fail(w)) => why.push(format!("{}: {w}", side.name())),
            Some(Outcome::Fatal(w)) => why.push(format!("{}: fatal: {w}", side.name())),
            None => why.push(format!("{}: no report", side.name())),
        }
    }
    Err(why.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let pass = Outcome::Pass;
        let fail = Outcome::Fail("bad".into());
        let fatal = Outcome::Fatal("dead".into());
        assert_eq!(combine(Some(&pass), Some(&pass)), Ok(()));
        assert_eq!(combine(Some(&pass), Some(&fail)), Err("B: bad".into()));
        assert_eq!(
            combine(Some(&fatal), None),
            Err("A: fatal: dead; B: no report".into())
        );
        assert!(combine(None, None).unwrap_err().starts_with("not run"));
    }
}
