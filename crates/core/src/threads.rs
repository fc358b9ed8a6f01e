//! How many threads a decoding step computes with. All of them is fastest
//! on a machine with nothing else to do; on one busy with other work (a
//! browser and an IDE, a second engine, the parent of an isolated engine),
//! the threads of one step wait for each other at ggml's barriers whenever
//! the scheduler takes one away, and a single thread — which never waits —
//! can be much faster (measured: beside a second engine process, one thread
//! each ran 2.8× faster than two each).
//!
//! So the engine measures: each step's time against what a step of its size
//! cost at load (`reference`). With all threads, a run of steps slower than
//! the best it has seen makes it try one thread for a few steps; whichever
//! was faster over those steps stays, and the other is tried again later
//! (sooner when the machine's state seems to have changed, then less and
//! less often while the same choice keeps winning). The thread count does
//! not change results: every kernel computes each value the same way
//! whatever the number of threads (`__test__/exactness.test.js`).

/// Steps a mode's recent speed is the median of.
const WINDOW: usize = 8;
/// Steps with all threads this much slower than the best seen mean the
/// machine is busy: look at one thread.
const SLOW: f64 = 1.4;
/// Steps a mode runs for, when it is tried, before the two are compared.
const PROBE_STEPS: u32 = 8;
/// Steps before the first look, and the longest wait between two.
const FIRST_LOOK: u32 = 32;
const LONGEST_WAIT: u32 = 4096;
/// Steps with more tokens than this are not compared (a prompt chunk
/// scales with threads differently from a decoding step).
const MAX_TOKENS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    All,
    One,
}

#[derive(Debug, Clone)]
pub struct ThreadGovernor {
    max: usize,
    mode: Mode,
    /// Step time / reference of each mode's last `WINDOW` steps since it
    /// was last entered (All, One).
    recent: [std::collections::VecDeque<f64>; 2],
    /// The smoothed level of all threads, and the lowest it has been: the
    /// machine idle.
    typical_all: Option<f64>,
    best_all: Option<f64>,
    /// Steps measured in the current mode since it was entered.
    steps: u32,
    /// Whether the current mode is on trial (it ends after `PROBE_STEPS`),
    /// and whether slow steps started it.
    trial: bool,
    slow_trial: bool,
    /// All threads looked slow once: measured again before a trial.
    suspect: bool,
    /// One thread's level when it was last chosen.
    one_chosen_at: Option<f64>,
    /// Steps until the other mode is tried again; how long the wait after
    /// the next trial that keeps the current choice is.
    wait: u32,
    next_wait: u32,
    switches: u64,
}

impl ThreadGovernor {
    pub fn new(max: usize) -> Self {
        ThreadGovernor {
            max: max.max(1),
            mode: Mode::All,
            recent: [Default::default(), Default::default()],
            typical_all: None,
            best_all: None,
            steps: 0,
            trial: false,
            slow_trial: false,
            suspect: false,
            one_chosen_at: None,
            wait: FIRST_LOOK,
            next_wait: 256,
            switches: 0,
        }
    }

    /// Threads the next step computes with.
    pub fn threads(&self) -> usize {
        self.threads_of(self.mode)
    }

    /// Threads a step of `tokens` computes with. A step too large to be
    /// compared (a prompt chunk) runs with the chosen count, not with the
    /// one on trial: a trial starting near the end of one request once ran
    /// the whole prompt of the next with one thread, twice as slow (its
    /// chunks are not measured, so the trial could not end before it).
    pub fn threads_for(&self, tokens: usize) -> usize {
        if self.trial && tokens > MAX_TOKENS {
            self.threads_of(other(self.mode))
        } else {
            self.threads()
        }
    }

    fn threads_of(&self, mode: Mode) -> usize {
        match mode {
            Mode::All => self.max,
            Mode::One => 1,
        }
    }

    /// How many times the thread count changed.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// A step of `tokens` took `ms`; a step of that size cost `reference`
    /// ms with all threads when the engine loaded.
    pub fn observe(&mut self, tokens: usize, ms: f64, reference: Option<f64>) {
        if self.max == 1 || tokens > MAX_TOKENS || !ms.is_finite() || ms <= 0.0 {
            return;
        }
        let Some(reference) = reference.filter(|r| *r > 0.0) else { return };
        let r = ms / reference;
        let window = &mut self.recent[self.mode as usize];
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(r);
        self.steps += 1;
        let all_now = self.level(Mode::All);
        if let (Mode::All, Some(level), WINDOW) = (self.mode, all_now, self.recent[0].len()) {
            // The idle reference: the lowest the smoothed level has been (a
            // smoothed level, since the lowest of noisy ones is too low).
            let typical = self.typical_all.map_or(level, |t| t + 0.1 * (level - t));
            self.typical_all = Some(typical);
            self.best_all = Some(self.best_all.map_or(typical, |b| b.min(typical)));
        }
        if self.trial {
            if self.steps >= PROBE_STEPS {
                self.decide();
            }
            return;
        }
        self.wait = self.wait.saturating_sub(1);
        let slow = self.mode == Mode::All
            && self.recent[0].len() == WINDOW
            && matches!((all_now, self.best_all), (Some(now), Some(best)) if now > SLOW * best);
        // One thread running much faster than when it was chosen: the other
        // work may be gone, look at all threads now.
        let freed = self.mode == Mode::One
            && self.recent[1].len() == WINDOW
            && matches!((self.level(Mode::One), self.one_chosen_at), (Some(now), Some(then)) if now < then / SLOW);
        if !slow && self.recent[0].len() == WINDOW {
            self.suspect = false;
        }
        if slow && !self.suspect {
            // Slow: measure all threads afresh over a whole window first,
            // so that the comparison is with how they run now.
            self.suspect = true;
            self.recent[0].clear();
        } else if self.wait == 0 || slow || freed {
            self.try_other(slow || freed);
        }
    }

    /// How fast a mode ran lately: the median of its recent steps (one slow
    /// step — a page fault, a timer — does not move it).
    fn level(&self, mode: Mode) -> Option<f64> {
        let mut w: Vec<f64> = self.recent[mode as usize].iter().copied().collect();
        if w.is_empty() {
            return None;
        }
        w.sort_by(f64::total_cmp);
        Some(w[w.len() / 2])
    }

    /// Runs the other mode on trial.
    fn try_other(&mut self, because_slow: bool) {
        self.suspect = false;
        self.mode = other(self.mode);
        self.recent[self.mode as usize].clear();
        self.steps = 0;
        self.trial = true;
        self.slow_trial = because_slow;
        self.switches += 1;
    }

    /// After a trial: the faster mode stays.
    fn decide(&mut self) {
        self.trial = false;
        let on_trial = self.mode;
        let one_level = self.level(Mode::One);
        let winner = match (self.level(Mode::All), one_level) {
            (Some(all), Some(one)) if one < all => Mode::One,
            (Some(_), Some(_)) => Mode::All,
            _ => on_trial,
        };
        if winner != on_trial {
            // Back to the mode before the trial, measured afresh.
            self.mode = winner;
            self.recent[winner as usize].clear();
            self.steps = 0;
            self.switches += 1;
        }
        if winner == Mode::All && self.slow_trial {
            // Slower than idle, but one thread is no better: this is the
            // level to be slow against now (it falls again when idle).
            self.best_all = self.level(Mode::All);
            self.typical_all = self.best_all;
        }
        if winner == Mode::One {
            self.one_chosen_at = one_level;
        }
        if winner == on_trial {
            // The machine changed: look again soon.
            self.wait = 256;
            self.next_wait = 512;
        } else {
            // The same choice again: look less and less often.
            self.wait = self.next_wait;
            self.next_wait = (self.next_wait * 2).min(LONGEST_WAIT);
        }
    }
}

fn other(mode: Mode) -> Mode {
    match mode {
        Mode::All => Mode::One,
        Mode::One => Mode::All,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_chunk_during_a_trial_runs_with_the_chosen_count() {
        let mut g = ThreadGovernor::new(2);
        // Idle machine: the first look tries one thread after FIRST_LOOK steps.
        let mut n = 0;
        while !g.trial {
            g.observe(1, 10.0, Some(10.0));
            n += 1;
            assert!(n < 1000, "no trial started");
        }
        assert_eq!(g.threads(), 1, "on trial: one thread for decoding steps");
        assert_eq!(g.threads_for(1), 1);
        assert_eq!(g.threads_for(MAX_TOKENS), 1);
        // The next request's prompt arrives mid-trial: all threads.
        assert_eq!(g.threads_for(512), 2);
        // Prompt chunks do not end the trial; decoding steps do, and the
        // faster mode stays (all threads, twice as fast here).
        g.observe(512, 400.0, Some(200.0));
        assert!(g.trial);
        for _ in 0..PROBE_STEPS {
            g.observe(1, 20.0, Some(10.0));
        }
        assert!(!g.trial);
        assert_eq!((g.threads(), g.threads_for(512)), (2, 2));
    }

    /// Runs `steps` decoding steps whose time is `all` ms with all threads
    /// and `one` ms with one (reference 10 ms); returns the share of steps
    /// run with one thread and the total time.
    fn run(g: &mut ThreadGovernor, steps: usize, all: f64, one: f64) -> (f64, f64) {
        let (mut ones, mut total) = (0, 0.0);
        for _ in 0..steps {
            let ms = if g.threads() == 1 { one } else { all };
            ones += usize::from(g.threads() == 1);
            total += ms;
            g.observe(1, ms, Some(10.0));
        }
        (ones as f64 / steps as f64, total)
    }

    #[test]
    fn idle_keeps_all_threads_and_pays_little_for_looking() {
        let mut g = ThreadGovernor::new(2);
        let (one_share, total) = run(&mut g, 20_000, 10.0, 16.0);
        assert!(one_share < 0.02, "{one_share}");
        assert!(total < 20_000.0 * 10.0 * 1.012, "{total}");
        // Steps that jitter (±40 %, the odd 5× outlier) change nothing.
        let mut g = ThreadGovernor::new(2);
        let mut seed = 12345u64;
        let mut ones = 0;
        for i in 0..20_000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let jitter = 0.6 + 0.8 * ((seed >> 33) as f64 / (1u64 << 31) as f64);
            let base = if g.threads() == 1 { 16.0 } else { 10.0 };
            let ms = if i % 97 == 0 { base * 5.0 } else { base * jitter };
            ones += usize::from(g.threads() == 1);
            g.observe(1, ms, Some(10.0));
        }
        assert!(ones < 600, "{ones}");
    }

    #[test]
    fn a_busy_machine_moves_to_one_thread_and_back_when_it_is_idle_again() {
        let mut g = ThreadGovernor::new(2);
        run(&mut g, 500, 10.0, 16.0);
        assert_eq!(g.threads(), 2);
        // Another engine starts: two threads now take 35 ms a step, one 18.
        let (one_share, _) = run(&mut g, 2_000, 35.0, 18.0);
        assert!(one_share > 0.9, "{one_share}");
        assert_eq!(g.threads(), 1);
        // It stops: all threads are faster again, and taken back.
        let (one_share, _) = run(&mut g, 6_000, 10.0, 16.0);
        assert_eq!(g.threads(), 2);
        assert!(one_share < 0.4, "{one_share}");
    }

    #[test]
    fn busy_from_the_start_is_found_by_the_first_look() {
        let mut g = ThreadGovernor::new(4);
        let (one_share, _) = run(&mut g, 1_000, 30.0, 20.0);
        assert_eq!(g.threads(), 1);
        assert!(one_share > 0.9, "{one_share}");
    }

    #[test]
    fn one_configured_thread_or_big_steps_are_left_alone() {
        let mut g = ThreadGovernor::new(1);
        run(&mut g, 1_000, 30.0, 20.0);
        assert_eq!((g.threads(), g.switches()), (1, 0));
        let mut g = ThreadGovernor::new(2);
        for _ in 0..1_000 {
            g.observe(128, 500.0, Some(100.0));
            g.observe(1, f64::NAN, Some(10.0));
            g.observe(1, 10.0, None);
        }
        assert_eq!((g.threads(), g.switches()), (2, 0));
    }
}
