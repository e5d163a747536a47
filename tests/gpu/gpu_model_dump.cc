// Writes what an independent implementation needs to check the GPU model (model/gpu/gpu_model.h)
// on the same weights: the host model's initial weights, one packed batch with forced routing,
// and the GPU model's loss and every parameter gradient, in f32 (the debug mode) and bf16.
// scripts/gpu_model_torch.py `check` reads them (issue 22: "the PyTorch reference agrees with
// Orrery's GPU model on the same weights").
//
//   gpu_model_dump CONFIG OUT_DIR [TOKENS] [cuda|cpu]
//
// OUT_DIR/model.safetensors   Model::Save of the f32 host model (seed 1): the names of the
//                             checkpoints, "layers.L.moe.balancing_bias" included.
// OUT_DIR/batch.safetensors   tokens i32 [n], targets i32 [n] (-1: no target), cu_seqlens i64
//                             [docs + 1], forced_experts i32 [moe_layers, n, top_k].
// OUT_DIR/grads_f32.safetensors, grads_bf16.safetensors (cuda only)
//                             loss_sum f64 [1], tokens i64 [1] and d loss_sum / d theta (f32)
//                             under each parameter's name.
// The batch is four documents (0.49, 1 token, 0.34 and the rest of TOKENS, default 2048) of
// uniform random tokens whose targets are the next token of the same document; each MoE layer
// routes every token to top_k distinct uniformly drawn experts (so no near-tie can route a token
// differently on the two sides). With `cpu` the GPU model runs on its ops' CPU twins (f32 only):
// the tool itself is testable without a GPU.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "model/gpu/gpu_model.h"
#include "model/model.h"

using namespace orrery;

namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "gpu_model_dump: %s\n", s.ToString().c_str());
  return 1;
}

model::GpuBatch MakeBatch(const model::ModelConfig& c, int64_t n) {
  model::GpuBatch b;
  const int64_t a = n * 49 / 100, m = n * 34 / 100;
  b.cu_seqlens = {0, a, a + 1, a + 1 + m, n};
  PhiloxGenerator gen(7, 0);
  for (int64_t i = 0; i < n; ++i) {
    b.tokens.push_back(static_cast<int32_t>(gen.UniformInt(static_cast<uint64_t>(c.vocab_size))));
  }
  b.targets.assign(static_cast<size_t>(n), -1);
  for (size_t d = 0; d + 1 < b.cu_seqlens.size(); ++d) {
    for (int64_t t = b.cu_seqlens[d]; t + 1 < b.cu_seqlens[d + 1]; ++t) {
      b.targets[static_cast<size_t>(t)] = b.tokens[static_cast<size_t>(t + 1)];
    }
  }
  const int64_t layers = c.num_moe_layers(), k = c.moe.top_k, e = c.moe.num_experts;
  b.forced_experts = Tensor::Zeros({layers, n, k}, DType::kI32);
  int32_t* ids = b.forced_experts.data<int32_t>();
  for (int64_t r = 0; r < layers * n; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      int32_t id;
      bool repeated;
      do {
        id = static_cast<int32_t>(gen.UniformInt(static_cast<uint64_t>(e)));
        repeated = false;
        for (int64_t jj = 0; jj < j; ++jj) repeated |= ids[r * k + jj] == id;
      } while (repeated);
      ids[r * k + j] = id;
    }
  }
  return b;
}

Status DumpGradients(model::Model& host, const model::GpuBatch& batch, Device device, DType dtype,
                     const std::string& path) {
  model::GpuModelOptions o;
  o.compute_dtype = dtype;
  o.device = device;
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<model::GpuModel> gpu, model::GpuModel::FromHost(host, o));
  ORRERY_RETURN_IF_ERROR(gpu->ZeroGrad());
  ORRERY_ASSIGN_OR_RETURN(model::GpuLoss loss, gpu->ForwardBackward(batch, 1.0, true));
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back("loss_sum", Tensor::FromVector<double>({1}, {loss.loss_sum}));
  out.emplace_back("tokens", Tensor::FromVector<int64_t>({1}, {loss.tokens}));
  for (model::GpuParameter& p : gpu->parameters()) {
    ORRERY_ASSIGN_OR_RETURN(Tensor g, p.grad.To(Device::Cpu()));
    out.emplace_back(p.name, std::move(g));
  }
  std::printf("gpu_model_dump: %s loss_sum %.9g over %lld targets -> %s\n",
              std::string(DTypeName(dtype)).c_str(), loss.loss_sum,
              static_cast<long long>(loss.tokens), path.c_str());
  return WriteSafetensors(path, out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: gpu_model_dump CONFIG OUT_DIR [TOKENS] [cuda|cpu]\n");
    return 2;
  }
  const std::string dir = argv[2];
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : 2048;
  const std::string where = argc > 4 ? argv[4] : "cuda";
  if (n < 8) {
    std::fprintf(stderr, "gpu_model_dump: TOKENS %s: expected an integer >= 8\n", argv[3]);
    return 2;
  }
  if (where != "cuda" && where != "cpu") {
    std::fprintf(stderr, "gpu_model_dump: %s: expected cuda or cpu\n", where.c_str());
    return 2;
  }
  const bool cuda = where == "cuda";
  if (cuda && CudaDeviceCount() == 0) {
    std::fprintf(stderr, "gpu_model_dump: no CUDA device (pass cpu for the ops' CPU twins)\n");
    return 1;
  }
  auto config = model::LoadModelConfig(argv[1]);
  if (!config.ok()) return Fail(config.status());
  auto host = model::Model::Create(*config, 1, DType::kF32);
  if (!host.ok()) return Fail(host.status());
  if (Status s = (*host)->Save(dir + "/model.safetensors"); !s.ok()) return Fail(s);
  const model::GpuBatch batch = MakeBatch(*config, n);
  std::vector<int32_t> tokens = batch.tokens, targets = batch.targets;
  const std::vector<std::pair<std::string, Tensor>> batch_file = {
      {"tokens", Tensor::FromVector<int32_t>({n}, tokens)},
      {"targets", Tensor::FromVector<int32_t>({n}, targets)},
      {"cu_seqlens", Tensor::FromVector<int64_t>({static_cast<int64_t>(batch.cu_seqlens.size())},
                                                 batch.cu_seqlens)},
      {"forced_experts", batch.forced_experts}};
  if (Status s = WriteSafetensors(dir + "/batch.safetensors", batch_file); !s.ok()) return Fail(s);
  const Device device = cuda ? Device::Cuda(0) : Device::Cpu();
  if (Status s = DumpGradients(**host, batch, device, DType::kF32, dir + "/grads_f32.safetensors");
      !s.ok()) {
    return Fail(s);
  }
  if (cuda) {
    if (Status s =
            DumpGradients(**host, batch, device, DType::kBF16, dir + "/grads_bf16.safetensors");
        !s.ok()) {
      return Fail(s);
    }
  }
  return 0;
}
