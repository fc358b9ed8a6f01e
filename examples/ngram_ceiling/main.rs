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

// ---------------------------------------------------------------------------
// Linking without Node. `llama_engine` is one crate with its N-API binding,
// and napi-sys (built without `dyn-symbols`) leaves every `napi_*` function
// to be resolved by the Node process that loads the addon. An executable that
// links the crate's rlib pulls in object files that also hold binding code,
// so those symbols must exist at link time. They are never called here (this
// program touches only `core::speculation`); each stub aborts if it ever were.
// The list is napi-sys 3.4's whole API, so new binding code links too.
macro_rules! napi_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub extern "C" fn $name() {
            eprintln!(concat!("ngram_ceiling: N-API function ", stringify!($name), " called outside Node"));
            std::process::abort()
        }
    )*};
}

napi_stubs!(
    napi_acquire_threadsafe_function,
    napi_add_async_cleanup_hook,
    napi_add_env_cleanup_hook,
    napi_add_finalizer,
    napi_adjust_external_memory,
    napi_async_destroy,
    napi_async_init,
    napi_call_function,
    napi_call_threadsafe_function,
    napi_cancel_async_work,
    napi_check_object_type_tag,
    napi_close_callback_scope,
    napi_close_escapable_handle_scope,
    napi_close_handle_scope,
    napi_coerce_to_bool,
    napi_coerce_to_number,
    napi_coerce_to_object,
    napi_coerce_to_string,
    napi_create_array,
    napi_create_array_with_length,
    napi_create_arraybuffer,
    napi_create_async_work,
    napi_create_bigint_int64,
    napi_create_bigint_uint64,
    napi_create_bigint_words,
    napi_create_buffer,
    napi_create_buffer_copy,
    napi_create_dataview,
    napi_create_date,
    napi_create_double,
    napi_create_error,
    napi_create_external,
    napi_create_external_arraybuffer,
    napi_create_external_buffer,
    napi_create_function,
    napi_create_int32,
    napi_create_int64,
    napi_create_object,
    napi_create_promise,
    napi_create_range_error,
    napi_create_reference,
    napi_create_string_latin1,
    napi_create_string_utf16,
    napi_create_string_utf8,
    napi_create_symbol,
    napi_create_threadsafe_function,
    napi_create_type_error,
    napi_create_typedarray,
    napi_create_uint32,
    napi_define_class,
    napi_define_properties,
    napi_delete_async_work,
    napi_delete_element,
    napi_delete_property,
    napi_delete_reference,
    napi_detach_arraybuffer,
    napi_escape_handle,
    napi_fatal_error,
    napi_fatal_exception,
    napi_get_all_property_names,
    napi_get_and_clear_last_exception,
    napi_get_array_length,
    napi_get_arraybuffer_info,
    napi_get_boolean,
    napi_get_buffer_info,
    napi_get_cb_info,
    napi_get_dataview_info,
    napi_get_date_value,
    napi_get_element,
    napi_get_global,
    napi_get_instance_data,
    napi_get_last_error_info,
    napi_get_named_property,
    napi_get_new_target,
    napi_get_node_version,
    napi_get_null,
    napi_get_property,
    napi_get_property_names,
    napi_get_prototype,
    napi_get_reference_value,
    napi_get_threadsafe_function_context,
    napi_get_typedarray_info,
    napi_get_undefined,
    napi_get_uv_event_loop,
    napi_get_value_bigint_int64,
    napi_get_value_bigint_uint64,
    napi_get_value_bigint_words,
    napi_get_value_bool,
    napi_get_value_double,
    napi_get_value_external,
    napi_get_value_int32,
    napi_get_value_int64,
    napi_get_value_string_latin1,
    napi_get_value_string_utf16,
    napi_get_value_string_utf8,
    napi_get_value_uint32,
    napi_get_version,
    napi_has_element,
    napi_has_named_property,
    napi_has_own_property,
    napi_has_property,
    napi_instanceof,
    napi_is_array,
    napi_is_arraybuffer,
    napi_is_buffer,
    napi_is_dataview,
    napi_is_date,
    napi_is_detached_arraybuffer,
    napi_is_error,
    napi_is_exception_pending,
    napi_is_promise,
    napi_is_typedarray,
    napi_make_callback,
    napi_module_register,
    napi_new_instance,
    napi_object_freeze,
    napi_object_seal,
    napi_open_callback_scope,
    napi_open_escapable_handle_scope,
    napi_open_handle_scope,
    napi_queue_async_work,
    napi_ref_threadsafe_function,
    napi_reference_ref,
    napi_reference_unref,
    napi_reject_deferred,
    napi_release_threadsafe_function,
    napi_remove_async_cleanup_hook,
    napi_remove_env_cleanup_hook,
    napi_remove_wrap,
    napi_resolve_deferred,
    napi_run_script,
    napi_set_element,
    napi_set_instance_data,
    napi_set_named_property,
    napi_set_property,
    napi_strict_equals,
    napi_throw,
    napi_throw_error,
    napi_throw_range_error,
    napi_throw_type_error,
    napi_type_tag_object,
    napi_typeof,
    napi_unref_threadsafe_function,
    napi_unwrap,
    napi_wrap,
    node_api_create_buffer_from_arraybuffer,
    node_api_create_external_string_latin1,
    node_api_create_external_string_utf16,
    node_api_create_object_with_properties,
    node_api_create_property_key_latin1,
    node_api_create_property_key_utf16,
    node_api_create_property_key_utf8,
    node_api_create_syntax_error,
    node_api_get_module_file_name,
    node_api_post_finalizer,
    node_api_symbol_for,
    node_api_throw_syntax_error,
);
