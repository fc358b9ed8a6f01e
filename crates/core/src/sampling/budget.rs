//! `reasoning_budget`: at most so many tokens of thinking. Once a thinking
//! block has used its budget (and the last token completed a UTF-8
//! character), the family's end of thinking is forced token by token and the
//! answer goes on, as llama.cpp's reasoning-budget sampler does. A new
//! thinking block gets a new budget.
//!
//! The state moves only with tokens the request keeps (the sampler's
//! `accept`), so drafted tokens are checked against the state their
//! position would see: speculation changes nothing.

/// A thinking block's markers and the budget, from the chat plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetPlan {
    /// Tokens of thinking allowed per block (0: the block is closed at once).
    pub budget: u32,
    pub start: String,
    pub end: String,
    /// The prompt has opened the thinking already.
    pub open: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Outside thinking: watching for its start.
    Idle,
    Counting,
    /// The budget is spent; the last token ended inside a character.
    WaitingUtf8,
    /// Forcing the end of thinking: the next is `end[pos]`.
    Forcing(usize),
}

#[derive(Debug, Clone)]
pub struct ReasoningBudget {
    start: Vec<i32>,
    end: Vec<i32>,
    budget: u32,
    remaining: u32,
    state: State,
    /// The last tokens kept, to find the markers in (as long as the longest).
    recent: Vec<i32>,
}

impl ReasoningBudget {
    /// `start` and `end` are the markers' tokens; `end` must not be empty.
    pub fn new(start: Vec<i32>, end: Vec<i32>, budget: u32, open: bool) -> Option<ReasoningBudget> {
        if end.is_empty() {
            return None;
        }
        let mut b = ReasoningBudget { start, end, budget, remaining: budget, state: State::Idle, recent: Vec::new() };
        if open {
            b.begin();
        }
        Some(b)
    }

    fn begin(&mut self) {
        self.remaining = self.budget;
        self.recent.clear();
        self.state = if self.budget == 0 { State::Forcing(0) } else { State::Counting };
    }

    /// The token the next position must be, while the end is forced.
    pub fn forced(&self) -> Option<i32> {
        match self.state {
            State::Forcing(i) => self.end.get(i).copied(),
            _ => None,
        }
    }

    fn ends_with(&self, marker: &[i32]) -> bool {
        !marker.is_empty() && self.recent.ends_with(marker)
    }

    /// Records a kept token; `completes` says whether it ends a UTF-8
    /// character (it does unless its bytes stop part-way through one).
    pub fn accept(&mut self, token: i32, completes: bool) {
        let keep = self.start.len().max(self.end.len());
        self.recent.push(token);
        if self.recent.len() > keep {
            self.recent.remove(0);
        }
        match self.state {
            State::Idle => {
                if self.ends_with(&self.start) {
                    self.begin();
                }
            }
            State::Counting | State::WaitingUtf8 => {
                if self.ends_with(&self.end) {
                    self.state = State::Idle;
                    self.recent.clear();
                    return;
                }
                if self.state == State::Counting {
                    self.remaining = self.remaining.saturating_sub(1);
                }
                if self.remaining == 0 {
                    // Forced from where the end marker already stands (a
                    // token of it may be the one that spent the budget).
                    let k = (1..self.end.len()).rev().find(|&k| self.recent.ends_with(&self.end[..k])).unwrap_or(0);
                    self.state = if completes { State::Forcing(k) } else { State::WaitingUtf8 };
                }
            }
            State::Forcing(i) => {
                self.state = if i + 1 >= self.end.len() { State::Idle } else { State::Forcing(i + 1) };
                if self.state == State::Idle {
                    self.recent.clear();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: [i32; 1] = [100];
    const END: [i32; 2] = [101, 102];

    fn run(b: &mut ReasoningBudget, model: &[i32]) -> Vec<i32> {
        // The "model" writes `model` in order; forced tokens replace its choice.
        let mut out = Vec::new();
        let mut it = model.iter();
        for _ in 0..model.len() + END.len() {
            let t = match b.forced() {
                Some(f) => f,
                None => match it.next() {
                    Some(&t) => t,
                    None => break,
                },
            };
            b.accept(t, true);
            out.push(t);
        }
        out
    }

    #[test]
    fn forces_the_end_at_the_budget_and_goes_on() {
        let mut b = ReasoningBudget::new(START.to_vec(), END.to_vec(), 3, true).unwrap();
        let out = run(&mut b, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(out, [1, 2, 3, 101, 102, 4, 5, 6]);
    }

    #[test]
    fn a_natural_end_stops_counting_and_a_new_block_gets_a_new_budget() {
        let mut b = ReasoningBudget::new(START.to_vec(), END.to_vec(), 3, false).unwrap();
        // Not thinking: nothing forced.
        assert_eq!(run(&mut b, &[7, 8, 9]), [7, 8, 9]);
        // A block that ends by itself within budget.
        assert_eq!(run(&mut b, &[100, 1, 101, 102, 5]), [100, 1, 101, 102, 5]);
        // A second block over budget.
        assert_eq!(run(&mut b, &[100, 1, 2, 3, 4]), [100, 1, 2, 3, 101, 102, 4]);
        // The budget spent on the end marker's first token: only its rest is forced.
        let mut b = ReasoningBudget::new(START.to_vec(), END.to_vec(), 2, true).unwrap();
        b.accept(1, true);
        b.accept(101, true);
        assert_eq!(b.forced(), Some(102));
        b.accept(102, true);
        assert_eq!(b.forced(), None);
    }

    #[test]
    fn zero_closes_the_block_at_once_and_a_cut_character_is_finished_first() {
        let b = ReasoningBudget::new(START.to_vec(), END.to_vec(), 0, true).unwrap();
        assert_eq!(b.forced(), Some(101));
        let mut b = ReasoningBudget::new(START.to_vec(), END.to_vec(), 1, true).unwrap();
        b.accept(0xE2, false);
        assert_eq!(b.forced(), None);
        b.accept(0x82, false);
        assert_eq!(b.forced(), None);
        b.accept(0xAC, true);
        assert_eq!(b.forced(), Some(101));
        assert!(ReasoningBudget::new(START.to_vec(), Vec::new(), 1, true).is_none());
    }
}
