//! Mutated session files for the loader's fuzz test (`__test__/sessions.test.js`):
//! truncations, bit flips, and changed bytes with the checksum recomputed (so
//! the structural checks and llama.cpp's own reading are what meet them).
//!
//! cargo run --release --example session_fuzz -- SESSION OUT_DIR COUNT SEED

use std::path::Path;

use xxhash_rust::xxh3::xxh3_128;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, out, count, seed] = args.as_slice() else {
        eprintln!("usage: session_fuzz SESSION OUT_DIR COUNT SEED");
        std::process::exit(2);
    };
    let bytes = std::fs::read(input).expect("SESSION: a file");
    let count: usize = count.parse().expect("COUNT: a number");
    let mut rng: u64 = seed.parse().expect("SEED: a number");
    let mut next = move || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        rng >> 17
    };
    std::fs::create_dir_all(out).expect("OUT_DIR");
    for i in 0..count {
        let mut b = bytes.clone();
        let kind = i % 4;
        match kind {
            0 => b.truncate(next() as usize % b.len()),
            1 => {
                for _ in 0..1 + next() % 4 {
                    let at = next() as usize % b.len();
                    b[at] ^= 1 << (next() % 8);
                }
            }
            _ => {
                // Re-checksummed: a byte of the header, the tokens or the cells'
                // structure (kind 2: the first 64 KiB), or anywhere (kind 3).
                let body = b.len() - 16;
                let span = if kind == 2 { body.min(64 << 10) } else { body };
                for _ in 0..1 + next() % 3 {
                    let at = 12 + next() as usize % (span - 12);
                    b[at] = next() as u8;
                }
                let sum = xxh3_128(&b[..body]).to_le_bytes();
                b[body..].copy_from_slice(&sum);
            }
        }
        std::fs::write(Path::new(out).join(format!("{i:05}.session")), &b).expect("write");
    }
}
