// A large paged FP8 cache for the C4 / composed-prefill benchmarks, built fast: kTemplate
// well-formed records (fill_random_records, or write-path records of randn/10 latents when
// `attention_scale` is set, so attention outputs stay in the data range of DESIGN §5) are
// uploaded once and replicated on the device; slot s holds template record s % kTemplate. The
// host keeps the template, so a checker can decode any slot without reading the device.
// model1_fp8 (scales in the page tail, padded pages): the template is kTemplate / page_size pages
// (at least one) of page_bytes each, replicated page-wise: block b holds template page
// b % template_pages.
#pragma once

#include <algorithm>
#include <vector>

#include "bench_util.h"
#include "cache_common.h"
#include "reference/oracle.h"
#include "selkv/formats.h"

namespace selkv::bench {

class Fp8Pool {
 public:
  static constexpr int64_t kTemplate = 4096;

  // num_slots rounded up to whole pages of page_size; pages are dense (stride = page * record).
  Fp8Pool(KvFormat format, int64_t num_slots, int32_t page_size, bool attention_scale, uint64_t seed)
      : format_(format), page_(page_size) {
    num_blocks_ = (num_slots + page_size - 1) / page_size;
    if (format == KvFormat::kModel1Fp8) {
      init_paged(attention_scale, seed);
      return;
    }
    const int rec = fmt::record_bytes(format);
    tmpl_.resize(size_t(kTemplate) * rec);
    Rng rng(seed);
    if (attention_scale) {
      for (int64_t s = 0; s < kTemplate; ++s) {
        const auto lat = random_bf16(fmt::kNopeDim, 0.1f, rng), rope = random_bf16(fmt::kRopeDim, 0.1f, rng);
        ref::encode_record(lat.data(), rope.data(), format, s % 2 ? ScaleMode::kAmax : ScaleMode::kPow2,
                           &tmpl_[size_t(s) * rec]);
      }
    } else {
      fill_random_records(tmpl_.data(), kTemplate, format, rng);
    }
    const size_t total = size_t(num_blocks_ * page_size) * rec;
    dev_ = DeviceBuffer(std::max<size_t>(total, 16));
    const size_t t_bytes = std::min(total, tmpl_.size());
    SELKV_BENCH_CUDA(cudaMemcpy(dev_.get(), tmpl_.data(), t_bytes, cudaMemcpyHostToDevice));
    // Doubling device copies: [0, n) -> [n, 2n); the template period stays kTemplate records.
    for (size_t done = t_bytes; done < total;) {
      const size_t n = std::min(done, total - done);
      SELKV_BENCH_CUDA(cudaMemcpy(dev_.as<uint8_t>() + done, dev_.get(), n, cudaMemcpyDeviceToDevice));
      done += n;
    }
    SELKV_BENCH_CUDA(cudaDeviceSynchronize());
  }

  PagedKvCache view() const {
    return PagedKvCache{dev_.get(), num_blocks_, page_, fmt::page_bytes(format_, page_), format_};
  }
  // bf16 row [dequant_dim] a reader must produce for `slot` (the oracle's decode of the template).
  void decode(int64_t slot, uint16_t* out) const {
    if (format_ != KvFormat::kModel1Fp8) {
      ref::decode_record(record(slot), format_, out);
      return;
    }
    const int64_t pb = fmt::page_bytes(format_, page_);
    ref::decode_token(&tmpl_[size_t(((slot / page_) % tmpl_pages_) * pb)], format_, page_, slot % page_, out);
  }
  int64_t num_slots() const { return num_blocks_ * page_; }
  // Host copy of the record at `slot` (pages are dense, so the byte offset is slot * record);
  // the in-record formats only (model1_fp8: decode()).
  const uint8_t* record(int64_t slot) const {
    return &tmpl_[size_t(slot % kTemplate) * fmt::record_bytes(format_)];
  }
  KvFormat format() const { return format_; }

 private:
  void init_paged(bool attention_scale, uint64_t seed) {
    const int64_t pb = fmt::page_bytes(format_, page_);
    tmpl_pages_ = std::max<int64_t>(1, kTemplate / page_);
    tmpl_.assign(size_t(tmpl_pages_ * pb), 0);
    Rng rng(seed);
    if (attention_scale) {
      for (int64_t s = 0; s < tmpl_pages_ * page_; ++s) {
        const auto lat = random_bf16(fmt::kNopeDim, 0.1f, rng), rope = random_bf16(fmt::kRopeDim, 0.1f, rng);
        ref::encode_token(lat.data(), rope.data(), format_, ScaleMode::kPow2, &tmpl_[size_t((s / page_) * pb)], page_,
                          s % page_);
      }
    } else {
      fill_random_cache(tmpl_.data(), tmpl_pages_, page_, pb, format_, rng);
    }
    const size_t total = size_t(num_blocks_ * pb);
    dev_ = DeviceBuffer(std::max<size_t>(total, 16));
    const size_t t_bytes = std::min(total, tmpl_.size());
    SELKV_BENCH_CUDA(cudaMemcpy(dev_.get(), tmpl_.data(), t_bytes, cudaMemcpyHostToDevice));
    for (size_t done = t_bytes; done < total;) {  // period: tmpl_pages_ pages
      const size_t n = std::min(done, total - done);
      SELKV_BENCH_CUDA(cudaMemcpy(dev_.as<uint8_t>() + done, dev_.get(), n, cudaMemcpyDeviceToDevice));
      done += n;
    }
    SELKV_BENCH_CUDA(cudaDeviceSynchronize());
  }

  int64_t tmpl_pages_ = 0;
  KvFormat format_;
  int32_t page_;
  int64_t num_blocks_ = 0;
  std::vector<uint8_t> tmpl_;
  DeviceBuffer dev_;
};

}  // namespace selkv::bench
