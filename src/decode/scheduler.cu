// Split-KV scheduler: per-row block counts -> prefix sums, effective part count and part table.
#include <cub/block/block_scan.cuh>

#include "decode/decode_params.h"
#include "decode/scheduler.h"

namespace selkv::decode {
namespace {

constexpr int kSchedThreads = 512;

__global__ void __launch_bounds__(kSchedThreads)
decode_scheduler_kernel(int32_t batch, int32_t seq_q, int32_t topk, const int32_t* topk_length,
                        int32_t topk2, const int32_t* extra_topk_length, int32_t num_sm_parts,
                        int32_t min_blocks, bool default_granularity, int32_t* md) {
  using Scan = cub::BlockScan<int32_t, kSchedThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int32_t rows = batch * seq_q;
  // Rows have lengths (a dynamic plan) when either cache's topk_length is given; the extra
  // cache's blocks (K2 = topk2, 0 = none) follow the main cache's in each row.
  const bool dynamic = topk_length != nullptr || extra_topk_length != nullptr;
  const int32_t max_blocks = topk / kBlockTokens + topk2 / kBlockTokens;
  int32_t* prefix = md + kMdPrefix;
  // The plan's snapshot of the lengths: topk_length is read here once, everything below (and the
  // decode kernel) uses the snapshot, so the plan is consistent whatever happens to topk_length.
  int32_t* lens = md + md_lengths_offset(rows);
  int32_t* lens2 = md + md_extra_lengths_offset(rows, batch);
  for (int32_t b = int32_t(threadIdx.x); b < batch; b += kSchedThreads) {
    lens[b] = topk_length != nullptr ? clamp_topk_length(topk_length[b], topk) : topk;
    lens2[b] = extra_topk_length != nullptr ? clamp_topk_length(extra_topk_length[b], topk2) : topk2;
  }
  if (threadIdx.x == 0) md[md_extra_offset(rows, batch)] = topk2;
  __syncthreads();  // the snapshot visible to the whole CTA
  // Blocks per row -> prefix sums; dynamic plans also scan the rows' pieces of min_blocks blocks and
  // write the row-piece cut's part begins while they fit the grid (row_pieces).
  __shared__ int32_t s_begin[kMaxDecodeParts + 1];
  __shared__ int32_t s_longest_row;
  if (threadIdx.x == 0) s_longest_row = 0;
  __syncthreads();
  int32_t carry = 0, piece_carry = 0;  // the same in every thread (the scans' totals)
  for (int32_t base = 0; base < rows; base += kSchedThreads) {
    const int32_t r = base + int32_t(threadIdx.x);
    int32_t n = 0;
    if (r < rows) {
      n = max_blocks;
      if (dynamic) {
        const int32_t b = row_coord(r, batch).b;
        n = (lens[b] + kBlockTokens - 1) / kBlockTokens + (lens2[b] + kBlockTokens - 1) / kBlockTokens;
        if (n < 1) n = 1;  // an empty row still gets one (fully masked) block: out 0, lse -inf
      }
    }
    const int32_t pieces = dynamic ? row_pieces(n, min_blocks) : 0;
    if (dynamic && n > min_blocks) atomicMax(&s_longest_row, n);
    int32_t incl, total, piece_excl = 0, piece_total = 0;
    Scan(tmp).InclusiveSum(n, incl, total);
    if (dynamic) {  // uniform across the CTA; fixed plans never take the row-piece cut
      __syncthreads();  // tmp reuse
      Scan(tmp).ExclusiveSum(pieces, piece_excl, piece_total);
    }
    if (r < rows) {
      prefix[r + 1] = carry + incl;
      const int32_t row_begin = carry + incl - n;
      for (int32_t j = 0; j < pieces && piece_carry + piece_excl + j < num_sm_parts; ++j)
        s_begin[piece_carry + piece_excl + j] = row_begin + j * min_blocks;
    }
    carry += total;
    piece_carry += piece_total;
    __syncthreads();  // tmp reuse
  }
  const int32_t T = carry;
  // (s_longest_row is final: the loop's last __syncthreads follows every atomicMax)
  const bool one_block = dynamic && one_block_parts_pay(default_granularity, T, s_longest_row, min_blocks, num_sm_parts);
  const bool row_pieces_cut = dynamic && (one_block || piece_carry <= num_sm_parts);
  const int32_t np = one_block ? T : row_pieces_cut ? piece_carry : effective_parts(T, min_blocks, num_sm_parts);
  if (one_block)  // the row pieces of one block: part q is block q (overwrites the loop's pieces)
    for (int32_t q = int32_t(threadIdx.x); q < np; q += kSchedThreads) s_begin[q] = q;
  __shared__ int32_t s_longest;
  if (threadIdx.x == 0) {
    prefix[0] = 0;
    s_longest = 0;
    if (row_pieces_cut) s_begin[np] = T;
  }
  __syncthreads();  // prefix complete and visible to the whole CTA
  // Otherwise cut at row starts when that lengthens the longest part little (row_start_cut_pays: no
  // row split, no partials, nothing for the combine); else the balanced cut.
  DecodeCut cut = DecodeCut::kRowPieces;
  if (!row_pieces_cut) {
    for (int32_t q = int32_t(threadIdx.x); q <= np; q += kSchedThreads)
      s_begin[q] = row_start_part_begin(prefix, rows, T, np, q);
    __syncthreads();
    for (int32_t q = int32_t(threadIdx.x); q < np; q += kSchedThreads) atomicMax(&s_longest, s_begin[q + 1] - s_begin[q]);
    __syncthreads();
    cut = row_start_cut_pays(s_longest, T, np) ? DecodeCut::kRowStarts : DecodeCut::kBalanced;
  }
  if (threadIdx.x == 0) {
    md_write_header(md, T, np, rows, min_blocks, cut, 0, topk);
    if (topk2 > 0) md[3] = kMdMagicExtra;
  }
  // Part entries: each part's blocks, the row holding its first block and the first two rows'
  // bounds and top-k lengths, so that a decode CTA starts without a search and without a load
  // that waits on another.
  auto len_of = [&](int32_t r) -> int32_t { return r < rows ? lens[row_coord(r, batch).b] : 0; };
  const bool from_table = cut != DecodeCut::kBalanced;
  for (int32_t q = int32_t(threadIdx.x); q < np; q += kSchedThreads) {
    const int32_t b = from_table ? s_begin[q] : part_begin(q, T, np);
    const int32_t e = from_table ? s_begin[q + 1] : part_begin(q + 1, T, np);
    const int32_t r = row_containing(prefix, rows, b < T ? b : T - 1);
    int4* entry = reinterpret_cast<int4*>(md + kMdPartEntry + kMdPartEntryInts * q);
    entry[0] = make_int4(b, e, r, prefix[r]);
    entry[1] = make_int4(prefix[r + 1], prefix[r + 2 < rows ? r + 2 : rows], len_of(r), len_of(r + 1));
  }
  __syncthreads();  // header and part entries visible to the whole CTA
  // Split-row table for the combine, in part order, from the same schedule view the decode
  // kernel walks (fixed: closed form; dynamic: the entries above). One combine CTA column per
  // entry, so the combine launches no CTA that has nothing to merge.
  int32_t count = 0;  // the same in every thread
  for (int32_t base = 0; base < np; base += kSchedThreads) {
    const int32_t q = base + int32_t(threadIdx.x);
    SplitRow sr;
    if (q < np) {
      sr = dynamic ? split_row_of_part(DynamicSchedule(DynamicSchedule::Known{}, md, rows, T, np), q)
                   : split_row_of_part(FixedSchedule(rows, topk + topk2, min_blocks, num_sm_parts), q);
    }
    const int32_t flag = sr.num_parts > 0 ? 1 : 0;
    int32_t excl, total;
    Scan(tmp).ExclusiveSum(flag, excl, total);
    if (flag) {
      int4 e;
      e.x = sr.row, e.y = sr.first_part, e.z = sr.num_parts, e.w = sr.first_slot;
      *reinterpret_cast<int4*>(md + kMdSplitRows + 4 * (count + excl)) = e;
    }
    count += total;
    __syncthreads();  // tmp reuse
  }
  if (threadIdx.x == 0) md[kMdSplitCount] = count;
}

}  // namespace

cudaError_t launch_decode_scheduler(int32_t batch, int32_t seq_q, int32_t topk,
                                    const int32_t* topk_length, int32_t topk2,
                                    const int32_t* extra_topk_length, int32_t num_sm_parts,
                                    int32_t min_blocks_per_part, bool default_granularity, int32_t* metadata,
                                    cudaStream_t stream) {
  decode_scheduler_kernel<<<1, kSchedThreads, 0, stream>>>(batch, seq_q, topk, topk_length, topk2,
                                                           extra_topk_length, num_sm_parts,
                                                           min_blocks_per_part, default_granularity, metadata);
  return cudaGetLastError();
}

}  // namespace selkv::decode
