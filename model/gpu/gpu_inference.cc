// GpuInferenceState (model/gpu/gpu_inference.h): slot and page bookkeeping on the host, state and
// page pools on the device, the general inference pass over the GpuModel (GpuModel::RunInference
// with the KDA and MLA layers' Infer as its sequence mixers) and the fixed-shape decode step
// (the layers' Decode / Infer over the state tables), eager or replayed from CUDA graphs.
#include "model/gpu/gpu_inference.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "core/cuda_allocator.h"
#include "core/cuda_graph.h"
#include "core/device.h"
#include "core/logging.h"
#include "kernels/rows.h"
#include "kernels/token_sampling.h"
#include "model/gpu/gpu_layers.h"

namespace orrery::model {
namespace {

Tensor I32(const std::vector<int32_t>& v) {
  return Tensor::FromVector<int32_t>({static_cast<int64_t>(v.size())}, v);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The rows of the fixed-shape step's input buffer (i32 [kInputRows, max bucket]).
enum InputRow : int64_t {
  kTokens = 0,       // the token fed (0 for padding)
  kStateRows = 1,    // the slot: its row of the KDA and conv state tables (-1 for padding)
  kTableRows = 2,    // its row of the block table (num_slots, an all-zero row, for padding)
  kSlotMapping = 3,  // page * page_size + offset of its new latent (-1 for padding: not written)
  kContext = 4,      // tokens it holds after the step (1 for padding: row 0 of page 0)
  kInputRows = 5,
};

// The buckets up to the one holding n: the powers of two and their 1.5 multiples.
std::vector<int64_t> BucketsUpTo(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t p = 1;; p *= 2) {
    for (int64_t b : {p, p + p / 2}) {
      if (b == p + p / 2 && p < 2) continue;
      out.push_back(b);
      if (b >= n) return out;
    }
  }
}

// What a device-side pass (general or fixed-shape) leaves for its caller.
struct DeviceStep {
  Tensor logits;      // f32 [rows, vocab] on the device
  Tensor expert_ids;  // i32 [moe_layers, tokens, top_k] on the host
};

// The fixed-shape step's outputs on the device: logits f32 [B, V] and `out` i32 [2B + moe_layers
// * B * top_k]: the sampled ids, the log-probabilities (f32 bits) and the expert ids.
struct StepTensors {
  Tensor logits, out;
};

}  // namespace

struct GpuInferenceState::Impl {
  GpuModel* model = nullptr;
  ModelConfig c;
  GpuInferenceOptions options;
  Device device;
  DType dtype = DType::kF32;        // the compute dtype: conv history and latent pages
  int64_t hist = 0;                 // conv_size - 1
  int64_t latent = 0;               // dc + dr
  std::vector<int64_t> kind_index;  // per layer: its index among the KDA or the MLA layers
  // Per KDA layer: [S, H, K, V] f32, and q, k, v history [S, hist, width].
  std::vector<Tensor> kda_state;
  std::vector<std::array<Tensor, 3>> conv;
  std::vector<Tensor> pools;  // per MLA layer: [num_pages, page_size, latent]
  std::vector<bool> used;
  std::vector<int64_t> length;
  std::vector<std::vector<int32_t>> block;  // per slot: its pages in token order
  std::vector<int32_t> refs;                // per page: slots holding it
  std::vector<int32_t> free_pages;          // a stack

  // The MHA-form prefill of the slots being fed now (Extend), or null: per MLA layer their
  // keys and values, and per slot the row of its position 0.
  struct MhaScratch {
    std::vector<gpu::MlaContextKv> layers;
    std::vector<int64_t> begin;  // by slot; -1: not in the call
  };
  MhaScratch* mha = nullptr;
  int64_t mha_tokens = 0;  // fed in the MHA form so far
  // The fixed-shape decode step (gpu_inference.h).
  int64_t width = 1;             // W: the block table's fixed width
  std::vector<int64_t> buckets;  // ascending, the last holding num_slots
  Tensor table_dev;              // i32 [num_slots + 1, W]; the last row all zeros
  std::vector<int32_t> table_host;
  std::vector<char> table_dirty;  // per slot: its block changed since its row was uploaded
  Tensor in_dev;                  // i32 [kInputRows, max bucket]
  std::vector<int32_t> in_host;
  Tensor draw_dev;  // f64 [max bucket, 3]: temperature, top_p, u
  std::vector<double> draw_host;
  std::vector<int32_t> out_host;  // the copy back of StepTensors::out
  std::map<int64_t, gpu::InferenceSegments> bucket_segments;
  struct Graph {
    std::unique_ptr<DeviceGraph> graph;
    StepTensors out;
  };
  std::map<int64_t, Graph> graphs;  // by bucket * 2 + sampled
  std::map<int64_t, int> uses;      // steps run per key (a graph is captured at the second)
  bool graphs_on = true;
  uint64_t graph_pool = 0;
  DecodeStats stats;
  // Page changes of the step in progress (undone when it fails).
  struct PageChange {
    int64_t slot;
    int32_t from, to;  // copy-on-write: block.back() was `from`, is `to`; a new page: from = -1
  };
  std::vector<PageChange> changes;
  mutable std::vector<bool> seen_scratch;  // CheckDecode's, kept to not allocate per step

  ~Impl() {
    if (!graphs.empty()) {
      (void)CudaSynchronize(device.index);  // no replay still running when its graph goes
      graphs.clear();
    }
    if (graph_pool != 0) CudaReleasePrivatePool(device.index, graph_pool);
  }

  void Unref(int32_t page) {
    if (--refs[static_cast<size_t>(page)] == 0) free_pages.push_back(page);
  }
  int32_t Take() {
    const int32_t p = free_pages.back();
    free_pages.pop_back();
    refs[static_cast<size_t>(p)] = 1;
    return p;
  }
  void DropPages(int64_t slot) {
    for (int32_t p : block[static_cast<size_t>(slot)]) Unref(p);
    block[static_cast<size_t>(slot)].clear();
    table_dirty[static_cast<size_t>(slot)] = 1;
  }

  Status ZeroSlot(int64_t slot) {
    for (Tensor& t : kda_state) {
      ORRERY_ASSIGN_OR_RETURN(Tensor row, t.Slice(slot, slot + 1));
      ORRERY_RETURN_IF_ERROR(row.SetZero());
    }
    for (auto& per : conv) {
      for (Tensor& t : per) {
        if (!t.defined()) continue;
        ORRERY_ASSIGN_OR_RETURN(Tensor row, t.Slice(slot, slot + 1));
        ORRERY_RETURN_IF_ERROR(row.SetZero());
      }
    }
    DropPages(slot);
    length[static_cast<size_t>(slot)] = 0;
    return Status::OK();
  }

  // Pages a feed of m tokens into `slot` takes from the pool (a copy-on-write one included).
  int64_t PagesNeeded(int64_t slot, int64_t m) const {
    if (pools.empty()) return 0;
    const auto& b = block[static_cast<size_t>(slot)];
    const int64_t len = length[static_cast<size_t>(slot)], ps = options.page_size;
    int64_t need = CeilDiv(len + m, ps) - static_cast<int64_t>(b.size());
    if (len % ps != 0 && refs[static_cast<size_t>(b.back())] > 1) ++need;
    return need;
  }

  Status Check(const std::vector<int64_t>& slots,
               const std::vector<std::vector<int32_t>>& feeds) const;
  // Check for one token per slot (no per-token lists built).
  Status CheckDecode(const std::vector<int64_t>& slots, const std::vector<int32_t>& tokens) const;
  // The slot's id, its length after m more tokens, and that pages are enough: shared by both.
  Status CheckSlotFeed(int64_t s, int64_t m, std::vector<bool>* seen) const;
  Status CheckPages(int64_t pages) const;
  StatusOr<DeviceStep> Extend(const std::vector<int64_t>& slots,
                              const std::vector<std::vector<int32_t>>& feeds);
  // GpuInferenceState::Prefill: the MLA form per slot (the rule, gpu_inference.h), then Extend
  // once per form.
  StatusOr<DeviceStep> Prefill(const std::vector<int64_t>& slots,
                               const std::vector<std::vector<int32_t>>& feeds);
  // The MHA form's scratch for feeding `slots`: allocated (ResourceExhausted when it does not
  // fit) and the slots' contexts decompressed into it.
  StatusOr<MhaScratch> MakeMhaScratch(const std::vector<int64_t>& slots,
                                      const std::vector<std::vector<int32_t>>& feeds);
  // Per token of a slot, all MLA layers: H (dn + dr + dv) values in the compute dtype.
  int64_t MhaBytesPerToken() const;
  // One forward pass; every feed at most prefill_chunk tokens; pages already checked.
  StatusOr<DeviceStep> Pass(const std::vector<int64_t>& slots,
                            const std::vector<std::vector<int32_t>>& feeds);
  Status RunPass(const std::vector<int64_t>& slots, const std::vector<std::vector<int32_t>>& feeds,
                 DeviceStep* out);

  // Draws on the device from `logits` [slots.size(), V] (device) by `draws`.
  Status SampleOnDevice(const Tensor& logits, const std::vector<TokenDraw>& draws,
                        SampledStep* out);

  // The fixed-shape decode step; exactly one of `logits` (the StepOutput form) or `sampled`
  // (with draws) is non-null.
  Status FixedDecode(const std::vector<int64_t>& slots, const std::vector<int32_t>& tokens,
                     const std::vector<TokenDraw>* draws, StepOutput* logits, SampledStep* sampled);
  // Its device work for bucket b from the input buffers: what a graph captures.
  Status StepBody(int64_t b, bool sample, StepTensors* t);
  void TakeDecodePages(const std::vector<int64_t>& slots);
  void UndoDecodePages();
  Status UploadTableRows();
  int64_t Bucket(int64_t n) const { return *std::lower_bound(buckets.begin(), buckets.end(), n); }
};

Status GpuInferenceState::Impl::CheckSlotFeed(int64_t s, int64_t m, std::vector<bool>* seen) const {
  if (s < 0 || s >= static_cast<int64_t>(used.size())) {
    return InvalidArgumentError("gpu inference: slot " + std::to_string(s) + " is outside [0, " +
                                std::to_string(used.size()) + ")");
  }
  if (!used[static_cast<size_t>(s)]) {
    return FailedPreconditionError("gpu inference: slot " + std::to_string(s) +
                                   " is not allocated");
  }
  if ((*seen)[static_cast<size_t>(s)]) {
    return InvalidArgumentError("gpu inference: slot " + std::to_string(s) +
                                " appears twice in one call");
  }
  (*seen)[static_cast<size_t>(s)] = true;
  const int64_t total = length[static_cast<size_t>(s)] + m;
  if (total > options.max_tokens_per_slot) {
    return ResourceExhaustedError(
        "gpu inference: slot " + std::to_string(s) + " would hold " + std::to_string(total) +
        " tokens, more than max_tokens_per_slot = " + std::to_string(options.max_tokens_per_slot));
  }
  return Status::OK();
}

Status GpuInferenceState::Impl::CheckPages(int64_t pages) const {
  if (!pools.empty() && pages > static_cast<int64_t>(free_pages.size())) {
    return ResourceExhaustedError("gpu inference: the call needs " + std::to_string(pages) +
                                  " latent pages, " + std::to_string(free_pages.size()) + " of " +
                                  std::to_string(options.num_pages) +
                                  " are free (release finished slots, or raise num_pages)");
  }
  return Status::OK();
}

namespace {

Status CheckToken(int32_t id, int64_t slot, int64_t vocab) {
  if (id < 0 || id >= vocab) {
    return InvalidArgumentError("gpu inference: token id " + std::to_string(id) + " for slot " +
                                std::to_string(slot) + " is outside the vocabulary [0, " +
                                std::to_string(vocab) + ")");
  }
  return Status::OK();
}

}  // namespace

Status GpuInferenceState::Impl::Check(const std::vector<int64_t>& slots,
                                      const std::vector<std::vector<int32_t>>& feeds) const {
  if (slots.empty()) return InvalidArgumentError("gpu inference: no slots given");
  if (slots.size() != feeds.size()) {
    return InvalidArgumentError("gpu inference: " + std::to_string(slots.size()) + " slots but " +
                                std::to_string(feeds.size()) + " token lists");
  }
  std::vector<bool> seen(used.size(), false);
  int64_t pages = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i];
    const int64_t m = static_cast<int64_t>(feeds[i].size());
    ORRERY_RETURN_IF_ERROR(CheckSlotFeed(s, m, &seen));
    if (m == 0) {
      return InvalidArgumentError("gpu inference: the token list of slot " + std::to_string(s) +
                                  " is empty");
    }
    for (int32_t id : feeds[i]) ORRERY_RETURN_IF_ERROR(CheckToken(id, s, c.vocab_size));
    pages += PagesNeeded(s, m);
  }
  return CheckPages(pages);
}

StatusOr<DeviceStep> GpuInferenceState::Impl::Prefill(
    const std::vector<int64_t>& slots, const std::vector<std::vector<int32_t>>& feeds) {
  ORRERY_RETURN_IF_ERROR(Check(slots, feeds));
  // The rule (gpu_inference.h): feeds of at least mha_prefill_min_tokens take the MHA form when
  // its scratch fits, the others the absorbed form; the two groups run as separate calls.
  std::vector<size_t> mha_group, absorbed_group;
  int64_t mha_rows = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t m = static_cast<int64_t>(feeds[i].size());
    const bool mha_form =
        !pools.empty() && options.mha_prefill_min_tokens > 0 && m >= options.mha_prefill_min_tokens;
    (mha_form ? mha_group : absorbed_group).push_back(i);
    if (mha_form) mha_rows += length[static_cast<size_t>(slots[i])] + m;
  }
  if (!mha_group.empty() && device.is_cuda()) {
    const int64_t available = DeviceBytesAvailable(device);  // 0: unknown (the allocation decides)
    if (available > 0 &&
        mha_rows * MhaBytesPerToken() + options.mha_prefill_reserve_bytes > available) {
      mha_group.clear();  // does not fit: every slot absorbed
    }
  }
  if (mha_group.empty()) return Extend(slots, feeds);
  auto part = [&](const std::vector<size_t>& which, std::vector<int64_t>* s,
                  std::vector<std::vector<int32_t>>* f) {
    for (size_t i : which) {
      s->push_back(slots[i]);
      f->push_back(feeds[i]);
    }
  };
  std::vector<int64_t> mha_slots, other_slots;
  std::vector<std::vector<int32_t>> mha_feeds, other_feeds;
  part(mha_group, &mha_slots, &mha_feeds);
  part(absorbed_group, &other_slots, &other_feeds);
  StatusOr<MhaScratch> scratch = MakeMhaScratch(mha_slots, mha_feeds);
  if (!scratch.ok() && scratch.status().code() == StatusCode::kResourceExhausted) {
    return Extend(slots, feeds);  // the scratch did not fit after all: nothing was fed yet
  }
  ORRERY_RETURN_IF_ERROR(scratch.status());
  mha = &*scratch;
  StatusOr<DeviceStep> mha_out = Extend(mha_slots, mha_feeds);
  mha = nullptr;
  ORRERY_RETURN_IF_ERROR(mha_out.status());
  for (const auto& f : mha_feeds) mha_tokens += static_cast<int64_t>(f.size());
  *scratch = MhaScratch();  // freed before the absorbed group runs
  if (absorbed_group.empty()) return mha_out;
  ORRERY_ASSIGN_OR_RETURN(DeviceStep other, Extend(other_slots, other_feeds));
  // Both groups' rows back in call order.
  const int64_t k = c.moe.top_k, nmoe = c.num_moe_layers();
  std::vector<int64_t> base(slots.size() + 1, 0);
  for (size_t i = 0; i < slots.size(); ++i) {
    base[i + 1] = base[i] + static_cast<int64_t>(feeds[i].size());
  }
  DeviceStep out;
  ORRERY_ASSIGN_OR_RETURN(
      out.logits,
      Tensor::Allocate({static_cast<int64_t>(slots.size()), c.vocab_size}, DType::kF32, device));
  out.expert_ids = Tensor::Zeros({nmoe, base.back(), nmoe > 0 ? k : 0}, DType::kI32);
  for (const auto& [group, part_out] :
       {std::pair<const std::vector<size_t>&, const DeviceStep&>{mha_group, *mha_out},
        std::pair<const std::vector<size_t>&, const DeviceStep&>{absorbed_group, other}}) {
    int64_t at = 0;
    for (size_t j = 0; j < group.size(); ++j) {
      const size_t i = group[j];
      const int64_t m = static_cast<int64_t>(feeds[i].size());
      const int64_t row = static_cast<int64_t>(i), from = static_cast<int64_t>(j);
      ORRERY_ASSIGN_OR_RETURN(Tensor dst, out.logits.Slice(row, row + 1));
      ORRERY_ASSIGN_OR_RETURN(Tensor src, part_out.logits.Slice(from, from + 1));
      ORRERY_RETURN_IF_ERROR(dst.CopyFrom(src));
      for (int64_t l = 0; l < nmoe; ++l) {
        std::copy_n(part_out.expert_ids.data<int32_t>() + (l * part_out.expert_ids.dim(1) + at) * k,
                    m * k, out.expert_ids.data<int32_t>() + (l * base.back() + base[i]) * k);
      }
      at += m;
    }
  }
  return out;
}

int64_t GpuInferenceState::Impl::MhaBytesPerToken() const {
  const int64_t per_layer = c.mla.heads * (c.mla_qk_head_dim() + c.mla.v_head_dim) *
                            static_cast<int64_t>(DTypeSize(dtype));
  return per_layer * static_cast<int64_t>(pools.size());
}

StatusOr<GpuInferenceState::Impl::MhaScratch> GpuInferenceState::Impl::MakeMhaScratch(
    const std::vector<int64_t>& slots, const std::vector<std::vector<int32_t>>& feeds) {
  MhaScratch scratch;
  scratch.begin.assign(used.size(), -1);
  int64_t rows = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    scratch.begin[static_cast<size_t>(slots[i])] = rows;
    rows += length[static_cast<size_t>(slots[i])] + static_cast<int64_t>(feeds[i].size());
  }
  const int64_t h = c.mla.heads, dqk = c.mla_qk_head_dim(), dv = c.mla.v_head_dim;
  for (size_t l = 0; l < pools.size(); ++l) {
    gpu::MlaContextKv kv;
    ORRERY_ASSIGN_OR_RETURN(kv.k, Tensor::Allocate({rows, h, dqk}, dtype, device));
    ORRERY_ASSIGN_OR_RETURN(kv.v, Tensor::Allocate({rows, h, dv}, dtype, device));
    scratch.layers.push_back(std::move(kv));
  }
  // The contexts the slots hold (multi-turn, or copied from a shared prompt): decompressed from
  // their latent pages once, prefill_chunk positions at a time.
  std::vector<const gpu::GpuMla*> mla;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (const gpu::GpuMla* a = model->mla_layer(l)) mla.push_back(a);
  }
  if (mla.size() != pools.size()) {
    return InternalError("gpu inference: MLA layers and pools differ");
  }
  const int64_t ps = options.page_size;
  for (int64_t s : slots) {
    const int64_t len = length[static_cast<size_t>(s)],
                  begin = scratch.begin[static_cast<size_t>(s)];
    const auto& b = block[static_cast<size_t>(s)];
    for (int64_t p0 = 0; p0 < len; p0 += options.prefill_chunk) {
      const int64_t p1 = std::min(len, p0 + options.prefill_chunk);
      std::vector<int32_t> where;
      for (int64_t p = p0; p < p1; ++p) {
        where.push_back(static_cast<int32_t>(b[static_cast<size_t>(p / ps)] * ps + p % ps));
      }
      ORRERY_ASSIGN_OR_RETURN(Tensor index, I32(where).To(device));
      for (size_t l = 0; l < pools.size(); ++l) {
        ORRERY_ASSIGN_OR_RETURN(Tensor rows_of_pool,
                                pools[l].Reshape({options.num_pages * ps, latent}));
        Tensor lat;
        ORRERY_RETURN_IF_ERROR(kernels::GatherRows(rows_of_pool, index, &lat));
        ORRERY_ASSIGN_OR_RETURN(Tensor k, scratch.layers[l].k.Slice(begin + p0, begin + p1));
        ORRERY_ASSIGN_OR_RETURN(Tensor v, scratch.layers[l].v.Slice(begin + p0, begin + p1));
        ORRERY_RETURN_IF_ERROR(mla[l]->Decompress(lat, &k, &v));
      }
    }
  }
  return scratch;
}

Status GpuInferenceState::Impl::CheckDecode(const std::vector<int64_t>& slots,
                                            const std::vector<int32_t>& tokens) const {
  if (slots.empty()) return InvalidArgumentError("gpu inference: no slots given");
  if (slots.size() != tokens.size()) {
    return InvalidArgumentError("gpu inference: " + std::to_string(slots.size()) + " slots but " +
                                std::to_string(tokens.size()) + " tokens");
  }
  std::vector<bool>& seen = seen_scratch;
  seen.assign(used.size(), false);
  int64_t pages = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    ORRERY_RETURN_IF_ERROR(CheckSlotFeed(slots[i], 1, &seen));
    ORRERY_RETURN_IF_ERROR(CheckToken(tokens[i], slots[i], c.vocab_size));
    pages += PagesNeeded(slots[i], 1);
  }
  return CheckPages(pages);
}

StatusOr<DeviceStep> GpuInferenceState::Impl::Extend(
    const std::vector<int64_t>& slots, const std::vector<std::vector<int32_t>>& feeds) {
  ORRERY_RETURN_IF_ERROR(Check(slots, feeds));
  const int64_t chunk = options.prefill_chunk;
  bool fits = true;
  for (const auto& f : feeds) fits = fits && static_cast<int64_t>(f.size()) <= chunk;
  if (fits) return Pass(slots, feeds);
  // Successive chunks: each slot's logits from its last chunk (rows copied on the device), its
  // expert ids in token order.
  const int64_t ns = static_cast<int64_t>(slots.size()), k = c.moe.top_k;
  const int64_t nmoe = c.num_moe_layers();
  std::vector<int64_t> base(slots.size() + 1, 0);
  for (size_t i = 0; i < slots.size(); ++i) {
    base[i + 1] = base[i] + static_cast<int64_t>(feeds[i].size());
  }
  DeviceStep out;
  ORRERY_ASSIGN_OR_RETURN(out.logits, Tensor::Allocate({ns, c.vocab_size}, DType::kF32, device));
  out.expert_ids = Tensor::Zeros({nmoe, base.back(), nmoe > 0 ? k : 0}, DType::kI32);
  for (int64_t off = 0;; off += chunk) {
    std::vector<int64_t> sub_slots, which;
    std::vector<std::vector<int32_t>> sub_feeds;
    for (size_t i = 0; i < slots.size(); ++i) {
      const int64_t m = static_cast<int64_t>(feeds[i].size());
      if (off >= m) continue;
      sub_slots.push_back(slots[i]);
      which.push_back(static_cast<int64_t>(i));
      sub_feeds.emplace_back(feeds[i].begin() + off, feeds[i].begin() + std::min(m, off + chunk));
    }
    if (sub_slots.empty()) break;
    ORRERY_ASSIGN_OR_RETURN(DeviceStep part, Pass(sub_slots, sub_feeds));
    int64_t at = 0;
    for (size_t j = 0; j < which.size(); ++j) {
      const int64_t i = which[j], m = static_cast<int64_t>(sub_feeds[j].size());
      const int64_t r = static_cast<int64_t>(j);
      ORRERY_ASSIGN_OR_RETURN(Tensor dst, out.logits.Slice(i, i + 1));
      ORRERY_ASSIGN_OR_RETURN(Tensor src, part.logits.Slice(r, r + 1));
      ORRERY_RETURN_IF_ERROR(dst.CopyFrom(src));
      for (int64_t l = 0; l < nmoe; ++l) {
        std::copy_n(part.expert_ids.data<int32_t>() + (l * part.expert_ids.dim(1) + at) * k, m * k,
                    out.expert_ids.data<int32_t>() + (l * base.back() + base[i] + off) * k);
      }
      at += m;
    }
  }
  return out;
}

StatusOr<DeviceStep> GpuInferenceState::Impl::Pass(const std::vector<int64_t>& slots,
                                                   const std::vector<std::vector<int32_t>>& feeds) {
  // Pages first (copy-on-write of a shared, partially filled last page, then new pages to hold
  // the feed), undone if the pass fails.
  const int64_t ps = options.page_size;
  std::vector<std::vector<int32_t>> saved_blocks;
  std::vector<int32_t> taken, cow_sources;
  if (!pools.empty()) {
    for (int64_t s : slots) {
      auto& b = block[static_cast<size_t>(s)];
      saved_blocks.push_back(b);
      table_dirty[static_cast<size_t>(s)] = 1;
      const int64_t len = length[static_cast<size_t>(s)];
      if (len % ps != 0 && refs[static_cast<size_t>(b.back())] > 1) {
        const int32_t from = b.back(), to = Take();
        taken.push_back(to);
        for (Tensor& pool : pools) {
          ORRERY_ASSIGN_OR_RETURN(Tensor dst, pool.Slice(to, to + 1));
          ORRERY_ASSIGN_OR_RETURN(Tensor src, pool.Slice(from, from + 1));
          ORRERY_RETURN_IF_ERROR(dst.CopyFrom(src));
        }
        Unref(from);
        cow_sources.push_back(from);
        b.back() = to;
      }
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      auto& b = block[static_cast<size_t>(slots[i])];
      const int64_t end =
          length[static_cast<size_t>(slots[i])] + static_cast<int64_t>(feeds[i].size());
      while (static_cast<int64_t>(b.size()) * ps < end) {
        taken.push_back(Take());
        b.push_back(taken.back());
      }
    }
  }
  DeviceStep out;
  Status st = RunPass(slots, feeds, &out);
  if (!st.ok()) {
    for (int32_t p : cow_sources) ++refs[static_cast<size_t>(p)];  // shared: never freed
    for (int32_t p : taken) Unref(p);
    for (size_t i = 0; i < saved_blocks.size(); ++i) {
      block[static_cast<size_t>(slots[i])] = std::move(saved_blocks[i]);
    }
    return st;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    length[static_cast<size_t>(slots[i])] += static_cast<int64_t>(feeds[i].size());
  }
  return out;
}

Status GpuInferenceState::Impl::RunPass(const std::vector<int64_t>& slots,
                                        const std::vector<std::vector<int32_t>>& feeds,
                                        DeviceStep* out) {
  const int64_t ns = static_cast<int64_t>(slots.size()), ps = options.page_size;
  // Host index arrays of the call.
  gpu::InferenceSegments seg;
  seg.cu.push_back(0);
  std::vector<int32_t> tokens, last, slot_index, mapping, context, table;
  int64_t max_pages = 1;
  bool uniform = true;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i], len = length[static_cast<size_t>(s)];
    const int64_t m = static_cast<int64_t>(feeds[i].size());
    tokens.insert(tokens.end(), feeds[i].begin(), feeds[i].end());
    seg.cu.push_back(seg.cu.back() + m);
    last.push_back(static_cast<int32_t>(seg.cu.back() - 1));
    slot_index.push_back(static_cast<int32_t>(s));
    uniform = uniform && m == static_cast<int64_t>(feeds[0].size());
    context.push_back(static_cast<int32_t>(len + m));
    max_pages = std::max(max_pages, CeilDiv(len + m, ps));
    if (!pools.empty()) {
      const auto& b = block[static_cast<size_t>(s)];
      for (int64_t j = 0; j < m; ++j) {
        const int64_t pos = len + j;
        mapping.push_back(static_cast<int32_t>(b[pos / ps] * ps + pos % ps));
      }
    }
  }
  const int64_t n = seg.cu.back();
  seg.n = n;
  seg.cu_host = Tensor::FromVector<int64_t>({ns + 1}, seg.cu);
  ORRERY_ASSIGN_OR_RETURN(seg.cu_device, seg.cu_host.To(device));
  if (hist > 0) {
    std::vector<int32_t> ext, new_rows, hist_rows;
    std::vector<int64_t> ext_cu{0};
    for (int64_t i = 0; i < ns; ++i) {
      const int64_t m = seg.cu[i + 1] - seg.cu[i], start = ext_cu.back();
      for (int64_t r = 0; r < hist; ++r) ext.push_back(static_cast<int32_t>(i * hist + r));
      for (int64_t t = 0; t < m; ++t) {
        ext.push_back(static_cast<int32_t>(ns * hist + seg.cu[i] + t));
        new_rows.push_back(static_cast<int32_t>(start + hist + t));
      }
      ext_cu.push_back(start + hist + m);
      for (int64_t r = 0; r < hist; ++r) {
        hist_rows.push_back(static_cast<int32_t>(ext_cu.back() - hist + r));
      }
    }
    ORRERY_ASSIGN_OR_RETURN(seg.ext_index, I32(ext).To(device));
    ORRERY_ASSIGN_OR_RETURN(seg.new_rows, I32(new_rows).To(device));
    ORRERY_ASSIGN_OR_RETURN(seg.hist_rows, I32(hist_rows).To(device));
    seg.ext_cu_host = Tensor::FromVector<int64_t>({ns + 1}, ext_cu);
    ORRERY_ASSIGN_OR_RETURN(seg.ext_cu, seg.ext_cu_host.To(device));
  }
  gpu::MlaPagedCall call;
  call.uniform = uniform;
  if (!pools.empty()) {
    table.assign(static_cast<size_t>(ns * max_pages), 0);
    for (int64_t i = 0; i < ns; ++i) {
      const auto& b = block[static_cast<size_t>(slots[i])];
      std::copy(b.begin(), b.end(), table.begin() + i * max_pages);
    }
    ORRERY_ASSIGN_OR_RETURN(call.slot_mapping, I32(mapping).To(device));
    ORRERY_ASSIGN_OR_RETURN(call.block_table,
                            Tensor::FromVector<int32_t>({ns, max_pages}, table).To(device));
    ORRERY_ASSIGN_OR_RETURN(call.context_lens, I32(context).To(device));
  }
  ORRERY_ASSIGN_OR_RETURN(Tensor slot_dev, I32(slot_index).To(device));
  // The MHA form's rows: each segment's new tokens after its slot's context.
  gpu::MlaMhaCall mha_call;
  if (mha != nullptr) {
    std::vector<int32_t> rows;
    for (size_t i = 0; i < slots.size(); ++i) {
      const int64_t len = length[static_cast<size_t>(slots[i])];
      const int64_t m = static_cast<int64_t>(feeds[i].size());
      const int64_t begin = mha->begin[static_cast<size_t>(slots[i])];
      for (int64_t j = 0; j < m; ++j) rows.push_back(static_cast<int32_t>(begin + len + j));
      mha_call.begin.push_back(begin);
      mha_call.keys.push_back(len + m);
      ORRERY_ASSIGN_OR_RETURN(Tensor cu_q, Tensor::FromVector<int64_t>({2}, {0, m}).To(device));
      ORRERY_ASSIGN_OR_RETURN(Tensor cu_k,
                              Tensor::FromVector<int64_t>({2}, {0, len + m}).To(device));
      mha_call.cu_q.push_back(cu_q);
      mha_call.cu_k.push_back(cu_k);
    }
    ORRERY_ASSIGN_OR_RETURN(mha_call.rows, I32(rows).To(device));
  }

  // The slots' KDA and conv state, gathered in call order (scattered back after the pass).
  std::vector<gpu::KdaSlotState> kda(kda_state.size());
  for (size_t i = 0; i < kda_state.size(); ++i) {
    ORRERY_RETURN_IF_ERROR(kernels::GatherRows(kda_state[i], slot_dev, &kda[i].state));
    for (int j = 0; j < 3 && hist > 0; ++j) {
      Tensor rows;
      ORRERY_RETURN_IF_ERROR(kernels::GatherRows(conv[i][j], slot_dev, &rows));
      ORRERY_ASSIGN_OR_RETURN(kda[i].conv[j], rows.Reshape({ns * hist, rows.dim(2)}));
    }
  }
  gpu::InferencePass pass;
  ORRERY_ASSIGN_OR_RETURN(pass.tokens, I32(tokens).To(device));
  ORRERY_ASSIGN_OR_RETURN(pass.last, I32(last).To(device));
  pass.mixer = [&](int64_t l, const gpu::GpuKda* k, const gpu::GpuMla* a, const Tensor& x,
                   Tensor* y) -> Status {
    const size_t index = static_cast<size_t>(kind_index[static_cast<size_t>(l)]);
    if (k != nullptr) return k->Infer(x, seg, &kda[index], y);
    if (mha != nullptr) {
      return a->InferMha(x, seg, call, mha_call, &mha->layers[index], &pools[index], y);
    }
    return a->Infer(x, seg, call, &pools[index], y);
  };
  ORRERY_RETURN_IF_ERROR(model->SyncInferenceInputs());
  ORRERY_RETURN_IF_ERROR(model->RunInference(&pass));

  out->logits = pass.logits;
  const int64_t nmoe = static_cast<int64_t>(pass.expert_ids.size()), k = c.moe.top_k;
  out->expert_ids = Tensor::Zeros({nmoe, n, nmoe > 0 ? k : 0}, DType::kI32);
  for (int64_t l = 0; l < nmoe; ++l) {
    ORRERY_ASSIGN_OR_RETURN(Tensor ids, pass.expert_ids[static_cast<size_t>(l)].To(Device::Cpu()));
    std::copy_n(ids.data<int32_t>(), n * k, out->expert_ids.data<int32_t>() + l * n * k);
  }
  for (size_t i = 0; i < kda_state.size(); ++i) {
    ORRERY_RETURN_IF_ERROR(kernels::ScatterRows(kda[i].state, slot_dev, &kda_state[i]));
    for (int j = 0; j < 3 && hist > 0; ++j) {
      ORRERY_ASSIGN_OR_RETURN(Tensor rows,
                              kda[i].conv[j].Reshape({ns, hist, kda[i].conv[j].dim(1)}));
      ORRERY_RETURN_IF_ERROR(kernels::ScatterRows(rows, slot_dev, &conv[i][j]));
    }
  }
  return Status::OK();
}

Status GpuInferenceState::Impl::SampleOnDevice(const Tensor& logits,
                                               const std::vector<TokenDraw>& draws,
                                               SampledStep* out) {
  const int64_t ns = logits.dim(0);
  if (static_cast<int64_t>(draws.size()) != ns) {
    return InvalidArgumentError("gpu inference: " + std::to_string(ns) + " slots but " +
                                std::to_string(draws.size()) + " draws");
  }
  Tensor params = Tensor::Empty({ns, 3}, DType::kF64);
  for (int64_t i = 0; i < ns; ++i) {
    params.data<double>()[i * 3] = draws[static_cast<size_t>(i)].temperature;
    params.data<double>()[i * 3 + 1] = draws[static_cast<size_t>(i)].top_p;
    params.data<double>()[i * 3 + 2] = draws[static_cast<size_t>(i)].uniform;
  }
  ORRERY_ASSIGN_OR_RETURN(Tensor params_dev, params.To(device));
  Tensor ids, logprobs;
  ORRERY_RETURN_IF_ERROR(kernels::SampleTokens(logits, params_dev, &ids, &logprobs));
  ORRERY_ASSIGN_OR_RETURN(Tensor ids_host, ids.To(Device::Cpu()));
  ORRERY_ASSIGN_OR_RETURN(Tensor lp_host, logprobs.To(Device::Cpu()));
  out->ids.assign(ids_host.data<int32_t>(), ids_host.data<int32_t>() + ns);
  out->logprobs.assign(lp_host.data<float>(), lp_host.data<float>() + ns);
  return Status::OK();
}

void GpuInferenceState::Impl::TakeDecodePages(const std::vector<int64_t>& slots) {
  changes.clear();
  if (pools.empty()) return;
  const int64_t ps = options.page_size;
  for (int64_t s : slots) {
    auto& b = block[static_cast<size_t>(s)];
    const int64_t len = length[static_cast<size_t>(s)];
    if (len % ps != 0 && refs[static_cast<size_t>(b.back())] > 1) {
      const int32_t from = b.back(), to = Take();
      b.back() = to;
      Unref(from);
      changes.push_back({s, from, to});
      table_dirty[static_cast<size_t>(s)] = 1;
    } else if (len % ps == 0) {
      const int32_t page = Take();
      b.push_back(page);
      changes.push_back({s, -1, page});
      table_dirty[static_cast<size_t>(s)] = 1;
    }
  }
}

void GpuInferenceState::Impl::UndoDecodePages() {
  for (auto it = changes.rbegin(); it != changes.rend(); ++it) {
    auto& b = block[static_cast<size_t>(it->slot)];
    if (it->from < 0) {
      b.pop_back();
    } else {
      b.back() = it->from;
      ++refs[static_cast<size_t>(it->from)];  // it was shared: never freed meanwhile
    }
    Unref(it->to);
    table_dirty[static_cast<size_t>(it->slot)] = 1;
  }
  changes.clear();
}

Status GpuInferenceState::Impl::UploadTableRows() {
  int64_t dirty = 0;
  for (char d : table_dirty) dirty += d != 0;
  if (dirty == 0) return Status::OK();
  if (dirty > 8) {  // many rows (after a large prefill): the whole table in one copy
    for (size_t s = 0; s < table_dirty.size(); ++s) {
      int32_t* row = table_host.data() + s * static_cast<size_t>(width);
      std::fill(row, row + width, 0);
      std::copy(block[s].begin(), block[s].end(), row);
      table_dirty[s] = 0;
    }
    return DeviceCopy(table_dev.raw_data(), device, table_host.data(), Device::Cpu(),
                      table_dev.nbytes());
  }
  for (size_t s = 0; s < table_dirty.size(); ++s) {
    if (!table_dirty[s]) continue;
    int32_t* row = table_host.data() + s * static_cast<size_t>(width);
    const auto& b = block[s];
    std::fill(row, row + width, 0);
    std::copy(b.begin(), b.end(), row);
    ORRERY_ASSIGN_OR_RETURN(Tensor dst,
                            table_dev.Slice(static_cast<int64_t>(s), static_cast<int64_t>(s) + 1));
    ORRERY_RETURN_IF_ERROR(DeviceCopy(dst.raw_data(), device, row, Device::Cpu(), dst.nbytes()));
    table_dirty[s] = 0;
  }
  return Status::OK();
}

Status GpuInferenceState::Impl::StepBody(int64_t b, bool sample, StepTensors* t) {
  const int64_t nmoe = c.num_moe_layers(), k = c.moe.top_k;
  auto input = [&](InputRow r) -> StatusOr<Tensor> {
    ORRERY_ASSIGN_OR_RETURN(Tensor row, in_dev.Slice(r, r + 1));
    ORRERY_ASSIGN_OR_RETURN(row, row.Reshape({in_dev.dim(1)}));
    return row.Slice(0, b);
  };
  ORRERY_ASSIGN_OR_RETURN(const Tensor tokens, input(kTokens));
  ORRERY_ASSIGN_OR_RETURN(const Tensor state_rows, input(kStateRows));
  ORRERY_ASSIGN_OR_RETURN(const Tensor table_rows, input(kTableRows));
  gpu::MlaPagedCall call;
  call.uniform = true;
  ORRERY_ASSIGN_OR_RETURN(call.slot_mapping, input(kSlotMapping));
  ORRERY_ASSIGN_OR_RETURN(call.context_lens, input(kContext));
  if (!pools.empty()) {
    ORRERY_RETURN_IF_ERROR(kernels::GatherRows(table_dev, table_rows, &call.block_table));
  }
  const gpu::InferenceSegments& seg = bucket_segments[b];
  ORRERY_ASSIGN_OR_RETURN(t->out, Tensor::Allocate({2 * b + nmoe * b * k}, DType::kI32, device));
  gpu::InferencePass pass;
  pass.tokens = tokens;
  if (nmoe > 0) {
    ORRERY_ASSIGN_OR_RETURN(Tensor ids, t->out.Slice(2 * b, 2 * b + nmoe * b * k));
    ORRERY_ASSIGN_OR_RETURN(pass.expert_ids_out, ids.Reshape({nmoe, b, k}));
  }
  pass.mixer = [&](int64_t l, const gpu::GpuKda* kda, const gpu::GpuMla* mla, const Tensor& x,
                   Tensor* y) -> Status {
    const size_t index = static_cast<size_t>(kind_index[static_cast<size_t>(l)]);
    if (kda != nullptr) {
      gpu::KdaStateRows st;
      st.rows = state_rows;
      st.state = &kda_state[index];
      for (int j = 0; j < 3; ++j) st.conv[j] = &conv[index][static_cast<size_t>(j)];
      return kda->Decode(x, st, y);
    }
    return mla->Infer(x, seg, call, &pools[index], y);
  };
  ORRERY_RETURN_IF_ERROR(model->RunInference(&pass));
  t->logits = pass.logits;
  if (!sample) return Status::OK();
  ORRERY_ASSIGN_OR_RETURN(const Tensor params, draw_dev.Slice(0, b));
  ORRERY_ASSIGN_OR_RETURN(Tensor ids, t->out.Slice(0, b));
  ORRERY_ASSIGN_OR_RETURN(Tensor lp_bits, t->out.Slice(b, 2 * b));
  Tensor logprobs =
      Tensor::Wrap({b}, DType::kF32, device, lp_bits.raw_data(), std::make_shared<Tensor>(t->out));
  return kernels::SampleTokens(pass.logits, params, &ids, &logprobs);
}

Status GpuInferenceState::Impl::FixedDecode(const std::vector<int64_t>& slots,
                                            const std::vector<int32_t>& tokens,
                                            const std::vector<TokenDraw>* draws,
                                            StepOutput* logits_out, SampledStep* sampled) {
  ORRERY_RETURN_IF_ERROR(CheckDecode(slots, tokens));
  const bool sample = draws != nullptr;
  const int64_t ns = static_cast<int64_t>(slots.size()), b = Bucket(ns);
  const int64_t bmax = in_dev.dim(1), ps = options.page_size;
  const int64_t nslots = static_cast<int64_t>(used.size());
  if (sample && static_cast<int64_t>(draws->size()) != ns) {
    return InvalidArgumentError("gpu inference: " + std::to_string(ns) + " slots but " +
                                std::to_string(draws->size()) + " draws");
  }
  // Pages (copy-on-write of a shared, partially filled last page, or a new page at a page
  // boundary), then the step's inputs.
  TakeDecodePages(slots);
  for (const PageChange& ch : changes) {
    if (ch.from < 0) continue;
    for (Tensor& pool : pools) {
      ORRERY_ASSIGN_OR_RETURN(Tensor dst, pool.Slice(ch.to, ch.to + 1));
      ORRERY_ASSIGN_OR_RETURN(Tensor src, pool.Slice(ch.from, ch.from + 1));
      Status st = dst.CopyFrom(src);
      if (!st.ok()) {
        UndoDecodePages();
        return st;
      }
    }
  }
  int32_t* in = in_host.data();
  for (int64_t i = 0; i < b; ++i) {
    const bool real = i < ns;
    const int64_t s = real ? slots[static_cast<size_t>(i)] : -1;
    const int64_t len = real ? length[static_cast<size_t>(s)] : 0;
    in[kTokens * bmax + i] = real ? tokens[static_cast<size_t>(i)] : 0;
    in[kStateRows * bmax + i] = static_cast<int32_t>(s);
    in[kTableRows * bmax + i] = static_cast<int32_t>(real ? s : nslots);
    int32_t slot = -1;
    if (real && !pools.empty()) {
      const auto& blk = block[static_cast<size_t>(s)];
      slot = static_cast<int32_t>(blk[static_cast<size_t>(len / ps)] * ps + len % ps);
    }
    in[kSlotMapping * bmax + i] = slot;
    in[kContext * bmax + i] = static_cast<int32_t>(real ? len + 1 : 1);
    if (sample) {
      const TokenDraw d = real ? (*draws)[static_cast<size_t>(i)] : TokenDraw{};
      draw_host[static_cast<size_t>(i) * 3] = d.temperature;
      draw_host[static_cast<size_t>(i) * 3 + 1] = d.top_p;
      draw_host[static_cast<size_t>(i) * 3 + 2] = d.uniform;
    }
  }
  Status st = UploadTableRows();
  if (st.ok()) st = DeviceCopy(in_dev.raw_data(), device, in, Device::Cpu(), in_dev.nbytes());
  if (st.ok() && sample) {
    st = DeviceCopy(draw_dev.raw_data(), device, draw_host.data(), Device::Cpu(),
                    static_cast<size_t>(b) * 3 * sizeof(double));
  }
  if (st.ok()) st = model->SyncInferenceInputs();
  // The step: a graph's replay, its capture, or the eager ops.
  StepTensors t;
  const int64_t key = b * 2 + (sample ? 1 : 0);
  bool done = false;
  if (graphs_on && options.decode == GpuInferenceOptions::Decode::kGraph &&
      (!device.is_cuda() || model->compute_dtype() != DType::kBF16)) {
    graphs_on = false;  // a graph needs a step without read backs: the bf16 path on CUDA
    stats.graphs_off = device.is_cuda()
                           ? "f32 compute: the MoE experts' per-expert loop reads counts back"
                           : "no CUDA device: the ops' CPU twins run eagerly";
  }
  if (st.ok() && options.decode == GpuInferenceOptions::Decode::kGraph && graphs_on) {
    auto it = graphs.find(key);
    if (it == graphs.end() && ++uses[key] >= 2) {
      if (graph_pool == 0) {
        StatusOr<uint64_t> pool = CudaCreatePrivatePool(device.index);
        if (pool.ok()) graph_pool = *pool;
      }
      StepTensors captured;
      StatusOr<std::unique_ptr<DeviceGraph>> g =
          graph_pool == 0 ? StatusOr<std::unique_ptr<DeviceGraph>>(
                                InternalError("gpu inference: no private pool for the graphs"))
                          : DeviceGraph::Capture(device.index, graph_pool,
                                                 [&] { return StepBody(b, sample, &captured); });
      if (g.ok()) {
        ++stats.graph_captures;
        stats.graph_nodes += (*g)->nodes();
        it = graphs.emplace(key, Graph{std::move(g).value(), captured}).first;
      } else {
        graphs_on = false;
        stats.graphs_off = g.status().ToString();
        ORRERY_LOG(WARN) << "gpu inference: CUDA graphs turned off, decode runs eagerly: "
                         << stats.graphs_off;
      }
    }
    if (it != graphs.end()) {
      st = it->second.graph->Replay();
      t = it->second.out;
      ++stats.graph_replays;
      done = true;
    }
  }
  if (st.ok() && !done) {
    st = StepBody(b, sample, &t);
    ++stats.eager_steps;
  }
  // The outputs back (the only wait of the step).
  const int64_t nmoe = c.num_moe_layers(), k = c.moe.top_k;
  if (st.ok()) {
    st = DeviceCopy(out_host.data(), Device::Cpu(), t.out.raw_data(), device, t.out.nbytes());
  }
  if (st.ok() && logits_out != nullptr) {
    StatusOr<Tensor> rows = t.logits.Slice(0, ns);
    st = rows.ok() ? Status::OK() : rows.status();
    if (st.ok()) {
      StatusOr<Tensor> host = rows->To(Device::Cpu());
      st = host.ok() ? Status::OK() : host.status();
      if (st.ok()) logits_out->logits = *host;
    }
  }
  if (!st.ok()) {
    UndoDecodePages();
    return st;
  }
  Tensor ids = Tensor::Empty({nmoe, ns, nmoe > 0 ? k : 0}, DType::kI32);
  for (int64_t l = 0; l < nmoe; ++l) {
    std::copy_n(out_host.data() + 2 * b + l * b * k, ns * k, ids.data<int32_t>() + l * ns * k);
  }
  if (logits_out != nullptr) logits_out->expert_ids = ids;
  if (sampled != nullptr) {
    sampled->expert_ids = ids;
    sampled->ids.assign(out_host.data(), out_host.data() + ns);
    sampled->logprobs.resize(static_cast<size_t>(ns));
    std::memcpy(sampled->logprobs.data(), out_host.data() + b, static_cast<size_t>(ns) * 4);
  }
  for (int64_t s : slots) ++length[static_cast<size_t>(s)];
  changes.clear();
  return Status::OK();
}

GpuInferenceState::GpuInferenceState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuInferenceState::~GpuInferenceState() = default;

StatusOr<std::unique_ptr<GpuInferenceState>> GpuInferenceState::Create(
    GpuModel* model, const GpuInferenceOptions& options) {
  const ModelConfig& c = model->config();
  GpuInferenceOptions o = options;
  if (o.max_tokens_per_slot == 0) o.max_tokens_per_slot = c.max_seq_len;
  if (o.num_slots < 1 || o.page_size < 1 || o.prefill_chunk < 1 || o.num_pages < 0 ||
      o.max_tokens_per_slot < 1 || o.max_tokens_per_slot > c.max_seq_len) {
    return InvalidArgumentError(
        "gpu inference: expected num_slots, page_size and prefill_chunk >= 1, num_pages >= 0 and "
        "max_tokens_per_slot in [0, max_seq_len = " +
        std::to_string(c.max_seq_len) + "]; got num_slots " + std::to_string(o.num_slots) +
        ", page_size " + std::to_string(o.page_size) + ", prefill_chunk " +
        std::to_string(o.prefill_chunk) + ", num_pages " + std::to_string(o.num_pages) +
        ", max_tokens_per_slot " + std::to_string(options.max_tokens_per_slot));
  }
  if (o.mha_prefill_min_tokens < 0 || o.mha_prefill_reserve_bytes < 0) {
    return InvalidArgumentError(
        "gpu inference: expected mha_prefill_min_tokens and mha_prefill_reserve_bytes >= 0; got " +
        std::to_string(o.mha_prefill_min_tokens) + " and " +
        std::to_string(o.mha_prefill_reserve_bytes));
  }
  if (o.num_pages == 0) {
    // Every slot at max_tokens_per_slot, but on CUDA no more than half the device's available
    // memory: the pool is shared, and a max_seq_len of 1M times many slots would ask for more
    // than the device has (a call that then runs out of pages is a ResourceExhausted error).
    o.num_pages = o.num_slots * CeilDiv(o.max_tokens_per_slot, o.page_size);
    const int64_t page_bytes = c.num_mla_layers() * o.page_size *
                               (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim) *
                               static_cast<int64_t>(DTypeSize(model->compute_dtype()));
    const int64_t available = DeviceBytesAvailable(model->device());  // 0: unknown
    if (model->device().is_cuda() && page_bytes > 0 && available > 0) {
      o.num_pages = std::max<int64_t>(1, std::min(o.num_pages, available / 2 / page_bytes));
    }
  }
  if (const char* mode = std::getenv("ORRERY_DECODE"); mode != nullptr && *mode != '\0') {
    const std::string m = mode;
    if (m == "graph") {
      o.decode = GpuInferenceOptions::Decode::kGraph;
    } else if (m == "eager") {
      o.decode = GpuInferenceOptions::Decode::kEager;
    } else if (m == "pass") {
      o.decode = GpuInferenceOptions::Decode::kPass;
    } else {
      return InvalidArgumentError("ORRERY_DECODE: '" + m + "', expected graph, eager or pass");
    }
  }
  if (o.num_pages * o.page_size > (int64_t{1} << 31) - 1) {
    return InvalidArgumentError(
        "gpu inference: num_pages * page_size = " + std::to_string(o.num_pages * o.page_size) +
        " latent rows exceed the i32 slot mapping");
  }
  auto impl = std::make_unique<Impl>();
  impl->model = model;
  impl->c = c;
  impl->options = o;
  impl->device = model->device();
  impl->dtype = model->compute_dtype();
  impl->hist = c.kda.conv_size - 1;
  impl->latent = c.mla.kv_lora_rank + c.mla.qk_rope_head_dim;
  const int64_t s = o.num_slots;
  const int64_t widths[3] = {c.kda_key_width(), c.kda_key_width(), c.kda_value_width()};
  int64_t kda_layers = 0, mla_layers = 0;
  for (LayerKind kind : c.layers) {
    if (kind == LayerKind::kKda) {
      impl->kind_index.push_back(kda_layers++);
      ORRERY_ASSIGN_OR_RETURN(Tensor state,
                              Tensor::Allocate({s, c.kda.heads, c.kda.head_k_dim, c.kda.head_v_dim},
                                               DType::kF32, impl->device));
      impl->kda_state.push_back(state);
      std::array<Tensor, 3> conv;
      for (int j = 0; j < 3 && impl->hist > 0; ++j) {
        ORRERY_ASSIGN_OR_RETURN(
            conv[j], Tensor::Allocate({s, impl->hist, widths[j]}, impl->dtype, impl->device));
      }
      impl->conv.push_back(conv);
    } else {
      impl->kind_index.push_back(mla_layers++);
      StatusOr<Tensor> pool =
          Tensor::Allocate({o.num_pages, o.page_size, impl->latent}, impl->dtype, impl->device);
      if (!pool.ok()) {
        return pool.status().WithContext(
            "gpu inference: the latent page pool of " + std::to_string(o.num_pages) + " pages (" +
            std::to_string(o.num_pages * o.page_size * impl->latent *
                           static_cast<int64_t>(DTypeSize(impl->dtype))) +
            " bytes per MLA layer)");
      }
      impl->pools.push_back(*pool);
    }
  }
  impl->used.assign(static_cast<size_t>(s), false);
  impl->length.assign(static_cast<size_t>(s), 0);
  impl->block.assign(static_cast<size_t>(s), {});
  impl->refs.assign(static_cast<size_t>(o.num_pages), 0);
  for (int64_t p = o.num_pages - 1; p >= 0; --p) {
    impl->free_pages.push_back(static_cast<int32_t>(p));
  }
  // Zeroed pools: the decode step's padding rows read row 0 of page 0.
  for (Tensor& pool : impl->pools) ORRERY_RETURN_IF_ERROR(pool.SetZero());
  // The fixed-shape decode step's buffers.
  impl->width = CeilDiv(o.max_tokens_per_slot, o.page_size);
  impl->buckets = BucketsUpTo(s);
  const int64_t bmax = impl->buckets.back();
  ORRERY_ASSIGN_OR_RETURN(impl->table_dev,
                          Tensor::Allocate({s + 1, impl->width}, DType::kI32, impl->device));
  ORRERY_RETURN_IF_ERROR(impl->table_dev.SetZero());
  impl->table_host.assign(static_cast<size_t>((s + 1) * impl->width), 0);
  impl->table_dirty.assign(static_cast<size_t>(s), 0);
  ORRERY_ASSIGN_OR_RETURN(impl->in_dev,
                          Tensor::Allocate({kInputRows, bmax}, DType::kI32, impl->device));
  impl->in_host.assign(static_cast<size_t>(kInputRows * bmax), 0);
  ORRERY_ASSIGN_OR_RETURN(impl->draw_dev, Tensor::Allocate({bmax, 3}, DType::kF64, impl->device));
  impl->draw_host.assign(static_cast<size_t>(bmax * 3), 0.0);
  impl->out_host.assign(static_cast<size_t>(2 * bmax + c.num_moe_layers() * bmax * c.moe.top_k), 0);
  for (int64_t b : impl->buckets) {
    gpu::InferenceSegments& seg = impl->bucket_segments[b];
    seg.n = b;
    for (int64_t i = 0; i <= b; ++i) seg.cu.push_back(i);
  }
  impl->changes.reserve(static_cast<size_t>(s));
  return std::unique_ptr<GpuInferenceState>(new GpuInferenceState(std::move(impl)));
}

int64_t GpuInferenceState::num_slots() const { return static_cast<int64_t>(impl_->used.size()); }

int64_t GpuInferenceState::num_free() const {
  return std::count(impl_->used.begin(), impl_->used.end(), false);
}

StatusOr<int64_t> GpuInferenceState::Allocate() {
  for (size_t s = 0; s < impl_->used.size(); ++s) {
    if (impl_->used[s]) continue;
    ORRERY_RETURN_IF_ERROR(impl_->ZeroSlot(static_cast<int64_t>(s)));
    impl_->used[s] = true;
    return static_cast<int64_t>(s);
  }
  return ResourceExhaustedError("gpu inference: all " + std::to_string(impl_->used.size()) +
                                " slots are in use");
}

Status GpuInferenceState::CheckSlot(int64_t slot) const {
  if (slot < 0 || slot >= num_slots()) {
    return InvalidArgumentError("gpu inference: slot " + std::to_string(slot) + " is outside [0, " +
                                std::to_string(num_slots()) + ")");
  }
  if (!impl_->used[static_cast<size_t>(slot)]) {
    return FailedPreconditionError("gpu inference: slot " + std::to_string(slot) +
                                   " is not allocated");
  }
  return Status::OK();
}

Status GpuInferenceState::Release(int64_t slot) {
  ORRERY_RETURN_IF_ERROR(CheckSlot(slot));
  impl_->DropPages(slot);
  impl_->length[static_cast<size_t>(slot)] = 0;
  impl_->used[static_cast<size_t>(slot)] = false;
  return Status::OK();
}

Status GpuInferenceState::Reset(int64_t slot) {
  ORRERY_RETURN_IF_ERROR(CheckSlot(slot));
  return impl_->ZeroSlot(slot);
}

Status GpuInferenceState::CopySlot(int64_t src, int64_t dst) {
  ORRERY_RETURN_IF_ERROR(CheckSlot(src));
  ORRERY_RETURN_IF_ERROR(CheckSlot(dst));
  if (src == dst) return Status::OK();
  Impl& m = *impl_;
  auto copy_row = [&](Tensor& t) -> Status {
    ORRERY_ASSIGN_OR_RETURN(Tensor to, t.Slice(dst, dst + 1));
    ORRERY_ASSIGN_OR_RETURN(Tensor from, t.Slice(src, src + 1));
    return to.CopyFrom(from);
  };
  for (Tensor& t : m.kda_state) ORRERY_RETURN_IF_ERROR(copy_row(t));
  for (auto& per : m.conv) {
    for (Tensor& t : per) {
      if (t.defined()) ORRERY_RETURN_IF_ERROR(copy_row(t));
    }
  }
  m.DropPages(dst);  // marks dst's table row as changed
  m.block[static_cast<size_t>(dst)] = m.block[static_cast<size_t>(src)];
  for (int32_t p : m.block[static_cast<size_t>(dst)]) ++m.refs[static_cast<size_t>(p)];
  m.length[static_cast<size_t>(dst)] = m.length[static_cast<size_t>(src)];
  return Status::OK();
}

bool GpuInferenceState::in_use(int64_t slot) const {
  return slot >= 0 && slot < num_slots() && impl_->used[static_cast<size_t>(slot)];
}

int64_t GpuInferenceState::length(int64_t slot) const {
  return slot >= 0 && slot < num_slots() ? impl_->length[static_cast<size_t>(slot)] : 0;
}

int64_t GpuInferenceState::page_size() const { return impl_->options.page_size; }
int64_t GpuInferenceState::num_pages() const { return impl_->options.num_pages; }
int64_t GpuInferenceState::free_pages() const {
  return static_cast<int64_t>(impl_->free_pages.size());
}

int64_t GpuInferenceState::PagesNeeded(int64_t slot, int64_t tokens) const {
  if (!in_use(slot)) return 0;
  return impl_->PagesNeeded(slot, tokens);
}

int64_t GpuInferenceState::MhaBytesPerToken() const { return impl_->MhaBytesPerToken(); }
int64_t GpuInferenceState::mha_prefill_tokens() const { return impl_->mha_tokens; }

int64_t GpuInferenceState::bytes() const {
  int64_t total = 0;
  for (const Tensor& t : impl_->kda_state) total += static_cast<int64_t>(t.nbytes());
  for (const auto& per : impl_->conv) {
    for (const Tensor& t : per) total += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  }
  for (const Tensor& t : impl_->pools) total += static_cast<int64_t>(t.nbytes());
  return total;
}

StatusOr<StepOutput> GpuInferenceState::Prefill(const std::vector<int64_t>& slots,
                                                const std::vector<std::vector<int32_t>>& tokens) {
  ORRERY_ASSIGN_OR_RETURN(DeviceStep d, impl_->Prefill(slots, tokens));
  StepOutput out;
  ORRERY_ASSIGN_OR_RETURN(out.logits, d.logits.To(Device::Cpu()));
  out.expert_ids = d.expert_ids;
  return out;
}

StatusOr<SampledStep> GpuInferenceState::PrefillAndSample(
    const std::vector<int64_t>& slots, const std::vector<std::vector<int32_t>>& tokens,
    const std::vector<TokenDraw>& draws) {
  if (draws.size() != slots.size()) {
    return InvalidArgumentError("gpu inference: " + std::to_string(slots.size()) + " slots but " +
                                std::to_string(draws.size()) + " draws");
  }
  ORRERY_ASSIGN_OR_RETURN(DeviceStep d, impl_->Prefill(slots, tokens));
  SampledStep out;
  out.expert_ids = d.expert_ids;
  ORRERY_RETURN_IF_ERROR(impl_->SampleOnDevice(d.logits, draws, &out));
  return out;
}

StatusOr<StepOutput> GpuInferenceState::DecodeStep(const std::vector<int64_t>& slots,
                                                   const std::vector<int32_t>& tokens) {
  if (impl_->options.decode != GpuInferenceOptions::Decode::kPass) {
    StepOutput out;
    ORRERY_RETURN_IF_ERROR(impl_->FixedDecode(slots, tokens, nullptr, &out, nullptr));
    return out;
  }
  std::vector<std::vector<int32_t>> feeds;
  feeds.reserve(tokens.size());
  for (int32_t t : tokens) feeds.push_back({t});
  ++impl_->stats.pass_steps;
  ORRERY_ASSIGN_OR_RETURN(DeviceStep d, impl_->Extend(slots, feeds));
  StepOutput out;
  ORRERY_ASSIGN_OR_RETURN(out.logits, d.logits.To(Device::Cpu()));
  out.expert_ids = d.expert_ids;
  return out;
}

StatusOr<SampledStep> GpuInferenceState::DecodeAndSample(const std::vector<int64_t>& slots,
                                                         const std::vector<int32_t>& tokens,
                                                         const std::vector<TokenDraw>& draws) {
  if (draws.size() != slots.size()) {
    return InvalidArgumentError("gpu inference: " + std::to_string(slots.size()) + " slots but " +
                                std::to_string(draws.size()) + " draws");
  }
  SampledStep out;
  if (impl_->options.decode != GpuInferenceOptions::Decode::kPass) {
    ORRERY_RETURN_IF_ERROR(impl_->FixedDecode(slots, tokens, &draws, nullptr, &out));
    return out;
  }
  std::vector<std::vector<int32_t>> feeds;
  feeds.reserve(tokens.size());
  for (int32_t t : tokens) feeds.push_back({t});
  ++impl_->stats.pass_steps;
  ORRERY_ASSIGN_OR_RETURN(DeviceStep d, impl_->Extend(slots, feeds));
  out.expert_ids = d.expert_ids;
  ORRERY_RETURN_IF_ERROR(impl_->SampleOnDevice(d.logits, draws, &out));
  return out;
}

const DecodeStats& GpuInferenceState::decode_stats() const { return impl_->stats; }

void GpuInferenceState::set_decode(GpuInferenceOptions::Decode mode) {
  impl_->options.decode = mode;
}

int64_t GpuInferenceState::DecodeBucket(int64_t n) const {
  return n < 1 ? 1 : n > impl_->buckets.back() ? impl_->buckets.back() : impl_->Bucket(n);
}

}  // namespace orrery::model
