// Links selkv::selkv from an installed package and checks what needs no GPU: the versions of
// the headers, the library and the CMake package agree, and a bad argument comes back as an
// InvalidArgument Status naming it (validation runs before any CUDA call).
#include <selkv/selkv.h>

#include <cstdio>
#include <cstring>

int main() {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "selkv_consumer: FAILED: %s\n", what);
      ++failures;
    }
  };
  expect(std::strcmp(selkv::version(), SELKV_VERSION_STRING) == 0, "library version == header version");
  expect(std::strcmp(SELKV_PACKAGE_VERSION, SELKV_VERSION_STRING) == 0, "CMake package version == header version");

  selkv::WriteKvCacheParams p;
  p.num_tokens = -1;
  const selkv::Status st = selkv::write_kv_cache(p, nullptr);
  expect(st.code() == selkv::StatusCode::kInvalidArgument, "num_tokens = -1 is InvalidArgument");
  expect(st.message().find("num_tokens") != std::string::npos, "the message names num_tokens");

  expect(selkv::decode_metadata_size(2, 2) > 0, "decode_metadata_size(2, 2) > 0");

  std::printf("selkv_consumer: selkv %s, write_kv_cache(num_tokens=-1) -> %s\n", selkv::version(),
              st.to_string().c_str());
  return failures == 0 ? 0 : 1;
}
