//! The drafters, in one table. Each entry says what a drafter is called
//! (its word in `speculative.mode`, the `source` of the tokens it proposed
//! and its key in a result's `drafters`), when a request runs it, the
//! acceptance its controller assumes before measuring any, and how it is
//! made for a request. The request field's choices, the token sources, the
//! chain's order, the binding's `drafters()` (from which the CLI colours
//! and the docs test derive) all read this table: a new drafter is its own
//! file and one line in `DRAFTERS`.
//!
//! What an entry holds, and what the engine offers a drafter being made
//! (`DrafterHost`), is `entry`'s.

use std::sync::OnceLock;

use serde_json::{json, Value};

pub use super::entry::{DrafterEntry, DrafterHost, MakeDrafter, Runs};

/// Every drafter, in the order a request's chain tries them.
pub const DRAFTERS: &[DrafterEntry] = &[super::grammar::ENTRY, super::suffix::ENTRY, super::ngram::ENTRY, super::draft_model::ENTRY];

/// A bit per entry of `DRAFTERS`.
pub type DrafterSet = u32;

/// The drafters a request's chain is made of, in chain order: `named` is the
/// set its mode names (`None`: `auto`). `Err` names a drafter the mode asks
/// for that needs a draft model the engine does not have.
pub fn chain_for(named: Option<DrafterSet>, has_draft_model: bool) -> Result<Vec<&'static DrafterEntry>, &'static str> {
    let mut out = Vec::new();
    for (i, e) in DRAFTERS.iter().enumerate() {
        match e.runs {
            Runs::Always => out.push(e),
            Runs::Named { in_auto, needs_draft_model } => {
                let asked = named.map_or(in_auto, |set| set & (1 << i) != 0);
                if !asked {
                    continue;
                }
                if needs_draft_model && !has_draft_model {
                    if named.is_some() {
                        return Err(e.name);
                    }
                    continue;
                }
                out.push(e);
            }
        }
    }
    Ok(out)
}

/// The names a mode can take besides `auto` and `off`: every non-empty set
/// of nameable drafters, their names joined by `+` in table order
/// (`ngram`, `draft`, `ngram+draft`), each with its set.
fn named_sets() -> &'static [(&'static str, DrafterSet)] {
    static SETS: OnceLock<Vec<(&'static str, DrafterSet)>> = OnceLock::new();
    SETS.get_or_init(|| {
        let nameable: Vec<usize> = (0..DRAFTERS.len()).filter(|&i| matches!(DRAFTERS[i].runs, Runs::Named { .. })).collect();
        let mut sets: Vec<(&'static str, DrafterSet)> = Vec::new();
        for bits in 1u32..(1 << nameable.len()) {
            let members: Vec<usize> = nameable.iter().enumerate().filter(|(j, _)| bits & (1 << j) != 0).map(|(_, &i)| i).collect();
            let name = members.iter().map(|&i| DRAFTERS[i].name).collect::<Vec<_>>().join("+");
            let set = members.iter().fold(0, |s, &i| s | (1 << i));
            sets.push((Box::leak(name.into_boxed_str()), set));
        }
        // Single drafters first, then pairs, …: the short names lead.
        sets.sort_by_key(|(_, set)| set.count_ones());
        sets
    })
}

/// Every `speculative.mode` choice: `auto`, `off`, then the drafter sets.
pub fn mode_names() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| ["auto", "off"].into_iter().chain(named_sets().iter().map(|(n, _)| *n)).collect())
}

/// The set a mode name other than `auto` and `off` stands for.
pub fn set_named(name: &str) -> Option<DrafterSet> {
    named_sets().iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The name of a set `set_named` returned.
pub fn name_of_set(set: DrafterSet) -> &'static str {
    named_sets().iter().find(|(_, s)| *s == set).map_or("off", |(n, _)| n)
}

/// Every `source` a token event can carry: `target`, then each drafter's.
pub fn token_sources() -> impl Iterator<Item = &'static str> {
    std::iter::once("target").chain(DRAFTERS.iter().map(|e| e.name))
}

/// The table as the binding exports it (`drafters()`).
pub fn drafters_json() -> Value {
    DRAFTERS
        .iter()
        .map(|e| {
            let (runs, in_auto, needs) = match e.runs {
                Runs::Always => ("always", true, false),
                Runs::Named { in_auto, needs_draft_model } => ("named", in_auto, needs_draft_model),
            };
            json!({ "name": e.name, "runs": runs, "inAuto": in_auto, "needsDraftModel": needs, "prior": e.prior })
        })
        .collect::<Vec<_>>()
        .into()
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::sampling::constraint::Constraint;
    use crate::speculation::controller::DraftController;
    use crate::speculation::drafter::{Draft, Drafter};
    use crate::speculation::ngram::NgramCache;

    /// A host with everything a drafter could ask for, and a stand-in for
    /// the draft model.
    struct FullHost;
    struct StandIn;
    impl Drafter for StandIn {
        fn name(&self) -> &'static str {
            "draft"
        }
        fn draft(&mut self, _: &[i32], _: usize, _: usize) -> Option<Draft> {
            None
        }
        fn ms_per_token(&self) -> Option<f64> {
            None
        }
    }
    impl<'m> DrafterHost<'m> for FullHost {
        fn n_max(&self) -> usize {
            8
        }
        fn adaptive(&self) -> bool {
            true
        }
        fn in_auto(&self) -> bool {
            true
        }
        fn constraint(&self) -> Option<Rc<RefCell<Constraint>>> {
            let schema = json!({ "type": "object", "properties": { "a": { "type": "integer" } }, "required": ["a"] });
            let (env, _) = crate::sampling::constraint::fixtures::env();
            let compiler = crate::sampling::constraint::Compiler::new(&env).ok()?;
            Some(Rc::new(RefCell::new(compiler.compile(&crate::chat::format::json_answer(&schema)).ok()?)))
        }
        fn ngram_caches(&self) -> (Arc<Mutex<NgramCache>>, Option<Arc<NgramCache>>) {
            (Arc::default(), None)
        }
        fn suffix_store(&self) -> (Arc<Mutex<crate::speculation::suffix::SuffixStore>>, String) {
            (Arc::default(), String::new())
        }
        fn draft_model(&mut self) -> Option<Box<dyn Drafter + 'm>> {
            Some(Box::new(StandIn))
        }
        fn kept_controller(&mut self, _: &'static str) -> Option<DraftController> {
            None
        }
    }

    #[test]
    fn every_entry_makes_a_drafter_of_its_name() {
        for e in DRAFTERS {
            let (d, _) = (e.make)(e, &mut FullHost).unwrap_or_else(|| panic!("{} made nothing with everything offered", e.name));
            assert_eq!(d.name(), e.name);
            assert!(e.prior > 0.0 && e.prior < 1.0, "{}", e.name);
        }
        let names: Vec<&str> = DRAFTERS.iter().map(|e| e.name).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique);
        assert!(!names.contains(&"target") && !names.iter().any(|n| n.contains('+')));
    }

    #[test]
    fn mode_names_are_the_wire_names() {
        assert_eq!(
            mode_names(),
            ["auto", "off", "suffix", "ngram", "draft", "suffix+ngram", "suffix+draft", "ngram+draft", "suffix+ngram+draft"]
        );
        for name in &mode_names()[2..] {
            assert_eq!(name_of_set(set_named(name).unwrap()), *name);
        }
        assert_eq!(set_named("draft+ngram"), None);
        assert_eq!(set_named("grammar"), None, "the grammar drafter is not named: it runs whenever a request speculates");
        assert_eq!(token_sources().collect::<Vec<_>>(), ["target", "grammar", "suffix", "ngram", "draft"]);
    }

    #[test]
    fn chains_follow_the_mode_and_the_draft_model() {
        let names = |c: Vec<&DrafterEntry>| c.iter().map(|e| e.name).collect::<Vec<_>>();
        assert_eq!(names(chain_for(None, true).unwrap()), ["grammar", "suffix", "ngram", "draft"]);
        assert_eq!(names(chain_for(None, false).unwrap()), ["grammar", "suffix", "ngram"]);
        assert_eq!(names(chain_for(set_named("ngram"), false).unwrap()), ["grammar", "ngram"]);
        assert_eq!(chain_for(set_named("draft"), false).err(), Some("draft"));
        assert_eq!(chain_for(set_named("ngram+draft"), false).err(), Some("draft"));
        assert_eq!(names(chain_for(set_named("draft"), true).unwrap()), ["grammar", "draft"]);
    }
}
