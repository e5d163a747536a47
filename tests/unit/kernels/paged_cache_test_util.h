// Random paged latent caches for the MLA decode tests (kernels/mla_decode.h), CPU and GPU: each
// sequence's pages drawn from a shuffled pool with spare pages, optionally a first page shared by
// every sequence (a common prefix), and every slot no sequence owns filled with NaN, so that a
// kernel reading a position outside a context (a wrong page, offset or length) poisons its output
// instead of passing by luck.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"
#include "kernels/mla_decode.h"

namespace orrery::kernels::testing {

struct PagedCacheSpec {
  std::vector<int32_t> context_lens;
  int64_t page_size = 16;
  int64_t width = 24;             // D
  int64_t spare_pages = 3;        // pages no sequence uses (all NaN)
  bool share_first_page = false;  // sequences with more than one page share sequence 0's first
};

// An f64 cache on the cpu with N(0, 1) rows at every owned position. Unused block_table entries
// point at a spare page when there is one.
inline PagedLatentCache RandomPagedCache(const PagedCacheSpec& s, PhiloxGenerator& rng) {
  const int64_t n = static_cast<int64_t>(s.context_lens.size()), ps = s.page_size;
  std::vector<int64_t> need(n);
  int64_t total = s.spare_pages, max_pages = 1;
  for (int64_t i = 0; i < n; ++i) {
    need[i] = (s.context_lens[i] + ps - 1) / ps;
    total += need[i];
    max_pages = std::max(max_pages, need[i] + 1);
  }
  total = std::max<int64_t>(total, 1);
  std::vector<int32_t> perm(total);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = total - 1; i > 0; --i) {
    std::swap(perm[i], perm[static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(i + 1)))]);
  }
  const int32_t spare = s.spare_pages > 0 ? perm[total - 1] : 0;
  PagedLatentCache c;
  c.block_table = Tensor::FromVector<int32_t>(
      {n, max_pages}, std::vector<int32_t>(static_cast<size_t>(n * max_pages), spare));
  c.context_lens = Tensor::FromVector<int32_t>({n}, s.context_lens);
  c.pages = Tensor::Empty({total, ps, s.width}, DType::kF64);
  double* p = c.pages.data<double>();
  std::fill_n(p, c.pages.numel(), std::numeric_limits<double>::quiet_NaN());
  int32_t* table = c.block_table.data<int32_t>();
  const bool share = s.share_first_page && n > 0 && need[0] > 1;
  int64_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < need[i]; ++b) {
      table[i * max_pages + b] =
          (share && i > 0 && b == 0 && need[i] > 1) ? table[0] : perm[next++];
    }
  }
  // Rows at every owned position (a shared page is written by each owner; its positions are the
  // same, so the last draw stands for all).
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t pos = 0; pos < s.context_lens[i]; ++pos) {
      const int64_t page = table[i * max_pages + pos / ps];
      double* row = p + (page * ps + pos % ps) * s.width;
      for (int64_t d = 0; d < s.width; ++d) row[d] = rng.Normal();
    }
  }
  return c;
}

// The rows of sequence i, positions 0 .. context_lens[i] - 1, gathered into [len, D] (f64).
inline Tensor ContiguousRows(const PagedLatentCache& c, int64_t i) {
  const int64_t ps = c.pages.dim(1), d = c.pages.dim(2), max_pages = c.block_table.dim(1);
  const int64_t len = c.context_lens.data<int32_t>()[i];
  const Tensor pages = c.pages.Cast(DType::kF64).value();
  Tensor rows = Tensor::Empty({len, d}, DType::kF64);
  for (int64_t pos = 0; pos < len; ++pos) {
    const int64_t page = c.block_table.data<int32_t>()[i * max_pages + pos / ps];
    std::copy_n(pages.data<double>() + (page * ps + pos % ps) * d, d,
                rows.data<double>() + pos * d);
  }
  return rows;
}

}  // namespace orrery::kernels::testing
