#include "learner/pretrainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/logging.h"
#include "core/progress.h"

namespace orrery {
namespace {

std::string FormatRate(double tokens_per_s) {
  char buf[32];
  if (tokens_per_s >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2fM", tokens_per_s / 1e6);
  else if (tokens_per_s >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.1fk", tokens_per_s / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", tokens_per_s);
  return buf;
}

}  // namespace

StatusOr<StepResult> TrainStep(TrainableModel& model, AdamW& optimizer,
                               const std::vector<PackedBatch>& micro_batches, double lr,
                               double clip_grad_norm) {
  StepResult r;
  for (const PackedBatch& b : micro_batches) r.targets += b.num_targets;
  ORRERY_RETURN_IF_ERROR(optimizer.ZeroGrad());
  double loss_sum = 0;
  const double scale = r.targets > 0 ? 1.0 / static_cast<double>(r.targets) : 0.0;
  for (const PackedBatch& b : micro_batches) {
    ORRERY_ASSIGN_OR_RETURN(LossSum l, model.ForwardBackward(b, scale));
    loss_sum += l.loss_sum;
  }
  if (!std::isfinite(loss_sum)) {
    return InternalError("loss is not finite (" + std::to_string(loss_sum) +
                         "): lower the learning rate or check the data");
  }
  r.loss = r.targets > 0 ? loss_sum / static_cast<double>(r.targets) : 0.0;
  ORRERY_ASSIGN_OR_RETURN(r.balance, model.UpdateBalancing());
  ORRERY_ASSIGN_OR_RETURN(r.grad_norm, optimizer.ClipGradNorm(clip_grad_norm));
  r.lr = lr;
  ORRERY_RETURN_IF_ERROR(optimizer.Step(lr));
  return r;
}

Pretrainer::Pretrainer(PretrainerOptions options, TrainableModel* model, const TokenDataset* data,
                       AdamW optimizer)
    : options_(std::move(options)),
      model_(model),
      data_(data),
      optimizer_(std::move(optimizer)),
      train_packer_(data, data->DocumentsInSplit(false), options_.config.run.seed, true,
                    options_.pad_id),
      heldout_docs_(data->DocumentsInSplit(true)) {
  state_.seed = options_.config.run.seed;
}

StatusOr<std::unique_ptr<Pretrainer>> Pretrainer::Create(PretrainerOptions options,
                                                         TrainableModel* model,
                                                         const TokenDataset* data) {
  const PretrainConfig& c = options.config;
  if (data->DocumentsInSplit(false).empty()) {
    return InvalidArgumentError(data->dir() + ": no training documents");
  }
  if (c.eval_tokens > 0 && data->DocumentsInSplit(true).empty()) {
    return InvalidArgumentError(data->dir() +
                                ": no held-out documents (prepare the data with "
                                "--heldout-fraction > 0, or set pretrain.eval_tokens = 0)");
  }
  if (data->vocab_size() > c.model.vocab_size) {
    return InvalidArgumentError(
        data->dir() + ": the data's vocabulary (" + std::to_string(data->vocab_size()) +
        ") is larger than the model's vocab_size (" + std::to_string(c.model.vocab_size) + ")");
  }
  for (const StageConfig& s : c.stages) {
    if (model->max_seq_len() > 0 && s.seq_len > model->max_seq_len()) {
      return InvalidArgumentError("stage '" + s.name + "': seq_len " + std::to_string(s.seq_len) +
                                  " is longer than the model allows (" +
                                  std::to_string(model->max_seq_len()) + ")");
    }
  }
  ORRERY_ASSIGN_OR_RETURN(AdamW optimizer, AdamW::Create(c.adamw, model->Parameters()));
  std::unique_ptr<Pretrainer> p(
      new Pretrainer(std::move(options), model, data, std::move(optimizer)));
  std::error_code ec;
  std::filesystem::create_directories(p->options_.run_dir, ec);
  if (ec) return IoError("create run directory " + p->options_.run_dir + ": " + ec.message());
  if (p->options_.resume) {
    ORRERY_RETURN_IF_ERROR(p->Restore());
  } else if (std::filesystem::exists(p->options_.run_dir + "/checkpoints", ec) &&
             LatestCheckpoint(p->options_.run_dir + "/checkpoints").ok()) {
    return FailedPreconditionError(p->options_.run_dir +
                                   " already holds checkpoints: pass --resume to continue it, or "
                                   "choose another --out");
  }
  ORRERY_ASSIGN_OR_RETURN(p->metrics_,
                          MetricsFileWriter::Open(p->options_.run_dir + "/metrics.jsonl"));
  return p;
}

Status Pretrainer::Restore() {
  ORRERY_ASSIGN_OR_RETURN(LoadedCheckpoint ck, ReadCheckpoint(options_.run_dir + "/checkpoints"));
  if (ck.state.seed != options_.config.run.seed) {
    return FailedPreconditionError("checkpoint " + ck.path + " was made with seed " +
                                   std::to_string(ck.state.seed) + ", the config says " +
                                   std::to_string(options_.config.run.seed));
  }
  if (ck.state.stage > static_cast<int64_t>(options_.config.stages.size())) {
    return FailedPreconditionError("checkpoint " + ck.path + " is at stage " +
                                   std::to_string(ck.state.stage) + " but the config has only " +
                                   std::to_string(options_.config.stages.size()));
  }
  auto load = [&](const std::string& name, const Tensor& dst) -> Status {
    auto it = ck.model.find(name);
    if (it == ck.model.end())
      return DataLossError("checkpoint " + ck.path + " lacks tensor " + name);
    if (it->second.shape() != dst.shape() || it->second.dtype() != dst.dtype()) {
      return DataLossError("checkpoint " + ck.path + ": tensor " + name + " is " +
                           it->second.ToString() + ", the model expects " + dst.ToString());
    }
    Tensor d = dst;
    return d.CopyFrom(it->second);
  };
  for (const ParamRef& p : optimizer_.params()) ORRERY_RETURN_IF_ERROR(load(p.name, p.value));
  for (const auto& [name, t] : model_->Buffers()) ORRERY_RETURN_IF_ERROR(load(name, t));
  ORRERY_RETURN_IF_ERROR(model_->ParametersLoaded());
  Status s = optimizer_.LoadState(ck.optimizer, ck.state.optimizer_step);
  if (!s.ok()) return s.WithContext("checkpoint " + ck.path);
  state_ = ck.state;
  train_packer_.set_cursor(state_.cursor);
  ORRERY_LOG(INFO) << "resumed from " << ck.path << " at step " << state_.step << ", stage "
                   << state_.stage + 1;
  return Status::OK();
}

StatusOr<std::string> Pretrainer::SaveCheckpoint() {
  CheckpointContents c;
  state_.cursor = train_packer_.cursor();
  state_.optimizer_step = optimizer_.step();
  c.state = state_;
  for (const ParamRef& p : optimizer_.params()) c.model.emplace_back(p.name, p.value);
  for (const auto& b : model_->Buffers()) c.model.push_back(b);
  c.optimizer = optimizer_.StateTensors();
  c.files = options_.checkpoint_files;
  return WriteCheckpoint(options_.run_dir + "/checkpoints", c, options_.config.keep_checkpoints);
}

StatusOr<double> Pretrainer::Evaluate(int64_t seq_len) {
  const PretrainConfig& c = options_.config;
  DocumentPacker packer(data_, heldout_docs_, 0, /*shuffle=*/false, options_.pad_id);
  const int64_t micro_rows = std::max<int64_t>(1, c.micro_batch_tokens / seq_len);
  int64_t rows = std::max<int64_t>(1, c.eval_tokens / seq_len);
  LossSum total;
  while (rows > 0) {
    const int64_t n = std::min(rows, micro_rows);
    ORRERY_ASSIGN_OR_RETURN(LossSum l, model_->Evaluate(packer.Next(n, seq_len)));
    total.loss_sum += l.loss_sum;
    total.tokens += l.tokens;
    rows -= n;
  }
  return total.tokens > 0 ? total.loss_sum / static_cast<double>(total.tokens) : 0.0;
}

Status Pretrainer::Record(const MetricRecord& m) {
  ORRERY_RETURN_IF_ERROR(metrics_->Write(m));
  if (options_.on_metric) options_.on_metric(m);
  return Status::OK();
}

StatusOr<PretrainSummary> Pretrainer::Run() {
  const PretrainConfig& c = options_.config;
  PretrainSummary summary;
  const int64_t total_steps = c.total_steps();
  const int64_t start_step = state_.step;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&]() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Counts steps of this invocation (so the rate and ETA stay right after --resume).
  std::unique_ptr<Progress> progress;
  if (options_.show_progress) {
    progress = std::make_unique<Progress>(
        start_step > 0 ? "pretrain (resumed at " + std::to_string(start_step) + ")" : "pretrain",
        total_steps - start_step, "steps", stdout, 10.0);
  }
  int64_t last_saved_step = -1;
  int64_t tokens_this_run = 0;
  bool stopped = false;
  const std::string source = "learner:0";

  for (; state_.stage < static_cast<int64_t>(c.stages.size()); ++state_.stage) {
    if (options_.max_steps >= 0 && state_.step >= options_.max_steps) {
      // Stopped at a stage boundary: the next stage starts (and is evaluated and logged) when
      // the run resumes, not twice.
      stopped = true;
      break;
    }
    const StageConfig& stage = c.stages[state_.stage];
    const int64_t stage_steps = stage.steps(c.tokens_per_step);
    const int64_t rows_per_step = c.tokens_per_step / stage.seq_len;
    const int64_t micro_rows = std::max<int64_t>(1, c.micro_batch_tokens / stage.seq_len);
    StageSummary ss{stage.name, stage.seq_len, 0, -1, -1, -1};
    if (state_.stage_steps == 0) {
      ORRERY_LOG(INFO) << "stage " << state_.stage + 1 << "/" << c.stages.size() << " '"
                       << stage.name << "': seq_len " << stage.seq_len << ", " << stage_steps
                       << " steps of " << rows_per_step << " rows (" << rows_per_step / micro_rows
                       << " micro-batches of " << micro_rows << "), lr scale " << stage.lr_scale;
      if (c.eval_tokens > 0) {
        ORRERY_ASSIGN_OR_RETURN(ss.first_eval_loss, Evaluate(stage.seq_len));
        ORRERY_LOG(INFO) << "stage '" << stage.name << "' start: held-out loss "
                         << ss.first_eval_loss;
        MetricRecord m{UnixSeconds(), source, state_.step, {}, {}};
        m.scalars["stage"] = static_cast<double>(state_.stage);
        m.scalars["seq_len"] = static_cast<double>(stage.seq_len);
        m.scalars["eval_loss"] = ss.first_eval_loss;
        m.scalars["stage_start"] = 1;
        ORRERY_RETURN_IF_ERROR(Record(m));
      }
    }
    while (state_.stage_steps < stage_steps) {
      if (options_.max_steps >= 0 && state_.step >= options_.max_steps) {
        stopped = true;
        break;
      }
      const auto step_t0 = std::chrono::steady_clock::now();
      std::vector<PackedBatch> micro;
      for (int64_t r = 0; r < rows_per_step; r += micro_rows) {
        micro.push_back(train_packer_.Next(std::min(micro_rows, rows_per_step - r), stage.seq_len));
      }
      const double lr = LearningRate(c.schedule, state_.step) * stage.lr_scale;
      ORRERY_ASSIGN_OR_RETURN(StepResult r,
                              TrainStep(*model_, optimizer_, micro, lr, c.clip_grad_norm));
      ++state_.step;
      ++state_.stage_steps;
      state_.tokens += c.tokens_per_step;
      tokens_this_run += c.tokens_per_step;
      ss.steps = state_.stage_steps;
      ss.last_train_loss = r.loss;
      const double step_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0).count();
      const double tps = static_cast<double>(c.tokens_per_step) / std::max(step_s, 1e-9);

      MetricRecord m{UnixSeconds(), source, state_.step, {}, {}};
      m.scalars["stage"] = static_cast<double>(state_.stage);
      m.scalars["seq_len"] = static_cast<double>(stage.seq_len);
      m.scalars["loss"] = r.loss;
      m.scalars["lr"] = r.lr;
      m.scalars["grad_norm"] = r.grad_norm;
      m.scalars["tokens_per_second"] = tps;
      m.scalars["tokens"] = static_cast<double>(state_.tokens);
      for (size_t l = 0; l < r.balance.size(); ++l) {
        m.vectors["expert_load/layer" + std::to_string(l)] = r.balance[l].load;
        m.scalars["max_violation/layer" + std::to_string(l)] = r.balance[l].max_violation;
      }
      const bool stage_end = state_.stage_steps == stage_steps;
      if (c.eval_tokens > 0 &&
          ((c.eval_every > 0 && state_.step % c.eval_every == 0) || stage_end)) {
        ORRERY_ASSIGN_OR_RETURN(double eval, Evaluate(stage.seq_len));
        m.scalars["eval_loss"] = eval;
        ss.last_eval_loss = eval;
      }
      ORRERY_RETURN_IF_ERROR(Record(m));
      const double run_tps = static_cast<double>(tokens_this_run) / std::max(elapsed(), 1e-9);
      char extra[160];
      std::snprintf(extra, sizeof(extra), "stage %s (%lld) | loss %.4f | lr %.2e | %s tok/s",
                    stage.name.c_str(), static_cast<long long>(stage.seq_len), r.loss, r.lr,
                    FormatRate(run_tps).c_str());
      if (progress) progress->Update(state_.step - start_step, extra);
      if (c.checkpoint_every > 0 && state_.step % c.checkpoint_every == 0) {
        ORRERY_ASSIGN_OR_RETURN(summary.last_checkpoint, SaveCheckpoint());
        last_saved_step = state_.step;
      }
    }
    if (stopped) {
      summary.stages.push_back(ss);
      break;
    }
    ORRERY_LOG(INFO) << "stage " << state_.stage + 1 << " '" << stage.name << "' done after step "
                     << state_.step << ": train loss " << ss.last_train_loss << ", held-out loss "
                     << ss.last_eval_loss;
    summary.stages.push_back(ss);
    state_.stage_steps = 0;
  }
  summary.finished = !stopped;
  summary.steps = state_.step;
  summary.tokens = state_.tokens;
  summary.seconds = elapsed();
  summary.tokens_per_second =
      static_cast<double>(tokens_this_run) / std::max(summary.seconds, 1e-9);
  if (last_saved_step != state_.step) {
    ORRERY_ASSIGN_OR_RETURN(summary.last_checkpoint, SaveCheckpoint());
  }
  if (progress) progress->Finish(summary.finished ? "done" : "stopped at --max-steps");
  return summary;
}

}  // namespace orrery
