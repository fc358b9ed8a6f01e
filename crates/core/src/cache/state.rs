//! A sequence's KV cells as llama.cpp serialises them
//! (`llama_state_seq_get_data`, llama.cpp of llama-cpp-sys-2 0.1.160), read
//! and checked here so that nothing llama.cpp would misread reaches it.
//!
//! ```text
//! u32 magic 0xaf143cd8, i32 seq id
//! per KV cache (one; two for sliding-window models: the full one, then the window's):
//!   u32 n_stream, then per stream:
//!     u32 cell count; when > 0:
//!       per cell: i32 pos, u32 n_seq_id (1), [12 bytes of M-RoPE position], i32 seq id
//!       u32 v_trans, u32 n_layer, u32 n_rot_k, u32 n_rot_v
//!       per layer: i32 K type, u64 K row bytes, cells × row bytes
//!       per layer with V: i32 V type, then either u64 row bytes and cells × row
//!       bytes, or (v_trans) u32 element bytes, u32 rows, rows × cells × element bytes
//! ```
//!
//! One sequence's cells live in one stream (a slot's), so what is kept is
//! that stream's part of each cache ([`Cells`]): it does not depend on the
//! engine's number of slots, and [`Cells::blob`] writes it back for any.
//! A sliding-window cache holds only the window's cells: such a state can be
//! restored only as a whole (the window before an earlier cut is gone).

use super::positions::Positions;

pub const MAGIC: u32 = 0xaf14_3cd8;

/// Caps that keep a hostile header from asking for absurd sizes before the
/// length check catches it.
const MAX_CACHES: usize = 4;
const MAX_LAYERS: u32 = 4096;
const MAX_STREAMS: u32 = 4096;

/// A sequence's cells in each KV cache of the context, without the stream
/// layout around them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cells {
    /// Per cache: its cell count and the bytes after it (cells, then data).
    pub caches: Vec<(u32, Vec<u8>)>,
}

/// What [`Cells::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Cells of the first (full) cache: the tokens held.
    pub n_tokens: usize,
    /// Whether a cache holds fewer cells than the first (a sliding window):
    /// the state can then only be continued after its last token.
    pub windowed: bool,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| format!("ends early (at byte {})", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }
    fn skip(&mut self, n: u64) -> Result<(), String> {
        let n = usize::try_from(n).map_err(|_| format!("a size of {n} bytes"))?;
        self.take(n).map(|_| ())
    }
}

/// How a model's cells are written: bytes per cell in the cell list (12, or
/// 24 with M-RoPE positions) and whether V is stored (not for MLA models,
/// whose V is part of K). Not in the state itself: the one that reads the
/// whole state consistently is the one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    meta: usize,
    with_v: bool,
}

const SHAPES: [Shape; 4] = [
    Shape { meta: 12, with_v: true },
    Shape { meta: 24, with_v: true },
    Shape { meta: 12, with_v: false },
    Shape { meta: 24, with_v: false },
];

/// Walks one stream's cells and data (after its cell count), checking that
/// the cells are one sequence's and that every size adds up; returns their
/// positions.
fn walk_stream(r: &mut Reader<'_>, cells: u32, shape: Shape) -> Result<Vec<i32>, String> {
    let mut positions = Vec::with_capacity(cells as usize);
    for _ in 0..cells {
        let pos = r.i32()?;
        let n_seq = r.u32()?;
        if n_seq != 1 {
            return Err(format!("a cell belongs to {n_seq} sequences"));
        }
        r.take(shape.meta - 12)?;
        r.i32()?; // the sequence it was saved from; restored into another
        positions.push(pos);
    }
    let cells = u64::from(cells);
    let v_trans = r.u32()?;
    let n_layer = r.u32()?;
    if v_trans > 1 || n_layer == 0 || n_layer > MAX_LAYERS {
        return Err(format!("a malformed data header (v_trans {v_trans}, {n_layer} layers)"));
    }
    r.u32()?; // n_rot_k
    r.u32()?; // n_rot_v
    for _ in 0..n_layer {
        r.i32()?;
        let row = r.u64()?;
        r.skip(row.checked_mul(cells).ok_or("a K size overflows")?)?;
    }
    if shape.with_v {
        for _ in 0..n_layer {
            r.i32()?;
            if v_trans == 0 {
                let row = r.u64()?;
                r.skip(row.checked_mul(cells).ok_or("a V size overflows")?)?;
            } else {
                let el = u64::from(r.u32()?);
                let rows = u64::from(r.u32()?);
                r.skip(el.checked_mul(rows).and_then(|x| x.checked_mul(cells)).ok_or("a V size overflows")?)?;
            }
        }
    }
    Ok(positions)
}

/// The first shape that `parse` accepts, or the first shape's error.
fn with_shape<T>(mut parse: impl FnMut(Shape) -> Result<T, String>) -> Result<T, String> {
    let mut first = None;
    for shape in SHAPES {
        match parse(shape) {
            Ok(t) => return Ok(t),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_default())
}

/// One stream's cells and data (`have` cells) with `extra` zero cells put
/// in front, at positions 0..extra (the others' positions are unchanged).
fn pad_stream(bytes: &[u8], have: usize, extra: usize, shape: Shape) -> Result<Vec<u8>, String> {
    let mut r = Reader { bytes, at: 0 };
    let mut out = Vec::with_capacity(bytes.len() * (have + extra) / have.max(1) + 64);
    let meta = r.take(have * shape.meta)?;
    let seq = meta.get(shape.meta - 4..shape.meta).unwrap_or(&[0; 4]).to_vec();
    for p in 0..extra {
        out.extend_from_slice(&(p as i32).to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend(std::iter::repeat_n(0u8, shape.meta - 12));
        out.extend_from_slice(&seq);
    }
    out.extend_from_slice(meta);
    let header = r.take(16)?;
    out.extend_from_slice(header);
    let v_trans = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let n_layer = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let rows = |r: &mut Reader<'_>, out: &mut Vec<u8>, row: usize| -> Result<(), String> {
        out.extend(std::iter::repeat_n(0u8, extra * row));
        out.extend_from_slice(r.take(have * row)?);
        Ok(())
    };
    for _ in 0..n_layer {
        out.extend_from_slice(r.take(4)?);
        let row = r.u64()?;
        out.extend_from_slice(&row.to_le_bytes());
        rows(&mut r, &mut out, row as usize)?;
    }
    if shape.with_v {
        for _ in 0..n_layer {
            out.extend_from_slice(r.take(4)?);
            if v_trans == 0 {
                let row = r.u64()?;
                out.extend_from_slice(&row.to_le_bytes());
                rows(&mut r, &mut out, row as usize)?;
            } else {
                let el = r.u32()?;
                let n_rows = r.u32()?;
                out.extend_from_slice(&el.to_le_bytes());
                out.extend_from_slice(&n_rows.to_le_bytes());
                // Transposed: each of the rows holds one element per cell.
                for _ in 0..n_rows {
                    rows(&mut r, &mut out, el as usize)?;
                }
            }
        }
    }
    if !r.done() {
        return Err("bytes after the cells' data".into());
    }
    Ok(out)
}

impl Cells {
    /// The sequence's cells out of a state llama.cpp wrote for it.
    pub fn from_blob(blob: &[u8]) -> Result<Cells, String> {
        with_shape(|shape| Self::from_blob_as(blob, shape))
    }

    fn from_blob_as(blob: &[u8], shape: Shape) -> Result<Cells, String> {
        let mut r = Reader { bytes: blob, at: 0 };
        if r.u32()? != MAGIC {
            return Err("not a llama.cpp sequence state".into());
        }
        r.i32()?;
        let mut caches = Vec::new();
        while !r.done() {
            if caches.len() == MAX_CACHES {
                return Err("more KV caches than a context has".into());
            }
            let n_stream = r.u32()?;
            if n_stream == 0 || n_stream > MAX_STREAMS {
                return Err(format!("{n_stream} streams"));
            }
            let mut found: Option<(u32, Vec<u8>)> = None;
            for _ in 0..n_stream {
                let cells = r.u32()?;
                if cells == 0 {
                    continue;
                }
                let start = r.at;
                walk_stream(&mut r, cells, shape)?;
                if found.is_some() {
                    return Err("the cells of one sequence in two streams".into());
                }
                found = Some((cells, blob[start..r.at].to_vec()));
            }
            caches.push(found.unwrap_or((0, Vec::new())));
        }
        if caches.is_empty() {
            return Err("no KV cache".into());
        }
        Ok(Cells { caches })
    }

    /// A state llama.cpp reads into any sequence of a context with
    /// `n_stream` streams (one per slot).
    pub fn blob(&self, n_stream: u32) -> Vec<u8> {
        let size: usize = 8 + self.caches.iter().map(|(_, b)| 4 + 4 * n_stream as usize + b.len()).sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&0i32.to_le_bytes());
        for (cells, bytes) in &self.caches {
            out.extend_from_slice(&n_stream.to_le_bytes());
            out.extend_from_slice(&cells.to_le_bytes());
            out.extend_from_slice(bytes);
            for _ in 1..n_stream {
                out.extend_from_slice(&0u32.to_le_bytes());
            }
        }
        out
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.caches.iter().map(|(_, b)| 4 + b.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.caches.iter().all(|(n, _)| *n == 0)
    }

    /// Checks that these are the cells of `n_tokens` tokens at `at`'s
    /// positions (0..n_tokens without media that shrink them) in the first
    /// cache, and a suffix of them ending at the same last position in any
    /// other (a sliding window).
    pub fn check(&self, n_tokens: usize, at: &Positions) -> Result<Layout, String> {
        let Some((first, _)) = self.caches.first() else { return Err("no KV cache".into()) };
        if *first as usize != n_tokens {
            return Err(format!("holds {first} cells for {n_tokens} tokens"));
        }
        with_shape(|shape| {
            let mut windowed = false;
            for (i, (cells, bytes)) in self.caches.iter().enumerate() {
                let mut r = Reader { bytes, at: 0 };
                let positions = walk_stream(&mut r, *cells, shape)?;
                if !r.done() {
                    return Err(format!("KV cache {i}: {} bytes too many", bytes.len() - r.at));
                }
                let Some(start) = n_tokens.checked_sub(positions.len()) else {
                    return Err(format!("KV cache {i}: {} cells for {n_tokens} tokens", positions.len()));
                };
                at.check_cells(&positions, n_tokens).map_err(|e| format!("KV cache {i}: {e}"))?;
                if i == 0 && start != 0 {
                    return Err("the first KV cache does not start at position 0".into());
                }
                windowed |= positions.len() < n_tokens;
            }
            if windowed && !at.is_identity() {
                return Err("a sliding window over media that shrink positions (not kept)".into());
            }
            Ok(Layout { n_tokens, windowed })
        })
    }

    /// These cells with every sliding-window cache filled out to all
    /// `n_tokens` positions by zero cells in front. A restore then puts
    /// every cell where computing the tokens put it (cell i at position i),
    /// so attention sums in the same order; the zero cells are all outside
    /// the window of any later token (the window's state was written from
    /// its last one), masked exactly as the cells they stand for were: the
    /// same logits, bit for bit.
    pub fn padded(&self, n_tokens: usize, at: &Positions) -> Result<Cells, String> {
        self.check(n_tokens, at)?;
        with_shape(|shape| {
            let mut caches = Vec::with_capacity(self.caches.len());
            for (cells, bytes) in &self.caches {
                let have = *cells as usize;
                if have == n_tokens {
                    caches.push((*cells, bytes.clone()));
                    continue;
                }
                caches.push((n_tokens as u32, pad_stream(bytes, have, n_tokens - have, shape)?));
            }
            Ok(Cells { caches })
        })
    }

    /// Serialised: u32 number of caches, then per cache u32 cells, u64
    /// length and the bytes.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.caches.len() as u32).to_le_bytes());
        for (cells, bytes) in &self.caches {
            out.extend_from_slice(&cells.to_le_bytes());
            out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    }

    /// Reads what [`write_to`](Self::write_to) wrote, from the front of
    /// `bytes`; returns it and the bytes used.
    pub fn read_from(bytes: &[u8]) -> Result<(Cells, usize), String> {
        let mut r = Reader { bytes, at: 0 };
        let n = r.u32()? as usize;
        if n == 0 || n > MAX_CACHES {
            return Err(format!("{n} KV caches"));
        }
        let mut caches = Vec::with_capacity(n);
        for _ in 0..n {
            let cells = r.u32()?;
            let len = r.u64()?;
            let len = usize::try_from(len).map_err(|_| format!("a size of {len} bytes"))?;
            caches.push((cells, r.take(len)?.to_vec()));
        }
        Ok((Cells { caches }, r.at))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A state as llama.cpp writes it for `n` tokens in stream `stream` of
    /// `n_stream`: two layers, f16 K rows of 8 bytes, V transposed (2-byte
    /// elements, 4 rows); a second (window) cache of the last `window`
    /// cells when given.
    pub fn fake_blob(n: u32, stream: u32, n_stream: u32, window: Option<u32>) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&(stream as i32).to_le_bytes());
        let mut cache = |cells: u32, first: u32| {
            out.extend_from_slice(&n_stream.to_le_bytes());
            for s in 0..n_stream {
                if s != stream {
                    out.extend_from_slice(&0u32.to_le_bytes());
                    continue;
                }
                out.extend_from_slice(&cells.to_le_bytes());
                for p in first..first + cells {
                    out.extend_from_slice(&(p as i32).to_le_bytes());
                    out.extend_from_slice(&1u32.to_le_bytes());
                    out.extend_from_slice(&(stream as i32).to_le_bytes());
                }
                for x in [1u32, 2, 0, 0] {
                    out.extend_from_slice(&x.to_le_bytes());
                }
                for l in 0..2u8 {
                    out.extend_from_slice(&1i32.to_le_bytes());
                    out.extend_from_slice(&8u64.to_le_bytes());
                    out.extend(std::iter::repeat_n(l + 1, 8 * cells as usize));
                }
                for l in 0..2u8 {
                    out.extend_from_slice(&1i32.to_le_bytes());
                    out.extend_from_slice(&2u32.to_le_bytes());
                    out.extend_from_slice(&4u32.to_le_bytes());
                    out.extend(std::iter::repeat_n(l + 10, 8 * cells as usize));
                }
            }
        };
        cache(n, 0);
        if let Some(w) = window {
            cache(w.min(n), n - w.min(n));
        }
        out
    }

    /// One stream of cells at `positions`, with M-RoPE's 12 extra bytes a cell.
    fn mrope_blob(positions: &[i32]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&0i32.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&(positions.len() as u32).to_le_bytes());
        for &p in positions {
            out.extend_from_slice(&p.to_le_bytes());
            out.extend_from_slice(&1u32.to_le_bytes());
            out.extend_from_slice(&[7u8; 12]);
            out.extend_from_slice(&0i32.to_le_bytes());
        }
        for x in [0u32, 1, 0, 0] {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.extend_from_slice(&1i32.to_le_bytes());
        out.extend_from_slice(&4u64.to_le_bytes());
        out.extend(std::iter::repeat_n(3u8, 4 * positions.len()));
        out.extend_from_slice(&1i32.to_le_bytes());
        out.extend_from_slice(&4u64.to_le_bytes());
        out.extend(std::iter::repeat_n(4u8, 4 * positions.len()));
        out
    }

    #[test]
    fn cells_after_an_mrope_image_are_checked_at_its_positions() {
        use crate::cache::positions::Span;
        let image = Positions::new([Span { start: 2, n_tokens: 4, n_pos: 2 }]).unwrap();
        let cells = Cells::from_blob(&mrope_blob(&[0, 1, 2, 2, 2, 2, 4, 5])).unwrap();
        assert_eq!(cells.check(8, &image).unwrap(), Layout { n_tokens: 8, windowed: false });
        assert!(cells.check(8, &Positions::default()).is_err(), "not 0..8");
        assert_eq!(cells.padded(8, &image).unwrap(), cells);
        let plain = Cells::from_blob(&mrope_blob(&[0, 1, 2, 3, 4, 5, 6, 7])).unwrap();
        assert!(plain.check(8, &image).is_err(), "text after the image at its own index");
    }

    #[test]
    fn cells_come_out_of_any_stream_and_go_back_for_any_number_of_slots() {
        let blob = fake_blob(5, 2, 4, None);
        let cells = Cells::from_blob(&blob).unwrap();
        assert_eq!(cells.caches.len(), 1);
        assert_eq!(cells.check(5, &Positions::default()).unwrap(), Layout { n_tokens: 5, windowed: false });
        // Back into stream 0 of a 4-slot context: the same cells, stream 0.
        let again = Cells::from_blob(&cells.blob(4)).unwrap();
        assert_eq!(again, cells);
        assert_eq!(Cells::from_blob(&cells.blob(1)).unwrap(), cells);
        // The slot a state was saved from does not matter.
        assert_eq!(Cells::from_blob(&fake_blob(5, 0, 1, None)).unwrap().check(5, &Positions::default()).unwrap().n_tokens, 5);
    }

    #[test]
    fn a_sliding_window_cache_is_a_suffix() {
        let cells = Cells::from_blob(&fake_blob(9, 1, 2, Some(4))).unwrap();
        assert_eq!(cells.caches.len(), 2);
        assert_eq!(cells.check(9, &Positions::default()).unwrap(), Layout { n_tokens: 9, windowed: true });
        let whole = Cells::from_blob(&fake_blob(3, 1, 2, Some(4))).unwrap();
        assert_eq!(whole.check(3, &Positions::default()).unwrap(), Layout { n_tokens: 3, windowed: false });
    }

    #[test]
    fn a_window_is_padded_to_every_position_with_zero_cells() {
        let cells = Cells::from_blob(&fake_blob(9, 1, 2, Some(4))).unwrap();
        let padded = cells.padded(9, &Positions::default()).unwrap();
        assert_eq!(padded.check(9, &Positions::default()).unwrap(), Layout { n_tokens: 9, windowed: false });
        assert_eq!(padded.caches[0], cells.caches[0]);
        // The padded window is what a 9-cell cache would be, with zeros for
        // the 5 cells it stands in for: K rows 1, 2 and V rows 10, 11 of
        // the fake become zero for those cells.
        let full = Cells::from_blob(&fake_blob(9, 1, 2, None)).unwrap();
        let (n, bytes) = &padded.caches[1];
        assert_eq!((*n, bytes.len()), (full.caches[0].0, full.caches[0].1.len()));
        let mut want = full.caches[0].1.clone();
        let data = 9 * 12 + 16;
        for layer in 0..2 {
            let k = data + layer * (12 + 72) + 12;
            want[k..k + 5 * 8].fill(0);
        }
        let v0 = data + 2 * (12 + 72);
        for layer in 0..2 {
            let v = v0 + layer * (12 + 72) + 12;
            for row in 0..4 {
                want[v + row * 18..v + row * 18 + 5 * 2].fill(0);
            }
        }
        assert_eq!(bytes, &want);
        // Whole states are left as they are.
        let whole = Cells::from_blob(&fake_blob(3, 0, 1, Some(4))).unwrap();
        assert_eq!(whole.padded(3, &Positions::default()).unwrap(), whole);
    }

    #[test]
    fn serialised_cells_read_back() {
        let cells = Cells::from_blob(&fake_blob(7, 0, 3, Some(5))).unwrap();
        let mut bytes = Vec::new();
        cells.write_to(&mut bytes);
        bytes.extend_from_slice(b"tail");
        let (back, used) = Cells::read_from(&bytes).unwrap();
        assert_eq!((back, used), (cells, bytes.len() - 4));
    }

    #[test]
    fn anything_malformed_is_refused_never_misread() {
        let blob = fake_blob(6, 1, 2, Some(3));
        let cells = Cells::from_blob(&blob).unwrap();
        assert!(cells.check(5, &Positions::default()).is_err(), "another token count");
        // Every truncation of the blob and of the kept bytes.
        // (A cut between two caches leaves a shorter well-formed state: the
        // caller knows how many caches its context has.)
        for n in 0..blob.len() {
            match Cells::from_blob(&blob[..n]) {
                Ok(c) => assert!(c.caches.len() < cells.caches.len(), "blob cut at {n}"),
                Err(e) => assert!(!e.is_empty()),
            }
        }
        let mut kept = Vec::new();
        cells.write_to(&mut kept);
        for n in 0..kept.len() {
            if let Ok((c, _)) = Cells::read_from(&kept[..n]) {
                assert!(c.check(6, &Positions::default()).is_err(), "kept bytes cut at {n} still checked");
            }
        }
        // Positions out of order, a cell shared by two sequences.
        let mut moved = blob.clone();
        moved[8 + 4 + 4 + 4 + 12] = 9; // second cell's position (magic, seq, n_stream, two counts, a cell)
        assert!(Cells::from_blob(&moved).and_then(|c| c.check(6, &Positions::default())).is_err());
        let mut shared = blob.clone();
        shared[8 + 4 + 4 + 4 + 4] = 2; // first cell's n_seq_id
        assert!(Cells::from_blob(&shared).is_err());
        assert!(Cells::from_blob(b"\0\0\0\0\0\0\0\0").is_err());
        // Random bytes after a valid header.
        let mut rng = 12345u64;
        for _ in 0..2000 {
            let mut b = blob.clone();
            for _ in 0..3 {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let at = (rng >> 33) as usize % b.len();
                b[at] ^= 1 << ((rng >> 20) % 8);
            }
            if let Ok(c) = Cells::from_blob(&b) {
                let _ = c.check(6, &Positions::default());
            }
        }
    }
}
