#include <cuda_bf16.h>

#include <cmath>

#include "decode/combine.h"

namespace selkv::decode {
namespace {

constexpr int kHeadsPerCombineCta = 4;
constexpr int kCombineThreads = 128 * kHeadsPerCombineCta;  // 128 threads x 4 floats = 512 dims

__global__ void __launch_bounds__(kCombineThreads)
decode_combine_kernel(const DecodeKernelParams p) {
  const int32_t* md = p.metadata;
  const int32_t T = md[0], np = md[1];
  const int32_t* prefix = md + kMdHeaderInts;
  const int32_t r = blockIdx.x;
  const int32_t first_part = part_of(prefix[r], T, np);
  const int32_t last_part = part_of(prefix[r + 1] - 1, T, np);
  if (first_part == last_part) return;  // not split: written by the decode kernel
  const int32_t n_splits = last_part - first_part + 1;
  // Launched as a programmatic dependent of the decode kernel: wait for its completion (and the
  // visibility of its partials) before reading them. The metadata above was written by an earlier
  // kernel that had completed before the decode kernel started.
  asm volatile("griddepcontrol.wait;" ::: "memory");

  const int h = blockIdx.y * kHeadsPerCombineCta + threadIdx.x / 128;
  const int d = (threadIdx.x % 128) * 4;
  const int32_t b = r / p.seq_q, s = r % p.seq_q;

  // slot of part q for row r: 2q if q starts inside row r, else 2q+1 (its last row).
  auto slot_of = [&](int32_t q) {
    return 2 * q + (part_begin(q, T, np) >= prefix[r] ? 0 : 1);
  };
  float max_lse = -INFINITY;
  for (int32_t i = 0; i < n_splits; ++i) {
    const float l = p.accum_lse[int64_t(slot_of(first_part + i)) * p.num_heads + h];
    max_lse = fmaxf(max_lse, l);
  }
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum_w = 0.f;
  if (max_lse != -INFINITY) {
    for (int32_t i = 0; i < n_splits; ++i) {
      const int64_t slot = slot_of(first_part + i);
      const float l = p.accum_lse[slot * p.num_heads + h];
      const float w = expf(l - max_lse);  // 0 for an empty split (lse = -inf)
      sum_w += w;
      const float4 o = *reinterpret_cast<const float4*>(
          p.accum_out + (slot * p.num_heads + h) * 512 + d);
      acc.x += w * o.x; acc.y += w * o.y; acc.z += w * o.z; acc.w += w * o.w;
    }
  }
  float lse = -INFINITY, f = 0.f;
  if (max_lse != -INFINITY) {
    lse = max_lse + logf(sum_w);
    f = 1.f / sum_w;
    if (p.attn_sink != nullptr) f *= 1.f / (1.f + expf(p.attn_sink[h] - lse));
  }
  __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x * f, acc.y * f);
  __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z * f, acc.w * f);
  uint2 packed;
  packed.x = *reinterpret_cast<uint32_t*>(&lo);
  packed.y = *reinterpret_cast<uint32_t*>(&hi);
  uint16_t* out = p.out + b * p.out_batch_stride + s * p.out_seq_stride + h * p.out_head_stride + d;
  *reinterpret_cast<uint2*>(out) = packed;
  if (d == 0) p.lse[b * p.lse_batch_stride + s * p.lse_seq_stride + h] = lse;
}

}  // namespace

cudaError_t launch_decode_combine(const DecodeKernelParams& p, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(p.num_rows, p.num_heads / kHeadsPerCombineCta, 1);
  cfg.blockDim = dim3(kCombineThreads, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  // Programmatic dependent launch: the launch overlaps the decode kernel's tail (small batches
  // are latency-bound); correctness comes from griddepcontrol.wait in the kernel.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, decode_combine_kernel, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace selkv::decode
