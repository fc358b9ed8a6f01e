//! The n-gram ceiling for `npm run bench`: the speed-up an oracle prompt-lookup
//! drafter would get on a greedy output if it knew in advance how many of its
//! drafted tokens the target accepts.
//!
//! Reads one JSON object on stdin:
//!
//! ```json
//! { "prompt": [ids], "output": [ids], "batch_ms": [null, t1, t2, ..., t16], "n_max": 16 }
//! ```
//!
//! `output` is the greedy output of the target (its first token comes from the
//! prompt pass, as in the engine; every later token costs a target pass);
//! `batch_ms[n]` the measured cost of a target batch of n tokens (null where
//! not measured: interpolated linearly between measured sizes, extrapolated
//! from the last two beyond the largest). Prints
//! `{ "ceiling": x, "steps": n, "drafted": n, ... }`.
//!
//! The replay: the history starts as prompt + first output token, with a
//! context n-gram cache over it (`NgramParams::default()`, empty dynamic and
//! static caches: a fresh engine). At each position the drafter drafts up to
//! `n_max` tokens; `a` is the length of the draft's prefix equal to the actual
//! next output tokens (at most the tokens left minus one, the bonus token).
//! Verifying those `a` tokens yields a+1 tokens for t(a+1), against
//! (a+1)·t(1) plainly: the oracle drafts exactly them when t(a+1) <
//! (a+1)·t(1), and otherwise decodes one token plainly. The context cache is
//! updated incrementally with the tokens each step adds, as the drafter does.
//! ceiling = N·t(1) / total cost, N = the tokens produced by target passes.
//!
//! `policy` is the engine's own choice replayed on the same output and priced
//! the same way (the lookup drafts up to n_max, the adaptive controller picks
//! how much of it to verify from each token's class, the target accepts the
//! prefix that matches): what the engine would reach on a machine without
//! timing noise. `policy / ceiling` is the controller's loss to the oracle.
//!
//! cargo build --release --example ngram_ceiling
//! echo '{...}' | target/release/examples/ngram_ceiling

use std::io::Read;

mod replay;

use replay::{oracle, policy, Prices};
use serde_json::{json, Value};

fn ids(v: &Value, field: &str) -> Result<Vec<i32>, String> {
    v.get(field)
        .and_then(Value::as_array)
        .ok_or(format!("{field}: an array of token ids is required"))?
        .iter()
        .map(|x| x.as_i64().map(|t| t as i32).ok_or(format!("{field}: not a token id: {x}")))
        .collect()
}

fn run(input: &Value) -> Result<Value, String> {
    let prompt = ids(input, "prompt")?;
    let output = ids(input, "output")?;
    let batch_ms: Vec<Option<f64>> =
        input.get("batch_ms").and_then(Value::as_array).ok_or("batch_ms: an array is required")?.iter().map(Value::as_f64).collect();
    let n_max = input.get("n_max").and_then(Value::as_u64).unwrap_or(16) as usize;
    let prices = Prices::new(&batch_ms)?;
    let o = oracle(&prompt, &output, &prices, n_max);
    Ok(json!({
        "ceiling": o.ceiling,
        "policy": policy(&prompt, &output, &prices, n_max),
        "steps": o.steps,
        "drafted": o.drafted,
        "tokens": o.tokens,
        "matched": o.matched,
        "oracle_ms": o.total_ms,
        "plain_ms": o.tokens as f64 * prices.t(1),
        "t": (1..=n_max + 1).map(|k| prices.t(k)).collect::<Vec<f64>>(),
    }))
}

fn main() {
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("ngram_ceiling: cannot read stdin: {e}");
        std::process::exit(2);
    }
    let input: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("ngram_ceiling: bad JSON: {e}");
            std::process::exit(2);
        }
    };
    match run(&input) {
        Ok(out) => println!("{out}"),
        Err(e) => {
            eprintln!("ngram_ceiling: {e}");
            std::process::exit(2);
        }
    }
}
