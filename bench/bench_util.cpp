#include "bench_util.h"

#include <algorithm>
#include <unordered_set>

#include "formats/codec.h"

namespace selkv::bench {

std::vector<uint16_t> random_bf16(size_t n, float stddev, Rng& rng) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = codec::float_to_bf16(rng.normal() * stddev);
  return v;
}

std::vector<int64_t> sample_distinct(int64_t n, int64_t k, Rng& rng) {
  if (k > n) throw std::invalid_argument("sample_distinct: k > n");
  std::vector<int64_t> out;
  out.reserve(size_t(k));
  if (k * 4 >= n) {  // dense: partial Fisher-Yates over the whole range
    std::vector<int64_t> all(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[size_t(i)] = i;
    for (int64_t i = 0; i < k; ++i) std::swap(all[size_t(i)], all[size_t(rng.range(i, n - 1))]);
    out.assign(all.begin(), all.begin() + k);
  } else {  // sparse: rejection
    std::unordered_set<int64_t> seen;
    seen.reserve(size_t(k) * 2);
    while (int64_t(out.size()) < k) {
      const int64_t v = rng.range(0, n - 1);
      if (seen.insert(v).second) out.push_back(v);
    }
  }
  return out;
}

std::vector<int32_t> permutation(int32_t n, Rng& rng) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) p[size_t(i)] = i;
  for (int32_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[size_t(rng.range(0, i))]);
  return p;
}

}  // namespace selkv::bench
