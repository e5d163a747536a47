#include "model/commands.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"
#include "model/ops_run.h"

namespace orrery::model {
namespace {

std::string Human(double v) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (v >= 1000.0 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g%s", v, units[u]);
  return buf;
}

int RunModelInfo(const CliArgs& args) {
  StatusOr<ModelConfig> config = LoadModelConfig(args.Get("config"));
  if (!config.ok()) return ReportError(config.status());
  const int64_t context = args.Int("context", 8192);
  if (context < 1) return ReportError(InvalidArgumentError("--context: expected >= 1"));
  const ParamBreakdown b = ComputeParamBreakdown(*config, context);
  if (args.Flag("json")) {
    nlohmann::ordered_json j;
    j["name"] = config->name;
    j["layers"] = config->LayerPattern();
    j["total_params"] = b.total_params;
    j["active_params"] = b.active_params;
    nlohmann::ordered_json comps = nlohmann::ordered_json::object();
    for (const auto& r : b.rows) comps[r.component] = {{"total", r.total}, {"active", r.active}};
    j["components"] = comps;
    j["kda_state_bytes_per_sequence"] = b.kda_state_bytes_per_sequence;
    j["mla_cache_bytes_per_token_bf16"] = b.mla_cache_bytes_per_token_bf16;
    j["mla_cache_bytes_per_token_f32"] = b.mla_cache_bytes_per_token_f32;
    j["context_length"] = context;
    j["forward_flops_per_token"] = b.forward_flops_per_token;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model %s: %lld layers %s, hidden %lld, vocab %lld\n", config->name.c_str(),
              static_cast<long long>(config->num_layers), config->LayerPattern().c_str(),
              static_cast<long long>(config->hidden_size),
              static_cast<long long>(config->vocab_size));
  std::printf("%-20s %16s %16s\n", "component", "total", "active/token");
  for (const auto& r : b.rows) {
    std::printf("%-20s %16lld %16lld\n", r.component.c_str(), static_cast<long long>(r.total),
                static_cast<long long>(r.active));
  }
  std::printf("%-20s %16lld %16lld   (%s total, %s active)\n", "all",
              static_cast<long long>(b.total_params), static_cast<long long>(b.active_params),
              Human(static_cast<double>(b.total_params)).c_str(),
              Human(static_cast<double>(b.active_params)).c_str());
  std::printf("KDA state per sequence: %lld bytes (f32 recurrent + conv state)\n",
              static_cast<long long>(b.kda_state_bytes_per_sequence));
  std::printf("MLA cache per token: %lld bytes bf16, %lld bytes f32\n",
              static_cast<long long>(b.mla_cache_bytes_per_token_bf16),
              static_cast<long long>(b.mla_cache_bytes_per_token_f32));
  std::printf("forward FLOPs per token at context %lld: %s\n", static_cast<long long>(context),
              Human(b.forward_flops_per_token).c_str());
  return 0;
}

int RunOpsRun(const CliArgs& args) {
  OpRunOptions options;
  options.op = args.Get("op");
  options.in_path = args.Get("in");
  options.out_path = args.Get("out");
  options.backward = args.Flag("backward");
  options.device = args.Get("device", "cpu");
  for (const std::string& kv : args.List("attr")) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return ReportError(InvalidArgumentError("--attr " + kv + ": expected KEY=VALUE"));
    }
    options.attrs[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  const Status st = RunOp(options);
  if (!st.ok()) return ReportError(st);
  return 0;
}

}  // namespace

void RegisterModelCommands(CliRegistry& registry) {
  registry.config_sections().Add("model", [](ConfigTable& root) { (void)ReadModelConfig(root); });
  // For the key reference: a model with every layer kind, so each sub-table's keys are read.
  registry.config_sections().AddKeyExample(
      "[model]\nvocab_size = 1024\nhidden_size = 128\nnum_layers = 4\nfull_attn_layers = [4]\n");
  registry.AddGroup({"model"}, "Inspect model configurations");
  registry.Add(CliCommand{
      {"model", "info"},
      "Parameter counts (total and active per token) by component, KDA state, MLA cache and "
      "forward FLOPs of a model config",
      {{"--config", "model TOML file ([model] table)", CliKind::kString, /*required=*/true, ""},
       {"--context", "context length for the FLOP estimate", CliKind::kInt, false, "8192"},
       {"--json", "print JSON", CliKind::kFlag, false, ""}},
      RunModelInfo});
  std::string ops;
  for (const std::string& name : OpNames()) ops += (ops.empty() ? "" : ", ") + name;
  registry.AddGroup({"ops"}, "Run single Orrery ops on safetensors files (docs/ops.md)");
  registry.Add(CliCommand{
      {"ops", "run"},
      "Run one op on the tensors of a safetensors file and write its outputs (and with "
      "--backward every input gradient) to another; names and layouts in docs/ops.md",
      {{"--op", "op name: " + ops, CliKind::kString, /*required=*/true, ""},
       {"--in", "input safetensors file", CliKind::kString, true, ""},
       {"--out", "output safetensors file (written atomically)", CliKind::kString, true, ""},
       {"--backward", "read upstream gradients d<output> and write input gradients d<input>",
        CliKind::kFlag, false, ""},
       {"--device", "cpu, or cuda for kda/kda_recurrent in CUDA builds", CliKind::kString, false,
        "cpu"},
       {"--attr", "op attribute KEY=VALUE (repeatable), e.g. chunk_size=16, top_k=2",
        CliKind::kStringList, false, ""}},
      RunOpsRun});
}

}  // namespace orrery::model
