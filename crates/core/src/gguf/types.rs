//! ggml's tensor types as a GGUF file names them: block size and bytes per
//! block. The table is ggml's own (`ggml_blck_size`, `ggml_type_size`);
//! `engine::model`'s tests compare it with the linked ggml, so a vendored
//! update that adds or changes a type fails there, not in a user's load.

/// (id, name, elements per block, bytes per block). Removed types (ids
/// 4, 5, 31–33, 36–38) are absent: a file that uses one is refused.
const TYPES: [(u32, &str, u64, u64); 35] = [
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
    (42, "Q2_0", 64, 18),
];

/// A tensor type ggml can load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorType {
    pub id: u32,
    pub name: &'static str,
    pub block_size: u64,
    pub block_bytes: u64,
}

impl TensorType {
    pub fn from_id(id: u32) -> Option<TensorType> {
        TYPES.iter().find(|t| t.0 == id).map(|&(id, name, block_size, block_bytes)| TensorType { id, name, block_size, block_bytes })
    }

    /// Every type in the table.
    pub fn all() -> impl Iterator<Item = TensorType> {
        TYPES.iter().filter_map(|t| TensorType::from_id(t.0))
    }

    /// Bytes of a tensor of `elements` elements whose rows are whole blocks;
    /// `None` when that does not fit in a u64.
    pub fn bytes(&self, elements: u64) -> Option<u64> {
        (elements / self.block_size).checked_mul(self.block_bytes)
    }
}
