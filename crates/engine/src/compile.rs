//! Constraints compiled off the engine thread. A schema or a tool list is
//! compiled by llguidance once per distinct grammar (later requests copy
//! it); even bounded (`core::json::schema`, `ParserLimits`) a compile
//! can take a good part of a second, and on the engine thread that would
//! be a second without tokens for every other request. So a request whose
//! constraint is not compiled yet goes to this thread and comes back to the
//! front of the queue with it; the engine thread goes on stepping.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc};

use super::shared::{Job, Shared};
use llama_engine_core::error::{EngineError, Result};
use llama_engine_core::sampling::constraint::{Compiler, Constraint, Grammar};

/// Why a grammar does not compile, named at the request's field (and the
/// tool or place in the schema, when that can be found).
pub type Locate = fn(&Compiler, &str, &Job, String) -> EngineError;

struct Task {
    job: Job,
    grammar: Grammar,
    field: &'static str,
}

/// The compiling thread of one engine. Dropping it ends the thread once it
/// has finished what it is compiling.
pub struct CompileThread {
    tx: mpsc::Sender<Task>,
}

impl CompileThread {
    pub fn start(compiler: Compiler, shared: Arc<Shared>, locate: Locate) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Task>();
        std::thread::Builder::new()
            .name("llama-engine-compile".into())
            .spawn(move || {
                for Task { mut job, grammar, field } in rx {
                    let compiled = catch_unwind(AssertUnwindSafe(|| compile(&compiler, &grammar, field, &job, locate)))
                        .unwrap_or_else(|panic| Err(EngineError::from_panic(&*panic)));
                    job.compiled = Some(compiled.map(|c| (grammar, c)));
                    if let Err(job) = shared.resubmit(job) {
                        job.sink.finish(Err(EngineError::disposed()));
                    }
                }
            })
            .map_err(|e| EngineError::internal(format!("cannot start the compiling thread: {e}")))?;
        Ok(CompileThread { tx })
    }

    /// Compiles `job`'s constraint, then queues the job again, first.
    pub fn submit(&self, job: Job, grammar: Grammar, field: &'static str) -> std::result::Result<(), Box<Job>> {
        self.tx.send(Task { job, grammar, field }).map_err(|e| Box::new(e.0.job))
    }
}

/// A schema title that, with LLAMA_ENGINE_FAULT_INJECTION=1 (the test
/// suite), makes its grammar's compile take 3 s more: a compile that takes seconds,
/// whatever the machine, for the test that the engine thread goes on
/// stepping meanwhile.
const SLOW_COMPILE_TITLE: &str = "__llama_engine_slow_compile__";

fn compile(compiler: &Compiler, grammar: &Grammar, field: &str, job: &Job, locate: Locate) -> Result<Constraint> {
    let marked = || match grammar {
        Grammar::JsonSchema(schema) => schema.to_string().contains(SLOW_COMPILE_TITLE),
        Grammar::Lark(lark) | Grammar::LarkAfter(lark, _) => lark.contains(SLOW_COMPILE_TITLE),
    };
    if std::env::var("LLAMA_ENGINE_FAULT_INJECTION").is_ok_and(|v| v == "1") && marked() {
        std::thread::sleep(std::time::Duration::from_secs(3));
    }
    compiler.compile(grammar).map_err(|why| locate(compiler, field, job, why))
}
