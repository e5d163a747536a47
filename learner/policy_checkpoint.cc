#include "learner/policy_checkpoint.h"

#include "learner/checkpoint.h"

namespace orrery {

StatusOr<PolicyCheckpoint> LoadPolicyCheckpoint(const std::string& path) {
  ORRERY_ASSIGN_OR_RETURN(LoadedCheckpoint ck, ReadCheckpoint(path));  // verifies hashes
  PolicyCheckpoint p;
  p.path = ck.path;
  ORRERY_ASSIGN_OR_RETURN(model::ModelConfig config,
                          model::LoadModelConfig(ck.path + "/model.toml"));
  ORRERY_ASSIGN_OR_RETURN(p.model, model::Model::Create(config, 0));
  Status s = p.model->Load(ck.path + "/model.safetensors");
  if (!s.ok()) return s.WithContext("checkpoint " + ck.path);
  ORRERY_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(ck.path + "/tokenizer.json"));
  p.tokenizer = std::make_unique<Tokenizer>(std::move(tok));
  ORRERY_ASSIGN_OR_RETURN(ChatFormat f, ChatFormat::Create(p.tokenizer.get()));
  p.format = std::make_unique<ChatFormat>(f);
  return p;
}

}  // namespace orrery
