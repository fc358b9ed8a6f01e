//! Memory given back after large transient work. Parsing, rendering and
//! tokenizing a body of megabytes allocates hundreds of megabytes for
//! moments, on whichever thread did it; glibc keeps what was freed in that
//! thread's arena, so the process stayed hundreds of megabytes larger after
//! each burst of big requests (measured: +570 MB after the hostile server
//! suite, of which the prompt cache held 85). `malloc_trim` hands free
//! pages back to the system. It walks every arena and can take tens of
//! milliseconds, so it runs on a thread of its own, never on the engine
//! thread between two steps; requests that come while it runs are one.

use std::sync::{Condvar, Mutex, OnceLock};

/// Inputs at least this large are followed by a trim.
const LARGE: usize = 1 << 20;

/// After work on an input of `bytes`: gives freed memory back when it was large.
pub fn release_after(bytes: usize) {
    if bytes >= LARGE {
        Trimmer::get().request();
    }
}

struct Trimmer {
    wanted: Mutex<bool>,
    wake: Condvar,
}

impl Trimmer {
    fn get() -> &'static Trimmer {
        static TRIMMER: OnceLock<&'static Trimmer> = OnceLock::new();
        TRIMMER.get_or_init(|| {
            let t: &'static Trimmer = Box::leak(Box::new(Trimmer { wanted: Mutex::new(false), wake: Condvar::new() }));
            // Without the thread, requests are only recorded: nothing to do.
            let _ = std::thread::Builder::new().name("llama-engine-trim".into()).spawn(move || t.run());
            t
        })
    }

    fn request(&self) {
        *self.wanted.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.wake.notify_one();
    }

    fn run(&self) {
        loop {
            let mut wanted = self.wanted.lock().unwrap_or_else(|p| p.into_inner());
            while !*wanted {
                wanted = self.wake.wait(wanted).unwrap_or_else(|p| p.into_inner());
            }
            *wanted = false;
            drop(wanted);
            trim();
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only returns free pages of the allocator's arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
