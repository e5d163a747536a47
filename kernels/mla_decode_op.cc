// PagedLatentWrite / MlaDecodePaged: argument checks, then plain CPU loops (the oracle) or CUDA.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/elementwise_check.h"
#include "kernels/mla_decode.h"
#include "kernels/phase_profile.h"
#if defined(ORRERY_KERNELS_CUDA)
#include "kernels/cuda/ops_cuda.h"
#endif

namespace orrery::kernels {
namespace {

constexpr const char* kWriteOp = "paged_latent_write";
constexpr const char* kOp = "mla_decode";

std::string Describe(const Tensor& t) { return t.defined() ? t.ToString() : "undefined"; }

// t defined, of a dtype the device supports (cpu f32/f64, cuda bf16/f32).
Status CheckFloat(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) return InvalidArgumentError(std::string(op) + ": " + name + " is undefined");
  const bool cpu = t.device().is_cpu();
  const DType dt = t.dtype();
  if (cpu ? (dt != DType::kF32 && dt != DType::kF64) : (dt != DType::kF32 && dt != DType::kBF16)) {
    return InvalidArgumentError(
        std::string(op) + ": " + name + " " + t.ToString() +
        (cpu ? ", expected f32 or f64 on cpu" : ", expected bf16 or f32 on cuda"));
  }
  return Status::OK();
}

// pages [num_pages >= 1, page_size >= 1, D] of `dtype` on `device`, D = width when width > 0.
Status CheckPages(const char* op, const Tensor& pages, int64_t width, DType dtype, Device device) {
  if (!pages.defined() || pages.ndim() != 3 || pages.dim(0) < 1 || pages.dim(1) < 1 ||
      (width > 0 && pages.dim(2) != width) || pages.dtype() != dtype ||
      !(pages.device() == device)) {
    return InvalidArgumentError(
        std::string(op) + ": pages " + Describe(pages) + ", expected " +
        std::string(DTypeName(dtype)) + "[num_pages >= 1, page_size >= 1, " +
        (width > 0 ? std::to_string(width) : std::string("D")) + "] on " + device.ToString());
  }
  return Status::OK();
}

template <typename T>
void WriteCpu(const Tensor& latents, const int32_t* slots, Tensor* pages) {
  const int64_t rows = latents.dim(0), d = latents.dim(1);
  const T* src = latents.data<T>();
  T* dst = pages->data<T>();
  for (int64_t t = 0; t < rows; ++t) {
    if (slots[t] < 0) continue;
    std::copy_n(src + t * d, d, dst + static_cast<int64_t>(slots[t]) * d);
  }
}

// The oracle: per (sequence, query, head) the scores over the visible rows in f64, a max-shifted
// softmax, the weighted sum of the rows' first dv columns.
template <typename T>
void DecodeCpu(const Tensor& q, const PagedLatentCache& cache, int64_t dv, double scale, Tensor* o,
               Tensor* lse) {
  const int64_t n_seq = q.dim(0), nq = q.dim(1), heads = q.dim(2), d = q.dim(3);
  const int64_t page_size = cache.pages.dim(1), max_pages = cache.block_table.dim(1);
  const T* qp = q.data<T>();
  const T* pages = cache.pages.data<T>();
  const int32_t* table = cache.block_table.data<int32_t>();
  const int32_t* lens = cache.context_lens.data<int32_t>();
  T* op = o->data<T>();
  float* lp = lse->data<float>();
  std::vector<double> scores, acc(static_cast<size_t>(dv));
  for (int64_t n = 0; n < n_seq; ++n) {
    for (int64_t j = 0; j < nq; ++j) {
      const int64_t visible = lens[n] - nq + j + 1;
      for (int64_t h = 0; h < heads; ++h) {
        const T* qv = qp + ((n * nq + j) * heads + h) * d;
        scores.assign(static_cast<size_t>(visible), 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t p = 0; p < visible; ++p) {
          const int64_t page = table[n * max_pages + p / page_size];
          const T* row = pages + (page * page_size + p % page_size) * d;
          double s = 0;
          for (int64_t i = 0; i < d; ++i) s += static_cast<double>(qv[i]) * row[i];
          scores[p] = scale * s;
          mx = std::max(mx, scores[p]);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0;
        for (int64_t p = 0; p < visible; ++p) {
          const int64_t page = table[n * max_pages + p / page_size];
          const T* row = pages + (page * page_size + p % page_size) * d;
          const double w = std::exp(scores[p] - mx);
          sum += w;
          for (int64_t i = 0; i < dv; ++i) acc[i] += w * row[i];
        }
        T* out = op + ((n * nq + j) * heads + h) * dv;
        for (int64_t i = 0; i < dv; ++i) out[i] = static_cast<T>(acc[i] / sum);
        lp[(n * nq + j) * heads + h] = static_cast<float>(mx + std::log(sum));
      }
    }
  }
}

}  // namespace

Status CheckPagedLatentIndices(const PagedLatentCache& cache, int64_t queries) {
  const Tensor& bt = cache.block_table;
  if (!cache.pages.defined() || cache.pages.ndim() != 3) {
    return InvalidArgumentError(std::string(kOp) + ": pages " + Describe(cache.pages) +
                                ", expected [num_pages, page_size, D]");
  }
  if (!bt.defined() || bt.ndim() != 2 || bt.dtype() != DType::kI32 || !bt.device().is_cpu()) {
    return InvalidArgumentError(std::string(kOp) + ": block_table " + Describe(bt) +
                                ", expected i32[N, max_pages_per_seq] on cpu");
  }
  ORRERY_RETURN_IF_ERROR(
      ExpectAs(kOp, "context_lens", cache.context_lens, {bt.dim(0)}, DType::kI32, Device::Cpu()));
  const int64_t nq = queries;
  const int64_t n_seq = cache.context_lens.dim(0), max_pages = cache.block_table.dim(1);
  const int64_t num_pages = cache.pages.dim(0), page_size = cache.pages.dim(1);
  const int32_t* lens = cache.context_lens.data<int32_t>();
  const int32_t* table = cache.block_table.data<int32_t>();
  for (int64_t n = 0; n < n_seq; ++n) {
    if (lens[n] < nq || lens[n] > max_pages * page_size) {
      return InvalidArgumentError(
          std::string(kOp) + ": context_lens[" + std::to_string(n) +
          "] = " + std::to_string(lens[n]) + ", expected in [" + std::to_string(nq) + " (Q), " +
          std::to_string(max_pages * page_size) + " (max_pages_per_seq * page_size)]");
    }
    for (int64_t b = 0; b < (lens[n] + page_size - 1) / page_size; ++b) {
      const int32_t page = table[n * max_pages + b];
      if (page < 0 || page >= num_pages) {
        return InvalidArgumentError(std::string(kOp) + ": block_table[" + std::to_string(n) + ", " +
                                    std::to_string(b) + "] = " + std::to_string(page) +
                                    ", expected a page id in [0, " + std::to_string(num_pages) +
                                    ")");
      }
    }
  }
  return Status::OK();
}

Status PagedLatentWrite(const Tensor& latents, const Tensor& slot_mapping, Tensor* pages) {
  PhaseScope phase("op.paged_latent_write");
  ORRERY_RETURN_IF_ERROR(CheckFloat(kWriteOp, "latents", latents));
  if (latents.ndim() != 2 || latents.dim(1) < 1) {
    return InvalidArgumentError(std::string(kWriteOp) + ": latents " + latents.ToString() +
                                ", expected [tokens, D >= 1]");
  }
  ORRERY_RETURN_IF_ERROR(
      CheckPages(kWriteOp, *pages, latents.dim(1), latents.dtype(), latents.device()));
  ORRERY_RETURN_IF_ERROR(ExpectAs(kWriteOp, "slot_mapping", slot_mapping, {latents.dim(0)},
                                  DType::kI32, latents.device()));
  const int64_t slots = pages->dim(0) * pages->dim(1);
  if (slots > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError(std::string(kWriteOp) + ": pages " + pages->ToString() +
                                " hold more slots than an i32 slot_mapping can address");
  }
  if (latents.dim(0) == 0) return Status::OK();
  if (latents.device().is_cpu()) {
    const int32_t* s = slot_mapping.data<int32_t>();
    for (int64_t t = 0; t < latents.dim(0); ++t) {
      if (s[t] >= slots) {
        return InvalidArgumentError(std::string(kWriteOp) + ": slot_mapping[" + std::to_string(t) +
                                    "] = " + std::to_string(s[t]) + ", expected < " +
                                    std::to_string(slots) + " (num_pages * page_size) or < 0");
      }
    }
    if (latents.dtype() == DType::kF32) {
      WriteCpu<float>(latents, s, pages);
    } else {
      WriteCpu<double>(latents, s, pages);
    }
    return Status::OK();
  }
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::PagedLatentWriteCuda(latents, slot_mapping, pages);
#else
  return NoCuda(kWriteOp, latents);
#endif
}

Status MlaDecodePaged(const Tensor& q, const PagedLatentCache& cache, int64_t dv, float scale,
                      Tensor* o, Tensor* lse) {
  return MlaDecodePaged(q, cache, dv, scale, MlaDecodeOptions{}, o, lse);
}

Status MlaDecodePaged(const Tensor& q, const PagedLatentCache& cache, int64_t dv, float scale,
                      const MlaDecodeOptions& options, Tensor* o, Tensor* lse) {
  PhaseScope phase("op.mla_decode");
  ORRERY_RETURN_IF_ERROR(CheckFloat(kOp, "q", q));
  if (q.ndim() != 4 || q.dim(1) < 1 || q.dim(3) < 1) {
    return InvalidArgumentError(std::string(kOp) + ": q " + q.ToString() +
                                ", expected [N, Q >= 1, H, D >= 1]");
  }
  const int64_t n_seq = q.dim(0), nq = q.dim(1), heads = q.dim(2), d = q.dim(3);
  ORRERY_RETURN_IF_ERROR(CheckPages(kOp, cache.pages, d, q.dtype(), q.device()));
  const Tensor& table = cache.block_table;
  if (!table.defined() || table.ndim() != 2 || table.dim(0) != n_seq || table.dim(1) < 1 ||
      table.dtype() != DType::kI32 || !(table.device() == q.device())) {
    return InvalidArgumentError(std::string(kOp) + ": block_table " + Describe(table) +
                                ", expected i32[" + std::to_string(n_seq) +
                                ", max_pages_per_seq >= 1] on " + q.device().ToString());
  }
  ORRERY_RETURN_IF_ERROR(
      ExpectAs(kOp, "context_lens", cache.context_lens, {n_seq}, DType::kI32, q.device()));
  if (dv < 1 || dv > d) {
    return InvalidArgumentError(std::string(kOp) + ": dv " + std::to_string(dv) +
                                ", expected in [1, " + std::to_string(d) + "] (D)");
  }
  if (!q.device().is_cpu() && d > kMaxMlaDecodeWidthCuda) {
    return InvalidArgumentError(std::string(kOp) + ": q " + q.ToString() + ", expected D <= " +
                                std::to_string(kMaxMlaDecodeWidthCuda) + " on cuda");
  }
  if (!std::isfinite(scale)) {
    return InvalidArgumentError(std::string(kOp) + ": scale " + std::to_string(scale) +
                                ", expected a finite number");
  }
  if (options.max_splits < 0) {
    return InvalidArgumentError(std::string(kOp) + ": max_splits " +
                                std::to_string(options.max_splits) + ", expected >= 0");
  }
  if (table.dim(1) * cache.pages.dim(1) > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError(std::string(kOp) + ": block_table " + table.ToString() +
                                " with page_size " + std::to_string(cache.pages.dim(1)) +
                                " addresses more positions than an i32 context length holds");
  }
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "o", {n_seq, nq, heads, dv}, q.dtype(), q.device(), o));
  ORRERY_RETURN_IF_ERROR(AllocateAs(kOp, "lse", {n_seq, nq, heads}, DType::kF32, q.device(), lse));
  if (q.device().is_cpu()) {
    ORRERY_RETURN_IF_ERROR(CheckPagedLatentIndices(cache, nq));
    if (n_seq == 0 || heads == 0) return Status::OK();
    if (q.dtype() == DType::kF32) {
      DecodeCpu<float>(q, cache, dv, scale, o, lse);
    } else {
      DecodeCpu<double>(q, cache, dv, scale, o, lse);
    }
    return Status::OK();
  }
  if (n_seq == 0 || heads == 0) return Status::OK();
#if defined(ORRERY_KERNELS_CUDA)
  return cuda::MlaDecodePagedCuda(q, cache, dv, scale, options.max_splits, o, lse);
#else
  return NoCuda(kOp, q);
#endif
}

}  // namespace orrery::kernels
