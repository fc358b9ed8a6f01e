//! The reader and the checks on small files built here: a valid model
//! passes; every truncation, random damage and each hostile value is
//! refused with its cause, and nothing panics.

use std::io::Cursor;

use super::*;

/// A GGUF file under construction: metadata entries (type id and value
/// bytes) and tensors (name, dims, type id), data filled with zeros.
#[derive(Clone)]
struct Builder {
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32)>,
}

fn gstr(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

impl Builder {
    /// A tiny llama: 2 layers, 64 wide, 4 heads sharing 2 key/value heads,
    /// 8 tokens, F32 weights.
    fn llama() -> Builder {
        let mut b = Builder { kv: vec![], tensors: vec![] };
        b.string("general.architecture", "llama");
        b.u32("llama.block_count", 2);
        b.u32("llama.context_length", 128);
        b.u32("llama.embedding_length", 64);
        b.u32("llama.feed_forward_length", 128);
        b.u32("llama.attention.head_count", 4);
        b.u32("llama.attention.head_count_kv", 2);
        b.u32("llama.rope.dimension_count", 16);
        b.string("tokenizer.ggml.model", "gpt2");
        b.strings("tokenizer.ggml.tokens", &["a", "b", "c", "d", "e", "f", "g", "h"]);
        b.tensor("token_embd.weight", &[64, 8], 0);
        for i in 0..2 {
            b.tensor(&format!("blk.{i}.attn_q.weight"), &[64, 64], 0);
            b.tensor(&format!("blk.{i}.attn_k.weight"), &[64, 32], 0);
            b.tensor(&format!("blk.{i}.ffn_up.weight"), &[64, 128], 0);
        }
        b
    }

    fn raw(&mut self, key: &str, t: u32, value: Vec<u8>) -> &mut Self {
        self.kv.retain(|(k, _, _)| k != key);
        self.kv.push((key.into(), t, value));
        self
    }
    fn u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.raw(key, 4, v.to_le_bytes().to_vec())
    }
    fn i32(&mut self, key: &str, v: i32) -> &mut Self {
        self.raw(key, 5, v.to_le_bytes().to_vec())
    }
    fn u64(&mut self, key: &str, v: u64) -> &mut Self {
        self.raw(key, 10, v.to_le_bytes().to_vec())
    }
    fn string(&mut self, key: &str, v: &str) -> &mut Self {
        self.raw(key, 8, gstr(v))
    }
    fn strings(&mut self, key: &str, v: &[&str]) -> &mut Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        for s in v {
            b.extend(gstr(s));
        }
        self.raw(key, 9, b)
    }
    fn u32s(&mut self, key: &str, v: &[u32]) -> &mut Self {
        let mut b = 4u32.to_le_bytes().to_vec();
        b.extend((v.len() as u64).to_le_bytes());
        for x in v {
            b.extend(x.to_le_bytes());
        }
        self.raw(key, 9, b)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], t: u32) -> &mut Self {
        self.tensors.push((name.into(), dims.to_vec(), t));
        self
    }

    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, t, v) in &self.kv {
            out.extend(gstr(k));
            out.extend(t.to_le_bytes());
            out.extend(v);
        }
        let mut offset = 0u64;
        let mut data_len = 0u64;
        for (name, dims, t) in &self.tensors {
            out.extend(gstr(name));
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.to_le_bytes());
            out.extend(offset.to_le_bytes());
            let elements = dims.iter().try_fold(1u64, |a, d| a.checked_mul(*d)).unwrap_or(0);
            let bytes = TensorType::from_id(*t).and_then(|k| k.bytes(elements)).unwrap_or(0).min(1 << 20);
            data_len = offset + bytes;
            offset = (offset + bytes).div_ceil(32) * 32;
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        out.resize(out.len() + data_len as usize, 0);
        out
    }
}

fn read(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    read_from(Cursor::new(bytes), bytes.len() as u64)
}

fn refusal(b: &Builder) -> String {
    let bytes = b.build();
    match read(&bytes) {
        Err(e) => e.0,
        Ok(f) => check_model(&f).expect_err("should be refused"),
    }
}

#[test]
fn a_valid_model_reads_and_passes() {
    let bytes = Builder::llama().build();
    let f = read(&bytes).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.tensors.len(), 7);
    assert_eq!(f.tensor("blk.1.attn_k.weight").unwrap().dims, vec![64, 32]);
    assert_eq!(f.get("llama.block_count").and_then(Value::as_int), Some(2));
    check_model(&f).unwrap();
}

#[test]
fn every_truncation_is_refused_without_panicking() {
    let bytes = Builder::llama().build();
    for cut in 0..bytes.len() {
        let r = read(&bytes[..cut]);
        assert!(r.is_err(), "a file cut at {cut} of {} was read", bytes.len());
    }
}

#[test]
fn random_damage_never_panics() {
    let bytes = Builder::llama().build();
    let header_end = read(&bytes).unwrap().data_offset as usize;
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % header_end;
            b[at] ^= 1 << (next() % 8);
        }
        if let Ok(f) = read(&b) {
            let _ = check_model(&f);
        }
    }
}

#[test]
fn hostile_counts_and_lengths_are_refused() {
    let mut bytes = Builder::llama().build();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // n_kv
    assert!(read(&bytes).unwrap_err().0.contains("metadata entries"));
    let mut bytes = Builder::llama().build();
    bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes()); // n_tensors
    assert!(read(&bytes).unwrap_err().0.contains("tensors"));
    // The first key's length past the end of the file.
    let mut bytes = Builder::llama().build();
    let len = bytes.len() as u64;
    bytes[24..32].copy_from_slice(&len.to_le_bytes());
    assert!(read(&bytes).unwrap_err().0.contains("file ends"));
    // An array longer than the file.
    let mut b = Builder::llama();
    let mut v = 4u32.to_le_bytes().to_vec();
    v.extend((1u64 << 29).to_le_bytes());
    b.raw("llama.attention.head_count", 9, v);
    assert!(refusal(&b).contains("llama.attention.head_count"));
}

#[test]
fn structural_damage_names_its_cause() {
    let mut b = Builder::llama();
    b.tensor("blk.0.attn_q.weight", &[64, 64], 0);
    assert!(refusal(&b).contains("appears twice"));
    let mut b = Builder::llama();
    b.tensor("x.weight", &[64, 1], 4);
    assert!(refusal(&b).contains("type 4"));
    let mut b = Builder::llama();
    b.tensor("x.weight", &[33, 1], 2);
    assert!(refusal(&b).contains("not a multiple"));
    let mut b = Builder::llama();
    b.tensor("x.weight", &[0, 1], 0);
    assert!(refusal(&b).contains("0 elements"));
    let mut b = Builder::llama();
    b.tensor("x.weight", &[1 << 40, 1 << 40], 0);
    assert!(refusal(&b).contains("overflows"));
    let mut bytes = Builder::llama().build();
    bytes.truncate(bytes.len() - 1);
    assert!(read(&bytes).unwrap_err().0.contains("ends past the end of the file"));
    let mut b = Builder::llama();
    b.strings("tokenizer.ggml.tokens", &["a", "b", "a"]);
    assert!(refusal(&b).contains("second copy"));
    let mut b = Builder::llama();
    b.strings("tokenizer.ggml.tokens", &["a", "", "[EMPTY_1]"]);
    assert!(refusal(&b).contains("second copy"));
    let mut b = Builder::llama();
    b.u64("general.alignment", 32);
    assert!(refusal(&b).contains("alignment"));
    let mut b = Builder::llama();
    b.u32("general.alignment", 24);
    assert!(refusal(&b).contains("power of two"));
}

#[test]
fn hyperparameters_llama_cpp_asserts_on_are_refused() {
    for (key, value, expect) in [
        ("llama.block_count", 0, "block_count is 0"),
        ("llama.block_count", 100_000, "block_count is 100000"),
        ("llama.embedding_length", 0, "embedding_length is 0"),
        ("llama.embedding_length", u32::MAX, "embedding_length"),
        ("llama.attention.head_count", 0, "head_count is 0"),
        ("llama.attention.head_count_kv", 0, "head_count_kv is 0"),
        ("llama.attention.head_count_kv", 3, "not a divisor"),
        ("llama.attention.head_count_kv", 8, "more key/value heads"),
        ("llama.attention.head_count", 1 << 31, "head_count"),
        ("llama.attention.key_length", 0, "key size is 0"),
        ("llama.rope.dimension_count", 17, "rope.dimension_count"),
        ("llama.rope.dimension_count", 64, "rope.dimension_count"),
        ("llama.feed_forward_length", 0, "feed_forward_length is 0"),
        ("llama.context_length", u32::MAX, "context_length"),
        ("llama.expert_count", 100_000, "expert_count"),
        ("llama.expert_used_count", 2, "more than expert_count"),
        ("llama.nextn_predict_layers", 3, "nextn_predict_layers"),
    ] {
        let mut b = Builder::llama();
        b.u32(key, value);
        let why = refusal(&b);
        assert!(why.contains(expect), "{key} = {value}: {why}");
    }
    let mut b = Builder::llama();
    b.u32("llama.expert_count", 8);
    assert!(refusal(&b).contains("expert_used_count is 0"));
    let mut b = Builder::llama();
    b.string("llama.rope.scaling.type", "sideways");
    assert!(refusal(&b).contains("sideways"));
    let mut b = Builder::llama();
    b.string("llama.block_count", "two");
    assert!(refusal(&b).contains("not an integer"));
    let mut b = Builder::llama();
    b.u32s("llama.attention.head_count", &[4, 4, 4]);
    assert!(refusal(&b).contains("3 values for 2 layers"));
    // Per-layer values pass when they are consistent, and -1 in a signed key is "unset".
    let mut b = Builder::llama();
    b.u32s("llama.attention.head_count", &[4, 4]).i32("llama.attention.sliding_window_pattern", -1);
    check_model(&read(&b.build()).unwrap()).unwrap();
    let mut b = Builder::llama();
    b.raw("general.architecture", 4, 1u32.to_le_bytes().to_vec());
    assert!(refusal(&b).contains("general.architecture"));
    let mut b = Builder::llama();
    b.string("general.architecture", "clip");
    assert!(refusal(&b).contains("not a language model"));
}

#[test]
fn the_vocabulary_is_checked() {
    // SentencePiece needs every byte; a BPE vocabulary does not.
    let spm: Vec<String> = (0..256).map(|b| format!("<0x{b:02X}>")).chain(["a".into()]).collect();
    let spm: Vec<&str> = spm.iter().map(String::as_str).collect();
    let mut b = Builder::llama();
    b.string("tokenizer.ggml.model", "llama").strings("tokenizer.ggml.tokens", &spm);
    check_model(&read(&b.build()).unwrap()).unwrap();
    let mut b = Builder::llama();
    b.string("tokenizer.ggml.model", "llama").strings("tokenizer.ggml.tokens", &spm[1..]);
    assert!(refusal(&b).contains("byte 0x00"));
    let mut b = Builder::llama();
    b.kv.retain(|(k, _, _)| k != "tokenizer.ggml.tokens");
    assert!(refusal(&b).contains("no vocabulary"));
    let mut b = Builder::llama();
    b.u32s("tokenizer.ggml.tokens", &[1, 2]);
    assert!(refusal(&b).contains("not a list of strings"));
    let mut b = Builder::llama();
    b.u32s("tokenizer.ggml.token_type", &[1, 1]);
    assert!(refusal(&b).contains("wrong type"));
    let mut b = Builder::llama();
    let mut v = 5u32.to_le_bytes().to_vec();
    v.extend(2u64.to_le_bytes());
    v.extend([0u8; 8]);
    b.raw("tokenizer.ggml.token_type", 9, v);
    assert!(refusal(&b).contains("2 entries for 8 tokens"));
}

#[test]
fn the_type_table_agrees_on_sizes_it_states() {
    let q4k = TensorType::from_id(12).unwrap();
    assert_eq!((q4k.name, q4k.block_size, q4k.block_bytes), ("Q4_K", 256, 144));
    assert_eq!(q4k.bytes(512), Some(288));
    assert!(TensorType::from_id(4).is_none() && TensorType::from_id(43).is_none());
    assert_eq!(TensorType::all().count(), 35);
}

/// Every model fixture present (`npm run models`) passes the checks.
#[test]
fn the_model_fixtures_pass() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "gguf") {
            let t = std::time::Instant::now();
            let file = read_gguf(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if file.get("general.type").and_then(Value::as_str) == Some("adapter") {
                continue; // the_adapter_fixtures_fit_their_base_only
            }
            if file.get("general.architecture").and_then(Value::as_str) == Some("clip") {
                check_projector(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                continue;
            }
            check_model(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            eprintln!("{}: read and checked in {:?}", path.display(), t.elapsed());
        }
    }
}

/// The LoRA adapter fixtures (`npm run models`) fit their base model and
/// are refused for the other one, and as models.
#[test]
fn the_adapter_fixtures_fit_their_base_only() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let read = |name: &str| read_gguf(&dir.join(name)).ok();
    let (Some(smol), Some(gemma), Some(smol_lora), Some(gemma_lora)) = (
        read("SmolLM2-135M-Instruct.Q4_1.gguf"),
        read("gemma-3-270m-q4_k_m.gguf"),
        read("SmolLM2-135M-Instruct.lora-test.gguf"),
        read("gemma-3-270m.lora-test.gguf"),
    ) else {
        return;
    };
    check_adapter(&smol_lora, &smol).unwrap();
    check_adapter(&gemma_lora, &gemma).unwrap();
    assert!(check_adapter(&gemma_lora, &smol).unwrap_err().contains("an adapter for a gemma3 model"));
    assert!(check_adapter(&smol, &smol).unwrap_err().contains("not a LoRA adapter"));
    assert!(check_model(&smol_lora).is_err());
}

/// Adapters whose tensors do not fit the base's weights are refused.
#[test]
fn adapters_that_do_not_fit_are_refused() {
    let base = read(&Builder::llama().build()).unwrap();
    let adapter = |a: &[u64], bdims: &[u64]| {
        let mut b = Builder { kv: vec![], tensors: vec![] };
        b.string("general.architecture", "llama").string("general.type", "adapter").string("adapter.type", "lora");
        b.tensor("blk.0.attn_q.weight.lora_a", a, 0).tensor("blk.0.attn_q.weight.lora_b", bdims, 0);
        read(&b.build()).unwrap()
    };
    check_adapter(&adapter(&[64, 8], &[8, 64]), &base).unwrap();
    assert!(check_adapter(&adapter(&[32, 8], &[8, 64]), &base).unwrap_err().contains("do not fit"));
    assert!(check_adapter(&adapter(&[64, 8], &[4, 64]), &base).unwrap_err().contains("do not fit"));
}

#[test]
fn split_models_name_their_parts() {
    let one = read(&Builder::llama().build()).unwrap();
    assert_eq!(split_parts("/m/model.gguf", &one), Ok(vec![]));
    let mut b = Builder::llama();
    b.raw("split.no", 2, 0u16.to_le_bytes().to_vec()).raw("split.count", 2, 3u16.to_le_bytes().to_vec());
    let first = read(&b.build()).unwrap();
    assert_eq!(
        split_parts("/m/big-00001-of-00003.gguf", &first),
        Ok(vec!["/m/big-00002-of-00003.gguf".to_string(), "/m/big-00003-of-00003.gguf".to_string()])
    );
    // llama.cpp finds the others by the first one's name: another name is refused, as is a later part.
    assert!(split_parts("/m/big.gguf", &first).unwrap_err().contains("-00001-of-00003.gguf"));
    let mut later = Builder::llama();
    later.raw("split.no", 2, 1u16.to_le_bytes().to_vec()).raw("split.count", 2, 3u16.to_le_bytes().to_vec());
    let later = read(&later.build()).unwrap();
    assert!(split_parts("/m/big-00002-of-00003.gguf", &later).unwrap_err().contains("load its first file"));
    assert_eq!(check_split_part(&later, 2, 3), Ok(()));
    assert!(check_split_part(&later, 3, 3).is_err());
    assert!(check_split_part(&one, 2, 3).is_err());
    let mut huge = Builder::llama();
    huge.u32("split.count", 1_000_000);
    assert!(split_parts("/m/x-00001-of-1000000.gguf", &read(&huge.build()).unwrap()).is_err());
}
