// The kernel arguments of the backward template: one parameter list that its three entry points share (the
// launcher, tuner/runtime/backward_launch.py, passes it positionally) and the struct the device code reads.
//
// Q, dQ [B, H, Sq, D]; K, V, dK, dV [B, Hkv, Sk, D]; O, dO like Q: element strides (batch, head, sequence; the head
// dim contiguous, rows 16-byte aligned). lse [B, H, Sq] fp32 contiguous as the forward writes it (natural log,
// -inf for a row that sees no key); lse_log2 and delta [B, H, ROW_PAD-padded Sq] and dq_accum [B, H, Sq, D] fp32
// are the launcher's scratch.
#pragma once

namespace fc {

struct BwdArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;
  float* lse_log2;
  float* delta;
  float* dq_accum;
  void* dq;
  void* dk;
  void* dv;
  long long q_sb, q_sh, q_ss;
  long long k_sb, k_sh, k_ss;
  long long v_sb, v_sh, v_ss;
  long long o_sb, o_sh, o_ss;
  long long do_sb, do_sh, do_ss;
  long long dq_sb, dq_sh, dq_ss;
  long long dk_sb, dk_sh, dk_ss;
  long long dv_sb, dv_sh, dv_ss;
  int sq, sk, heads, h_per_kv;
  float scale;  // softmax scale (natural units)
};

}  // namespace fc

#define ATTN_BWD_PARAMS ATTN_BWD_PARAMS_LIST
#define ATTN_BWD_PARAMS_LIST                                                                                    \
  const void *q, const void *k, const void *v, const void *o, const void *dout, const float *lse,              \
      float *lse_log2, float *delta, float *dq_accum, void *dq, void *dk, void *dv, long long q_sb,             \
      long long q_sh, long long q_ss, long long k_sb, long long k_sh, long long k_ss, long long v_sb,           \
      long long v_sh, long long v_ss, long long o_sb, long long o_sh, long long o_ss, long long do_sb,          \
      long long do_sh, long long do_ss, long long dq_sb, long long dq_sh, long long dq_ss, long long dk_sb,     \
      long long dk_sh, long long dk_ss, long long dv_sb, long long dv_sh, long long dv_ss, int sq, int sk,      \
      int heads, int h_per_kv, float scale

#define ATTN_BWD_ARGS                                                                                           \
  fc::BwdArgs {                                                                                                 \
    q, k, v, o, dout, lse, lse_log2, delta, dq_accum, dq, dk, dv, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb,     \
        v_sh, v_ss, o_sb, o_sh, o_ss, do_sb, do_sh, do_ss, dq_sb, dq_sh, dq_ss, dk_sb, dk_sh, dk_ss, dv_sb,     \
        dv_sh, dv_ss, sq, sk, heads, h_per_kv, scale                                                            \
  }
