#include "kernels/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/thread_pool.h"
#include "kernels/gemm.h"

namespace orrery::kernels {
namespace {

struct Task {
  int64_t begin, len, head;
};

std::vector<Task> Tasks(const AttentionShape& s, const std::vector<int64_t>& cu) {
  std::vector<Task> tasks;
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    for (int64_t h = 0; h < s.heads; ++h) tasks.push_back({cu[d], cu[d + 1] - cu[d], h});
  }
  return tasks;
}

}  // namespace

template <typename T>
void CausalAttentionForward(const AttentionShape& s, const std::vector<int64_t>& cu_seqlens,
                            double scale, const T* q, const T* k, const T* v, T* o, T* lse) {
  const std::vector<Task> tasks = Tasks(s, cu_seqlens);
  const int64_t qs = s.heads * s.qk_dim, vs = s.heads * s.v_dim;
  ThreadPool::Default().ParallelFor(static_cast<int64_t>(tasks.size()), 1,
                                    [&](int64_t tb, int64_t te) {
                                      std::vector<T> scores;
                                      for (int64_t ti = tb; ti < te; ++ti) {
                                        const Task& t = tasks[static_cast<size_t>(ti)];
                                        const int64_t n = t.len;
                                        if (n == 0) continue;
                                        scores.assign(static_cast<size_t>(n * n), T(0));
                                        const T* qh = q + t.begin * qs + t.head * s.qk_dim;
                                        const T* kh = k + t.begin * qs + t.head * s.qk_dim;
                                        const T* vh = v + t.begin * vs + t.head * s.v_dim;
                                        Gemm(false, true, n, n, s.qk_dim, static_cast<T>(scale), qh,
                                             qs, kh, qs, T(0), scores.data(), n);
                                        for (int64_t i = 0; i < n; ++i) {
                                          T* row = scores.data() + i * n;
                                          T m = -std::numeric_limits<T>::infinity();
                                          for (int64_t j = 0; j <= i; ++j) m = std::max(m, row[j]);
                                          T sum = 0;
                                          for (int64_t j = 0; j <= i; ++j) {
                                            row[j] = std::exp(row[j] - m);
                                            sum += row[j];
                                          }
                                          const T inv = T(1) / sum;
                                          for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
                                          for (int64_t j = i + 1; j < n; ++j) row[j] = 0;
                                          lse[(t.begin + i) * s.heads + t.head] = m + std::log(sum);
                                        }
                                        Gemm(false, false, n, s.v_dim, n, T(1), scores.data(), n,
                                             vh, vs, T(0), o + t.begin * vs + t.head * s.v_dim, vs);
                                      }
                                    });
}

template <typename T>
void CausalAttentionBackward(const AttentionShape& s, const std::vector<int64_t>& cu_seqlens,
                             double scale, const T* q, const T* k, const T* v, const T* o,
                             const T* lse, const T* d_o, T* dq, T* dk, T* dv) {
  const std::vector<Task> tasks = Tasks(s, cu_seqlens);
  const int64_t qs = s.heads * s.qk_dim, vs = s.heads * s.v_dim;
  ThreadPool::Default().ParallelFor(
      static_cast<int64_t>(tasks.size()), 1, [&](int64_t tb, int64_t te) {
        std::vector<T> p, dp;
        for (int64_t ti = tb; ti < te; ++ti) {
          const Task& t = tasks[static_cast<size_t>(ti)];
          const int64_t n = t.len;
          const int64_t qo = t.begin * qs + t.head * s.qk_dim;
          const int64_t vo = t.begin * vs + t.head * s.v_dim;
          if (n == 0) continue;
          p.assign(static_cast<size_t>(n * n), T(0));
          dp.assign(static_cast<size_t>(n * n), T(0));
          Gemm(false, true, n, n, s.qk_dim, static_cast<T>(scale), q + qo, qs, k + qo, qs, T(0),
               p.data(), n);
          Gemm(false, true, n, n, s.v_dim, T(1), d_o + vo, vs, v + vo, vs, T(0), dp.data(), n);
          for (int64_t i = 0; i < n; ++i) {
            const T l = lse[(t.begin + i) * s.heads + t.head];
            const T* dor = d_o + vo + i * vs;
            const T* orow = o + vo + i * vs;
            T di = 0;
            for (int64_t c = 0; c < s.v_dim; ++c) di += dor[c] * orow[c];
            T* pr = p.data() + i * n;
            T* dpr = dp.data() + i * n;
            for (int64_t j = 0; j <= i; ++j) {
              pr[j] = std::exp(pr[j] - l);
              dpr[j] = pr[j] * (dpr[j] - di);  // dS
            }
            for (int64_t j = i + 1; j < n; ++j) pr[j] = dpr[j] = 0;
          }
          // dV = P^T dO; dQ = scale dS K; dK = scale dS^T Q.
          Gemm(true, false, n, s.v_dim, n, T(1), p.data(), n, d_o + vo, vs, T(0), dv + vo, vs);
          Gemm(false, false, n, s.qk_dim, n, static_cast<T>(scale), dp.data(), n, k + qo, qs, T(0),
               dq + qo, qs);
          Gemm(true, false, n, s.qk_dim, n, static_cast<T>(scale), dp.data(), n, q + qo, qs, T(0),
               dk + qo, qs);
        }
      });
}

template <typename T>
void PrefixCausalAttentionForward(const PrefixAttentionShape& s, const std::vector<int64_t>& cu_q,
                                  const std::vector<int64_t>& cu_k, double scale, const T* q,
                                  const T* k, const T* v, T* o, T* lse) {
  constexpr int64_t kBlock = 64;
  struct Block {
    int64_t doc, head, begin, end;  // queries begin .. end - 1 of the document
  };
  std::vector<Block> blocks;
  for (size_t d = 0; d + 1 < cu_q.size(); ++d) {
    const int64_t n = cu_q[d + 1] - cu_q[d];
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t b = 0; b < n; b += kBlock) {
        blocks.push_back({static_cast<int64_t>(d), h, b, std::min(n, b + kBlock)});
      }
    }
  }
  const int64_t qs = s.heads * s.qk_dim, vs = s.heads * s.v_dim;
  ThreadPool::Default().ParallelFor(
      static_cast<int64_t>(blocks.size()), 1, [&](int64_t bb, int64_t be) {
        std::vector<T> scores;
        for (int64_t bi = bb; bi < be; ++bi) {
          const Block& b = blocks[static_cast<size_t>(bi)];
          const size_t d = static_cast<size_t>(b.doc);
          const int64_t n = cu_q[d + 1] - cu_q[d], len = cu_k[d + 1] - cu_k[d];
          const int64_t rows = b.end - b.begin;
          // Query i sees keys 0 .. len - n + i; the block's last query the most.
          const int64_t keys = len - n + b.end;
          const int64_t q0 = cu_q[d] + b.begin;
          scores.assign(static_cast<size_t>(rows * keys), T(0));
          const T* qh = q + q0 * qs + b.head * s.qk_dim;
          const T* kh = k + cu_k[d] * qs + b.head * s.qk_dim;
          const T* vh = v + cu_k[d] * vs + b.head * s.v_dim;
          Gemm(false, true, rows, keys, s.qk_dim, static_cast<T>(scale), qh, qs, kh, qs, T(0),
               scores.data(), keys);
          for (int64_t r = 0; r < rows; ++r) {
            T* row = scores.data() + r * keys;
            const int64_t visible = len - n + b.begin + r + 1;
            T m = -std::numeric_limits<T>::infinity();
            for (int64_t j = 0; j < visible; ++j) m = std::max(m, row[j]);
            T sum = 0;
            for (int64_t j = 0; j < visible; ++j) {
              row[j] = std::exp(row[j] - m);
              sum += row[j];
            }
            const T inv = T(1) / sum;
            for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
            for (int64_t j = visible; j < keys; ++j) row[j] = 0;
            lse[(q0 + r) * s.heads + b.head] = m + std::log(sum);
          }
          Gemm(false, false, rows, s.v_dim, keys, T(1), scores.data(), keys, vh, vs, T(0),
               o + q0 * vs + b.head * s.v_dim, vs);
        }
      });
}

#define ORRERY_INSTANTIATE(T)                                                                  \
  template void CausalAttentionForward<T>(const AttentionShape&, const std::vector<int64_t>&,  \
                                          double, const T*, const T*, const T*, T*, T*);       \
  template void CausalAttentionBackward<T>(const AttentionShape&, const std::vector<int64_t>&, \
                                           double, const T*, const T*, const T*, const T*,     \
                                           const T*, const T*, T*, T*, T*);                    \
  template void PrefixCausalAttentionForward<T>(                                               \
      const PrefixAttentionShape&, const std::vector<int64_t>&, const std::vector<int64_t>&,   \
      double, const T*, const T*, const T*, T*, T*);
ORRERY_INSTANTIATE(float)
ORRERY_INSTANTIATE(double)
#undef ORRERY_INSTANTIATE

}  // namespace orrery::kernels
