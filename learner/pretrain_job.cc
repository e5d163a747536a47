#include "learner/pretrain_job.h"

#include <cstdio>

#include "core/device.h"
#include "core/file_io.h"
#include "learner/data_prepare.h"
#include "learner/gpu_trainable.h"
#include "learner/hybrid_trainable.h"
#include "model/chat_format.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace orrery {

StatusOr<PretrainSummary> RunPretrainJob(const PretrainJobOptions& options) {
  const PretrainConfig* config = &options.config;
  const int threads = ApplyRunConfig(config->run);
  const std::string& run_dir = options.run_dir;
  // Before anything else is read or written: a GPU run on a machine without one stops here.
  if (config->run.device == RunDevice::kCuda && CudaDeviceCount() == 0) {
    return FailedPreconditionError(
        "run.device = \"cuda\": no CUDA device is visible to this process" +
        std::string(CudaCompiledIn() ? "" : " (this build has no CUDA support)") +
        "; set device = \"cpu\" to pretrain on the CPU");
  }

  StatusOr<TokenDataset> data = TokenDataset::Open(config->data_dir);
  if (!data.ok()) return data.status().WithContext("pretrain.data");
  StatusOr<Tokenizer> tokenizer = Tokenizer::Load(config->data_dir + "/tokenizer.json");
  if (!tokenizer.ok()) return tokenizer.status();
  StatusOr<ChatFormat> format = ChatFormat::Create(&*tokenizer);
  if (!format.ok()) return format.status();
  StatusOr<std::string> model_text = ReadFileToString(config->model_path);
  if (!model_text.ok()) return model_text.status();
  StatusOr<std::string> tokenizer_text = ReadFileToString(config->data_dir + "/tokenizer.json");
  if (!tokenizer_text.ok()) return tokenizer_text.status();

  StatusOr<std::unique_ptr<model::Model>> model =
      model::Model::Create(config->model, config->run.seed);
  if (!model.ok()) return model.status();
  // [run] device = "cuda": the GPU model, made from the host model (the same initialisation).
  std::unique_ptr<model::GpuModel> gpu_model;
  std::unique_ptr<TrainableModel> trainable_ptr;
  if (config->run.device == RunDevice::kCuda) {
    model::GpuModelOptions go;
    go.compute_dtype = config->run.dtype;
    go.recompute_layers = config->recompute_layers;
    StatusOr<std::unique_ptr<model::GpuModel>> g = model::GpuModel::FromHost(**model, go);
    if (!g.ok()) return g.status().WithContext("run.device = \"cuda\"");
    gpu_model = std::move(g).value();
    trainable_ptr = std::make_unique<GpuTrainable>(gpu_model.get());
  } else {
    trainable_ptr = std::make_unique<HybridTrainable>(model->get());
  }
  TrainableModel& trainable = *trainable_ptr;

  PretrainerOptions o;
  o.config = *config;
  o.run_dir = run_dir;
  o.max_steps = options.max_steps;
  o.resume = options.resume;
  o.on_metric = options.on_metric;
  o.pad_id = format->pad_id();
  o.checkpoint_files = {{"model.toml", *model_text}, {"tokenizer.json", *tokenizer_text}};
  int64_t params = 0;
  for (const ParamRef& p : trainable.Parameters()) params += p.value.numel();
  std::printf(
      "pretrain: model %s (%lld parameters) on %s, data %s (%lld documents, %lld tokens), "
      "%zu stages, %lld steps, %d threads, run dir %s\n",
      config->model.name.c_str(), static_cast<long long>(params),
      gpu_model ? (config->run.dtype == DType::kF32 ? "cuda:0 (f32)" : "cuda:0 (bf16)") : "cpu",
      config->data_dir.c_str(), static_cast<long long>(data->num_documents()),
      static_cast<long long>(data->num_tokens()), config->stages.size(),
      static_cast<long long>(config->total_steps()), threads, run_dir.c_str());
  std::fflush(stdout);
  StatusOr<std::unique_ptr<Pretrainer>> trainer = Pretrainer::Create(o, &trainable, &*data);
  if (!trainer.ok()) return trainer.status();
  StatusOr<PretrainSummary> s = (*trainer)->Run();
  if (!s.ok()) return s.status();

  std::printf("\npretrain summary: %s after %lld steps, %lld tokens in %.0f s (%.0f tokens/s)\n",
              s->finished ? "finished" : "stopped", static_cast<long long>(s->steps),
              static_cast<long long>(s->tokens), s->seconds, s->tokens_per_second);
  std::printf("  %-12s %8s %6s %14s %14s %12s\n", "stage", "seq_len", "steps", "held-out start",
              "held-out end", "train loss");
  for (const StageSummary& st : s->stages) {
    auto fmt = [](double v) {
      char b[32];
      if (v < 0) return std::string("-");
      std::snprintf(b, sizeof(b), "%.4f", v);
      return std::string(b);
    };
    std::printf("  %-12s %8lld %6lld %14s %14s %12s\n", st.name.c_str(),
                static_cast<long long>(st.seq_len), static_cast<long long>(st.steps),
                fmt(st.first_eval_loss).c_str(), fmt(st.last_eval_loss).c_str(),
                fmt(st.last_train_loss).c_str());
  }
  std::printf("  checkpoint: %s\n  metrics: %s/metrics.jsonl\n", s->last_checkpoint.c_str(),
              run_dir.c_str());
  if (gpu_model) {
    const CachingAllocatorStats mem = GetCachingAllocatorStats(gpu_model->device().index);
    std::printf("  peak device memory: %.2f GiB in use (%lld device allocations)\n",
                static_cast<double>(mem.peak_bytes_in_use) / (1 << 30),
                static_cast<long long>(mem.device_allocs));
  }
  std::fflush(stdout);
  return s;
}

}  // namespace orrery
