//! Work that may take seconds and must not slow decoding: tokenizing and
//! rendering huge inputs, on threads of low scheduling priority (nice 10 on
//! Linux). On a machine with two cores, three threads tokenizing megabytes
//! beside the engine's own made its steps several times slower and its
//! streams stall for a quarter to half a second; at a lower priority they
//! take the cores the engine leaves. (Elsewhere the priority is unchanged.)

use std::sync::mpsc::{self, Sender};
use std::sync::{Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

/// Lowers the calling thread's scheduling priority, for good.
pub fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's id; a failure only leaves the priority.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

/// Runs `f` on a low-priority thread and waits for its result (the caller
/// — a thread of libuv's pool — sleeps meanwhile).
pub fn run_low<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    let sent = pool().lock().unwrap_or_else(|p| p.into_inner()).send(job);
    match sent {
        Ok(()) => match rx.recv() {
            Ok(Ok(out)) => out,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => panic!("the background thread stopped"),
        },
        // No background thread: do it here.
        Err(mpsc::SendError(job)) => {
            job();
            match rx.recv() {
                Ok(Ok(out)) => out,
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                Err(_) => panic!("the background work was lost"),
            }
        }
    }
}

fn pool() -> &'static Mutex<Sender<Job>> {
    static POOL: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = std::sync::Arc::new(Mutex::new(rx));
        // Two threads: one huge input does not hold every other.
        for i in 0..2 {
            let rx = rx.clone();
            let _ = std::thread::Builder::new().name(format!("llama-engine-text-{i}")).stack_size(32 << 20).spawn(move || {
                lower_this_thread();
                loop {
                    let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                }
            });
        }
        Mutex::new(tx)
    })
}
