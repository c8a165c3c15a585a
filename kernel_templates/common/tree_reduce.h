// Row reductions of the online softmax, over a thread's registers.
#pragma once

namespace fc {

// Pairwise reduction of v[0 .. 2W) into v[0], by compile-time recursion so
// every index is a constant (a run-time loop would put v in local memory).
template <int W>
struct TreeReduce {
  template <class Op>
  __device__ static __forceinline__ void run(float* v, Op op) {
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = op(v[i], v[i + W]);
    TreeReduce<W / 2>::run(v, op);
  }
};
template <>
struct TreeReduce<0> {
  template <class Op>
  __device__ static __forceinline__ void run(float*, Op) {}
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct AddOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

}  // namespace fc
