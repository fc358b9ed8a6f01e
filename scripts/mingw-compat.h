/* Force-included into llama.cpp's C/C++ sources when `npm run prebuild --
 * --target x86_64-pc-windows-gnu` cross-builds with Debian 12's MinGW-w64
 * (headers v10), which declare SetThreadInformation(ThreadPowerThrottling)
 * but not the structure ggml-cpu passes to it (added in MinGW-w64 v11). */
#include <_mingw.h>
#if defined(__MINGW64_VERSION_MAJOR) && __MINGW64_VERSION_MAJOR < 11 && !defined(THREAD_POWER_THROTTLING_CURRENT_VERSION)
typedef struct _THREAD_POWER_THROTTLING_STATE {
  unsigned long Version;
  unsigned long ControlMask;
  unsigned long StateMask;
} THREAD_POWER_THROTTLING_STATE;
#define THREAD_POWER_THROTTLING_CURRENT_VERSION 1
#define THREAD_POWER_THROTTLING_EXECUTION_SPEED 0x1
#endif

/* GCC 12's AMX tile intrinsics pass the stride as `long`, 32 bits on
 * Windows, so the assembler gets a 32-bit index register (`(%rax,%edi,1)`)
 * and rejects ggml's AMX kernels (the sapphirerapids variant). Redefined
 * with a 64-bit stride, after the header that defines them. */
#if defined(__AMX_TILE__) && defined(_WIN64) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#include <immintrin.h>
#undef _tile_loadd_internal
#undef _tile_stream_loadd_internal
#undef _tile_stored_internal
#define _tile_loadd_internal(dst, base, stride) \
  __asm__ volatile("{tileloadd\t(%0,%1,1), %%tmm" #dst "|tileloadd\t%%tmm" #dst ", [%0+%1*1]}" ::"r"((const void *)(base)), "r"((long long)(stride)))
#define _tile_stream_loadd_internal(dst, base, stride) \
  __asm__ volatile("{tileloaddt1\t(%0,%1,1), %%tmm" #dst "|tileloaddt1\t%%tmm" #dst ", [%0+%1*1]}" ::"r"((const void *)(base)), "r"((long long)(stride)))
#define _tile_stored_internal(src, base, stride) \
  __asm__ volatile("{tilestored\t%%tmm" #src ", (%0,%1,1)|tilestored\t[%0+%1*1], %%tmm" #src "}" ::"r"((void *)(base)), "r"((long long)(stride)) : "memory")
#endif
