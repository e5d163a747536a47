#include "learner/pretrain_config.h"

#include <algorithm>

namespace orrery {

int64_t PretrainConfig::total_steps() const {
  int64_t n = 0;
  for (const StageConfig& s : stages) n += s.steps(tokens_per_step);
  return n;
}

PretrainConfig ReadPretrainConfig(ConfigTable& root) {
  PretrainConfig c;
  c.run = ReadRunConfig(root);
  ConfigTable p = root.Table("pretrain");
  if (!p.present()) {
    root.Fail("pretrain", "missing [pretrain] table");
    return c;
  }
  c.model_path = p.RequiredPath("model");
  c.data_dir = p.RequiredPath("data");
  c.tokens_per_step = p.Int("tokens_per_step", c.tokens_per_step, 1, int64_t{1} << 40);
  c.micro_batch_tokens = p.Int("micro_batch_tokens", c.micro_batch_tokens, 1, int64_t{1} << 32);
  c.eval_every = p.Int("eval_every", c.eval_every, 0, int64_t{1} << 40);
  c.eval_tokens = p.Int("eval_tokens", c.eval_tokens, 0, int64_t{1} << 40);
  c.checkpoint_every = p.Int("checkpoint_every", c.checkpoint_every, 0, int64_t{1} << 40);
  c.keep_checkpoints = p.Int("keep_checkpoints", c.keep_checkpoints, 1, 1000);
  c.recompute_layers = p.Bool("recompute_layers", false);
  if (c.recompute_layers && c.run.device != RunDevice::kCuda) {
    p.Fail("recompute_layers", "applies to the GPU model only: set [run] device = \"cuda\"");
  }
  if (c.micro_batch_tokens > c.tokens_per_step) {
    p.Fail("micro_batch_tokens",
           "must not exceed pretrain.tokens_per_step (" + std::to_string(c.tokens_per_step) + ")");
  }

  ConfigTable o = root.Table("optimizer");
  c.schedule.peak_lr = o.Float("lr", 3e-3, 0, 10);
  c.adamw.beta1 = o.Float("beta1", c.adamw.beta1, 0, 0.999999);
  c.adamw.beta2 = o.Float("beta2", c.adamw.beta2, 0, 0.999999);
  c.adamw.eps = o.Float("eps", c.adamw.eps, 1e-30, 1);
  c.adamw.weight_decay = o.Float("weight_decay", c.adamw.weight_decay, 0, 10);
  c.clip_grad_norm = o.Float("clip_grad_norm", c.clip_grad_norm, 0, 1e9);
  const std::string kind = o.Enum("schedule", "wsd", {"constant", "cosine", "wsd"});
  c.schedule.kind =
      ParseLrScheduleKind(kind).ok() ? *ParseLrScheduleKind(kind) : LrScheduleKind::kWsd;
  c.schedule.warmup_steps = o.Int("warmup_steps", 0, 0, int64_t{1} << 40);
  c.schedule.min_ratio = o.Float("min_lr_ratio", c.schedule.min_ratio, 0, 1);
  c.schedule.decay_fraction = o.Float("decay_fraction", c.schedule.decay_fraction, 0, 1);

  std::vector<ConfigTable> stages = root.TableArray("stages");
  if (stages.empty()) root.Fail("stages", "at least one [[stages]] entry is required");
  for (size_t i = 0; i < stages.size(); ++i) {
    ConfigTable& s = stages[i];
    StageConfig st;
    st.name = s.String("name", "stage" + std::to_string(i + 1));
    st.seq_len = s.RequiredInt("seq_len", 1, int64_t{1} << 32);
    st.tokens = s.RequiredInt("tokens", 1, int64_t{1} << 50);
    st.lr_scale = s.Float("lr_scale", 1.0, 0, 100);
    if (st.seq_len > 0 && c.micro_batch_tokens % st.seq_len != 0) {
      s.Fail("seq_len", std::to_string(st.seq_len) +
                            " does not divide pretrain.micro_batch_tokens (" +
                            std::to_string(c.micro_batch_tokens) + "): rows must be whole");
    } else if (st.seq_len > 0 && c.tokens_per_step % st.seq_len != 0) {
      s.Fail("seq_len", std::to_string(st.seq_len) + " does not divide pretrain.tokens_per_step (" +
                            std::to_string(c.tokens_per_step) + ")");
    } else if (st.tokens > 0 && st.tokens < c.tokens_per_step) {
      s.Fail("tokens", std::to_string(st.tokens) +
                           " is less than one step (pretrain.tokens_per_step = " +
                           std::to_string(c.tokens_per_step) + ")");
    }
    c.stages.push_back(st);
  }
  if (!c.stages.empty()) {
    c.schedule.total_steps = std::max<int64_t>(1, c.total_steps());
    if (c.schedule.warmup_steps >= c.schedule.total_steps) {
      o.Fail("warmup_steps", "must be less than the run's total steps (" +
                                 std::to_string(c.schedule.total_steps) + ")");
    }
  }

  if (!c.model_path.empty()) {
    StatusOr<model::ModelConfig> m = model::LoadModelConfig(c.model_path);
    if (!m.ok()) {
      p.Fail("model", m.status().message());
    } else {
      c.model = *m;
      for (size_t i = 0; i < stages.size() && i < c.stages.size(); ++i) {
        const StageConfig& st = c.stages[i];
        if (st.seq_len > c.model.max_seq_len) {
          stages[i].Fail("seq_len", "stage '" + st.name + "': seq_len " +
                                        std::to_string(st.seq_len) + " exceeds the model's " +
                                        "max_seq_len " + std::to_string(c.model.max_seq_len) +
                                        " (" + c.model_path + ")");
        }
      }
    }
  }
  return c;
}

StatusOr<PretrainConfig> LoadPretrainConfig(const std::string& path) {
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseFile(path));
  ConfigTable root = doc.root();
  PretrainConfig c = ReadPretrainConfig(root);
  ORRERY_RETURN_IF_ERROR(doc.Finish());
  return c;
}

}  // namespace orrery
