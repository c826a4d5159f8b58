// Tiny row-parallel loop for the oracle's attention paths. Each row is computed by exactly one
// thread with a fixed operation order, so results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace selkv::ref::detail {

// Threads to use: `requested` if >= 1, else the hardware concurrency (at most 64).
inline int oracle_threads(int requested) {
  if (requested >= 1) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(std::min(hw, 64u));
}

// Calls fn(row) for every row in [0, rows) on oracle_threads(threads) threads, rows handed out
// dynamically.
template <typename Fn>
void parallel_rows(int64_t rows, int threads, Fn&& fn) {
  const int n = int(std::min<int64_t>(oracle_threads(threads), rows));
  if (n <= 1) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t r = next.fetch_add(1); r < rows; r = next.fetch_add(1)) fn(r);
  };
  std::vector<std::thread> pool;
  pool.reserve(n - 1);
  for (int i = 0; i < n - 1; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

}  // namespace selkv::ref::detail
