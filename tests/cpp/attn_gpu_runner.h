// Problem builders, oracles and GPU runners shared by the decode, prefill, composed, contract,
// fuzz and big-cache suites (one copy of each generator): C5 decode (any strides, plan options,
// graph replay, hang-safe waits), C7 prefill (any strides, graph replay) and the composed C4 -> C7
// and C3 -> C7 routes. Kernels of C5/C7 exist only with the CUTLASS headers, so include this under
// SELKV_HAVE_CUTLASS.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attn_check_util.h"
#include "gpu_test_util.h"
#include "reference/oracle.h"
#include "prefill/composed_ref.h"
#include "selkv/composed.h"
#include "selkv/decode.h"
#include "selkv/prefill.h"
#include "test_util.h"

namespace selkv::test {

// Runs `call(stream)` (enqueues work, returns a Status) eagerly, or captured into a CUDA graph and
// replayed twice; then waits with a deadline (sync_or_abort). False on any failure (reported).
template <typename F>
bool run_call(cudaStream_t stream, F&& call, bool graph, const std::string& what) {
  bool ok = true;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  if (graph) {
    ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok) {
      const Status st = call(stream);
      const bool ended = cudaStreamEndCapture(stream, &g) == cudaSuccess;
      if (!st.ok()) ADD_FAILURE() << what << ": " << st.to_string();
      ok = st.ok() && ended && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    }
    if (ok) ok = cudaGraphLaunch(ge, stream) == cudaSuccess && cudaGraphLaunch(ge, stream) == cudaSuccess;
    if (!ok) ADD_FAILURE() << what << ": graph capture / instantiate / launch failed";
  } else {
    const Status st = call(stream);
    ok = st.ok();
    if (!ok) ADD_FAILURE() << what << ": " << st.to_string();
  }
  ok = sync_or_abort(stream, what) && ok;
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  return ok;
}

// ---- C5 decode ------------------------------------------------------------------------------

struct DecodeProblem {
  int B = 1, S = 1, H = 64, K = 64;
  int64_t num_blocks = 0;
  int page = 64;
  int64_t block_stride = 0;
  std::vector<uint16_t> q;           // [B, S, H, 576]
  std::vector<uint8_t> cache;        // [num_blocks, block_stride]
  std::vector<int32_t> indices;      // [B, S, K]
  std::vector<int32_t> topk_length;  // [B] or empty (fixed top-k)
  std::vector<float> sink;           // [H] or empty
  float sm_scale = std::pow(576.f, -0.55f);
  int64_t nan_slot = -1;             // a slot no valid index selects; its record is all 0xFF (NaN)
  int64_t num_slots() const { return num_blocks * page; }
  PagedKvCache view() const {
    return PagedKvCache{cache.data(), num_blocks, page, block_stride, KvFormat::kDsMlaFp8};
  }
  int rows() const { return B * S; }
  // Entries [0, limit) of row r (= b * S + s) are candidates.
  int limit(int r) const {
    return topk_length.empty() ? K : std::clamp(topk_length[size_t(r / S)], 0, K);
  }
  bool valid(int r, int k) const {
    const int32_t v = indices[size_t(r) * K + k];
    return k < limit(r) && v >= 0 && v < num_slots();
  }
};

struct DecodeGenOpts {
  int B = 1, S = 1, H = 64, K = 64, page = 64;
  int64_t s_kv = 512;          // slots of each batch row's pool (rows of batch b select from it)
  int64_t stride_pad = 0;      // extra bytes per block (multiple of 16)
  bool dynamic = false;
  std::vector<int32_t> lens;   // topk_length when dynamic (empty: from {0, 1, 17, 63, 64, 65, ...})
  float garbage_rate = 0.06f;  // -1, -7, INT_MAX, INT_MIN, num_slots, num_slots + 5 inside rows
  float dup_rate = 0.02f;      // an entry repeating the previous one
  int empty_row = -1;          // a row (b * S + s) whose entries are all garbage
  float data_std = 0.1f;       // latent/rope std; q's is 0.1 / data_std (logit spread ~0.4)
  bool sink = false;           // attn_sink [H] ~ N(0, 1)
};

inline DecodeProblem make_decode_problem(const DecodeGenOpts& o, std::mt19937_64& rng) {
  DecodeProblem p;
  p.B = o.B; p.S = o.S; p.H = o.H; p.K = o.K; p.page = o.page;
  const int64_t tokens = int64_t(o.B) * o.s_kv;
  p.num_blocks = (tokens + o.page - 1) / o.page + 1;  // one spare block, never selected
  p.block_stride = int64_t(o.page) * fmt::kDsMlaRecordBytes + o.stride_pad;
  p.cache.assign(size_t(p.num_blocks * p.block_stride), 0xFF);  // NaN everywhere
  p.nan_slot = p.num_slots() - 1;
  p.q = randn_bf16(size_t(o.B) * o.S * o.H * fmt::kQkDim, 0.1f / o.data_std, rng);
  const int64_t ns = p.num_slots();
  if (o.dynamic) {
    const int defaults[] = {0, 1, 17, 63, 64, 65, 127, 128};
    for (int b = 0; b < o.B; ++b)
      p.topk_length.push_back(b < int(o.lens.size()) ? o.lens[size_t(b)]
                                                     : std::min(defaults[b % 8] + (b / 8) * 64, o.K));
  }
  const int32_t garbage[] = {-1, -7, INT_MAX, int32_t(ns), int32_t(ns + 5), INT_MIN};
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  p.indices.resize(size_t(o.B) * o.S * o.K);
  std::vector<int64_t> perm(size_t(o.s_kv));
  for (int b = 0; b < o.B; ++b)
    for (int s = 0; s < o.S; ++s) {
      const int r = b * o.S + s;
      int32_t* row = &p.indices[size_t(r) * o.K];
      std::iota(perm.begin(), perm.end(), int64_t(0));
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < o.K; ++k) {
        row[k] = int32_t(int64_t(b) * o.s_kv + perm[size_t(k) % perm.size()]);
        const float x = u01(rng);
        if (x < o.garbage_rate) row[k] = garbage[rng() % 6];
        else if (x < o.garbage_rate + o.dup_rate && k > 0) row[k] = row[k - 1];
      }
      if (r == o.empty_row)
        for (int k = 0; k < o.K; ++k) row[k] = garbage[k % 6];
      if (o.dynamic)  // poisoned tail past topk_length: must never be read
        for (int k = std::max(p.topk_length[size_t(b)], 0); k < o.K; ++k) {
          const int c = int(rng() % 4);
          row[k] = c == 0 ? -1 : c == 1 ? INT_MAX : c == 2 ? int32_t(p.nan_slot) : int32_t(rng() % uint64_t(ns));
        }
    }
  std::vector<char> referenced(size_t(ns), 0);
  for (int r = 0; r < p.rows(); ++r)
    for (int k = 0; k < p.limit(r); ++k)
      if (p.valid(r, k)) referenced[size_t(p.indices[size_t(r) * o.K + k])] = 1;
  const PagedKvCache v = p.view();
  for (int64_t slot = 0; slot < ns; ++slot) {
    if (!referenced[size_t(slot)]) continue;
    const auto latent = randn_bf16(fmt::kNopeDim, o.data_std, rng);
    const auto rope = randn_bf16(fmt::kRopeDim, o.data_std, rng);
    ref::encode_record(latent.data(), rope.data(), KvFormat::kDsMlaFp8,
                       (slot & 1) ? ScaleMode::kAmax : ScaleMode::kPow2, p.cache.data() + v.slot_offset(slot));
  }
  if (o.sink) {
    std::normal_distribution<float> d(0.f, 1.f);
    for (int h = 0; h < o.H; ++h) p.sink.push_back(d(rng));
  }
  return p;
}

inline void decode_oracle(const DecodeProblem& p, std::vector<float>* out, std::vector<float>* lse) {
  out->assign(size_t(p.rows()) * p.H * fmt::kVDim, 0.f);
  lse->assign(size_t(p.rows()) * p.H, 0.f);
  ref::SparseDecodeRefArgs a;
  a.q = p.q.data(); a.B = p.B; a.S_q = p.S; a.H = p.H;
  a.cache = p.view();
  a.indices = p.indices.data(); a.K = p.K;
  a.topk_length = p.topk_length.empty() ? nullptr : p.topk_length.data();
  a.sm_scale = p.sm_scale;
  a.attn_sink = p.sink.empty() ? nullptr : p.sink.data();
  a.out = out->data(); a.lse = lse->data();
  ref::sparse_decode(a);
}

enum NanWhere : int { kNanE4m3 = 1, kNanScale = 2, kNanQ = 4 };

// Poisons the problem as `where` asks and returns the (row * H + head) entries a NaN must reach:
// an E4M3 NaN byte (0x7F or 0xFF) in one record a valid entry of the first non-empty row selects,
// a NaN fp32 scale in one record of the last non-empty row (every head of every row that selects
// either), a NaN in one head of q of a middle row (that head only) and in head 0 of the empty row
// (no valid slot: stays out 0, lse -inf).
inline std::set<size_t> poison_decode(DecodeProblem& p, int where, int empty_row, std::mt19937_64& rng) {
  std::vector<int> live;
  for (int r = 0; r < p.rows(); ++r) {
    bool any = false;
    for (int k = 0; k < p.limit(r) && !any; ++k) any = p.valid(r, k);
    if (any) live.push_back(r);
  }
  std::set<size_t> nan;
  if (live.empty()) return nan;
  std::vector<int32_t> bad_slots;
  const PagedKvCache v = p.view();
  auto pick = [&](int r) {
    std::vector<int32_t> c;
    for (int k = 0; k < p.limit(r); ++k)
      if (p.valid(r, k)) c.push_back(p.indices[size_t(r) * p.K + k]);
    return c[rng() % c.size()];
  };
  if (where & kNanE4m3) {
    const int32_t s = pick(live.front());
    p.cache[size_t(v.slot_offset(s)) + rng() % 512] = (rng() & 1) ? 0x7F : 0xFF;
    bad_slots.push_back(s);
  }
  if (where & kNanScale) {
    const int32_t s = pick(live.back());
    const float nanv = std::nanf("");
    std::memcpy(p.cache.data() + v.slot_offset(s) + 512 + 4 * (rng() % 4), &nanv, 4);
    bad_slots.push_back(s);
  }
  for (int r = 0; r < p.rows(); ++r) {
    bool hit = false;
    for (int k = 0; k < p.limit(r) && !hit; ++k)
      hit = p.valid(r, k) && std::find(bad_slots.begin(), bad_slots.end(), p.indices[size_t(r) * p.K + k]) !=
                                 bad_slots.end();
    if (hit)
      for (int h = 0; h < p.H; ++h) nan.insert(size_t(r) * p.H + h);
  }
  if (where & kNanQ) {
    const int r = live[live.size() / 2], h = int(rng() % uint64_t(p.H));
    p.q[(size_t(r) * p.H + h) * fmt::kQkDim + rng() % fmt::kQkDim] = (rng() & 1) ? 0x7FC0 : 0xFFC1;
    nan.insert(size_t(r) * p.H + h);
    if (empty_row >= 0 && empty_row < p.rows()) p.q[size_t(empty_row) * p.H * fmt::kQkDim + 5] = 0x7FC0;
  }
  return nan;
}

// Padding (in elements) added to each stride of the device tensors; every pad must keep the
// API's 16-byte alignment: q / out pads multiples of 8, lse / indices pads multiples of 4.
struct DecodeLayout {
  int64_t q_head = 0, q_seq = 0, q_batch = 0;
  int64_t out_head = 0, out_seq = 0, out_batch = 0;
  int64_t lse_seq = 0, lse_batch = 0;
  int64_t idx_seq = 0, idx_batch = 0;
};

struct DecodeOut {
  std::vector<uint16_t> out;  // dense bf16 bits [B, S, H, 512]
  std::vector<float> lse;     // dense [B, S, H]
};

constexpr uint16_t kOutPoison = 0x7F7F;       // a finite bf16 no kernel writes by chance
constexpr uint32_t kLsePoisonBits = 0x7F7F7F7Fu;

// The device copy of one decode problem in a given layout: q / indices pads hold NaN q values and
// the problem's NaN slot, so a stray read shows; out / lse pads hold a poison checked on read().
class DecodeDevice {
 public:
  DecodeDevice(const DecodeProblem& p, const DecodeLayout& l = {}) : p_(p), l_(l) {
    const int64_t H = p.H;
    sp.batch = p.B; sp.seq_q = p.S; sp.num_heads = p.H; sp.topk = p.K;
    sp.q_head_stride = fmt::kQkDim + l.q_head;
    sp.q_seq_stride = H * sp.q_head_stride + l.q_seq;
    sp.q_batch_stride = p.S * sp.q_seq_stride + l.q_batch;
    sp.out_head_stride = fmt::kVDim + l.out_head;
    sp.out_seq_stride = H * sp.out_head_stride + l.out_seq;
    sp.out_batch_stride = p.S * sp.out_seq_stride + l.out_batch;
    sp.lse_seq_stride = H + l.lse_seq;
    sp.lse_batch_stride = p.S * sp.lse_seq_stride + l.lse_batch;
    sp.indices_seq_stride = p.K + l.idx_seq;
    sp.indices_batch_stride = p.S * sp.indices_seq_stride + l.idx_batch;
    q_elems_ = size_t(p.B) * sp.q_batch_stride;
    out_elems_ = size_t(p.B) * sp.out_batch_stride;
    lse_elems_ = size_t(p.B) * sp.lse_batch_stride;
    idx_elems_ = size_t(p.B) * sp.indices_batch_stride;
    std::vector<uint16_t> q(q_elems_, 0x7FC1);
    std::vector<int32_t> idx(idx_elems_, int32_t(p.nan_slot >= 0 ? p.nan_slot : 0));
    for (int b = 0; b < p.B; ++b)
      for (int s = 0; s < p.S; ++s) {
        for (int h = 0; h < p.H; ++h)
          std::memcpy(&q[size_t(b * sp.q_batch_stride + s * sp.q_seq_stride + h * sp.q_head_stride)],
                      &p.q[((size_t(b) * p.S + s) * p.H + h) * fmt::kQkDim], fmt::kQkDim * 2);
        std::memcpy(&idx[size_t(b * sp.indices_batch_stride + s * sp.indices_seq_stride)],
                    &p.indices[(size_t(b) * p.S + s) * p.K], size_t(p.K) * 4);
      }
    dq = std::make_unique<DevBuf>(q_elems_ * 2);
    dcache = std::make_unique<DevBuf>(p.cache.size());
    didx = std::make_unique<DevBuf>(idx_elems_ * 4);
    dlen = std::make_unique<DevBuf>(std::max<size_t>(p.topk_length.size(), 1) * 4);
    dsink = std::make_unique<DevBuf>(std::max<size_t>(p.sink.size(), 1) * 4);
    dout = std::make_unique<DevBuf>(out_elems_ * 2);
    dlse = std::make_unique<DevBuf>(lse_elems_ * 4);
    up(*dq, q); up(*dcache, p.cache); up(*didx, idx);
    if (!p.topk_length.empty()) up(*dlen, p.topk_length);
    if (!p.sink.empty()) up(*dsink, p.sink);
    sp.q = dq->ptr;
    sp.cache = PagedKvCache{dcache->ptr, p.num_blocks, p.page, p.block_stride, KvFormat::kDsMlaFp8};
    sp.indices = didx->as<int32_t>();
    sp.topk_length = p.topk_length.empty() ? nullptr : dlen->as<int32_t>();
    sp.attn_sink = p.sink.empty() ? nullptr : dsink->as<float>();
    sp.sm_scale = p.sm_scale;
    sp.out = dout->ptr;
    sp.lse = dlse->as<float>();
  }

  // The plan's shape for these params.
  DecodeShape shape(int num_sms = 0, int min_blocks = 0, DecodePartials f = DecodePartials::kAuto) const {
    DecodeShape s{sp.batch, sp.seq_q, sp.num_heads, sp.topk, sp.topk_length, num_sms};
    s.min_blocks_per_part = min_blocks;
    s.partials = f;
    return s;
  }

  void poison_outputs(cudaStream_t stream) const {
    EXPECT_EQ(cudaMemsetAsync(dout->ptr, 0x7F, out_elems_ * 2, stream), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(dlse->ptr, 0x7F, lse_elems_ * 4, stream), cudaSuccess);
  }

  // Dense copies of out / lse; pads must still hold the poison.
  DecodeOut read(const std::string& what) const {
    std::vector<uint16_t> out(out_elems_);
    std::vector<float> lse(lse_elems_);
    EXPECT_EQ(cudaMemcpy(out.data(), dout->ptr, out_elems_ * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(lse.data(), dlse->ptr, lse_elems_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    DecodeOut r;
    r.out.resize(size_t(p_.rows()) * p_.H * fmt::kVDim);
    r.lse.resize(size_t(p_.rows()) * p_.H);
    std::vector<char> covered_out(out_elems_, 0), covered_lse(lse_elems_, 0);
    for (int b = 0; b < p_.B; ++b)
      for (int s = 0; s < p_.S; ++s)
        for (int h = 0; h < p_.H; ++h) {
          const size_t dense = (size_t(b) * p_.S + s) * p_.H + h;
          const size_t o = size_t(b * sp.out_batch_stride + s * sp.out_seq_stride + h * sp.out_head_stride);
          const size_t l = size_t(b * sp.lse_batch_stride + s * sp.lse_seq_stride + h);
          std::memcpy(&r.out[dense * fmt::kVDim], &out[o], fmt::kVDim * 2);
          std::fill(covered_out.begin() + o, covered_out.begin() + o + fmt::kVDim, 1);
          r.lse[dense] = lse[l];
          covered_lse[l] = 1;
        }
    size_t bad = 0;
    for (size_t i = 0; i < out_elems_; ++i)
      if (!covered_out[i] && out[i] != kOutPoison) ++bad;
    for (size_t i = 0; i < lse_elems_; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &lse[i], 4);
      if (!covered_lse[i] && bits != kLsePoisonBits) ++bad;
    }
    EXPECT_EQ(bad, 0u) << what << ": the decode wrote into out / lse padding";
    return r;
  }

  const DecodeProblem& problem() const { return p_; }
  SparseDecodeParams sp;
  std::unique_ptr<DevBuf> dq, dcache, didx, dlen, dsink, dout, dlse;

 private:
  const DecodeProblem& p_;
  DecodeLayout l_;
  size_t q_elems_ = 0, out_elems_ = 0, lse_elems_ = 0, idx_elems_ = 0;
};

struct DecodeRunOpts {
  int num_sms = 0;
  int min_blocks = 0;
  DecodePartials partials = DecodePartials::kAuto;
  DecodeLayout layout;
  bool graph = false;  // capture metadata + decode into a CUDA graph and replay it twice
};

// Plans and runs one decode on a fresh stream; waits with a deadline. False on any failure
// (reported).
inline bool run_decode(const DecodeProblem& p, const DecodeRunOpts& o, DecodeOut* res, const std::string& what) {
  DecodeDevice d(p, o.layout);
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    ADD_FAILURE() << what << ": cudaStreamCreate";
    return false;
  }
  DevBuf dmd(decode_metadata_size(p.B, p.S));
  DecodeMetadata md;
  bool ok = true;
  d.poison_outputs(stream);
  const Status st = make_decode_metadata(d.shape(o.num_sms, o.min_blocks, o.partials), dmd.ptr, dmd.bytes, &md, stream);
  if (!st.ok()) { ADD_FAILURE() << what << ": " << st.to_string(); ok = false; }
  std::unique_ptr<DevBuf> dws;
  if (ok) {
    dws = std::make_unique<DevBuf>(decode_workspace_size(md));
    ok = run_call(stream, [&](cudaStream_t s) {
      if (o.graph) {  // the eager plan above sized the workspace; the graph re-plans on each replay
        const Status sm = make_decode_metadata(d.shape(o.num_sms, o.min_blocks, o.partials), dmd.ptr, dmd.bytes, &md, s);
        if (!sm.ok()) return sm;
      }
      return sparse_mla_decode(d.sp, md, dws->ptr, dws->bytes, s);
    }, o.graph, what);
  } else {
    (void)sync_or_abort(stream, what);
  }
  cudaStreamDestroy(stream);
  if (ok) *res = d.read(what);
  return ok;
}

inline std::string decode_name(const DecodeProblem& p, const DecodeRunOpts& o) {
  return "B" + std::to_string(p.B) + " S" + std::to_string(p.S) + " H" + std::to_string(p.H) + " K" +
         std::to_string(p.K) + " page" + std::to_string(p.page) + (p.topk_length.empty() ? "" : " dyn") +
         " sms" + std::to_string(o.num_sms) + " minblk" + std::to_string(o.min_blocks) + " partials" +
         std::to_string(int(o.partials));
}

// ---- C7 prefill -------------------------------------------------------------------------------

struct PrefillProblem {
  int T = 1, H = 64, D = 576, K = 64;
  int64_t N = 64;
  std::vector<uint16_t> q, kv;     // [T, H, D], [N, D]
  std::vector<int32_t> idx, len;   // [T, K]; len [T] or empty
  std::vector<float> sink;         // attn_sink [H] or empty
  float sm_scale = 0.f;
};

struct PrefillGenOpts {
  int T = 1, H = 64, D = 576, K = 64;
  int64_t N = 64;
  bool dynamic = false;
  int empty_every = 17;  // token t with t % empty_every == 5: every entry invalid (0: none)
  std::vector<int32_t> lens;  // topk_length when dynamic (empty: random, edges included)
  bool sink = false;  // attn_sink [H] ~ N(0, 2) (the lse's scale), head 0 -inf (no effect), head 1 +inf (out 0)
};

// q ~ randn, kv ~ randn / 10 (FlashMLA's calibration); kv rows no valid entry references are NaN.
inline PrefillProblem make_prefill_problem(const PrefillGenOpts& c, std::mt19937_64& rng) {
  PrefillProblem pr;
  pr.T = c.T; pr.H = c.H; pr.D = c.D; pr.K = c.K; pr.N = c.N;
  pr.q = randn_bf16(size_t(c.T) * c.H * c.D, 1.f, rng);
  pr.kv = randn_bf16(size_t(c.N) * c.D, 0.1f, rng);
  pr.sm_scale = std::pow(float(c.D), -0.55f);
  const int32_t bad[] = {-1, INT_MIN, int32_t(c.N), int32_t(c.N + 1), INT_MAX, -2};
  pr.idx.resize(size_t(c.T) * c.K);
  if (c.dynamic) pr.len.resize(size_t(c.T));
  std::vector<char> referenced(size_t(c.N), 0);
  for (int t = 0; t < c.T; ++t) {
    int32_t l = c.K;
    if (c.dynamic) {
      const int r = int(rng() % 6);
      l = r == 0 ? -int32_t(rng() % 3) : r == 1 ? c.K + int32_t(rng() % 3) : int32_t(rng() % uint64_t(c.K + 1));
      if (t < int(c.lens.size())) l = c.lens[size_t(t)];
      pr.len[size_t(t)] = l;
    }
    const bool empty_row = c.empty_every > 0 && t % c.empty_every == 5;
    for (int k = 0; k < c.K; ++k) {
      int32_t v;
      const int r = int(rng() % 8);
      if (empty_row || r == 0) v = bad[rng() % 6];
      else if (r == 1 && k > 0) v = pr.idx[size_t(t) * c.K + k - 1];  // duplicate
      else v = int32_t(rng() % uint64_t(c.N));
      pr.idx[size_t(t) * c.K + k] = v;
      if (k < l && v >= 0 && v < c.N) referenced[size_t(v)] = 1;
    }
  }
  for (int64_t n = 0; n < c.N; ++n)
    if (!referenced[size_t(n)])
      for (int d = 0; d < c.D; ++d) pr.kv[size_t(n) * c.D + d] = 0x7FC1;
  if (c.sink) {
    std::normal_distribution<float> nd(0.f, 2.f);
    pr.sink.resize(size_t(c.H));
    for (auto& v : pr.sink) v = nd(rng);
    pr.sink[0] = -INFINITY;
    if (c.H > 1) pr.sink[1] = INFINITY;
  }
  return pr;
}

struct PrefillOut {
  std::vector<uint16_t> out;  // dense [T, H, 512]
  std::vector<float> ml, lse;  // dense [T, H]
};

inline void prefill_oracle(const PrefillProblem& pr, PrefillOut* r, std::vector<float>* ref_out) {
  const size_t rows = size_t(pr.T) * pr.H;
  ref_out->assign(rows * 512, 0.f);
  r->ml.assign(rows, 0.f);
  r->lse.assign(rows, 0.f);
  ref::SparsePrefillRefArgs a;
  a.q = pr.q.data(); a.T = pr.T; a.H = pr.H; a.d_qk = pr.D;
  a.kv = pr.kv.data(); a.num_kv = pr.N; a.indices = pr.idx.data(); a.K = pr.K;
  a.topk_length = pr.len.empty() ? nullptr : pr.len.data();
  a.sm_scale = pr.sm_scale;
  a.attn_sink = pr.sink.empty() ? nullptr : pr.sink.data();
  a.out = ref_out->data(); a.max_logits = r->ml.data(); a.lse = r->lse.data();
  const Status st = ref::check_sparse_prefill_args(a);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (st.ok()) ref::sparse_prefill(a);
}

// The prefill tolerances of `got` against the oracle on the same problem.
inline void expect_prefill_matches_oracle(const PrefillProblem& pr, const PrefillOut& got, const std::string& what) {
  PrefillOut ref;
  std::vector<float> ref_out;
  prefill_oracle(pr, &ref, &ref_out);
  expect_prefill_close(got.out, got.ml, got.lse, ref_out, ref.ml, ref.lse, pr.H, what);
}

// Padding in elements (q / out / kv pads multiples of 8, ml / lse / indices pads multiples of 4).
struct PrefillLayout {
  int64_t q_head = 0, q_token = 0, out_head = 0, out_token = 0, ml_token = 0, lse_token = 0,
          idx_token = 0, kv_row = 0;
};

// Runs C7 with the given layout on a fresh stream (deadline wait); pads of q / kv / indices hold
// NaN or out-of-range garbage, pads of out / ml / lse a poison that must survive. graph: the call
// captured into a CUDA graph and replayed twice.
inline bool run_prefill(const PrefillProblem& pr, const PrefillLayout& l, PrefillOut* res, const std::string& what,
                        bool graph = false) {
  SparsePrefillParams p;
  p.num_tokens = pr.T; p.num_heads = pr.H; p.d_qk = pr.D; p.num_kv = pr.N; p.topk = pr.K;
  p.sm_scale = pr.sm_scale;
  p.q_head_stride = pr.D + l.q_head;
  p.q_token_stride = pr.H * p.q_head_stride + l.q_token;
  p.out_head_stride = 512 + l.out_head;
  p.out_token_stride = pr.H * p.out_head_stride + l.out_token;
  p.max_logits_token_stride = pr.H + l.ml_token;
  p.lse_token_stride = pr.H + l.lse_token;
  p.indices_token_stride = pr.K + l.idx_token;
  p.kv_row_stride = pr.D + l.kv_row;
  const size_t nq = size_t(pr.T) * p.q_token_stride, nout = size_t(pr.T) * p.out_token_stride,
               nml = size_t(pr.T) * p.max_logits_token_stride, nlse = size_t(pr.T) * p.lse_token_stride,
               nidx = size_t(pr.T) * p.indices_token_stride, nkv = size_t(pr.N) * p.kv_row_stride;
  std::vector<uint16_t> q(nq, 0x7FC1), kv(std::max<size_t>(nkv, 1), 0x7FC1);
  std::vector<int32_t> idx(nidx, int32_t(pr.N));  // pads: out of range
  for (int t = 0; t < pr.T; ++t) {
    for (int h = 0; h < pr.H; ++h)
      std::memcpy(&q[size_t(t) * p.q_token_stride + size_t(h) * p.q_head_stride],
                  &pr.q[(size_t(t) * pr.H + h) * pr.D], size_t(pr.D) * 2);
    std::memcpy(&idx[size_t(t) * p.indices_token_stride], &pr.idx[size_t(t) * pr.K], size_t(pr.K) * 4);
  }
  for (int64_t n = 0; n < pr.N; ++n)
    std::memcpy(&kv[size_t(n) * p.kv_row_stride], &pr.kv[size_t(n) * pr.D], size_t(pr.D) * 2);
  DevBuf dq(nq * 2), dkv(kv.size() * 2), didx(nidx * 4), dlen(std::max<size_t>(pr.len.size(), 1) * 4),
      dsink(std::max<size_t>(pr.sink.size(), 1) * 4), dout(nout * 2), dml(nml * 4), dlse(nlse * 4);
  up(dq, q); up(dkv, kv); up(didx, idx);
  if (!pr.len.empty()) up(dlen, pr.len);
  if (!pr.sink.empty()) up(dsink, pr.sink);
  EXPECT_EQ(cudaMemset(dout.ptr, 0x7F, nout * 2), cudaSuccess);
  EXPECT_EQ(cudaMemset(dml.ptr, 0x7F, nml * 4), cudaSuccess);
  EXPECT_EQ(cudaMemset(dlse.ptr, 0x7F, nlse * 4), cudaSuccess);
  p.q = dq.ptr; p.kv = dkv.ptr; p.indices = didx.as<int32_t>();
  p.topk_length = pr.len.empty() ? nullptr : dlen.as<int32_t>();
  p.attn_sink = pr.sink.empty() ? nullptr : dsink.as<float>();
  p.out = dout.ptr; p.max_logits = dml.as<float>(); p.lse = dlse.as<float>();
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    ADD_FAILURE() << what << ": cudaStreamCreate";
    return false;
  }
  const bool ok = run_call(stream, [&](cudaStream_t st) { return sparse_mla_prefill(p, st); }, graph, what);
  cudaStreamDestroy(stream);
  if (!ok) return false;
  const auto out = down<uint16_t>(dout, nout);
  const auto ml = down<float>(dml, nml);
  const auto lse = down<float>(dlse, nlse);
  res->out.resize(size_t(pr.T) * pr.H * 512);
  res->ml.resize(size_t(pr.T) * pr.H);
  res->lse.resize(size_t(pr.T) * pr.H);
  std::vector<char> cov_out(nout, 0), cov_ml(nml, 0), cov_lse(nlse, 0);
  for (int t = 0; t < pr.T; ++t)
    for (int h = 0; h < pr.H; ++h) {
      const size_t dense = size_t(t) * pr.H + h;
      const size_t o = size_t(t) * p.out_token_stride + size_t(h) * p.out_head_stride;
      std::memcpy(&res->out[dense * 512], &out[o], 512 * 2);
      std::fill(cov_out.begin() + o, cov_out.begin() + o + 512, 1);
      res->ml[dense] = ml[size_t(t) * p.max_logits_token_stride + h];
      res->lse[dense] = lse[size_t(t) * p.lse_token_stride + h];
      cov_ml[size_t(t) * p.max_logits_token_stride + h] = 1;
      cov_lse[size_t(t) * p.lse_token_stride + h] = 1;
    }
  size_t bad = 0;
  for (size_t i = 0; i < nout; ++i) bad += !cov_out[i] && out[i] != kOutPoison;
  for (size_t i = 0; i < nml; ++i) {
    uint32_t b;
    std::memcpy(&b, &ml[i], 4);
    bad += !cov_ml[i] && b != kLsePoisonBits;
  }
  for (size_t i = 0; i < nlse; ++i) {
    uint32_t b;
    std::memcpy(&b, &lse[i], 4);
    bad += !cov_lse[i] && b != kLsePoisonBits;
  }
  EXPECT_EQ(bad, 0u) << what << ": the prefill wrote into out / max_logits / lse padding";
  return true;
}

inline std::string prefill_name(const PrefillProblem& p) {
  return "T" + std::to_string(p.T) + " H" + std::to_string(p.H) + " D" + std::to_string(p.D) + " K" +
         std::to_string(p.K) + " N" + std::to_string(p.N) + (p.len.empty() ? "" : " dyn") +
         (p.sink.empty() ? "" : " sink");
}


// ---- composed route (a): FP8 paged cache + physical indices -> C4 -> C7 ----------------------

struct DqProblem {
  KvFormat format = KvFormat::kDsMlaFp8;
  int page = 64;
  int64_t num_blocks = 0, block_stride = 0;
  int T = 1, H = 64, K = 64;
  std::vector<uint8_t> cache;
  std::vector<uint16_t> q;        // [T, H, D]
  std::vector<int32_t> idx, len;  // [T, K]; len [T] or empty
  int64_t idx_pad = 0;            // extra indices per token row on the device (garbage 0x5a5a5a5a)
  size_t ws_slack = 0;            // workspace bytes past the required size (must stay untouched)
  int D() const { return fmt::dequant_dim(format); }
  int64_t P() const { return num_blocks * page; }
  PagedKvCache view() const { return PagedKvCache{cache.data(), num_blocks, page, block_stride, format}; }
};

struct DqGenOpts {
  KvFormat format = KvFormat::kDsMlaFp8;
  int page = 64;
  int64_t num_blocks = 16;
  int T = 4, H = 64, K = 64;
  bool dynamic = false;
  int empty_every = 13;  // token t with t % empty_every == 4 has no valid entry (0: none)
  int64_t idx_pad = 0;   // DqProblem::idx_pad
  size_t ws_slack = 0;   // DqProblem::ws_slack
};

// Records (randn / 10, pow2 and amax scales) only where a valid entry points; every other byte is
// 0xFF (E4M3 NaN, NaN scales), so a stray read shows.
inline DqProblem make_dq_problem(const DqGenOpts& c, std::mt19937_64& rng) {
  DqProblem p;
  p.format = c.format; p.page = c.page; p.num_blocks = c.num_blocks; p.T = c.T; p.H = c.H; p.K = c.K;
  p.idx_pad = c.idx_pad; p.ws_slack = c.ws_slack;
  p.block_stride = int64_t(c.page) * fmt::record_bytes(c.format) + 16 * int64_t(rng() % 2);
  p.cache.assign(size_t(p.num_blocks * p.block_stride), 0xFF);
  const int64_t P = p.P();
  const int32_t bad[] = {-1, INT_MIN, int32_t(P), int32_t(P + 1), INT_MAX, -2};
  p.idx.resize(size_t(c.T) * c.K);
  if (c.dynamic) p.len.resize(size_t(c.T));
  std::vector<char> referenced(size_t(P), 0);
  for (int t = 0; t < c.T; ++t) {
    int32_t l = c.K;
    if (c.dynamic) {
      const int r = int(rng() % 4);
      l = r == 0 ? -1 : r == 1 ? c.K + 3 : int32_t(rng() % uint64_t(c.K + 1));
      p.len[size_t(t)] = l;
    }
    for (int k = 0; k < c.K; ++k) {
      int32_t v = int32_t(rng() % uint64_t(P));
      const int r = int(rng() % 8);
      if ((c.empty_every > 0 && t % c.empty_every == 4) || r == 0) v = bad[rng() % 6];
      else if (r == 1 && k > 0) v = p.idx[size_t(t) * c.K + k - 1];  // duplicate
      p.idx[size_t(t) * c.K + k] = v;
      if (k < l && v >= 0 && v < P) referenced[size_t(v)] = 1;
    }
  }
  const PagedKvCache v = p.view();
  for (int64_t s = 0; s < P; ++s) {
    if (!referenced[size_t(s)]) continue;
    const auto lat = randn_bf16(512, 0.1f, rng);
    const auto rope = randn_bf16(64, 0.1f, rng);
    ref::encode_record(lat.data(), rope.data(), c.format, (s & 1) ? ScaleMode::kAmax : ScaleMode::kPow2,
                       p.cache.data() + v.slot_offset(s));
  }
  p.q = randn_bf16(size_t(c.T) * c.H * p.D(), 1.f, rng);
  return p;
}

struct ComposedOut {
  PrefillOut o;
  std::vector<uint8_t> ws;
};

// The attention side both composed routes (C4 -> C7, C3 -> C7) share on the device: q, the padded
// index rows, the lengths, the workspace (0xFF) and the poisoned outputs; bind() points a call's
// attn / workspace at them, run() launches on a fresh stream (deadline wait; graph: captured and
// replayed twice) and downloads out / max_logits / lse / workspace.
struct ComposedAttnBufs {
  size_t nout, nst, ws_bytes;
  DevBuf didx, dlen, dq, dws, dout, dml, dlse;
  template <class P>
  ComposedAttnBufs(const P& p, const std::vector<int32_t>& idx, size_t ws)
      : nout(size_t(p.T) * p.H * 512), nst(size_t(p.T) * p.H), ws_bytes(ws), didx(idx.size() * 4),
        dlen(std::max<size_t>(p.len.size(), 1) * 4), dq(p.q.size() * 2), dws(ws), dout(nout * 2), dml(nst * 4),
        dlse(nst * 4) {
    up(didx, idx);
    up(dq, p.q);
    if (!p.len.empty()) up(dlen, p.len);
    EXPECT_EQ(cudaMemset(dws.ptr, 0xFF, ws), cudaSuccess);
    EXPECT_EQ(cudaMemset(dout.ptr, 0x7F, nout * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(dml.ptr, 0xFF, nst * 4), cudaSuccess);
    EXPECT_EQ(cudaMemset(dlse.ptr, 0xFF, nst * 4), cudaSuccess);
  }
  template <class A>
  void bind(A& a, bool has_len) const {
    a.attn.q = dq.ptr; a.attn.indices = didx.as<int32_t>();
    a.attn.topk_length = has_len ? dlen.as<int32_t>() : nullptr;
    a.attn.out = dout.ptr; a.attn.max_logits = dml.as<float>(); a.attn.lse = dlse.as<float>();
    a.workspace = dws.ptr;
  }
  template <class Launch>
  bool run(Launch launch, bool graph, const std::string& what, ComposedOut* r) const {
    cudaStream_t stream;
    if (cudaStreamCreate(&stream) != cudaSuccess) return false;
    const bool ok = run_call(stream, launch, graph, what);
    cudaStreamDestroy(stream);
    if (!ok) return false;
    r->o.out = down<uint16_t>(dout, nout);
    r->o.ml = down<float>(dml, nst);
    r->o.lse = down<float>(dlse, nst);
    r->ws = down<uint8_t>(dws, ws_bytes);
    return true;
  }
};

// The oracle of a composed call h (its route's fields filled): q, index rows, lengths, poisoned
// host outputs and an aligned 0xFF workspace, then call(h); out (bf16, as floats in *ref_out),
// max_logits, lse and the workspace bytes into *r.
template <class P, class H, class Call>
bool run_composed_ref(const P& p, const std::vector<int32_t>& idx, H& h, Call call, ComposedOut* r,
                      std::vector<float>* ref_out) {
  const size_t nout = size_t(p.T) * p.H * 512, nst = size_t(p.T) * p.H;
  std::vector<uint16_t> out(nout, 0xFFFF);
  r->o.ml.assign(nst, 0.f);
  r->o.lse.assign(nst, 0.f);
  std::vector<uint8_t> host_ws(h.workspace_bytes + 16, 0xFF);
  auto* hw = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(host_ws.data()) + 15) & ~uintptr_t(15));
  h.attn.q = p.q.data(); h.attn.indices = idx.data();
  h.attn.topk_length = p.len.empty() ? nullptr : p.len.data();
  h.attn.out = out.data(); h.attn.max_logits = r->o.ml.data(); h.attn.lse = r->o.lse.data();
  h.workspace = hw;
  const Status st = call(h);
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (!st.ok()) return false;
  r->ws.assign(hw, hw + h.workspace_bytes);
  r->o.out = out;
  ref_out->resize(nout);
  for (size_t i = 0; i < nout; ++i) (*ref_out)[i] = f32(out[i]);
  return true;
}

// GPU vs oracle of a composed route's call: prefill tolerances (NaN rows included), workspace bit
// for bit. run_gpu(p, &out, what, graph) and run_ref(p, &out, &ref_out) are the route's runners.
template <class P, class RunGpu, class RunRef>
void check_composed_case(const P& p, const std::string& what, ComposedOut* keep, bool graph, RunGpu run_gpu,
                         RunRef run_ref) {
  ComposedOut g, r;
  std::vector<float> ref_out;
  if (!run_gpu(p, &g, what, graph) || !run_ref(p, &r, &ref_out)) return;
  expect_prefill_close(g.o.out, g.o.ml, g.o.lse, ref_out, r.o.ml, r.o.lse, p.H, what);
  EXPECT_TRUE(bits_equal(g.ws, r.ws)) << what << ": workspace differs from the oracle's";
  if (keep) *keep = std::move(g);
}

inline DequantPrefillParams dq_params(const DqProblem& p) {
  DequantPrefillParams a;
  a.attn.num_tokens = p.T; a.attn.num_heads = p.H; a.attn.d_qk = p.D();
  a.attn.topk = p.K; a.attn.sm_scale = std::pow(float(p.D()), -0.55f);
  set_contiguous_strides(&a.attn);
  a.attn.kv_row_stride = 0;  // owned by the call
  a.attn.num_kv = 0;
  a.attn.indices_token_stride = p.K + p.idx_pad;
  a.cache = p.view();
  a.workspace_bytes = dequant_prefill_workspace_size(p.T, p.K, p.P(), p.format) + p.ws_slack;
  return a;
}

// Dense [T, K] indices laid out in rows of K + pad, pads 0x5a5a5a5a (out of range, never read).
inline std::vector<int32_t> pad_index_rows(const std::vector<int32_t>& idx, int T, int K, int64_t pad) {
  if (pad == 0) return idx;
  const int64_t st = K + pad;
  std::vector<int32_t> v(size_t(T * st), 0x5a5a5a5a);
  for (int t = 0; t < T; ++t) std::copy_n(&idx[size_t(t) * K], K, &v[size_t(t * st)]);
  return v;
}

// The indices as laid out for the call: rows of K + idx_pad.
inline std::vector<int32_t> dq_indices(const DqProblem& p) { return pad_index_rows(p.idx, p.T, p.K, p.idx_pad); }

// GPU run (fresh stream, deadline wait; graph: captured and replayed twice); the workspace starts
// as 0xFF.
inline bool run_dq_gpu(const DqProblem& p, ComposedOut* r, const std::string& what, bool graph = false) {
  DequantPrefillParams a = dq_params(p);
  const ComposedAttnBufs bufs(p, dq_indices(p), a.workspace_bytes);
  DevBuf dcache(p.cache.size());
  up(dcache, p.cache);
  bufs.bind(a, !p.len.empty());
  a.cache.data = dcache.ptr;
  return bufs.run([&](cudaStream_t st) { return dequant_sparse_mla_prefill(a, st); }, graph, what, r);
}

// The oracle of the same call: out (bf16, as floats), max_logits, lse and the workspace bytes.
inline bool run_dq_ref(const DqProblem& p, ComposedOut* r, std::vector<float>* ref_out) {
  DequantPrefillParams h = dq_params(p);
  return run_composed_ref(
      p, dq_indices(p), h, [](const DequantPrefillParams& x) { return ref::dequant_sparse_mla_prefill(x); }, r,
      ref_out);
}

// GPU vs oracle: prefill tolerances (NaN rows included), workspace bit for bit.
inline void check_dq_case(const DqProblem& p, const std::string& what, ComposedOut* keep = nullptr,
                          bool graph = false) {
  check_composed_case(p, what, keep, graph, run_dq_gpu, run_dq_ref);
}

inline std::string dq_name(const DqProblem& p) {
  return std::string(p.format == KvFormat::kDsMlaFp8 ? "ds_mla_fp8" : "nope_fp8") + " page" +
         std::to_string(p.page) + " blocks" + std::to_string(p.num_blocks) + " T" + std::to_string(p.T) + " H" +
         std::to_string(p.H) + " K" + std::to_string(p.K) + (p.len.empty() ? "" : " dyn") +
         (int64_t(p.T) * p.K < p.P() ? " selected" : " full-pool");
}

// ---- composed route (b): C3 gather of each request's chunk -> C7 -----------------------------

struct GatherProblem {
  KvFormat format = KvFormat::kDsMlaFp8;
  int page = 64;
  int64_t num_blocks = 0, block_stride = 0;
  int32_t max_blocks = 0;                        // max_blocks_per_req
  int64_t bt_stride = 0;                         // block table row stride (> max_blocks)
  std::vector<uint8_t> cache;
  std::vector<int32_t> block_table;              // [reqs, bt_stride]
  std::vector<int32_t> starts, lens, ws_starts;  // [reqs]
  int64_t kv_rows = 0;                           // workspace rows (gaps included)
  int T = 1, H = 64, K = 64;
  std::vector<uint16_t> q;                       // [T, H, D]
  std::vector<int32_t> idx, len;                 // [T, K] workspace rows; len [T] or empty
  int64_t idx_pad = 0;                           // extra indices per token row on the device
  size_t ws_slack = 0;                           // workspace bytes past the required size
  int D() const { return fmt::dequant_dim(format); }
  int reqs() const { return int(starts.size()); }
  PagedKvCache view() const { return PagedKvCache{cache.data(), num_blocks, page, block_stride, format}; }
  int limit(int t) const { return len.empty() ? K : std::clamp(len[size_t(t)], 0, K); }
  bool valid(int t, int k) const {
    const int32_t v = idx[size_t(t) * K + k];
    return k < limit(t) && v >= 0 && v < kv_rows;
  }
  // The physical slot gathered into workspace row `row`; -1 for a gap row.
  int64_t slot_of_row(int64_t row) const {
    for (int r = 0; r < reqs(); ++r) {
      const int64_t i = row - ws_starts[size_t(r)];
      if (i < 0 || i >= lens[size_t(r)]) continue;
      const int64_t pos = starts[size_t(r)] + i;
      return int64_t(block_table[size_t(r * bt_stride + pos / page)]) * page + pos % page;
    }
    return -1;
  }
};

struct GatherGenOpts {
  KvFormat format = KvFormat::kDsMlaFp8;
  int page = 64;
  int reqs = 1;
  int T = 4, H = 64, K = 64;
  bool dynamic = false;
  std::vector<int32_t> starts, lens;  // per request (empty: odd starts < 3 * page, lens < 300, >= 1 for request 0)
  int empty_every = 11;  // token t with t % empty_every == 3 has no valid entry (0: none)
  int64_t idx_pad = 0;   // GatherProblem::idx_pad
  size_t ws_slack = 0;   // GatherProblem::ws_slack
};

// Requests land in the workspace in a shuffled order, 3 unwritten rows after each (they stay
// NaN; no index points at them). Only gathered positions hold records (randn / 10, pow2 and amax
// scales): every other cache byte is 0xFF and every block-table entry no gathered position needs
// is -1, out of range or a spare NaN block, so a stray read shows. Each token attends inside one
// request's rows.
inline GatherProblem make_gather_problem(const GatherGenOpts& c, std::mt19937_64& rng) {
  GatherProblem p;
  p.format = c.format; p.page = c.page; p.T = c.T; p.H = c.H; p.K = c.K;
  p.idx_pad = c.idx_pad; p.ws_slack = c.ws_slack;
  const int n = c.reqs;
  p.starts.resize(size_t(n)); p.lens.resize(size_t(n)); p.ws_starts.resize(size_t(n));
  int64_t used_blocks = 0, furthest = 1;
  for (int r = 0; r < n; ++r) {
    const size_t i = size_t(r);
    p.lens[i] = i < c.lens.size() ? c.lens[i] : int32_t(rng() % 300) + (r == 0 ? 1 : 0);
    p.starts[i] = i < c.starts.size() ? c.starts[i] : int32_t(rng() % uint64_t(3 * c.page)) | 1;
    const int64_t first = p.starts[i] / c.page, end = (int64_t(p.starts[i]) + p.lens[i] + c.page - 1) / c.page;
    if (p.lens[i] > 0) used_blocks += end - first;
    furthest = std::max(furthest, end);
  }
  p.max_blocks = int32_t(furthest + 1);  // one entry past the furthest request's last block
  p.bt_stride = p.max_blocks + 3;  // padded table rows: entries past max_blocks are never read
  const int64_t spare = 3;
  p.num_blocks = used_blocks + spare;
  p.block_stride = int64_t(c.page) * fmt::record_bytes(c.format) + 16 * int64_t(rng() % 2);
  p.cache.assign(size_t(p.num_blocks * p.block_stride), 0xFF);
  std::vector<int32_t> perm(static_cast<size_t>(p.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int32_t unused[] = {-1, int32_t(p.num_blocks), INT_MAX, perm[size_t(used_blocks)]};
  p.block_table.resize(size_t(n * p.bt_stride));
  for (auto& b : p.block_table) b = unused[rng() % 4];
  size_t next = 0;
  const PagedKvCache v = p.view();
  for (int r = 0; r < n; ++r) {
    const int64_t s0 = p.starts[size_t(r)], s1 = s0 + p.lens[size_t(r)];
    for (int64_t b = s0 / c.page; s0 < s1 && b * c.page < s1; ++b)
      p.block_table[size_t(r * p.bt_stride + b)] = perm[next++];
    for (int64_t pos = s0; pos < s1; ++pos) {
      const int64_t slot = int64_t(p.block_table[size_t(r * p.bt_stride + pos / c.page)]) * c.page + pos % c.page;
      const auto lat = randn_bf16(512, 0.1f, rng);
      const auto rope = randn_bf16(64, 0.1f, rng);
      ref::encode_record(lat.data(), rope.data(), c.format, (slot & 1) ? ScaleMode::kAmax : ScaleMode::kPow2,
                         p.cache.data() + v.slot_offset(slot));
    }
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int r : order) {
    p.ws_starts[size_t(r)] = int32_t(p.kv_rows);
    p.kv_rows += p.lens[size_t(r)] + 3;
  }
  const int64_t R = p.kv_rows;
  const int32_t bad[] = {-1, INT_MIN, int32_t(R), int32_t(R + 1), INT_MAX, -2};
  p.idx.resize(size_t(c.T) * c.K);
  if (c.dynamic) p.len.resize(size_t(c.T));
  for (int t = 0; t < c.T; ++t) {
    if (c.dynamic) {
      const int d = int(rng() % 6);  // edges too: <= 0 and > K
      p.len[size_t(t)] = d == 0 ? -int32_t(rng() % 3) : d == 1 ? c.K + int32_t(rng() % 3)
                                                               : int32_t(rng() % uint64_t(c.K + 1));
    }
    const size_t r = size_t(rng() % uint64_t(n));
    const bool empty = c.empty_every > 0 && t % c.empty_every == 3;
    for (int k = 0; k < c.K; ++k) {
      int32_t x = p.lens[r] > 0 ? p.ws_starts[r] + int32_t(rng() % uint64_t(p.lens[r])) : -1;
      const int u = int(rng() % 8);
      if (empty || u == 0) x = bad[rng() % 6];
      else if (u == 1 && k > 0) x = p.idx[size_t(t) * c.K + k - 1];  // duplicate
      p.idx[size_t(t) * c.K + k] = x;
    }
  }
  p.q = randn_bf16(size_t(c.T) * c.H * p.D(), 1.f, rng);
  return p;
}

inline GatherPrefillParams gather_params(const GatherProblem& p) {
  GatherPrefillParams a;
  a.attn.num_tokens = p.T; a.attn.num_heads = p.H; a.attn.d_qk = p.D();
  a.attn.topk = p.K; a.attn.sm_scale = std::pow(float(p.D()), -0.55f);
  set_contiguous_strides(&a.attn);
  a.attn.kv_row_stride = 0;  // owned by the call
  a.attn.num_kv = 0;
  a.attn.indices_token_stride = p.K + p.idx_pad;
  a.gather.num_blocks = p.num_blocks; a.gather.page_size = p.page;
  a.gather.block_stride_bytes = p.block_stride; a.gather.format = p.format;
  a.gather.block_table_row_stride = p.bt_stride; a.gather.max_blocks_per_req = p.max_blocks;
  a.gather.num_reqs = p.reqs();
  a.num_kv_rows = p.kv_rows;
  a.workspace_bytes = gather_prefill_workspace_size(p.kv_rows, p.format) + p.ws_slack;
  return a;
}

// GPU run (fresh stream, deadline wait; graph: captured and replayed twice); the workspace starts
// as 0xFF.
inline bool run_gather_gpu(const GatherProblem& p, ComposedOut* r, const std::string& what, bool graph = false) {
  GatherPrefillParams a = gather_params(p);
  const ComposedAttnBufs bufs(p, pad_index_rows(p.idx, p.T, p.K, p.idx_pad), a.workspace_bytes);
  const size_t nr = size_t(p.reqs()) * 4;
  DevBuf dcache(p.cache.size()), dbt(p.block_table.size() * 4), dst(nr), dln(nr), dwss(nr);
  up(dcache, p.cache); up(dbt, p.block_table); up(dst, p.starts); up(dln, p.lens); up(dwss, p.ws_starts);
  bufs.bind(a, !p.len.empty());
  a.gather.cache = dcache.ptr; a.gather.block_table = dbt.as<int32_t>();
  a.gather.seq_starts = dst.as<int32_t>(); a.gather.seq_lens = dln.as<int32_t>();
  a.gather.ws_starts = dwss.as<int32_t>();
  return bufs.run([&](cudaStream_t st) { return gather_sparse_mla_prefill(a, st); }, graph, what, r);
}

// The oracle of the same call: out (bf16, as floats), max_logits, lse and the workspace bytes.
inline bool run_gather_ref(const GatherProblem& p, ComposedOut* r, std::vector<float>* ref_out) {
  GatherPrefillParams h = gather_params(p);
  h.gather.cache = p.cache.data(); h.gather.block_table = p.block_table.data();
  h.gather.seq_starts = p.starts.data(); h.gather.seq_lens = p.lens.data(); h.gather.ws_starts = p.ws_starts.data();
  return run_composed_ref(
      p, pad_index_rows(p.idx, p.T, p.K, p.idx_pad), h,
      [](const GatherPrefillParams& x) { return ref::gather_sparse_mla_prefill(x); }, r, ref_out);
}

// GPU vs oracle: prefill tolerances (NaN rows included), workspace bit for bit (gap rows and
// slack included).
inline void check_gather_case(const GatherProblem& p, const std::string& what, ComposedOut* keep = nullptr,
                              bool graph = false) {
  check_composed_case(p, what, keep, graph, run_gather_gpu, run_gather_ref);
}

inline std::string gather_name(const GatherProblem& p) {
  return std::string(p.format == KvFormat::kDsMlaFp8 ? "ds_mla_fp8" : "nope_fp8") + " page" +
         std::to_string(p.page) + " reqs" + std::to_string(p.reqs()) + " rows" + std::to_string(p.kv_rows) + " T" +
         std::to_string(p.T) + " H" + std::to_string(p.H) + " K" + std::to_string(p.K) +
         (p.len.empty() ? "" : " dyn");
}

}  // namespace selkv::test
