// Test-only kernels that fail on purpose (see attn_fault.toml). Each one has
// the same entry-point signature as a real attention template, so the tuner
// renders, compiles, loads and launches it exactly like a real variant.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace fc_fault {

enum Mode { MODE_ILLEGAL_ADDRESS = 0, MODE_HANG = 1, MODE_OK_BUT_WRONG = 2 };

template <typename T_, int HEAD_DIM_, int BLOCK_M_, int MODE_, bool CAUSAL_>
struct FaultConfig {
  using T = T_;
  static constexpr int D = HEAD_DIM_;
  static constexpr int BM = BLOCK_M_;
  static constexpr int MODE = MODE_;
  static constexpr bool CAUSAL = CAUSAL_;
  static constexpr int THREADS = 128;
  static constexpr int MIN_BLOCKS = 1;
  static constexpr int SMEM_BYTES = 0;
};

// About 10 minutes at 2 GHz: long enough that only the watchdog ends it, but
// not infinite, so a GPU is never wedged for good if a kill goes wrong.
constexpr long long HANG_CYCLES = 1LL << 40;

template <class C>
__device__ __forceinline__ void run(const void* q, void* o, long long q_sb, long long q_sh, long long q_ss,
                                    long long o_sb, long long o_sh, long long o_ss, int sq) {
  using T = typename C::T;
  if constexpr (C::MODE == MODE_ILLEGAL_ADDRESS) {
    // A wild pointer far outside any allocation: the store faults with
    // "an illegal memory access was encountered" and poisons the context.
    volatile float* wild = reinterpret_cast<volatile float*>(reinterpret_cast<uintptr_t>(o) + (1ULL << 46));
    wild[threadIdx.x] = 1.0f;
  } else if constexpr (C::MODE == MODE_HANG) {
    const long long start = clock64();
    volatile int sink = 0;
    while (clock64() - start < HANG_CYCLES) sink = sink + 1;
    if (sink == -1) static_cast<T*>(o)[0] = T(0.0f);  // keeps the loop observable
  } else {
    // Every element of this block's rows is written, with finite values that
    // are not attention: O = 0.5 * Q + 1 (wrong, but never NaN).
    const int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * C::BM;
    const T* qb = static_cast<const T*>(q) + b * q_sb + h * q_sh;
    T* ob = static_cast<T*>(o) + b * o_sb + h * o_sh;
    for (int i = threadIdx.x; i < C::BM * C::D; i += C::THREADS) {
      const int r = m0 + i / C::D, c = i % C::D;
      if (r < sq) ob[r * o_ss + c] = T(0.5f * static_cast<float>(qb[r * q_ss + c]) + 1.0f);
    }
  }
}

}  // namespace fc_fault

#define ATTN_FWD_PARAMS                                                                                   \
  const void *q, const void *k, const void *v, void *o, float *lse, long long q_sb, long long q_sh,      \
      long long q_ss, long long k_sb, long long k_sh, long long k_ss, long long v_sb, long long v_sh,     \
      long long v_ss, long long o_sb, long long o_sh, long long o_ss, int sq, int sk, int h_per_kv,       \
      float scale

#define ATTN_FWD_BODY(CFG) fc_fault::run<CFG>(q, o, q_sb, q_sh, q_ss, o_sb, o_sh, o_ss, sq);
