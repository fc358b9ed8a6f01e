//! Memory given back after large transient work. Parsing, rendering and
//! tokenizing a body of megabytes allocates hundreds of megabytes for
//! moments, on whichever thread did it; glibc keeps what was freed in that
//! thread's arena, so the process stayed hundreds of megabytes larger after
//! each burst of big requests (measured: +570 MB after the hostile server
//! suite, of which the prompt cache held 85). `malloc_trim` hands free
//! pages back to the system.

/// Inputs at least this large are followed by a trim.
const LARGE: usize = 1 << 20;

/// After work on an input of `bytes`: gives freed memory back when it was large.
pub fn release_after(bytes: usize) {
    if bytes >= LARGE {
        trim();
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
