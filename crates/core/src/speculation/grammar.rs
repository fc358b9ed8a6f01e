//! The grammar drafter: the canonical tokens of what a request's constraint
//! forces (braces, quotes, key names, the rest of an enum value, a tool
//! call's closing tag; see `core::sampling::forced`) are proposed as a draft
//! and verified like any other. The constraint forces the same tokens in
//! the sampler, so a draft is rejected only where the tokenizer cut forced
//! text differently in the middle (then it costs what its controller
//! measured).

use std::cell::RefCell;
use std::rc::Rc;

use super::controller::DraftController;
use super::drafter::{Draft, Drafter};
use super::entry::{DrafterEntry, DrafterHost, Runs};
use crate::sampling::constraint::Constraint;
use crate::text::events::TokenSource;

/// In every speculating request that has a constraint, first in its chain.
/// Its prior: the sampler forces the same tokens, but the tokenizer may cut
/// the rest of forced text differently once its first token is written.
pub const ENTRY: DrafterEntry = DrafterEntry { name: "grammar", runs: Runs::Always, prior: 0.9, keeps_controller: false, make };

fn make<'m>(e: &DrafterEntry, host: &mut dyn DrafterHost<'m>) -> Option<(Box<dyn Drafter + 'm>, DraftController)> {
    let constraint = host.constraint()?;
    let ctl = DraftController::new(host.n_max(), host.adaptive(), e.prior).with_loss_check(false);
    Some((Box::new(GrammarDrafter::new(constraint)), ctl))
}

pub struct GrammarDrafter {
    constraint: Rc<RefCell<Constraint>>,
}

impl GrammarDrafter {
    /// `constraint` is the request's own (with its tokenizer), shared with its sampler.
    pub fn new(constraint: Rc<RefCell<Constraint>>) -> Self {
        GrammarDrafter { constraint }
    }
}

impl Drafter for GrammarDrafter {
    fn name(&self) -> &'static str {
        ENTRY.name
    }

    fn draft(&mut self, _history: &[i32], n_max: usize, _position: usize) -> Option<Draft> {
        let tokens = self.constraint.borrow_mut().forced(n_max);
        (!tokens.is_empty()).then(|| Draft::new(tokens, TokenSource(ENTRY.name), Vec::new()))
    }

    fn is_cheap(&self) -> bool {
        true
    }

    fn ms_per_token(&self) -> Option<f64> {
        // A few microseconds for the forced bytes and their tokenisation.
        Some(0.005)
    }
}
