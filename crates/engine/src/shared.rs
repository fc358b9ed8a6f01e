//! What the handle (`Engine`, on the JS thread) and the engine thread share,
//! in one type: the job queue and the cancel flags of running requests,
//! the n-gram caches, what the thread publishes for `status()`, and whether
//! the thread has exited. Everything here is behind its own lock, held
//! briefly; nothing here touches llama.cpp.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use std::path::PathBuf;

use llama_cpp_2::token::LlamaToken;
use serde_json::Value;

use super::embed::EmbedJob;
use llama_engine_core::cache::prompt_cache::CacheStats;
use llama_engine_core::cache::session::Session;
use llama_engine_core::chat::format::ChatPlan;
use llama_engine_core::error::EngineError;
use llama_engine_core::request::CompletionRequest;
use llama_engine_core::sampling::constraint::{Constraint, Grammar};
use llama_engine_core::speculation::ngram::NgramCache;
use llama_engine_core::speculation::suffix::SuffixStore;
use llama_engine_core::text::events::EventSink;

/// A request on its way to a slot: the validated request, where its events
/// go, and the flag that cancels it; for a session job, what to do with it.
pub struct Job {
    pub id: u64,
    /// What the caller sent, parsed and checked (a chat request's messages
    /// rendered into its prompt by then).
    pub request: CompletionRequest,
    /// What preparing it decided: how its output is read and constrained.
    pub plan: ChatPlan,
    pub sink: Box<dyn EventSink>,
    pub cancel: Arc<AtomicBool>,
    pub session: Option<SessionJob>,
    /// Its constraint, once the compiling thread compiled it (or why it
    /// could not), with the grammar it was compiled from.
    pub compiled: Option<Result<(Grammar, Constraint), EngineError>>,
    /// Its prompt's tokens, when the preparing thread tokenized it.
    pub tokens: Option<Vec<LlamaToken>>,
    /// Its images and audio, encoded, where they stand in `tokens`.
    pub media: Vec<crate::media::MediaSpan>,
    /// Time the preparing thread spent encoding them.
    pub encode_ms: f64,
}

/// The session jobs: they take a slot like a request, and answer with
/// `EventSink::reply`.
pub enum SessionJob {
    /// The request (its prompt, `n_predict` 0) is evaluated into a slot,
    /// then the slot's cells are written to `path` with `conversation`.
    Save { path: PathBuf, conversation: Value },
    /// A checked session file's cells go into a free slot, or into that
    /// idle slot.
    Load(Box<Session>, Option<usize>),
    /// What an idle slot holds is written to `path`.
    SaveSlot { slot: usize, path: PathBuf },
    /// An idle slot's cells are dropped.
    EraseSlot { slot: usize },
}

/// The n-gram caches and the suffix index shared by every request of an
/// engine.
#[derive(Clone, Default)]
pub struct NgramStore {
    pub dynamic: Arc<Mutex<NgramCache>>,
    pub fixed: Option<Arc<NgramCache>>,
    /// Earlier requests' outputs, for the suffix drafter, by namespace
    /// (capped together by `suffixCacheTokens`, oldest dropped first).
    pub suffix: Arc<Mutex<SuffixStore>>,
    /// The namespace of requests that name none (`suffixNamespace`).
    pub suffix_namespace: String,
}

/// What the engine thread publishes after each step, for `status()`.
#[derive(Debug, Clone, Default)]
pub struct Published {
    /// Measured cost (ms) of a target batch of n tokens, index n.
    pub batch_cost_ms: Vec<Option<f64>>,
    /// Measured cost (ms) of one draft-model step.
    pub draft_step_ms: Option<f64>,
    /// Tokens held in the slots' KV caches.
    pub tokens_cached: usize,
    /// The host-memory prompt cache.
    pub prompt_cache: CacheStats,
    /// Threads a step computes with now (`core::threads`).
    pub threads_in_use: usize,
    /// The target's decoding steps so far, and the slots they served (summed).
    pub decodes: u64,
    pub decoded_slots: u64,
    /// Each slot, in order.
    pub slots: Vec<SlotStatus>,
}

/// A slot as `status().slots` (and the server's `/slots`) report it.
#[derive(Debug, Clone, Default)]
pub struct SlotStatus {
    /// The request in it (its id), if any.
    pub request: Option<u64>,
    pub prompt_tokens: usize,
    pub predicted: usize,
    /// Tokens its KV stream holds.
    pub cached: usize,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// `embed()` calls, computed a chunk at a time between steps.
    embeds: VecDeque<EmbedJob>,
    /// Requests in a slot, with their cancel flags.
    running: HashMap<u64, Arc<AtomicBool>>,
    /// Requests handed to the preparing thread, not yet queued (counted as
    /// queued), with their cancel flags.
    preparing: HashMap<u64, Arc<AtomicBool>>,
    closed: bool,
}

/// Why a prepared job was not queued: it is given back to be answered.
pub enum NotQueued {
    Closed(Box<Job>),
    Aborted(Box<Job>),
}

/// Queue counts for `status()`.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueCounts {
    pub queued: usize,
    pub active: usize,
    pub closed: bool,
}

#[derive(Default)]
pub struct Shared {
    queue: Mutex<Queue>,
    /// Notified when a job is queued or the queue closes.
    wake: Condvar,
    published: Mutex<Published>,
    pub ngram: NgramStore,
    /// Set (and `exit` notified) when the engine thread has ended and freed
    /// its models.
    exited: Mutex<bool>,
    exit: Condvar,
}

/// A poisoned lock means a panic happened while it was held; the engine
/// thread catches its panics and every structure here stays consistent, so
/// poisoning is no reason to fail.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn new(ngram: NgramStore) -> Self {
        Shared { ngram, ..Default::default() }
    }

    /// Queues a job; gives it back when the engine is closed.
    pub fn submit(&self, job: Job) -> Result<(), Box<Job>> {
        let mut q = lock(&self.queue);
        if q.closed {
            return Err(Box::new(job));
        }
        q.jobs.push_back(job);
        drop(q);
        self.wake.notify_one();
        Ok(())
    }

    /// A request is being prepared (`engine::prepare`): `abort` finds it by
    /// `id`. False when the engine is closed.
    pub fn begin_preparing(&self, id: u64, cancel: Arc<AtomicBool>) -> bool {
        let mut q = lock(&self.queue);
        if q.closed {
            return false;
        }
        q.preparing.insert(id, cancel);
        true
    }

    /// A request whose preparation failed is forgotten.
    pub fn end_preparing(&self, id: u64) {
        lock(&self.queue).preparing.remove(&id);
    }

    /// Queues a prepared job, unless the engine closed or the job was
    /// aborted while it was prepared.
    pub fn submit_prepared(&self, job: Job) -> Result<(), NotQueued> {
        let mut q = lock(&self.queue);
        q.preparing.remove(&job.id);
        if q.closed {
            return Err(NotQueued::Closed(Box::new(job)));
        }
        if job.cancel.load(Ordering::SeqCst) {
            return Err(NotQueued::Aborted(Box::new(job)));
        }
        q.jobs.push_back(job);
        drop(q);
        self.wake.notify_one();
        Ok(())
    }

    /// Puts a job that `next_job` handed out back at the front of the queue
    /// (its constraint compiled); gives it back when the engine is closed.
    pub fn resubmit(&self, job: Job) -> Result<(), Box<Job>> {
        let mut q = lock(&self.queue);
        if q.closed {
            q.running.remove(&job.id);
            return Err(Box::new(job));
        }
        q.running.remove(&job.id);
        q.jobs.push_front(job);
        drop(q);
        self.wake.notify_one();
        Ok(())
    }

    /// Aborts job `id`: a running one is flagged (it stops within one
    /// step); a queued one leaves the queue and is returned, for the caller
    /// to answer.
    pub fn abort(&self, id: u64) -> Option<Job> {
        let mut q = lock(&self.queue);
        if let Some(cancel) = q.running.get(&id).or_else(|| q.preparing.get(&id)) {
            cancel.store(true, Ordering::SeqCst);
            return None;
        }
        let pos = q.jobs.iter().position(|j| j.id == id)?;
        q.jobs.remove(pos)
    }

    /// Flags every running request; queued ones are untouched.
    pub fn cancel_running(&self) {
        for cancel in lock(&self.queue).running.values() {
            cancel.store(true, Ordering::SeqCst);
        }
    }

    /// The next queued job, now counted as running; with `wait`, blocks
    /// until one is queued. `None` once the engine is closed (or, without
    /// `wait`, when the queue is empty).
    pub fn next_job(&self, wait: bool) -> Option<Job> {
        let mut q = lock(&self.queue);
        loop {
            if q.closed {
                return None;
            }
            if let Some(job) = q.jobs.pop_front() {
                q.running.insert(job.id, job.cancel.clone());
                return Some(job);
            }
            if !wait || !q.embeds.is_empty() {
                return None;
            }
            q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A request that `next_job` handed out is over.
    pub fn request_ended(&self, id: u64) {
        lock(&self.queue).running.remove(&id);
    }

    /// Queues an `embed()` call; gives it back when the engine is closed.
    pub fn submit_embed(&self, job: EmbedJob) -> Result<(), Box<EmbedJob>> {
        let mut q = lock(&self.queue);
        if q.closed {
            return Err(Box::new(job));
        }
        q.embeds.push_back(job);
        drop(q);
        self.wake.notify_one();
        Ok(())
    }

    /// The `embed()` call to work on next (not waiting).
    pub fn next_embed(&self) -> Option<EmbedJob> {
        let mut q = lock(&self.queue);
        if q.closed {
            return None;
        }
        q.embeds.pop_front()
    }

    /// Puts an unfinished `embed()` call back at the front; gives it back
    /// when the engine is closed.
    pub fn resubmit_embed(&self, job: EmbedJob) -> Result<(), Box<EmbedJob>> {
        let mut q = lock(&self.queue);
        if q.closed {
            return Err(Box::new(job));
        }
        q.embeds.push_front(job);
        Ok(())
    }

    /// Closes the queue: running requests are flagged (they end within one
    /// step); returns the queued jobs and `embed()` calls, for the caller
    /// to answer.
    pub fn close(&self) -> (Vec<Job>, Vec<EmbedJob>) {
        let queued = {
            let mut q = lock(&self.queue);
            q.closed = true;
            for cancel in q.running.values() {
                cancel.store(true, Ordering::SeqCst);
            }
            (q.jobs.drain(..).collect(), q.embeds.drain(..).collect())
        };
        self.wake.notify_all();
        queued
    }

    pub fn is_closed(&self) -> bool {
        lock(&self.queue).closed
    }

    pub fn counts(&self) -> QueueCounts {
        let q = lock(&self.queue);
        QueueCounts { queued: q.jobs.len() + q.preparing.len(), active: q.running.len(), closed: q.closed }
    }

    pub fn publish(&self, p: Published) {
        *lock(&self.published) = p;
    }

    pub fn published(&self) -> Published {
        lock(&self.published).clone()
    }

    /// Called once by the engine thread, after it freed its models.
    pub fn mark_exited(&self) {
        *lock(&self.exited) = true;
        self.exit.notify_all();
    }

    /// Waits until the engine thread has exited, at most `timeout`.
    pub fn wait_exited(&self, timeout: Duration) {
        let exited = lock(&self.exited);
        let _ = self.exit.wait_timeout_while(exited, timeout, |e| !*e);
    }
}
