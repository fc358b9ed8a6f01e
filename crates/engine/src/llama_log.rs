//! llama.cpp's and ggml's log. Nothing is printed unless the host asks
//! (`LLAMA_ENGINE_LOG=1` prints everything, `=warn` warnings and errors, to
//! stderr); but while a thread loads a model, the warnings and errors
//! llama.cpp logs on it are kept, so that a refusal can give llama.cpp's
//! own reason ("missing tensor 'blk.0.attn_q.weight'") instead of a null
//! pointer.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::io::Write;
use std::sync::Once;

use llama_cpp_sys_2::ggml_log_level;

/// Lines kept per capture: the first errors are the telling ones.
const MAX_LINES: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Print {
    Nothing,
    Warnings,
    Everything,
}

fn print_level() -> Print {
    match std::env::var("LLAMA_ENGINE_LOG").as_deref() {
        Err(_) | Ok("") | Ok("0") => Print::Nothing,
        Ok("warn") | Ok("warning") | Ok("error") => Print::Warnings,
        Ok(_) => Print::Everything,
    }
}

struct Capture {
    lines: Vec<(Level, String)>,
    partial: String,
    partial_level: Level,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Level {
    Warn,
    Error,
    Other,
}

thread_local! {
    static CAPTURE: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

static PRINT: std::sync::OnceLock<Print> = std::sync::OnceLock::new();

unsafe extern "C" fn on_log(level: ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let lvl = match level {
        llama_cpp_sys_2::GGML_LOG_LEVEL_WARN => Some(Level::Warn),
        llama_cpp_sys_2::GGML_LOG_LEVEL_ERROR => Some(Level::Error),
        llama_cpp_sys_2::GGML_LOG_LEVEL_CONT => None,
        _ => Some(Level::Other),
    };
    let print = *PRINT.get_or_init(print_level);
    if print == Print::Everything || print == Print::Warnings && matches!(lvl, Some(Level::Warn | Level::Error)) {
        let _ = std::io::stderr().write_all(text.as_bytes());
    }
    let _ = CAPTURE.try_with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else { return };
        let Some(c) = c.as_mut() else { return };
        if let Some(l) = lvl {
            c.partial_level = l;
        }
        c.partial.push_str(&text);
        while let Some(end) = c.partial.find('\n') {
            let line: String = c.partial.drain(..=end).collect();
            let line = line.trim().to_string();
            if !line.is_empty() && c.partial_level != Level::Other && c.lines.len() < MAX_LINES {
                c.lines.push((c.partial_level, line));
            }
        }
    });
}

/// Routes llama.cpp's and ggml's log here (once per process).
pub fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: registers a plain function with no user data.
        unsafe { llama_cpp_sys_2::llama_log_set(Some(on_log), std::ptr::null_mut()) };
        // The projector's library (mtmd, clip) logs through its own hook.
        unsafe { llama_cpp_sys_2::mtmd_helper_log_set(Some(on_log), std::ptr::null_mut()) };
    });
}

/// Runs `f`, keeping the warnings and errors llama.cpp logs on this thread
/// meanwhile.
pub fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<(Level, String)>) {
    let outer =
        CAPTURE.with(|c| c.borrow_mut().replace(Capture { lines: Vec::new(), partial: String::new(), partial_level: Level::Other }));
    let out = f();
    let lines = CAPTURE.with(|c| std::mem::replace(&mut *c.borrow_mut(), outer)).map(|c| c.lines).unwrap_or_default();
    (out, lines)
}

/// The line that says why llama.cpp refused, from what `capture` kept:
/// the exception text of "error loading model: …", else the first error
/// that is not the generic "failed to load model", else the last warning.
pub fn reason(lines: &[(Level, String)]) -> Option<String> {
    let strip = |l: &str| -> String {
        // "llama_model_load: error loading model: X" → "X"; "fn: X" → "X".
        if let Some((_, rest)) = l.split_once("error loading model: ") {
            return rest.trim().to_string();
        }
        match l.split_once(": ") {
            Some((f, rest)) if !f.contains(' ') => rest.trim().to_string(),
            _ => l.trim().to_string(),
        }
    };
    let generic = |l: &str| l.contains("failed to load model") || l.contains("failed to initialize") && l.contains("context");
    let exception = lines.iter().find(|(_, l)| l.contains("error loading model: ")).map(|(_, l)| strip(l));
    if let Some(why) = exception.as_ref().filter(|w| !generic(w)) {
        return Some(why.clone());
    }
    if let Some((_, l)) = lines.iter().find(|(lv, l)| *lv == Level::Error && !generic(l)) {
        return Some(strip(l));
    }
    exception
        .or_else(|| lines.iter().rev().find(|(lv, _)| *lv == Level::Warn).map(|(_, l)| strip(l)))
        .or_else(|| lines.first().map(|(_, l)| strip(l)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_telling_line_is_chosen() {
        let lines = vec![
            (Level::Warn, "llama_model_loader: a warning".to_string()),
            (Level::Error, "llama_model_load: error loading model: missing tensor 'blk.0.attn_q.weight'".to_string()),
            (Level::Error, "llama_model_load_from_file_impl: failed to load model".to_string()),
        ];
        assert_eq!(reason(&lines).as_deref(), Some("missing tensor 'blk.0.attn_q.weight'"));
        let lines = vec![
            (Level::Error, "llama_model_load_from_file_impl: failed to load model".to_string()),
            (Level::Error, "gguf_init_from_file_impl: tensor 'x' has invalid ggml type 99".to_string()),
        ];
        assert_eq!(reason(&lines).as_deref(), Some("tensor 'x' has invalid ggml type 99"));
        let lines = vec![
            (Level::Error, "gguf_init_from_reader: failed to read key-value pairs".to_string()),
            (Level::Error, "llama_model_load: error loading model: llama_model_loader: failed to load model from /x".to_string()),
        ];
        assert_eq!(reason(&lines).as_deref(), Some("failed to read key-value pairs"));
        assert_eq!(reason(&[]), None);
    }

    #[test]
    fn capture_keeps_whole_lines_of_this_thread() {
        install();
        let ((), lines) = capture(|| unsafe {
            on_log(llama_cpp_sys_2::GGML_LOG_LEVEL_ERROR, c"part one, ".as_ptr(), std::ptr::null_mut());
            on_log(llama_cpp_sys_2::GGML_LOG_LEVEL_CONT, c"part two\n".as_ptr(), std::ptr::null_mut());
            on_log(llama_cpp_sys_2::GGML_LOG_LEVEL_INFO, c"info\n".as_ptr(), std::ptr::null_mut());
        });
        assert_eq!(lines, vec![(Level::Error, "part one, part two".to_string())]);
        let ((), other) = capture(|| {
            std::thread::spawn(|| unsafe { on_log(llama_cpp_sys_2::GGML_LOG_LEVEL_ERROR, c"elsewhere\n".as_ptr(), std::ptr::null_mut()) })
                .join()
                .unwrap()
        });
        assert!(other.is_empty());
    }
}
