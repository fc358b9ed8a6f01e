//! Engine errors as JavaScript `Error`s: the message, the stable `code`
//! set on the object by N-API (`napi_create_error`), and for an
//! `INVALID_REQUEST` the offending `field`, so JavaScript never parses a
//! message. Used for thrown errors, rejected promises and the
//! error a request's event callback receives.

use napi::bindgen_prelude::*;
use napi::sys;

use llama_engine_core::error::EngineError;

/// An `EngineError` on its way into JavaScript.
pub struct JsEngineError(pub EngineError);

impl ToNapiValue for JsEngineError {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        let code = unsafe { String::to_napi_value(env, val.0.code.as_str().to_string())? };
        let message = unsafe { String::to_napi_value(env, val.0.message)? };
        let mut error = std::ptr::null_mut();
        let status = unsafe { sys::napi_create_error(env, code, message, &mut error) };
        if status != sys::Status::napi_ok {
            return Err(Error::new(Status::from(status), "cannot create an Error"));
        }
        if let Some((prompt, context)) = val.0.context {
            for (name, n) in [(c"promptTokens", prompt), (c"contextSize", context)] {
                let value = unsafe { u32::to_napi_value(env, u32::try_from(n).unwrap_or(u32::MAX))? };
                let status = unsafe { sys::napi_set_named_property(env, error, name.as_ptr(), value) };
                if status != sys::Status::napi_ok {
                    return Err(Error::new(Status::from(status), "cannot set an Error's property"));
                }
            }
        }
        if let Some(field) = val.0.field {
            let value = unsafe { String::to_napi_value(env, field)? };
            let status = unsafe { sys::napi_set_named_property(env, error, c"field".as_ptr(), value) };
            if status != sys::Status::napi_ok {
                return Err(Error::new(Status::from(status), "cannot set an Error's field"));
            }
        }
        Ok(error)
    }
}

/// The `napi::Error` that throws (or rejects with) the JS error of `e`.
pub fn js_error(env: &Env, e: EngineError) -> Error {
    let fallback = Error::from_reason(format!("{}: {}", e.code.as_str(), e.message));
    match unsafe { JsEngineError::to_napi_value(env.raw(), JsEngineError(e)) } {
        // SAFETY: `value` was just created in `env`, on this thread.
        Ok(value) => Error::from(unsafe { Unknown::from_raw_unchecked(env.raw(), value) }),
        Err(_) => fallback,
    }
}

/// Converts a core result for a synchronous binding function.
pub fn or_throw<T>(env: &Env, r: std::result::Result<T, EngineError>) -> Result<T> {
    r.map_err(|e| js_error(env, e))
}
