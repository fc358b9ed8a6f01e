//! A drafter's entry in the table (`registry::DRAFTERS`), and what the
//! engine offers a drafter being made for a request (`DrafterHost`): its
//! constraint, the shared n-gram caches, the draft model, the controllers
//! kept from earlier requests. A drafter that needs something of llama.cpp
//! gets it from the host (the draft model is one).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use super::controller::DraftController;
use super::drafter::Drafter;
use super::ngram::NgramCache;
use super::suffix::SuffixStore;
use crate::sampling::constraint::Constraint;

/// Makes a drafter for a request, with the controller that prices its
/// drafts; `None` when the host lacks what it needs (no constraint, say).
pub type MakeDrafter = for<'m> fn(&DrafterEntry, &mut dyn DrafterHost<'m>) -> Option<(Box<dyn Drafter + 'm>, DraftController)>;

pub struct DrafterEntry {
    /// Its name: a word of `speculative.mode`, the `source` of its accepted
    /// tokens, its key in `drafters`; the same as its `Drafter::name`.
    pub name: &'static str,
    pub runs: Runs,
    /// Acceptance its controller assumes before it has measured any.
    pub prior: f64,
    /// Its controller outlives the request: the engine keeps it (per
    /// speculative settings) for the next request that makes this drafter.
    pub keeps_controller: bool,
    pub make: MakeDrafter,
}

/// When a request runs a drafter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    /// In every request that speculates at all (whatever its mode names),
    /// when it has what the drafter needs: the grammar drafter.
    Always,
    /// When `speculative.mode` names it, or is `auto` (`in_auto`).
    Named { in_auto: bool, needs_draft_model: bool },
}

/// What the engine offers a drafter being made for a request.
pub trait DrafterHost<'m> {
    /// The request's `speculative.n_max` and `adaptive`.
    fn n_max(&self) -> usize;
    fn adaptive(&self) -> bool;
    /// Whether the request's mode is `auto` (it named no drafter): drafters
    /// that cost time are then only tried where they can pay well
    /// (`DraftController::set_cautious`).
    fn in_auto(&self) -> bool;
    /// The request's constraint (a schema, a tool call, a grammar), shared
    /// with its sampler.
    fn constraint(&self) -> Option<Rc<RefCell<Constraint>>>;
    /// The engine's shared n-gram caches: the dynamic one and the static one.
    fn ngram_caches(&self) -> (Arc<Mutex<NgramCache>>, Option<Arc<NgramCache>>);
    /// The engine's shared suffix indexes (earlier requests' outputs) and
    /// the namespace this request reads and adds to.
    fn suffix_store(&self) -> (Arc<Mutex<SuffixStore>>, String);
    /// The draft model as a drafter for this request, if one is loaded.
    fn draft_model(&mut self) -> Option<Box<dyn Drafter + 'm>>;
    /// The controller an earlier request left for the drafter `name` under
    /// this request's settings (`DrafterEntry::keeps_controller`).
    fn kept_controller(&mut self, name: &'static str) -> Option<DraftController>;
}
