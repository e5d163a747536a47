// A policy restored from a checkpoint directory: the model, its tokenizer and chat format. What
// `orrery generate`, the RL evaluation and the rollout and learner actors start from.
//
// `path` may be a checkpoint directory (RUN/checkpoints/step-N), a checkpoints directory or a run
// directory (their newest checkpoint is taken). Sizes and hashes are verified (a truncated or
// altered file is refused with its name); model.toml and tokenizer.json are the copies the
// checkpoint carries, so nothing else is needed.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "model/chat_format.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace orrery {

struct PolicyCheckpoint {
  std::string path;  // the checkpoint directory actually read
  std::unique_ptr<model::Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatFormat> format;  // points into *tokenizer
};

StatusOr<PolicyCheckpoint> LoadPolicyCheckpoint(const std::string& path);

}  // namespace orrery
