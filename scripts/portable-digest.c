// Prints the digest of every portable kernel (patch 0012's ggml_portable_digest):
// one "name<TAB>hash" line per op.
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>

int ggml_portable_digest(const char ** names, uint64_t * hashes, int max);

// ggml-cpu symbols portable.c links against but the digest never calls.
struct ggml_threadpool;
void ggml_barrier(struct ggml_threadpool * tp) { (void) tp; }
const void * ggml_get_type_traits_cpu(int type) { (void) type; return NULL; }

// ggml-base symbols of ggml.c the digest never reaches.
void ggml_critical_section_start(void) {}
void ggml_critical_section_end(void) {}
void ggml_backend_tensor_memset(void * t, unsigned char v, size_t o, size_t n) { (void) t; (void) v; (void) o; (void) n; }
void ggml_backend_tensor_set(void * t, const void * d, size_t o, size_t n) { (void) t; (void) d; (void) o; (void) n; }
int ggml_backend_buffer_get_usage(void * b) { (void) b; return 0; }

// Half to single precision, exactly (ggml-cpu.c fills this table at init).
float ggml_table_f32_f16[1 << 16];

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        exp = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    union { uint32_t u; float f; } v;
    v.u = bits;
    return v.f;
}

int main(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) {
        ggml_table_f32_f16[i] = half_to_float((uint16_t) i);
    }
    const char * names[64];
    uint64_t hashes[64];
    int n = ggml_portable_digest(names, hashes, 64);
    for (int i = 0; i < n && i < 64; i++) {
        printf("%s\t%016llx\n", names[i], (unsigned long long) hashes[i]);
    }
    return n > 0 ? 0 : 1;
}
