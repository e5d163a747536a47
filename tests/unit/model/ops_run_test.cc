// RunOp (`orrery ops run`): every op in f64 through files, its input gradients against central
// finite differences of its own forward outputs; bad inputs are one clear error.
#include "model/ops_run.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/philox.h"
#include "core/safetensors.h"
#include "kernels/attention.h"
#include "kernels/mla_decode.h"

namespace orrery::model {
namespace {

using Tensors = std::map<std::string, Tensor>;

Tensor Random(Shape shape, PhiloxGenerator& gen, double scale = 1.0, double shift = 0.0) {
  Tensor t = Tensor::Empty(std::move(shape), DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = shift + scale * gen.Normal();
  return t;
}

StatusOr<Tensors> RunOpFile(const std::string& op, const Tensors& in, bool backward,
                            const std::map<std::string, std::string>& attrs) {
  // CTest runs the tests of this binary as parallel processes: a file name per process.
  const std::string prefix = ::testing::TempDir() + "/op_" + std::to_string(::getpid());
  std::vector<std::pair<std::string, Tensor>> list(in.begin(), in.end());
  OpRunOptions o;
  o.op = op;
  o.in_path = prefix + "_in.safetensors";
  o.out_path = prefix + "_out.safetensors";
  ORRERY_RETURN_IF_ERROR(WriteSafetensors(o.in_path, list));
  o.backward = backward;
  o.attrs = attrs;
  ORRERY_RETURN_IF_ERROR(RunOp(o));
  ORRERY_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(o.out_path));
  Tensors out;
  for (const std::string& name : f.names()) {
    ORRERY_ASSIGN_OR_RETURN(Tensor t, f.Get(name));
    out[name] = t.Clone();
  }
  return out;
}

// L = sum over `outputs` of <output, R_output>. Checks d L / d input of every float input that is
// not an upstream gradient, at a few entries each.
void CheckGradients(const std::string& op, Tensors in, const std::vector<std::string>& outputs,
                    const std::map<std::string, std::string>& attrs,
                    const std::vector<std::string>& no_grad = {}) {
  StatusOr<Tensors> fwd = RunOpFile(op, in, false, attrs);
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  PhiloxGenerator gen(77, 1);
  Tensors with_d = in;
  for (const std::string& o : outputs) {
    ASSERT_TRUE(fwd->count(o)) << op << " wrote no '" << o << "'";
    with_d["d" + o] = Random(fwd->at(o).shape(), gen);
  }
  StatusOr<Tensors> bwd = RunOpFile(op, with_d, true, attrs);
  ASSERT_TRUE(bwd.ok()) << bwd.status().ToString();
  auto loss = [&](const Tensors& x) {
    StatusOr<Tensors> r = RunOpFile(op, x, false, attrs);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    double l = 0;
    for (const std::string& o : outputs) {
      const Tensor& t = r->at(o);
      for (int64_t i = 0; i < t.numel(); ++i) {
        l += t.data<double>()[i] * with_d.at("d" + o).data<double>()[i];
      }
    }
    return l;
  };
  double worst = 0;
  for (auto& [name, t] : in) {
    if (t.dtype() != DType::kF64 ||
        std::find(no_grad.begin(), no_grad.end(), name) != no_grad.end()) {
      continue;
    }
    ASSERT_TRUE(bwd->count("d" + name)) << op << " wrote no gradient of '" << name << "'";
    const Tensor& g = bwd->at("d" + name);
    ASSERT_EQ(g.shape(), t.shape()) << name;
    for (int64_t s = 0; s < std::min<int64_t>(t.numel(), 3); ++s) {
      const int64_t i = (s * 7919 + 3) % t.numel();
      double* w = t.data<double>() + i;
      const double old = *w, h = 1e-6;
      *w = old + h;
      const double lp = loss(in);
      *w = old - h;
      const double lm = loss(in);
      *w = old;
      const double fd = (lp - lm) / (2 * h);
      const double err = std::abs(fd - g.data<double>()[i]) / std::max(1.0, std::abs(fd));
      worst = std::max(worst, err);
      EXPECT_LT(err, 1e-6) << op << " d" << name << "[" << i << "]: fd " << fd << ", op "
                           << g.data<double>()[i];
    }
  }
  std::printf("ops run %s: max relative gradient error %.3g\n", op.c_str(), worst);
}

TEST(OpsRunTest, KdaGradientsMatchFiniteDifferences) {
  PhiloxGenerator gen(1, 1);
  const int64_t b = 1, t = 21, h = 2, k = 4, v = 3;
  Tensors in;
  in["q"] = Random({b, t, h, k}, gen, 0.5);
  in["k"] = Random({b, t, h, k}, gen, 0.5);
  in["v"] = Random({b, t, h, v}, gen);
  in["g"] = Random({b, t, h, k}, gen, 0.2, -0.5);
  in["beta"] = Random({b, t, h}, gen, 0.1, 0.5);
  in["initial_state"] = Random({b, h, k, v}, gen, 0.3);
  // The op normalises q and k itself here, so any raw q, k are valid.
  CheckGradients("kda", in, {"o", "final_state"}, {{"chunk_size", "16"}, {"use_qk_l2norm", "1"}});
  CheckGradients("kda_recurrent", in, {"o", "final_state"}, {{"use_qk_l2norm", "1"}});
  // Every transform of the op: beta as a logit, g as the gate's pre-activation with A_log and
  // dt_bias (whose gradients the op writes too), both gate forms.
  Tensors raw = in;
  raw["beta"] = Random({b, t, h}, gen);
  raw["g"] = Random({b, t, h, k}, gen);
  raw["A_log"] = Random({h}, gen, 0.3, -0.2);
  raw["dt_bias"] = Random({h * k}, gen, 0.5);
  for (const char* gate : {"bounded", "original"}) {
    CheckGradients("kda", raw, {"o", "final_state"},
                   {{"chunk_size", "16"},
                    {"use_qk_l2norm", "1"},
                    {"use_beta_sigmoid", "1"},
                    {"use_gate", "1"},
                    {"gate", gate},
                    {"lower_bound", "-4"}});
  }
}

TEST(OpsRunTest, MlaAttnResGluRmsNormGradientsMatchFiniteDifferences) {
  PhiloxGenerator gen(2, 1);
  Tensors mla{{"q", Random({1, 9, 2, 5}, gen)},
              {"k", Random({1, 9, 2, 5}, gen)},
              {"v", Random({1, 9, 2, 3}, gen)},
              {"cu_seqlens", Tensor::FromVector<int64_t>({3}, {0, 4, 9})}};
  CheckGradients("mla", mla, {"o"}, {});
  Tensors ar{{"sources", Random({3, 4, 6}, gen)},
             {"w", Random({6}, gen)},
             {"gamma", Random({6}, gen, 0.2, 1.0)}};
  CheckGradients("attn_res", ar, {"h"}, {{"eps", "1e-6"}});
  Tensors glu{{"a", Random({4, 5}, gen, 3.0)}, {"u", Random({4, 5}, gen, 10.0)}};
  CheckGradients("situ_glu", glu, {"h"}, {});
  CheckGradients("situ_glu", glu, {"h"}, {{"activation", "silu"}});
  Tensors rn{{"x", Random({3, 7}, gen)}, {"w", Random({7}, gen, 0.2, 1.0)}};
  CheckGradients("rmsnorm", rn, {"y"}, {});
}

TEST(OpsRunTest, MoeGradientsMatchFiniteDifferences) {
  PhiloxGenerator gen(3, 1);
  const int64_t n = 6, d = 5, e = 4, f = 3, l = 4, fs = 3;
  Tensors in{{"x", Random({n, d}, gen)},
             {"router", Random({e, d}, gen)},
             {"down", Random({l, d}, gen, 0.5)},
             {"up", Random({d, l}, gen, 0.5)},
             {"experts.w1", Random({e, f, l}, gen, 0.5)},
             {"experts.w3", Random({e, f, l}, gen, 0.5)},
             {"experts.w2", Random({e, l, f}, gen, 0.5)},
             {"latent_norm", Random({l}, gen, 0.2, 1.0)},
             {"shared.w1", Random({fs, d}, gen, 0.5)},
             {"shared.w3", Random({fs, d}, gen, 0.5)},
             {"shared.w2", Random({d, fs}, gen, 0.5)}};
  CheckGradients("moe", in, {"y"}, {{"top_k", "2"}, {"routed_scale", "1.5"}});
  // Forced routing replays the given ids.
  StatusOr<Tensors> free = RunOpFile("moe", in, false, {{"top_k", "2"}});
  ASSERT_TRUE(free.ok()) << free.status().ToString();
  Tensor ids = Tensor::FromVector<int32_t>({n, 2}, {3, 1, 0, 2, 1, 0, 2, 3, 0, 1, 3, 2});
  in["expert_ids"] = ids;
  StatusOr<Tensors> forced = RunOpFile("moe", in, false, {{"top_k", "2"}});
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    EXPECT_EQ(forced->at("expert_ids").data<int32_t>()[i], ids.data<int32_t>()[i]);
  }
}

TEST(OpsRunTest, TensorLevelOpsGradientsMatchFiniteDifferences) {
  PhiloxGenerator gen(6, 1);
  Tensors conv{{"x", Random({9, 4}, gen)},
               {"w", Random({4, 3}, gen, 0.5)},
               {"cu_seqlens", Tensor::FromVector<int64_t>({3}, {0, 4, 9})}};
  CheckGradients("short_conv", conv, {"y"}, {});
  // kv [N, H, Dn + Dv] with Dn 3, Dv 2; kr [N, Dr] shared by the heads.
  Tensors keys{{"kv", Random({5, 2, 5}, gen)}, {"kr", Random({5, 2}, gen)}};
  CheckGradients("mla_keys", keys, {"k", "v"}, {{"nope_dim", "3"}});
  Tensors gate{{"x", Random({4, 5}, gen)}, {"z", Random({4, 5}, gen, 2.0)}};
  CheckGradients("sigmoid_gate", gate, {"y"}, {});
  // Repeated ids accumulate into one row of dtable.
  Tensors emb{{"table", Random({5, 3}, gen)},
              {"ids", Tensor::FromVector<int32_t>({6}, {4, 0, 2, 4, 1, 4})}};
  CheckGradients("embedding", emb, {"y"}, {});
  StatusOr<Tensors> r = RunOpFile("embedding", emb, false, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(r->at("y").data<double>()[1 * 3 + j], emb.at("table").data<double>()[0 * 3 + j]);
  }
  // Chunks of 2 rows over 5; the zero mask weight drops row 3 whatever its target.
  Tensors head{{"x", Random({5, 4}, gen)},
               {"w", Random({7, 4}, gen)},
               {"targets", Tensor::FromVector<int32_t>({5}, {6, 0, 3, 3, 1})},
               {"mask", Tensor::FromVector<double>({5}, {1, 0.5, 1, 0, 2})}};
  CheckGradients("lm_head_loss", head, {"loss_sum"}, {{"chunk_rows", "2"}}, {"mask"});
  r = RunOpFile("lm_head_loss", head, false, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  double want = 0;
  for (int64_t n = 0; n < 5; ++n) {
    std::vector<double> z(7);
    for (int64_t v = 0; v < 7; ++v) {
      for (int64_t j = 0; j < 4; ++j) {
        z[v] += head.at("x").data<double>()[n * 4 + j] * head.at("w").data<double>()[v * 4 + j];
      }
    }
    double sum = 0;
    for (double zv : z) sum += std::exp(zv);
    want += head.at("mask").data<double>()[n] *
            (std::log(sum) - z[head.at("targets").data<int32_t>()[n]]);
  }
  EXPECT_NEAR(r->at("loss_sum").data<double>()[0], want, 1e-12);
}

TEST(OpsRunTest, BadInputIsOneClearError) {
  PhiloxGenerator gen(4, 1);
  Tensors in{{"x", Random({3, 7}, gen)}, {"w", Random({6}, gen)}};
  StatusOr<Tensors> r = RunOpFile("rmsnorm", in, false, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor 'w' has shape [6], expected [7]"), std::string::npos)
      << r.status().message();
  in["w"] = Random({7}, gen);
  in["wx"] = Random({7}, gen);
  r = RunOpFile("rmsnorm", in, false, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unexpected tensor 'wx'"), std::string::npos);
  in.erase("wx");
  r = RunOpFile("rmsnorm", in, false, {{"epsilon", "1"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no attribute 'epsilon'"), std::string::npos);
  r = RunOpFile("rmsnorm", in, true, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor 'dy'"), std::string::npos);
  r = RunOpFile("softmax", in, false, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown op"), std::string::npos);
  Tensors gated{{"q", Random({1, 4, 1, 2}, gen)}, {"k", Random({1, 4, 1, 2}, gen)},
                {"v", Random({1, 4, 1, 2}, gen)}, {"g", Random({1, 4, 1, 2}, gen)},
                {"beta", Random({1, 4, 1}, gen)}, {"A_log", Random({1}, gen)}};
  r = RunOpFile("kda", gated, false, {});  // A_log belongs to use_gate=1
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unexpected tensor 'A_log'"), std::string::npos)
      << r.status().message();
  r = RunOpFile("kda", gated, false, {{"use_gate", "1"}, {"gate", "softplus"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gate=softplus: expected bounded or original"),
            std::string::npos)
      << r.status().message();
  Tensors kda{{"q", Random({1, 4, 1, 3}, gen)}};
  r = RunOpFile("kda", kda, false, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor 'k' [B, T, H, K] is missing"), std::string::npos)
      << r.status().message();
  Tensors moe{{"x", Random({2, 3}, gen)},
              {"router", Random({4, 3}, gen)},
              {"experts.w1", Random({4, 2, 3}, gen)},
              {"experts.w3", Random({4, 2, 3}, gen)},
              {"experts.w2", Random({4, 3, 2}, gen)}};
  r = RunOpFile("moe", moe, false, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("top_k"), std::string::npos);
  // The ops on the Tensor-level kernels: their own checks and the kernels' come back as one line.
  struct Bad {
    const char* op;
    std::string error;
    Tensors in;
  };
  const Bad bad[] = {
      {"short_conv",
       "tensor 'w' has shape [3, 2], expected [4, 2]",
       {{"x", Random({5, 4}, gen)}, {"w", Random({3, 2}, gen)}}},
      {"short_conv", "W <= 16", {{"x", Random({5, 4}, gen)}, {"w", Random({4, 17}, gen)}}},
      {"short_conv",
       "cu_seqlens must run from 0 to T = 5",
       {{"x", Random({5, 4}, gen)},
        {"w", Random({4, 2}, gen)},
        {"cu_seqlens", Tensor::FromVector<int64_t>({2}, {0, 4})}}},
      {"embedding",
       "ids[1] = 5",
       {{"table", Random({5, 3}, gen)}, {"ids", Tensor::FromVector<int32_t>({2}, {0, 5})}}},
      {"embedding", "tensor 'ids' [N] is missing", {{"table", Random({5, 3}, gen)}}},
      {"lm_head_loss",
       "tensor 'targets' has shape [2], expected [3]",
       {{"x", Random({3, 4}, gen)},
        {"w", Random({7, 4}, gen)},
        {"targets", Tensor::FromVector<int32_t>({2}, {0, 1})}}},
      {"lm_head_loss",
       "targets[1] = 7",
       {{"x", Random({3, 4}, gen)},
        {"w", Random({7, 4}, gen)},
        {"targets", Tensor::FromVector<int32_t>({3}, {0, 7, 1})}}},
      {"mla_keys",
       "--attr nope_dim: expected an integer in [1, Dn + Dv = 5), got 0",
       {{"kv", Random({3, 2, 5}, gen)}, {"kr", Random({3, 2}, gen)}}},
      {"sigmoid_gate",
       "tensor 'z' has shape [4], expected [3]",
       {{"x", Random({3}, gen)}, {"z", Random({4}, gen)}}},
      {"attn_res",
       "tensor 'w' has shape [5], expected [6]",
       {{"sources", Random({3, 4, 6}, gen)}, {"w", Random({5}, gen)}}},
      {"mla",
       "tensor 'v' has shape [1, 4, 2, 3], expected [1, 4, 1, 3]",
       {{"q", Random({1, 4, 1, 2}, gen)},
        {"k", Random({1, 4, 1, 2}, gen)},
        {"v", Random({1, 4, 2, 3}, gen)}}},
  };
  for (const Bad& c : bad) {
    r = RunOpFile(c.op, c.in, false, {});
    ASSERT_FALSE(r.ok()) << c.op;
    EXPECT_NE(r.status().message().find(c.error), std::string::npos)
        << c.op << ": " << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status().message();
  }
  const Tensors head{{"x", Random({3, 4}, gen)},
                     {"w", Random({7, 4}, gen)},
                     {"targets", Tensor::FromVector<int32_t>({3}, {0, 6, 1})}};
  r = RunOpFile("lm_head_loss", head, false, {{"chunk_rows", "0"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("chunk_rows=0.000000: expected a positive integer"),
            std::string::npos)
      << r.status().message();
}

TEST(OpsRunTest, MatmulMatchesNaiveLoops) {
  PhiloxGenerator gen(5, 1);
  const Tensors in{
      {"a", Random({3, 4}, gen)}, {"b", Random({5, 4}, gen)}, {"c", Random({3, 5}, gen)}};
  StatusOr<Tensors> r =
      RunOpFile("matmul", in, false, {{"trans_b", "1"}, {"alpha", "2"}, {"beta", "0.5"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Tensor& c = r->at("c");
  ASSERT_EQ(c.shape(), (Shape{3, 5}));
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 5; ++j) {
      double s = 0;
      for (int64_t l = 0; l < 4; ++l) {
        s += in.at("a").data<double>()[i * 4 + l] * in.at("b").data<double>()[j * 4 + l];
      }
      EXPECT_NEAR(c.data<double>()[i * 5 + j], 2 * s + 0.5 * in.at("c").data<double>()[i * 5 + j],
                  1e-12);
    }
  }
  r = RunOpFile("matmul", {{"a", in.at("a")}, {"b", in.at("b")}}, false, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("matmul: inner dimensions differ"), std::string::npos)
      << r.status().message();
  r = RunOpFile("matmul", {{"a", in.at("a")}, {"b", in.at("b")}}, false, {{"trans_b", "2"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trans_b=2.000000: expected 0 or 1"), std::string::npos)
      << r.status().message();
}

// grouped_gemm through files: y, dx and dw against per-expert loops (an empty expert, rows past
// the last expert left zero), and offsets checked before either device runs.
TEST(OpsRunTest, GroupedGemmMatchesPerExpertLoops) {
  PhiloxGenerator gen(6, 1);
  const int64_t m = 9, k = 4, e = 3, n = 5;
  const Tensor off = Tensor::FromVector<int64_t>({e + 1}, {0, 4, 4, 8});  // expert 1 empty
  const Tensors in{{"x", Random({m, k}, gen)},
                   {"w", Random({e, n, k}, gen)},
                   {"dy", Random({m, n}, gen)},
                   {"offsets", off}};
  StatusOr<Tensors> r = RunOpFile("grouped_gemm", in, true, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const double* x = in.at("x").data<double>();
  const double* w = in.at("w").data<double>();
  const double* dy = in.at("dy").data<double>();
  const Tensor &y = r->at("y"), &dx = r->at("dx"), &dw = r->at("dw");
  ASSERT_EQ(y.shape(), (Shape{m, n}));
  ASSERT_EQ(dx.shape(), (Shape{m, k}));
  ASSERT_EQ(dw.shape(), (Shape{e, n, k}));
  std::vector<double> want_dw(static_cast<size_t>(e * n * k), 0.0);
  for (int64_t row = 0; row < m; ++row) {
    int64_t ex = -1;
    for (int64_t i = 0; i < e; ++i) {
      if (row >= off.data<int64_t>()[i] && row < off.data<int64_t>()[i + 1]) ex = i;
    }
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k && ex >= 0; ++l) s += x[row * k + l] * w[(ex * n + j) * k + l];
      EXPECT_NEAR(y.data<double>()[row * n + j], s, 1e-12) << "row " << row;
      for (int64_t l = 0; l < k && ex >= 0; ++l) {
        want_dw[static_cast<size_t>((ex * n + j) * k + l)] += dy[row * n + j] * x[row * k + l];
      }
    }
    for (int64_t l = 0; l < k; ++l) {
      double s = 0;
      for (int64_t j = 0; j < n && ex >= 0; ++j) s += dy[row * n + j] * w[(ex * n + j) * k + l];
      EXPECT_NEAR(dx.data<double>()[row * k + l], s, 1e-12) << "row " << row;
    }
  }
  for (size_t i = 0; i < want_dw.size(); ++i) EXPECT_NEAR(dw.data<double>()[i], want_dw[i], 1e-12);
  Tensors bad = in;
  bad["offsets"] = Tensor::FromVector<int64_t>({e + 1}, {0, 5, 4, 8});
  r = RunOpFile("grouped_gemm", bad, false, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(
      r.status().message().find("offsets[2] = 4: expected non-decreasing values in [0, M = 9]"),
      std::string::npos)
      << r.status().message();
}

TEST(OpsRunTest, CudaWithoutAGpuIsOneClearError) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is visible: tests/gpu covers --device cuda";
  for (const std::string& op : OpNames()) {
    OpRunOptions o;
    o.op = op;
    o.in_path = "/nonexistent/in.safetensors";
    o.out_path = "/nonexistent/out.safetensors";
    o.device = "cuda";
    const Status st = RunOp(o);
    ASSERT_FALSE(st.ok()) << op;
    EXPECT_EQ(st.message(), CudaCompiledIn()
                                ? "--device cuda: no CUDA device is visible on this machine"
                                : "--device cuda: this build has no CUDA support")
        << op;
  }
}

// mla_decode through files equals the op on the same values (K3's defaults replaced by attributes),
// and the index values are checked before either device runs.
TEST(OpsRunTest, MlaDecodeMatchesTheOpAndChecksIndices) {
  PhiloxGenerator gen(9, 1);
  const Tensor table = Tensor::FromVector<int32_t>({2, 3}, {2, 0, 3, 1, 3, 3});
  Tensors in{{"q", Random({2, 2, 3, 10}, gen)},
             {"pages", Random({4, 4, 10}, gen)},
             {"block_table", table},
             {"context_lens", Tensor::FromVector<int32_t>({2}, {9, 3})}};
  const std::map<std::string, std::string> attrs{{"dv", "6"}, {"scale", "0.4"}};
  StatusOr<Tensors> r = RunOpFile("mla_decode", in, false, attrs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const kernels::PagedLatentCache cache{in.at("pages"), table, in.at("context_lens")};
  Tensor o, lse;
  ASSERT_TRUE(kernels::MlaDecodePaged(in.at("q"), cache, 6, 0.4f, &o, &lse).ok());
  ASSERT_EQ(r->at("o").shape(), (Shape{2, 2, 3, 6}));
  for (int64_t i = 0; i < o.numel(); ++i) {
    EXPECT_EQ(r->at("o").data<double>()[i], o.data<double>()[i]) << i;
  }
  ASSERT_EQ(r->at("lse").shape(), (Shape{2, 2, 3}));
  for (int64_t i = 0; i < lse.numel(); ++i) {
    EXPECT_EQ(r->at("lse").data<float>()[i], lse.data<float>()[i]) << i;
  }

  const auto expect_error = [&](const Tensors& bad, bool backward, const std::string& want) {
    StatusOr<Tensors> e = RunOpFile("mla_decode", bad, backward, attrs);
    ASSERT_FALSE(e.ok()) << want;
    EXPECT_NE(e.status().message().find(want), std::string::npos) << e.status().message();
    EXPECT_EQ(e.status().message().find('\n'), std::string::npos) << e.status().message();
  };
  Tensors bad = in;
  bad["context_lens"] = Tensor::FromVector<int32_t>({2}, {9, 13});
  expect_error(bad, false, "context_lens[1] = 13, expected in [2 (Q), 12");
  bad = in;
  bad["block_table"] = Tensor::FromVector<int32_t>({2, 3}, {2, 7, 3, 1, 3, 3});
  expect_error(bad, false, "block_table[0, 1] = 7, expected a page id in [0, 4)");
  expect_error(in, true, "op mla_decode has no --backward");
  StatusOr<Tensors> e = RunOpFile("mla_decode", in, false, {{"dv", "11"}});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--attr dv: expected an integer in [1, D = 10]"),
            std::string::npos)
      << e.status().message();
}

// mla_prefill through files equals the op on the same values, one sequence without offsets is
// the whole batch, and the offsets are checked before either device runs.
TEST(OpsRunTest, MlaPrefillMatchesTheOpAndChecksOffsets) {
  PhiloxGenerator gen(10, 1);
  const Tensor cu_q = Tensor::FromVector<int64_t>({3}, {0, 1, 6});
  const Tensor cu_k = Tensor::FromVector<int64_t>({3}, {0, 9, 16});
  Tensors in{{"q", Random({6, 2, 5}, gen)},
             {"k", Random({16, 2, 5}, gen)},
             {"v", Random({16, 2, 3}, gen)},
             {"cu_seqlens_q", cu_q},
             {"cu_seqlens_k", Tensor::FromVector<int32_t>({3}, {0, 9, 16})}};
  StatusOr<Tensors> r = RunOpFile("mla_prefill", in, false, {{"scale", "0.7"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Tensor o, lse;
  ASSERT_TRUE(
      kernels::PrefixCausalAttention(in.at("q"), in.at("k"), in.at("v"), cu_q, cu_k, 0.7, &o, &lse)
          .ok());
  ASSERT_EQ(r->at("o").shape(), (Shape{6, 2, 3}));
  ASSERT_EQ(r->at("lse").shape(), (Shape{6, 2}));
  for (int64_t i = 0; i < o.numel(); ++i) {
    EXPECT_EQ(r->at("o").data<double>()[i], o.data<double>()[i]) << i;
  }
  for (int64_t i = 0; i < lse.numel(); ++i) {
    EXPECT_EQ(r->at("lse").data<double>()[i], lse.data<double>()[i]) << i;
  }
  // Without offsets: one sequence, the 6 queries the last of its 16 keys (default scale 5^-1/2).
  Tensors one{{"q", in.at("q")}, {"k", in.at("k")}, {"v", in.at("v")}};
  r = RunOpFile("mla_prefill", one, false, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(kernels::PrefixCausalAttention(
                  in.at("q"), in.at("k"), in.at("v"), Tensor::FromVector<int64_t>({2}, {0, 6}),
                  Tensor::FromVector<int64_t>({2}, {0, 16}), 1.0 / std::sqrt(5.0), &o, &lse)
                  .ok());
  for (int64_t i = 0; i < o.numel(); ++i) {
    EXPECT_EQ(r->at("o").data<double>()[i], o.data<double>()[i]) << i;
  }

  const auto expect_error = [&](const Tensors& bad, bool backward, const std::string& want) {
    StatusOr<Tensors> e = RunOpFile("mla_prefill", bad, backward, {});
    ASSERT_FALSE(e.ok()) << want;
    EXPECT_NE(e.status().message().find(want), std::string::npos) << e.status().message();
    EXPECT_EQ(e.status().message().find('\n'), std::string::npos) << e.status().message();
  };
  Tensors bad = in;
  bad["cu_seqlens_k"] = Tensor::FromVector<int64_t>({3}, {0, 12, 16});
  expect_error(bad, false, "document 1 has 5 queries but 4 keys");
  bad = in;
  bad.erase("cu_seqlens_k");
  expect_error(bad, false, "give both cu_seqlens_q and cu_seqlens_k, or neither");
  bad = in;
  bad["v"] = Random({15, 2, 3}, gen);
  expect_error(bad, false, "tensor 'v' has shape [15, 2, 3], expected [16, 2, 3]");
  expect_error(in, true, "op mla_prefill has no --backward");
}

}  // namespace
}  // namespace orrery::model
