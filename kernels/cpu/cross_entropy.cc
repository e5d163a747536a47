#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace orrery::kernels {
namespace {

Status Check(const Tensor& logits, const Tensor& targets) {
  if (!logits.defined() || logits.ndim() != 2 ||
      (logits.dtype() != DType::kF32 && logits.dtype() != DType::kF64) ||
      logits.device().is_cuda()) {
    return InvalidArgumentError("logits: expected a CPU f32/f64 tensor [N, V], got " +
                                (logits.defined() ? logits.ToString() : std::string("none")));
  }
  if (!targets.defined() || targets.dtype() != DType::kI32 || targets.numel() != logits.dim(0)) {
    return InvalidArgumentError("targets: expected i32 [" + std::to_string(logits.dim(0)) +
                                "], got " +
                                (targets.defined() ? targets.ToString() : std::string("none")));
  }
  return Status::OK();
}

// log-sum-exp of one row and the softmax into p.
template <typename T>
double RowSoftmax(const T* z, int64_t v, std::vector<double>* p) {
  double m = -INFINITY;
  for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(z[j]));
  double sum = 0;
  p->resize(static_cast<size_t>(v));
  for (int64_t j = 0; j < v; ++j) sum += ((*p)[j] = std::exp(static_cast<double>(z[j]) - m));
  for (int64_t j = 0; j < v; ++j) (*p)[j] /= sum;
  return m + std::log(sum);
}

Status CheckTarget(int32_t t, int64_t v, int64_t row) {
  if (t < 0 || t >= v) {
    return InvalidArgumentError("targets[" + std::to_string(row) + "] = " + std::to_string(t) +
                                " is outside the vocabulary [0, " + std::to_string(v) + ")");
  }
  return Status::OK();
}

template <typename T>
StatusOr<double> CrossEntropyImpl(const Tensor& logits, const Tensor& targets, const Tensor& mask,
                                  Tensor* dlogits) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  const T* z = logits.data<T>();
  const int32_t* t = targets.data<int32_t>();
  const float* m = mask.defined() ? mask.data<float>() : nullptr;
  double wsum = 0;
  for (int64_t i = 0; i < n; ++i) wsum += m ? m[i] : 1.0;
  if (dlogits) *dlogits = Tensor::Zeros(logits.shape(), logits.dtype());
  if (wsum == 0) return 0.0;
  double loss = 0;
  std::vector<double> p;
  for (int64_t i = 0; i < n; ++i) {
    const double wi = m ? m[i] : 1.0;
    if (wi == 0) continue;
    ORRERY_RETURN_IF_ERROR(CheckTarget(t[i], v, i));
    const double lse = RowSoftmax(z + i * v, v, &p);
    loss += wi * (lse - static_cast<double>(z[i * v + t[i]]));
    if (dlogits) {
      T* g = dlogits->data<T>() + i * v;
      const double c = wi / wsum;
      for (int64_t j = 0; j < v; ++j) g[j] = static_cast<T>(c * p[j]);
      g[t[i]] -= static_cast<T>(c);
    }
  }
  return loss / wsum;
}

template <typename T>
Status LogprobsImpl(const Tensor& logits, const Tensor& targets, Tensor* logprobs,
                    Tensor* entropy) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  const T* z = logits.data<T>();
  const int32_t* t = targets.data<int32_t>();
  *logprobs = Tensor::Empty({n}, logits.dtype());
  if (entropy) *entropy = Tensor::Empty({n}, logits.dtype());
  std::vector<double> p;
  for (int64_t i = 0; i < n; ++i) {
    ORRERY_RETURN_IF_ERROR(CheckTarget(t[i], v, i));
    const double lse = RowSoftmax(z + i * v, v, &p);
    logprobs->data<T>()[i] = static_cast<T>(static_cast<double>(z[i * v + t[i]]) - lse);
    if (entropy) {
      double h = 0;
      for (int64_t j = 0; j < v; ++j) {
        if (p[j] > 0) h -= p[j] * (static_cast<double>(z[i * v + j]) - lse);
      }
      entropy->data<T>()[i] = static_cast<T>(h);
    }
  }
  return Status::OK();
}

template <typename T>
Status LogprobsBackwardImpl(const Tensor& logits, const Tensor& targets, const Tensor& dlogprobs,
                            const Tensor& dentropy, Tensor* dlogits) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  for (const Tensor* g : {&dlogprobs, &dentropy}) {
    if (g->defined() && (g->dtype() != logits.dtype() || g->numel() != n)) {
      return InvalidArgumentError("upstream gradient: expected " +
                                  std::string(DTypeName(logits.dtype())) + " [" +
                                  std::to_string(n) + "], got " + g->ToString());
    }
  }
  const T* z = logits.data<T>();
  const int32_t* t = targets.data<int32_t>();
  *dlogits = Tensor::Zeros(logits.shape(), logits.dtype());
  std::vector<double> p;
  for (int64_t i = 0; i < n; ++i) {
    ORRERY_RETURN_IF_ERROR(CheckTarget(t[i], v, i));
    const double lse = RowSoftmax(z + i * v, v, &p);
    T* g = dlogits->data<T>() + i * v;
    if (dlogprobs.defined()) {
      const double d = dlogprobs.data<T>()[i];
      for (int64_t j = 0; j < v; ++j) g[j] += static_cast<T>(-d * p[j]);
      g[t[i]] += static_cast<T>(d);
    }
    if (dentropy.defined()) {
      // H = -sum p log p; dH/dz_j = -p_j (log p_j + H).
      const double d = dentropy.data<T>()[i];
      double h = 0;
      for (int64_t j = 0; j < v; ++j) h -= p[j] * (static_cast<double>(z[i * v + j]) - lse);
      for (int64_t j = 0; j < v; ++j) {
        g[j] += static_cast<T>(-d * p[j] * ((static_cast<double>(z[i * v + j]) - lse) + h));
      }
    }
  }
  return Status::OK();
}

}  // namespace

StatusOr<double> MaskedCrossEntropy(const Tensor& logits, const Tensor& targets, const Tensor& mask,
                                    Tensor* dlogits) {
  ORRERY_RETURN_IF_ERROR(Check(logits, targets));
  if (mask.defined() && (mask.dtype() != DType::kF32 || mask.numel() != logits.dim(0))) {
    return InvalidArgumentError("mask: expected f32 [" + std::to_string(logits.dim(0)) + "], got " +
                                mask.ToString());
  }
  if (logits.dtype() == DType::kF32) return CrossEntropyImpl<float>(logits, targets, mask, dlogits);
  return CrossEntropyImpl<double>(logits, targets, mask, dlogits);
}

Status TokenLogprobs(const Tensor& logits, const Tensor& targets, Tensor* logprobs,
                     Tensor* entropy) {
  ORRERY_RETURN_IF_ERROR(Check(logits, targets));
  if (logits.dtype() == DType::kF32) return LogprobsImpl<float>(logits, targets, logprobs, entropy);
  return LogprobsImpl<double>(logits, targets, logprobs, entropy);
}

Status TokenLogprobsBackward(const Tensor& logits, const Tensor& targets, const Tensor& dlogprobs,
                             const Tensor& dentropy, Tensor* dlogits) {
  ORRERY_RETURN_IF_ERROR(Check(logits, targets));
  if (logits.dtype() == DType::kF32) {
    return LogprobsBackwardImpl<float>(logits, targets, dlogprobs, dentropy, dlogits);
  }
  return LogprobsBackwardImpl<double>(logits, targets, dlogprobs, dentropy, dlogits);
}

}  // namespace orrery::kernels
