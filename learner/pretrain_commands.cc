#include "learner/pretrain_commands.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/file_io.h"
#include "core/logging.h"
#include "learner/checkpoint.h"
#include "learner/data_prepare.h"
#include "learner/hybrid_trainable.h"
#include "learner/policy_checkpoint.h"
#include "learner/pretrain_job.h"
#include "learner/pretrainer.h"
#include "learner/sampling.h"
#include "model/chat_format.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "rollout/make_backend.h"

namespace orrery {
namespace {

int Pretrain(const CliArgs& args) {
  StatusOr<PretrainConfig> config = LoadPretrainConfig(args.Get("config"));
  if (!config.ok()) return ReportError(config.status());
  if (args.Has("data")) config->data_dir = args.Get("data");
  PretrainJobOptions o;
  o.config = *config;
  o.run_dir = args.Has("out") ? args.Get("out") : config->run.dir;
  o.max_steps = args.Int("max-steps", -1);
  o.resume = args.Flag("resume");
  StatusOr<PretrainSummary> s = RunPretrainJob(o);
  return s.ok() ? 0 : ReportError(s.status());
}

// Continues `prompt` in slot 0 of `backend` (emptied first) until <|end|>/<|endoftext|> or
// max_tokens: one prefill feed, then one token per feed. The prompt and what is generated stay
// within the model's max_seq_len: a prompt that leaves no room is refused, and generation stops at
// the limit.
StatusOr<std::vector<int32_t>> Generate(rollout::PolicyBackend& backend, int64_t max_seq_len,
                                        const ChatFormat& format,
                                        const std::vector<int32_t>& prompt, int64_t max_tokens,
                                        const SamplingOptions& sampling, PhiloxGenerator& rng) {
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len >= max_seq_len) {
    return InvalidArgumentError("the prompt is " + std::to_string(prompt_len) +
                                " tokens; the model's max_seq_len is " +
                                std::to_string(max_seq_len) + ", leaving no room to generate");
  }
  max_tokens = std::min(max_tokens, max_seq_len - prompt_len);
  backend.Release(0);
  ORRERY_ASSIGN_OR_RETURN(rollout::FeedResult step, backend.Feed({0}, {prompt}));
  const int64_t vocab = backend.vocab_size();
  std::vector<int32_t> out;
  for (int64_t i = 0; i < max_tokens; ++i) {
    const int32_t next = SampleToken(step.logits.data<float>(), vocab, sampling, rng);
    out.push_back(next);
    if (next == format.end_of_turn_id() || next == format.end_of_text_id()) break;
    if (i + 1 < max_tokens) {
      ORRERY_ASSIGN_OR_RETURN(step, backend.Feed({0}, {{next}}));
    }
  }
  return out;
}

int GenerateCommand(const CliArgs& args) {
  const int64_t max_tokens = args.Int("max-tokens", 64);
  if (max_tokens < 1 || max_tokens > (1 << 20)) {
    return ReportError(InvalidArgumentError("generate: --max-tokens " + std::to_string(max_tokens) +
                                            " is outside [1, 1048576]"));
  }
  StatusOr<PolicyCheckpoint> m = LoadPolicyCheckpoint(args.Get("checkpoint"));
  if (!m.ok()) return ReportError(m.status());
  SamplingOptions sampling{args.Float("temperature", 0.0), args.Float("top-p", 1.0)};
  if (sampling.temperature < 0 || sampling.top_p <= 0 || sampling.top_p > 1) {
    return ReportError(InvalidArgumentError("--temperature must be >= 0 and --top-p in (0, 1]"));
  }
  PhiloxGenerator rng(static_cast<uint64_t>(args.Int("seed", 0)), 0);
  const std::string device = args.Get("device", "cpu"), dtype = args.Get("dtype", "bf16");
  if (device != "cpu" && device != "cuda") {
    return ReportError(InvalidArgumentError("--device " + device + ": expected cpu or cuda"));
  }
  if (dtype != "bf16" && dtype != "f32") {
    return ReportError(InvalidArgumentError("--dtype " + dtype + ": expected bf16 or f32"));
  }
  const int64_t max_seq_len = m->model->config().max_seq_len;
  StatusOr<std::unique_ptr<rollout::PolicyBackend>> backend = rollout::MakePolicyBackend(
      m->model.get(), device == "cuda" ? RunDevice::kCuda : RunDevice::kCpu,
      dtype == "f32" ? DType::kF32 : DType::kBF16, 1, max_seq_len);
  if (!backend.ok()) return ReportError(backend.status().WithContext("--device " + device));

  // Conversations whose assistant turn to generate: --prompt as one user message, or every line of
  // --prompts (chat-transcript JSONL, cut before its first assistant message).
  std::vector<std::vector<ChatMessage>> prompts;
  if (args.Has("prompt")) {
    ChatMessage user;
    user.role = ChatRole::kUser;
    user.content = args.Get("prompt");
    std::vector<ChatMessage> convo;
    if (args.Has("system")) {
      ChatMessage sys;
      sys.role = ChatRole::kSystem;
      sys.content = args.Get("system");
      convo.push_back(sys);
    }
    convo.push_back(user);
    prompts.push_back(convo);
  }
  if (args.Has("prompts")) {
    const std::string path = args.Get("prompts");
    StatusOr<std::string> text = ReadFileToString(path);
    if (!text.ok()) return ReportError(text.status());
    StatusOr<std::vector<std::vector<ChatMessage>>> chats = ParseChatTranscripts(path, *text);
    if (!chats.ok()) return ReportError(chats.status());
    for (auto& convo : *chats) {
      std::vector<ChatMessage> head;
      for (const ChatMessage& msg : convo) {
        if (msg.role == ChatRole::kAssistant) break;
        head.push_back(msg);
      }
      prompts.push_back(head);
    }
  }
  if (prompts.empty())
    return ReportError(InvalidArgumentError("give --prompt TEXT or --prompts FILE"));
  const int64_t show = args.Int("show", 5);
  int64_t well_formed_calls = 0, malformed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    StatusOr<RenderedChat> p = m->format->RenderPrompt(prompts[i]);
    if (!p.ok()) return ReportError(p.status());
    StatusOr<std::vector<int32_t>> gen =
        Generate(**backend, max_seq_len, *m->format, p->ids, max_tokens, sampling, rng);
    if (!gen.ok()) return ReportError(gen.status());
    StatusOr<ParsedAssistantTurn> turn = m->format->ParseAssistantTurn(*gen);
    const bool call = turn.ok() && !turn->message.tool_calls.empty();
    well_formed_calls += call ? 1 : 0;
    malformed += turn.ok() ? 0 : 1;
    if (static_cast<int64_t>(i) < show) {
      StatusOr<std::string> text = m->tokenizer->Decode(*gen);
      std::printf("--- prompt %zu: %s\n", i + 1, prompts[i].back().content.c_str());
      std::printf("    generated: %s\n", text.ok() ? text->c_str() : "(undecodable)");
      if (call) {
        for (const ToolCall& c : turn->message.tool_calls) {
          std::printf("    tool call: %s %s\n", c.name.c_str(), c.arguments_json.c_str());
        }
      } else if (!turn.ok()) {
        std::printf("    malformed: %s\n", turn.status().message().c_str());
      }
    }
  }
  if (prompts.size() > 1) {
    std::printf(
        "well-formed tool calls: %lld/%zu (%.0f%%); malformed turns: %lld\n",
        static_cast<long long>(well_formed_calls), prompts.size(),
        100.0 * static_cast<double>(well_formed_calls) / static_cast<double>(prompts.size()),
        static_cast<long long>(malformed));
  }
  return 0;
}

}  // namespace

void RegisterPretrainCommands(CliRegistry& registry) {
  registry.Add(CliCommand{
      {"pretrain"},
      "Pretrain the hybrid model through the staged curriculum of a config",
      {{"--config", "pretraining config (configs/pretrain/*.toml)", CliKind::kString, true, ""},
       {"--out", "run directory (default: [run] dir)", CliKind::kString, false, ""},
       {"--data", "prepared data directory (overrides pretrain.data)", CliKind::kString, false, ""},
       {"--max-steps", "stop after this many steps in total, with a checkpoint", CliKind::kInt,
        false, "-1"},
       {"--resume", "continue from the newest checkpoint in the run directory", CliKind::kFlag,
        false, ""}},
      Pretrain});
  registry.Add(CliCommand{
      {"generate"},
      "Generate an assistant turn from a checkpoint (greedy, temperature, top-p)",
      {{"--checkpoint", "checkpoint or run directory", CliKind::kString, true, ""},
       {"--prompt", "a user message", CliKind::kString, false, ""},
       {"--system", "a system message before --prompt", CliKind::kString, false, ""},
       {"--prompts", "chat-transcript JSONL: each conversation up to its first assistant turn",
        CliKind::kString, false, ""},
       {"--max-tokens", "tokens to generate at most", CliKind::kInt, false, "64"},
       {"--temperature", "0: greedy", CliKind::kFloat, false, "0"},
       {"--top-p", "nucleus sampling mass", CliKind::kFloat, false, "1"},
       {"--seed", "sampling seed", CliKind::kInt, false, "0"},
       {"--show", "print this many generations", CliKind::kInt, false, "5"},
       {"--device", "cpu, or cuda: the GPU model on CUDA device 0", CliKind::kString, false, "cpu"},
       {"--dtype", "the GPU model's compute dtype with --device cuda: bf16 or f32",
        CliKind::kString, false, "bf16"}},
      GenerateCommand});
}

}  // namespace orrery
