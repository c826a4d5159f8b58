// C8 QSA sparse prefill: CPU tests of every argument rule (selkv/qsa.h, src/qsa/qsa_checks.cpp),
// the zero-row no-op, the plan size, the routing rule (qsa_page4_wanted / qsa_route) and the
// page-4 route's own arguments (qsa::qsa_sparse_prefill_page4), all rejected before any CUDA call.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_page4.h"
#include "qsa_test_util.h"
#include "reference/oracle.h"
#include "selkv/qsa.h"

namespace {

using namespace selkv;
using qsa_test::Problem;

Problem valid(QsaSelectionForm form = QsaSelectionForm::kExpanded) {
  Problem pr;
  pr.form = form;
  pr.build();
  pr.lens[0] = 20;
  pr.select(0, 0, 9, {0, 1});
  pr.select(1, 0, 13, {2});
  return pr;
}

// Rejected by the GPU checks, the GPU entry point and (unless device-only) the oracle, naming arg.
void expect_invalid(const std::function<void(Problem&)>& mutate, const char* arg, bool device_only = false,
                    QsaSelectionForm form = QsaSelectionForm::kExpanded) {
  Problem pr = valid(form);
  if (device_only) {  // slack after every buffer: the oracle runs with the misaligned views
    for (auto* v : {&pr.q, &pr.k, &pr.v, &pr.out}) v->resize(v->size() + 4096);
    for (auto* v : {&pr.table, &pr.lens, &pr.req, &pr.pos, &pr.sel}) v->resize(v->size() + 64);
    pr.lse.resize(pr.lse.size() + 64);
    pr.repoint();
  }
  mutate(pr);
  const Status st = check_qsa_sparse_prefill(pr.p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << arg << ": " << st.to_string();
  EXPECT_NE(st.message().find(std::string(": ") + arg + ":"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("selkv::qsa_sparse_prefill"), std::string::npos) << st.message();
  EXPECT_EQ(qsa_sparse_prefill(pr.p, nullptr).code(), StatusCode::kInvalidArgument) << arg;
  const std::vector<uint16_t> before = pr.out;
  const Status ref = ref::qsa_sparse_prefill(pr.p, 1);
  if (device_only) {
    EXPECT_TRUE(ref.ok()) << arg << ": the oracle has no alignment rules: " << ref.to_string();
  } else {
    EXPECT_EQ(ref.code(), StatusCode::kInvalidArgument) << arg << ": " << ref.to_string();
    EXPECT_NE(ref.message().find(std::string(": ") + arg + ":"), std::string::npos) << ref.message();
    EXPECT_EQ(pr.out, before) << arg << ": the oracle wrote out despite the error";
  }
}

TEST(QsaChecks, ValidProblemPasses) {
  for (auto form : {QsaSelectionForm::kExpanded, QsaSelectionForm::kCompact}) {
    Problem pr = valid(form);
    EXPECT_TRUE(check_qsa_sparse_prefill(pr.p).ok()) << check_qsa_sparse_prefill(pr.p).to_string();
    std::vector<int32_t> md(qsa_metadata_size(pr.R, pr.K) / 4);
    EXPECT_TRUE(ref::qsa_sparse_prefill(pr.p).ok());
    EXPECT_TRUE(ref::qsa_plan(pr.p, md.data(), md.size() * 4).ok());
  }
}

// The route is decided on the host from the Params and the environment alone: 4096 rows of
// 512-block selections with a plan ask for (and take) page-4; 4095 rows, a selection narrower than
// kQsaPage4MinBlocks, no plan, force_simple or SELKV_QSA_PAGE4=0 do not.
TEST(QsaChecks, RouteRule) {
  const char* saved = std::getenv("SELKV_QSA_PAGE4");
  const std::string saved_value = saved ? saved : "";
  unsetenv("SELKV_QSA_PAGE4");
  QsaSparsePrefillParams p;
  alignas(16) static int32_t plan[4];
  p.num_rows = kQsaPage4MinRows;
  p.metadata = plan;
  EXPECT_TRUE(qsa_page4_wanted(p));
  p.num_rows = kQsaPage4MinRows - 1;
  EXPECT_FALSE(qsa_page4_wanted(p));
  p.num_rows = 1 << 20;
  EXPECT_TRUE(qsa_page4_wanted(p));
  p.max_blocks = kQsaPage4MinBlocks - 1;
  EXPECT_FALSE(qsa_page4_wanted(p));
  EXPECT_EQ(qsa_route(p), QsaKernel::kSimple);
  p.max_blocks = kQsaPage4MinBlocks;
  EXPECT_TRUE(qsa_page4_wanted(p));
  p.max_blocks = kQsaMaxBlocks;
  // The shape form: the same rule without the plan and force_simple.
  EXPECT_TRUE(qsa_page4_wanted(kQsaPage4MinRows, kQsaPage4MinBlocks));
  EXPECT_FALSE(qsa_page4_wanted(kQsaPage4MinRows - 1, kQsaMaxBlocks));
  EXPECT_FALSE(qsa_page4_wanted(kQsaPage4MinRows, kQsaPage4MinBlocks - 1));
  p.force_simple = true;
  EXPECT_FALSE(qsa_page4_wanted(p));
  p.force_simple = false;
  p.metadata = nullptr;
  EXPECT_FALSE(qsa_page4_wanted(p));
  p.metadata = plan;
  setenv("SELKV_QSA_PAGE4", "0", 1);
  EXPECT_FALSE(qsa_page4_wanted(p));
  EXPECT_FALSE(qsa_page4_wanted(kQsaPage4MinRows, kQsaMaxBlocks));
  setenv("SELKV_QSA_PAGE4", "1", 1);
  EXPECT_TRUE(qsa_page4_wanted(p));
  EXPECT_EQ(qsa_route(p), QsaKernel::kPage4);
  p.num_rows = kQsaPage4MinRows - 1;
  EXPECT_EQ(qsa_route(p), QsaKernel::kSimple);
  if (saved) setenv("SELKV_QSA_PAGE4", saved_value.c_str(), 1);
  else unsetenv("SELKV_QSA_PAGE4");
}

TEST(QsaChecks, ZeroRowsIsANoOpWithNullPointers) {
  QsaSparsePrefillParams p;
  p.num_rows = 0;
  p.num_q_heads = 6;
  p.num_kv_heads = 1;
  p.head_dim = 256;
  p.page_size = 16;
  p.scale = 0.0625f;
  EXPECT_TRUE(check_qsa_sparse_prefill(p).ok()) << check_qsa_sparse_prefill(p).to_string();
  EXPECT_TRUE(qsa_sparse_prefill(p, nullptr).ok());
  EXPECT_TRUE(qsa_plan(p, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(ref::qsa_sparse_prefill(p).ok());
  EXPECT_TRUE(ref::qsa_plan(p, nullptr, 0).ok());
  p.num_q_heads = 9;  // the shape rules still apply (group 9)
  EXPECT_EQ(check_qsa_sparse_prefill(p).code(), StatusCode::kInvalidArgument);
}

TEST(QsaChecks, ShapeRules) {
  expect_invalid([](Problem& x) { x.p.dtype = QsaDtype(7); }, "dtype");
  expect_invalid([](Problem& x) { x.p.num_rows = -1; }, "num_rows");
  expect_invalid([](Problem& x) { x.p.num_q_heads = 0; }, "num_q_heads");
  expect_invalid([](Problem& x) { x.p.num_kv_heads = 0; }, "num_kv_heads");
  expect_invalid([](Problem& x) { x.p.num_kv_heads = 3; }, "num_kv_heads");  // 2 % 3
  expect_invalid([](Problem& x) { x.p.num_q_heads = 9; x.p.num_kv_heads = 1; }, "num_q_heads");  // group 9
  expect_invalid([](Problem& x) { x.p.head_dim = 64; }, "head_dim");
  expect_invalid([](Problem& x) { x.p.head_dim = 192; }, "head_dim");
  expect_invalid([](Problem& x) { x.p.num_rows = int64_t(1) << 30; }, "num_rows");  // * Hq = 2^31
  expect_invalid([](Problem& x) { x.p.page_size = 0; }, "page_size");
  expect_invalid([](Problem& x) { x.p.page_size = 18; }, "page_size");
  expect_invalid([](Problem& x) { x.p.page_size = (1 << 24) + 4; }, "page_size");
  expect_invalid([](Problem& x) { x.p.num_pages = -1; }, "num_pages");
  expect_invalid([](Problem& x) { x.p.num_req = -1; }, "num_req");
  expect_invalid([](Problem& x) { x.p.block_table_width = -1; }, "block_table_width");
  expect_invalid([](Problem& x) { x.p.form = QsaSelectionForm(2); }, "form");
  expect_invalid([](Problem& x) { x.p.max_blocks = 0; }, "max_blocks");
  expect_invalid([](Problem& x) { x.p.max_blocks = 513; }, "max_blocks");
  for (float s : {0.f, -1.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::max()})
    expect_invalid([s](Problem& x) { x.p.scale = s; }, "scale");
}

TEST(QsaChecks, PointerAndStrideRules) {
  expect_invalid([](Problem& x) { x.p.req_ids = nullptr; }, "req_ids");
  expect_invalid([](Problem& x) { x.p.positions = nullptr; }, "positions");
  expect_invalid([](Problem& x) { x.p.selection = nullptr; }, "selection");
  expect_invalid([](Problem& x) { x.p.selection_stride = -1; }, "selection_stride");
  expect_invalid([](Problem& x) { x.p.block_ids = nullptr; }, "block_ids", false, QsaSelectionForm::kCompact);
  expect_invalid([](Problem& x) { x.p.block_counts = nullptr; }, "block_counts", false, QsaSelectionForm::kCompact);
  expect_invalid([](Problem& x) { x.p.block_ids_stride = -2; }, "block_ids_stride", false, QsaSelectionForm::kCompact);
  expect_invalid([](Problem& x) { x.p.seq_lens = nullptr; }, "seq_lens");
  expect_invalid([](Problem& x) { x.p.block_table = nullptr; }, "block_table");
  expect_invalid([](Problem& x) { x.p.block_table_stride = -1; }, "block_table_stride");
  expect_invalid([](Problem& x) { x.p.q = nullptr; }, "q");
  expect_invalid([](Problem& x) { x.p.out = nullptr; }, "out");
  expect_invalid([](Problem& x) { x.p.q_row_stride = -8; }, "q");
  expect_invalid([](Problem& x) { x.p.out_head_stride = -8; }, "out");
  expect_invalid([](Problem& x) { x.p.lse_row_stride = -1; }, "lse");
  expect_invalid([](Problem& x) { x.p.k_cache.data = nullptr; }, "k_cache");
  expect_invalid([](Problem& x) { x.p.v_cache.data = nullptr; }, "v_cache");
  expect_invalid([](Problem& x) { x.p.k_cache.slot_stride = -128; }, "k_cache");
  expect_invalid([](Problem& x) { x.p.v_cache.head_stride = -128; }, "v_cache");
  // Unused pointers may be null: the other selection form, the table with width 0, the caches with no page.
  Problem pr = valid();
  pr.p.block_ids = nullptr;
  pr.p.block_counts = nullptr;
  EXPECT_TRUE(check_qsa_sparse_prefill(pr.p).ok());
  pr.p.block_table_width = 0;
  pr.p.block_table = nullptr;
  pr.p.num_pages = 0;
  pr.p.k_cache.data = pr.p.v_cache.data = nullptr;
  EXPECT_TRUE(check_qsa_sparse_prefill(pr.p).ok()) << check_qsa_sparse_prefill(pr.p).to_string();
  pr.p.num_req = 0;
  pr.p.seq_lens = nullptr;
  EXPECT_TRUE(check_qsa_sparse_prefill(pr.p).ok());
  pr = valid(QsaSelectionForm::kCompact);
  pr.p.selection = nullptr;
  EXPECT_TRUE(check_qsa_sparse_prefill(pr.p).ok());
  pr.p.lse = nullptr;  // lse is optional
  EXPECT_TRUE(check_qsa_sparse_prefill(pr.p).ok());
}

TEST(QsaChecks, DeviceAlignmentRules) {
  auto off = [](const void* p, int bytes) { return static_cast<const void*>(static_cast<const char*>(p) + bytes); };
  expect_invalid([&](Problem& x) { x.p.q = off(x.p.q, 2); }, "q", true);
  expect_invalid([&](Problem& x) { x.p.out = const_cast<void*>(off(x.p.out, 2)); }, "out", true);
  expect_invalid([&](Problem& x) { x.p.k_cache.data = off(x.p.k_cache.data, 2); }, "k_cache", true);
  expect_invalid([&](Problem& x) { x.p.v_cache.data = off(x.p.v_cache.data, 2); }, "v_cache", true);
  expect_invalid([](Problem& x) { x.p.q_head_stride = 132; x.p.q_row_stride = 264; }, "q", true);
  expect_invalid([](Problem& x) { x.p.out_head_stride = 132; x.p.out_row_stride = 264; }, "out", true);
  expect_invalid([](Problem& x) { x.p.k_cache.slot_stride = 132; x.p.k_cache.page_stride = 132 * 8; }, "k_cache", true);
  expect_invalid([](Problem& x) { x.p.v_cache.slot_stride = 132; x.p.v_cache.page_stride = 132 * 8; }, "v_cache", true);
  expect_invalid([&](Problem& x) { x.p.lse = reinterpret_cast<float*>(const_cast<void*>(off(x.p.lse, 2))); }, "lse", true);
  expect_invalid([&](Problem& x) { x.p.req_ids = static_cast<const int32_t*>(off(x.p.req_ids, 1)); }, "req_ids", true);
  expect_invalid([&](Problem& x) { x.p.positions = static_cast<const int32_t*>(off(x.p.positions, 1)); }, "positions", true);
  expect_invalid([&](Problem& x) { x.p.seq_lens = static_cast<const int32_t*>(off(x.p.seq_lens, 1)); }, "seq_lens", true);
  expect_invalid([&](Problem& x) { x.p.block_table = static_cast<const int32_t*>(off(x.p.block_table, 1)); }, "block_table", true);
  expect_invalid([&](Problem& x) { x.p.selection = static_cast<const int32_t*>(off(x.p.selection, 1)); }, "selection", true);
  std::vector<int32_t> md(qsa_metadata_size(2, 4) / 4 + 4);
  expect_invalid([&](Problem& x) { x.p.metadata = off(md.data(), 4 + (reinterpret_cast<uintptr_t>(md.data()) % 16 == 12 ? 4 : 0));
                                   x.p.metadata_bytes = qsa_metadata_size(2, 4); }, "metadata", true);
}

TEST(QsaChecks, OverlapRules) {
  // out / lse against each other, themselves and every input.
  expect_invalid([](Problem& x) { x.p.out_row_stride = 0; }, "out");  // rows alias
  expect_invalid([](Problem& x) { x.p.lse_head_stride = 0; }, "lse");
  expect_invalid([](Problem& x) { x.p.lse = reinterpret_cast<float*>(x.out.data()); }, "lse");
  expect_invalid([](Problem& x) { x.p.out = x.q.data(); }, "out");
  expect_invalid([](Problem& x) { x.p.out = x.k.data(); }, "out");
  expect_invalid([](Problem& x) { x.p.out = x.v.data() + 128; }, "out");
  expect_invalid([](Problem& x) { x.p.lse = reinterpret_cast<float*>(x.sel.data()); }, "lse");
  expect_invalid([](Problem& x) { x.p.lse = reinterpret_cast<float*>(x.table.data()); }, "lse");
  expect_invalid([](Problem& x) { x.p.lse = reinterpret_cast<float*>(x.lens.data()); x.p.lse_row_stride = 0; x.p.lse_head_stride = 1;
                                  x.p.num_rows = 1; }, "lse");
  expect_invalid([](Problem& x) { x.p.lse = reinterpret_cast<float*>(x.req.data()); }, "lse");
  expect_invalid([](Problem& x) { x.p.lse = reinterpret_cast<float*>(x.pos.data()); }, "lse");
  expect_invalid([](Problem& x) { x.p.lse = reinterpret_cast<float*>(x.ids.data()); }, "lse", false, QsaSelectionForm::kCompact);
  expect_invalid([](Problem& x) { x.p.lse = reinterpret_cast<float*>(x.counts.data()); }, "lse", false, QsaSelectionForm::kCompact);
  std::vector<int32_t> md(qsa_metadata_size(2, 4) / 4);
  expect_invalid([&](Problem& x) { x.p.metadata = md.data(); x.p.metadata_bytes = md.size() * 4;
                                   x.p.lse = reinterpret_cast<float*>(md.data() + 8); }, "lse");
  // Inputs may alias each other (K and V the same memory, q inside the cache).
  Problem pr = valid();
  pr.p.v_cache = pr.p.k_cache;
  pr.p.q = pr.k.data();
  EXPECT_TRUE(check_qsa_sparse_prefill(pr.p).ok()) << check_qsa_sparse_prefill(pr.p).to_string();
}

TEST(QsaChecks, MetadataRules) {
  EXPECT_EQ(qsa_metadata_size(0, 512), 0u);
  EXPECT_EQ(qsa_metadata_size(5, 0), 0u);
  EXPECT_EQ(qsa_metadata_size(5, 513), 0u);
  EXPECT_EQ(qsa_metadata_size(-1, 4), 0u);
  // The group plan: header, 4 words a row (group table), then 2 (page, base) and 4 (token words)
  // per block of room, K + 1 blocks a row; the token words 16-byte aligned.
  auto words = [](size_t R, size_t K) { return (8 + 4 * R + 2 * R * (K + 1) + 3) / 4 * 4 + 4 * R * (K + 1); };
  EXPECT_EQ(qsa_metadata_size(5, 512), words(5, 512) * 4);
  EXPECT_EQ(qsa_metadata_size(5, 512), size_t(15420) * 4);
  EXPECT_EQ(qsa_metadata_size(4096, 512), words(4096, 512) * 4);
  Problem pr = valid();
  const size_t need = qsa_metadata_size(pr.R, pr.K);
  // Slack after the selection and req_ids: a plan placed at either overlaps that input alone,
  // whatever the heap put after it.
  for (auto* v : {&pr.sel, &pr.req}) v->resize(v->size() + need / 4);
  pr.repoint();
  std::vector<int32_t> md(need / 4 + 64);
  // Plan: too small, null, overlapping an input.
  Status st = ref::qsa_plan(pr.p, md.data(), need - 1);
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
  EXPECT_NE(st.message().find("selkv::qsa_plan: metadata_bytes: needs " + std::to_string(need)), std::string::npos)
      << st.message();
  EXPECT_EQ(qsa_plan(pr.p, md.data(), need - 1, nullptr).code(), StatusCode::kWorkspaceTooSmall);
  st = ref::qsa_plan(pr.p, nullptr, need);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(": metadata:"), std::string::npos) << st.message();
  st = ref::qsa_plan(pr.p, pr.sel.data(), need);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("metadata: overlaps selection"), std::string::npos) << st.message();
  st = ref::qsa_plan(pr.p, pr.req.data(), need);
  EXPECT_NE(st.message().find("metadata: overlaps req_ids"), std::string::npos) << st.message();
  // The plan does not need q, the caches or out, nor a valid scale.
  pr.p.q = nullptr;
  pr.p.out = nullptr;
  pr.p.k_cache.data = pr.p.v_cache.data = nullptr;
  pr.p.scale = 0.f;
  EXPECT_TRUE(ref::qsa_plan(pr.p, md.data(), need).ok());
  // Attention with a plan: too small a plan is kWorkspaceTooSmall.
  pr = valid();
  pr.p.metadata = md.data();
  pr.p.metadata_bytes = need - 4;
  EXPECT_EQ(check_qsa_sparse_prefill(pr.p).code(), StatusCode::kWorkspaceTooSmall);
  pr.p.metadata_bytes = need;
  EXPECT_NE(check_qsa_sparse_prefill(pr.p).code(), StatusCode::kWorkspaceTooSmall);
}

// The page-4 route's workspace: its size by head dim only, too small a workspace is
// kWorkspaceTooSmall naming workspace_bytes, misaligned or overlapping an input is rejected.
TEST(QsaChecks, WorkspaceRules) {
  EXPECT_EQ(qsa_workspace_size(64), 0u);
  EXPECT_EQ(qsa_workspace_size(0), 0u);
  EXPECT_GT(qsa_workspace_size(256), qsa_workspace_size(128));
  EXPECT_GT(qsa_workspace_size(128), 0u);
  Problem pr = valid();
  const size_t need = qsa_workspace_size(pr.p.head_dim);
  std::vector<int32_t> ws(need / 4 + 16);
  int32_t* base = ws.data() + (4 - (reinterpret_cast<uintptr_t>(ws.data()) % 16) / 4) % 4;  // 16-byte aligned
  pr.p.workspace = base;
  pr.p.workspace_bytes = need - 1;
  Status st = check_qsa_sparse_prefill(pr.p);
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
  EXPECT_NE(st.message().find("workspace_bytes: needs " + std::to_string(need)), std::string::npos) << st.message();
  pr.p.workspace_bytes = need;
  EXPECT_TRUE(check_qsa_sparse_prefill(pr.p).ok()) << check_qsa_sparse_prefill(pr.p).to_string();
  expect_invalid([&](Problem& x) { x.p.workspace = base + 1; x.p.workspace_bytes = need; }, "workspace", true);
  expect_invalid([&](Problem& x) { x.p.workspace = base; x.p.workspace_bytes = need;
                                   x.p.q = base + 64; }, "workspace");  // q inside the workspace
  expect_invalid([&](Problem& x) { x.p.workspace = base; x.p.workspace_bytes = need;
                                   x.p.out = base + 64; }, "out");
}

// The page-4 route checks the common rules first (same messages, its own op name), then needs a
// plan and a rows_per_cta within the merging warp's reach; nothing is launched on a rejection.
TEST(QsaChecks, Page4RouteArguments) {
  EXPECT_EQ(qsa::qsa_page4_max_rows(1), 32);
  EXPECT_EQ(qsa::qsa_page4_max_rows(2), 32);
  EXPECT_EQ(qsa::qsa_page4_max_rows(3), 21);
  EXPECT_EQ(qsa::qsa_page4_max_rows(6), 10);
  EXPECT_EQ(qsa::qsa_page4_max_rows(8), 8);
  Problem pr = valid();  // Hq 2, Hkv 1: group 2
  Status st = qsa::qsa_sparse_prefill_page4(pr.p, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("selkv::qsa_sparse_prefill (page-4): metadata:"), std::string::npos) << st.message();
  const size_t need = size_t(qsa::group_plan_words(pr.R, pr.K)) * 4;  // the group plan
  std::vector<int32_t> md(need / 4 + 4);
  pr.p.metadata = md.data();
  pr.p.metadata_bytes = need;
  for (int bad : {-1, 33, 1000}) {
    st = qsa::qsa_sparse_prefill_page4(pr.p, nullptr, bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad << ": " << st.to_string();
    EXPECT_NE(st.message().find(": rows_per_cta: must be 0 (default) or in [1, 32]"), std::string::npos)
        << st.message();
  }
  pr.p.metadata_bytes = need - 4;
  EXPECT_EQ(qsa::qsa_sparse_prefill_page4(pr.p, nullptr).code(), StatusCode::kWorkspaceTooSmall);
  pr.p.metadata_bytes = need;
  pr.p.scale = 0.f;
  st = qsa::qsa_sparse_prefill_page4(pr.p, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(": scale:"), std::string::npos) << st.message();
  pr.p.scale = 0.0625f;
  pr.p.num_q_heads = 6;
  pr.p.num_kv_heads = 1;
  pr.q.resize(size_t(pr.R * 6 * pr.D));
  pr.out.resize(size_t(pr.R * 6 * pr.D));
  pr.lse.resize(size_t(pr.R * 6));
  pr.p.q = pr.q.data();
  pr.p.out = pr.out.data();
  pr.p.lse = pr.lse.data();
  pr.p.q_row_stride = pr.p.out_row_stride = 6 * pr.D;
  pr.p.lse_row_stride = 6;
  st = qsa::qsa_sparse_prefill_page4(pr.p, nullptr, 11);
  EXPECT_NE(st.message().find("rows_per_cta: must be 0 (default) or in [1, 10] for num_q_heads / num_kv_heads = 6"),
            std::string::npos)
      << st.message();
  // Zero rows: a no-op, no plan needed.
  pr.p.num_rows = 0;
  pr.p.metadata = nullptr;
  EXPECT_TRUE(qsa::qsa_sparse_prefill_page4(pr.p, nullptr).ok());
}

}  // namespace
