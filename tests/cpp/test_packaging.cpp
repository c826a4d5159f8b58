// What a user of the package relies on without a GPU: the version macros, the golden vectors
// shipped in the tree, and error text that names a missing driver as missing.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "common/cuda_check.h"
#include "selkv/selkv.h"
#include "test_util.h"

namespace selkv {
namespace {

TEST(Version, HeaderMatchesProjectAndLibrary) {
  EXPECT_STREQ(SELKV_VERSION_STRING, SELKV_PROJECT_VERSION);  // project(VERSION) in CMakeLists.txt
  EXPECT_STREQ(version(), SELKV_VERSION_STRING);
  EXPECT_EQ(std::to_string(SELKV_VERSION_MAJOR) + "." + std::to_string(SELKV_VERSION_MINOR) + "." +
                std::to_string(SELKV_VERSION_PATCH),
            SELKV_VERSION_STRING);
  EXPECT_EQ(SELKV_VERSION, SELKV_VERSION_MAJOR * 10000 + SELKV_VERSION_MINOR * 100 + SELKV_VERSION_PATCH);
}

// Every array manifest.json lists is in the tree (tests/data/vectors) with the size its dtype and
// shape give.
TEST(GoldenVectors, EveryManifestEntryIsPresentWithItsSize) {
  std::ifstream f(test::vectors_dir() + "/manifest.json");
  ASSERT_TRUE(f) << "missing: " << test::vectors_dir() << "/manifest.json";
  const std::string manifest((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::regex entry(R"re("([A-Za-z0-9_]+)": \{\s*"dtype": "([a-z0-9]+)",\s*"shape": \[([^\]]*)\])re");
  const std::map<std::string, size_t> dtype_bytes = {{"bfloat16", 2}, {"uint8", 1}, {"int32", 4}, {"float32", 4}};
  int listed = 0;
  for (std::sregex_iterator it(manifest.begin(), manifest.end(), entry), end; it != end; ++it) {
    const std::string name = (*it)[1], dtype = (*it)[2], dims = (*it)[3];
    ASSERT_TRUE(dtype_bytes.count(dtype)) << name << ": unknown dtype " << dtype;
    size_t bytes = dtype_bytes.at(dtype);
    std::stringstream ss(dims);
    for (std::string d; std::getline(ss, d, ',');) bytes *= size_t(std::stoll(d));
    EXPECT_EQ(test::read_vector<uint8_t>(name + ".bin").size(), bytes) << name << ".bin";
    ++listed;
  }
  EXPECT_GE(listed, 16) << "manifest.json lists fewer arrays than the tests read";
}

TEST(CudaErrorText, NamesTheMissingGpu) {
  EXPECT_EQ(detail::cuda_error_text(cudaErrorNoDevice), "no NVIDIA GPU found (cudaErrorNoDevice)");
  EXPECT_NE(detail::cuda_error_text(cudaErrorInvalidValue).find("cudaErrorInvalidValue"), std::string::npos);
}

// Without any driver the runtime says "driver version is insufficient"; selkv says what is missing.
TEST(CudaErrorText, NoDriverIsNotCalledTooOld) {
  int driver = -1;
  ASSERT_EQ(cudaDriverGetVersion(&driver), cudaSuccess);
  if (driver != 0) GTEST_SKIP() << "an NVIDIA driver is installed (version " << driver << ")";
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  ASSERT_NE(err, cudaSuccess);
  const std::string text = detail::cuda_error_text(err);
  EXPECT_NE(text.find("no NVIDIA driver or GPU found"), std::string::npos) << text;
  EXPECT_EQ(text.find("insufficient"), std::string::npos) << text;
}

}  // namespace
}  // namespace selkv
