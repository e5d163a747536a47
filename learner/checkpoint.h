// Training checkpoints: everything needed to continue a run exactly.
//
// RUN/checkpoints/step-00000120/
//   model.safetensors      parameters and buffers (balancing biases) by name
//   optimizer.safetensors  AdamW moments ("adamw.m/<name>", "adamw.v/<name>")
//   trainer.json           step, stage, tokens, data cursor, seed, optimizer step, and an FNV-1a
//                          hash and size of each .safetensors file
//   model.toml, tokenizer.json   copies, so `orrery generate` needs only this directory
// A checkpoint is written into a temporary sibling directory and renamed into place, so a crash
// leaves either the whole checkpoint or none; the oldest ones beyond `keep` are then deleted.
// Reading verifies sizes and hashes: a truncated or altered file is refused with its name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "learner/packer.h"

namespace orrery {

struct TrainerState {
  int64_t step = 0;         // optimizer steps done
  int64_t stage = 0;        // index into the config's stages
  int64_t stage_steps = 0;  // steps done in that stage
  int64_t tokens = 0;       // input positions consumed over the run
  PackerCursor cursor;      // training data position
  uint64_t seed = 0;        // the run's seed (shuffle order is a function of it and the epoch)
  int64_t optimizer_step = 0;
};

struct CheckpointContents {
  TrainerState state;
  std::vector<std::pair<std::string, Tensor>> model;      // parameters and buffers
  std::vector<std::pair<std::string, Tensor>> optimizer;  // optimizer state
  std::map<std::string, std::string> files;               // extra files: name -> contents
};

// Writes RUN/checkpoints/step-NNNNNNNN atomically, then keeps the newest `keep`. Returns its path.
StatusOr<std::string> WriteCheckpoint(const std::string& checkpoints_dir,
                                      const CheckpointContents& contents, int64_t keep);

// The newest complete checkpoint under checkpoints_dir; NotFound when there is none.
StatusOr<std::string> LatestCheckpoint(const std::string& checkpoints_dir);

struct LoadedCheckpoint {
  TrainerState state;
  std::map<std::string, Tensor> model;
  std::map<std::string, Tensor> optimizer;
  std::string path;
};

// Reads and verifies a checkpoint directory (or a run directory / checkpoints directory, taking
// its newest checkpoint).
StatusOr<LoadedCheckpoint> ReadCheckpoint(const std::string& path);

// Resolves a run directory, checkpoints directory or checkpoint directory to a checkpoint dir.
StatusOr<std::string> ResolveCheckpointDir(const std::string& path);

}  // namespace orrery
