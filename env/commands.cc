#include "env/commands.h"

#include <cstdio>
#include <string>

#include "core/chat.h"
#include "core/safetensors.h"
#include "env/calc/transcripts.h"

namespace orrery {
namespace {

int RunSynth(const CliArgs& args) {
  const std::string env = args.Get("env");
  if (env != "calc") {
    return ReportError(InvalidArgumentError("env synth: --env '" + env +
                                            "' has no transcript generator (available: calc)"));
  }
  const int64_t count = args.Int("count");
  if (count < 1 || count > 100'000'000) {
    return ReportError(InvalidArgumentError("env synth: --count " + std::to_string(count) +
                                            " is outside [1, 100000000]"));
  }
  calc::TranscriptOptions options;
  StatusOr<calc::Split> split = calc::ParseSplit(args.Get("split"));
  if (!split.ok()) return ReportError(split.status().WithContext("env synth: --split"));
  options.split = *split;
  options.difficulty = static_cast<int>(args.Int("difficulty"));
  options.no_tool_fraction = args.Float("no-tool-fraction");
  options.no_tool_error_rate = args.Float("no-tool-error-rate");
  Status valid = calc::ValidateTranscriptOptions(options);
  if (!valid.ok()) return ReportError(valid.WithContext("env synth"));

  const uint64_t seed = static_cast<uint64_t>(args.Int("seed"));
  std::string out;
  int64_t with_tool = 0, correct = 0;
  for (int64_t i = 0; i < count; ++i) {
    StatusOr<calc::CalcTranscript> t = calc::MakeCalcTranscript(seed, i, options);
    if (!t.ok()) return ReportError(t.status().WithContext("env synth"));
    out += "{\"messages\":" + ChatMessagesToJson(t->messages) + "}\n";
    with_tool += t->used_tool;
    correct += t->correct;
  }
  const std::string path = args.Get("out");
  Status s = WriteFileAtomic(path, out);
  if (!s.ok()) return ReportError(s.WithContext("env synth: --out " + path));
  std::printf("wrote %lld transcripts to %s (%lld with the tool, %lld correct)\n",
              static_cast<long long>(count), path.c_str(), static_cast<long long>(with_tool),
              static_cast<long long>(correct));
  return 0;
}

}  // namespace

void RegisterEnvCommands(CliRegistry& registry) {
  registry.AddGroup({"env"}, "Tool environments: synthetic data, listing, trying and serving");
  registry.Add(CliCommand{
      {"env", "synth"},
      "Write synthetic tool-use transcripts as JSON lines ({\"messages\": [...]} per line)",
      {{"--env", "environment whose transcripts to generate (calc)", CliKind::kString, true, ""},
       {"--count", "number of transcripts", CliKind::kInt, true, ""},
       {"--seed", "seed: transcripts are a pure function of (seed, index)", CliKind::kInt, false,
        "0"},
       {"--out", "output file (JSON lines), written atomically", CliKind::kString, true, ""},
       {"--split", "task split: train or test", CliKind::kString, false, "train"},
       {"--difficulty", "1..4, or 0 for a uniform mix", CliKind::kInt, false, "0"},
       {"--no-tool-fraction", "fraction answered without the tool", CliKind::kFloat, false, "0.25"},
       {"--no-tool-error-rate", "probability that a no-tool answer is wrong", CliKind::kFloat,
        false, "0.6"}},
      RunSynth});
}

}  // namespace orrery
