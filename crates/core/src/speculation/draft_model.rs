//! The draft model's entry in the drafter table. The drafter itself runs
//! llama.cpp, so the engine makes it (`DrafterHost::draft_model`); its
//! controller is kept across requests with the same speculative settings,
//! since how often a draft model agrees with the target changes little
//! from one request to the next.

use super::controller::{DraftController, CONFIDENCE_BUCKETS, CONFIDENCE_PRIORS};
use super::drafter::Drafter;
use super::entry::{DrafterEntry, DrafterHost, Runs};

/// In `auto` when the engine has a draft model; named, it needs one.
pub const ENTRY: DrafterEntry =
    DrafterEntry { name: "draft", runs: Runs::Named { in_auto: true, needs_draft_model: true }, prior: 0.7, keeps_controller: true, make };

fn make<'m>(e: &DrafterEntry, host: &mut dyn DrafterHost<'m>) -> Option<(Box<dyn Drafter + 'm>, DraftController)> {
    let drafter = host.draft_model()?;
    let mut ctl = host.kept_controller(e.name).unwrap_or_else(|| {
        DraftController::new(host.n_max(), host.adaptive(), e.prior).with_confidence_classes(&CONFIDENCE_BUCKETS, &CONFIDENCE_PRIORS)
    });
    // A kept controller may come from a request that named the draft model.
    ctl.set_cautious(host.in_auto());
    Some((drafter, ctl))
}
