// Shared helpers for the GoogleTest suites: golden-vector loading, seeded RNG, GPU skip.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cfloat>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "formats/codec.h"

namespace selkv::test {

// Golden vectors: $SELKV_VECTORS_DIR, else the copy in the tree (tests/data/vectors).
inline std::string vectors_dir() {
  if (const char* env = std::getenv("SELKV_VECTORS_DIR"); env && *env) return env;
  return SELKV_DEFAULT_VECTORS_DIR;
}

// Reads a raw little-endian array; empty vector if the file is missing.
template <typename T>
std::vector<T> read_vector(const std::string& name) {
  std::ifstream f(vectors_dir() + "/" + name, std::ios::binary);
  if (!f) return {};
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

// The vectors ship with the tree, so a missing one is a broken checkout or a wrong
// SELKV_VECTORS_DIR: a failure, never a skip.
#define SELKV_REQUIRE_VECTOR(vec, name)                                                            \
  do {                                                                                             \
    if ((vec).empty())                                                                             \
      FAIL() << "golden vector missing or empty: " << ::selkv::test::vectors_dir() << "/" << (name) \
             << " (tests/data/vectors in the tree; SELKV_VECTORS_DIR overrides it)";               \
  } while (0)

inline bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SELKV_REQUIRE_GPU()                                  \
  do {                                                       \
    if (!::selkv::test::has_gpu()) GTEST_SKIP() << "no GPU"; \
  } while (0)

// Fresh seed per process unless SELKV_TEST_SEED is set; printed on failure by the caller.
inline uint64_t test_seed() {
  if (const char* env = std::getenv("SELKV_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  static const uint64_t seed = std::random_device{}();
  return seed;
}

inline uint16_t bf16(float f) { return codec::float_to_bf16(f); }
inline float f32(uint16_t h) { return codec::bf16_to_float(h); }

// bf16 bits of N(0, stddev) samples.
inline std::vector<uint16_t> randn_bf16(size_t n, float stddev, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.f, stddev);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16(d(rng));
  return v;
}

// The sm_scale rule (DESIGN §2: finite, > 0, sm_scale * log2(e) finite in fp32), as value lists
// every op's tests run through the op's check, GPU and CPU entry points alike.
inline std::vector<float> bad_sm_scales() {
  return {0.f, -0.f, -0.1f, -FLT_MIN, NAN, -NAN, INFINITY, -INFINITY, FLT_MAX, 3e38f,
          float(double(FLT_MAX) / 1.4426950408889634 * 1.000001)};  // s finite, s * log2(e) not
}
inline std::vector<float> good_sm_scales() {
  return {0.03f, 1.f, FLT_MIN, 1e-40f /* subnormal */, 1e-45f /* smallest subnormal */,
          float(double(FLT_MAX) / 1.4426950408889634 * 0.999999)};
}

}  // namespace selkv::test
