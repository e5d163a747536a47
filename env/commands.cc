#include "env/commands.h"

#include <cstdio>
#include <iostream>
#include <string>

#include "core/chat.h"
#include "core/safetensors.h"
#include "env/calc/transcripts.h"
#include "env/registry.h"
#include "env/retrieval/retrieval_env.h"

namespace orrery {
namespace {

// Retrieval transcripts with the document in the prompt: the task's messages and the correct
// answer (pretraining text for the long-context RL run's tokenizer and format).
int RunRetrievalSynth(const CliArgs& args, int64_t count) {
  StatusOr<env::Split> split = env::ParseSplit(args.Get("split"));
  if (!split.ok()) return ReportError(split.status().WithContext("env synth: --split"));
  env::RetrievalEnvOptions options;
  options.document = env::RetrievalDocument::kInPrompt;
  options.seed = static_cast<uint64_t>(args.Int("seed"));
  options.doc_tokens = args.Int("doc-tokens");
  std::string out;
  for (int64_t i = 0; i < count; ++i) {
    StatusOr<env::RetrievalTask> t =
        env::MakeRetrievalTask(options, *split, static_cast<uint64_t>(i));
    if (!t.ok()) return ReportError(t.status().WithContext("env synth: --doc-tokens"));
    std::vector<ChatMessage> m = env::RetrievalInitialMessages(*t, options.document);
    m.push_back(ChatMessage{ChatRole::kAssistant, "Answer: " + t->answer, {}, "", ""});
    out += "{\"messages\":" + ChatMessagesToJson(m) + "}\n";
  }
  const std::string path = args.Get("out");
  Status s = WriteFileAtomic(path, out);
  if (!s.ok()) return ReportError(s.WithContext("env synth: --out " + path));
  std::printf("wrote %lld transcripts to %s (documents of %lld words in the prompt)\n",
              static_cast<long long>(count), path.c_str(),
              static_cast<long long>(options.doc_tokens));
  return 0;
}

int RunSynth(const CliArgs& args) {
  const std::string env = args.Get("env");
  if (env != "calc" && env != "retrieval") {
    return ReportError(InvalidArgumentError(
        "env synth: --env '" + env + "' has no transcript generator (available: calc, retrieval)"));
  }
  const int64_t count = args.Int("count");
  if (count < 1 || count > 100'000'000) {
    return ReportError(InvalidArgumentError("env synth: --count " + std::to_string(count) +
                                            " is outside [1, 100000000]"));
  }
  if (env == "retrieval") return RunRetrievalSynth(args, count);
  calc::TranscriptOptions options;
  StatusOr<calc::Split> split = calc::ParseSplit(args.Get("split"));
  if (!split.ok()) return ReportError(split.status().WithContext("env synth: --split"));
  options.split = *split;
  options.difficulty = static_cast<int>(args.Int("difficulty"));
  options.no_tool_fraction = args.Float("no-tool-fraction");
  options.no_tool_error_rate = args.Float("no-tool-error-rate");
  StatusOr<calc::CalcTool> tool = calc::ParseCalcTool(args.Get("tool"));
  if (!tool.ok()) return ReportError(tool.status().WithContext("env synth: --tool"));
  options.tool = *tool;
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

// Creates the environment for `env try`: from --config when given, else `name` with default
// options. The config may be a whole run's (the other sections' validators read them).
StatusOr<std::unique_ptr<env::Env>> MakeEnv(const CliArgs& args, env::EnvRegistry& registry,
                                            const ConfigSections& sections) {
  const std::string path = args.Get("config");
  StatusOr<ConfigDocument> doc =
      path.empty()
          ? ConfigDocument::ParseString("[env]\nname = \"" + args.Get("env") + "\"\n", "--env")
          : ConfigDocument::ParseFile(path);
  if (!doc.ok()) return doc.status();
  ConfigTable root = doc->root();
  StatusOr<std::unique_ptr<env::Env>> made = env::CreateEnvFromConfig(root, registry);
  // A failure that stopped the reading early (a plug-in that does not load) left keys unread:
  // report it, not the first unread key; a config error recorded before it comes first.
  if (!made.ok()) return doc->error().ok() ? made.status() : doc->error();
  ORRERY_RETURN_IF_ERROR(path.empty() ? doc->Finish() : sections.Validate(*doc));
  return made;
}

void PrintMessage(const ChatMessage& m) {
  std::printf("[%s] %s\n", std::string(ChatRoleName(m.role)).c_str(), m.content.c_str());
}

// One episode in the terminal: the person plays the model.
int RunTry(const ConfigSections& sections, const CliArgs& args) {
  const int64_t task_seed = args.Int("task-seed");
  if (task_seed < 0) {
    return ReportError(InvalidArgumentError("env try: --task-seed " + std::to_string(task_seed) +
                                            " is negative: expected a task index >= 0"));
  }
  env::EnvRegistry registry;
  env::RegisterBuiltinEnvs(registry);
  StatusOr<std::unique_ptr<env::Env>> made = MakeEnv(args, registry, sections);
  if (!made.ok()) return ReportError(made.status().WithContext("env try"));
  env::Env& e = **made;
  StatusOr<env::Split> split = env::ParseSplit(args.Get("split", "train"));
  if (!split.ok()) return ReportError(split.status().WithContext("env try: --split"));
  StatusOr<env::TaskRef> task = e.Task(*split, static_cast<uint64_t>(task_seed));
  if (!task.ok()) return ReportError(task.status().WithContext("env try"));
  const double timeout = args.Float("timeout", 60);
  StatusOr<std::unique_ptr<env::Episode>> ep = e.Reset(*task, env::DeadlineIn(timeout));
  if (!ep.ok()) return ReportError(ep.status().WithContext("env try: reset " + task->id));
  env::Episode& episode = **ep;
  std::printf("task %s\ntools: %s\n", task->id.c_str(),
              env::ToolSpecsToJson(episode.tools()).c_str());
  std::vector<ChatMessage> trajectory = episode.initial_messages();
  for (const ChatMessage& m : trajectory) PrintMessage(m);
  std::printf(
      "\nType a tool call as  NAME {json arguments}  (e.g. calculate {\"expression\": \"1+2\"}),"
      "\nor  answer TEXT  to give the final answer (use \\n for new lines), or  quit.\n");
  std::string line;
  int call_index = 0;
  for (;;) {
    std::printf("> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "quit") {
      std::printf("\nepisode abandoned\n");
      return 1;
    }
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const std::string head = line.substr(0, space);
    const std::string rest = space == std::string::npos ? "" : line.substr(space + 1);
    if (head == "answer") {
      ChatMessage final_message;
      final_message.role = ChatRole::kAssistant;
      for (size_t i = 0; i < rest.size(); ++i) {
        if (rest.compare(i, 2, "\\n") == 0) {
          final_message.content += '\n';
          ++i;
        } else {
          final_message.content += rest[i];
        }
      }
      trajectory.push_back(final_message);
      StatusOr<env::EpisodeScore> score = episode.Score(trajectory, env::DeadlineIn(timeout));
      if (!score.ok()) return ReportError(score.status().WithContext("env try: score"));
      std::printf("reward %g\n", score->reward);
      for (const auto& [k, v] : score->components) std::printf("  %s = %g\n", k.c_str(), v);
      return 0;
    }
    ToolCall call{"call_" + std::to_string(call_index++), head, rest.empty() ? "{}" : rest};
    ChatMessage assistant;
    assistant.role = ChatRole::kAssistant;
    assistant.tool_calls.push_back(call);
    trajectory.push_back(assistant);
    StatusOr<env::ToolResult> result = episode.Step(call, env::DeadlineIn(timeout));
    if (!result.ok()) return ReportError(result.status().WithContext("env try: step"));
    ChatMessage tool;
    tool.role = ChatRole::kTool;
    tool.tool_call_id = call.id;
    tool.name = call.name;
    tool.content = result->content;
    trajectory.push_back(tool);
    std::printf("[tool%s, %.3f ms] %s\n", result->is_error ? " error" : "", result->latency_s * 1e3,
                result->content.c_str());
  }
}

int RunList(const CliArgs&) {
  env::EnvRegistry registry;
  env::RegisterBuiltinEnvs(registry);
  for (const auto& [name, description] : registry.List()) {
    std::printf("%-12s %s\n", name.c_str(), description.c_str());
  }
  return 0;
}

}  // namespace

void RegisterEnvCommands(CliRegistry& registry) {
  registry.AddGroup({"env"}, "Tool environments: synthetic data, listing, trying and serving");
  registry.Add(CliCommand{
      {"env", "synth"},
      "Write synthetic tool-use transcripts as JSON lines ({\"messages\": [...]} per line)",
      {{"--env", "environment whose transcripts to generate (calc, retrieval)", CliKind::kString,
        true, ""},
       {"--count", "number of transcripts", CliKind::kInt, true, ""},
       {"--seed", "seed: transcripts are a pure function of (seed, index)", CliKind::kInt, false,
        "0"},
       {"--out", "output file (JSON lines), written atomically", CliKind::kString, true, ""},
       {"--split", "task split: train or test", CliKind::kString, false, "train"},
       {"--difficulty", "1..4, or 0 for a uniform mix", CliKind::kInt, false, "0"},
       {"--no-tool-fraction", "fraction answered without the tool", CliKind::kFloat, false, "0.25"},
       {"--no-tool-error-rate", "probability that a no-tool answer is wrong", CliKind::kFloat,
        false, "0.6"},
       {"--tool", "what calculate takes: expression, or one_operation (one call per operation)",
        CliKind::kString, false, "expression"},
       {"--doc-tokens", "retrieval: words per document (in the prompt)", CliKind::kInt, false,
        "2000"}},
      RunSynth});
  registry.Add(CliCommand{{"env", "list"}, "List the registered environments", {}, RunList});
  const ConfigSections* sections = &registry.config_sections();
  registry.Add(CliCommand{
      {"env", "try"},
      "Play one episode in the terminal: type tool calls, give an answer, see the reward",
      {{"--env", "environment name (ignored with --config)", CliKind::kString, false, "calc"},
       {"--config", "TOML file with an [env] section (a whole run's config will do)",
        CliKind::kString, false, ""},
       {"--task-seed", "task index within the split", CliKind::kInt, false, "0"},
       {"--split", "train or test", CliKind::kString, false, "train"},
       {"--timeout", "deadline in seconds for each call", CliKind::kFloat, false, "60"}},
      [sections](const CliArgs& args) { return RunTry(*sections, args); }});
  registry.config_sections().Add("env", [](ConfigTable& root) {
    // With [rl], the [rl] validator creates it, for the rollouts' episodes in flight.
    if (root.Has("rl")) return;
    env::EnvRegistry envs;
    env::RegisterBuiltinEnvs(envs);
    StatusOr<std::unique_ptr<env::Env>> made = env::CreateEnvFromConfig(root, envs);
    if (!made.ok()) root.Table("env").Fail("name", made.status().message());
  });
  // For `orrery config keys`: each built-in environment's options and an [[env.mcp]] entry.
  for (const char* name : {"python", "retrieval", "external"}) {
    registry.config_sections().AddKeyExample(std::string("[env]\nname = \"") + name + "\"\n");
  }
  registry.config_sections().AddKeyExample("[[env.mcp]]\nname = \"fs\"\ncommand = [\"server\"]\n");
}

}  // namespace orrery
