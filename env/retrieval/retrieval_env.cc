#include "env/retrieval/retrieval_env.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/philox.h"
#include "env/calc/answer.h"
#include "env/tool_call.h"

namespace orrery::env {
namespace {

constexpr const char* kWords[] = {
    "the",    "council", "river",  "market",  "quietly", "reviewed",  "northern", "ledger",
    "of",     "and",     "a",      "season",  "harbor",  "merchants", "traveled", "through",
    "valley", "in",      "old",    "archive", "records", "show",      "that",     "bridge",
    "was",    "rebuilt", "after",  "storm",   "with",    "stone",     "from",     "hills",
    "near",   "village", "where",  "farmers", "sold",    "grain",     "every",    "autumn",
    "while",  "scribes", "copied", "letters", "for",     "distant",   "towns"};
constexpr const char* kAdjectives[] = {"Amber",   "Silent", "Copper",  "Hidden", "Northern",
                                       "Crimson", "Silver", "Eastern", "Golden", "Iron",
                                       "Verdant", "Hollow", "Azure",   "Ancient"};
constexpr const char* kNouns[] = {"Vault", "Library", "Tower",   "Harbor", "Garden", "Observatory",
                                  "Mill",  "Gate",    "Archive", "Bridge", "Market", "Chapel"};
constexpr const char* kAttributes[] = {"access code", "founding year", "registry number",
                                       "vault combination", "guild number"};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

class RetrievalEpisode : public Episode {
 public:
  // max_read bounds read's length through the tool schema (ValidateToolCall enforces it).
  RetrievalEpisode(RetrievalTask task, RetrievalDocument document, int64_t max_read)
      : task_(std::move(task)), document_(document) {
    messages_ = RetrievalInitialMessages(task_, document_);
    if (document_ == RetrievalDocument::kInPrompt) return;  // no tools: the text is in the prompt
    tools_ = {
        ToolSpec{
            "search",
            "Find a phrase in the document (case-insensitive); returns up to 5 "
            "matches with their offsets and surrounding text.",
            R"({"type":"object","properties":{"query":{"type":"string","maxLength":200}},"required":["query"],"additionalProperties":false})"},
        ToolSpec{
            "read", "Read the document text from offset (0-based, in characters).",
            R"({"type":"object","properties":{"offset":{"type":"integer","minimum":0},"length":{"type":"integer","minimum":1,"maximum":)" +
                std::to_string(max_read) +
                R"(}},"required":["offset","length"],"additionalProperties":false})"}};
  }
  const std::vector<ChatMessage>& initial_messages() const override { return messages_; }
  const std::vector<ToolSpec>& tools() const override { return tools_; }

  StatusOr<ToolResult> Step(const ToolCall& call, Deadline) override {
    const auto start = Clock::now();
    ToolResult r = Run(call);
    r.latency_s = std::chrono::duration<double>(Clock::now() - start).count();
    return r;
  }

  StatusOr<EpisodeScore> Score(const std::vector<ChatMessage>& trajectory, Deadline) override {
    const ChatMessage* last = nullptr;
    for (const ChatMessage& m : trajectory) {
      if (m.role == ChatRole::kAssistant) last = &m;
    }
    std::optional<std::string> given = last ? calc::ExtractAnswerLine(last->content) : std::nullopt;
    EpisodeScore s;
    s.reward = given && Lower(Trim(*given)) == Lower(task_.answer) ? 1.0 : 0.0;
    if (document_ == RetrievalDocument::kInPrompt) {
      const double depth = task_.document.empty() ? 0.0
                                                  : static_cast<double>(task_.answer_offset) /
                                                        static_cast<double>(task_.document.size());
      s.components = {{"correct", s.reward},
                      {"doc_words", static_cast<double>(task_.doc_words)},
                      {"depth", depth}};
    } else {
      s.components = {{"correct", s.reward}, {"searches", searches_}, {"reads", reads_}};
    }
    return s;
  }

 private:
  ToolResult Run(const ToolCall& call) {
    if (tools_.empty()) return ToolError("this task has no tools: the document is in the prompt");
    StatusOr<std::string> args = ValidateToolCall(call, tools_);
    if (!args.ok()) return ToolError(args.status().message());
    const nlohmann::json a = nlohmann::json::parse(*args);
    const std::string& doc = task_.document;
    if (call.name == "read") {
      ++reads_;
      const int64_t offset = a["offset"].get<int64_t>();
      if (offset >= static_cast<int64_t>(doc.size())) {
        return ToolError("offset " + std::to_string(offset) + " is past the end (" +
                         std::to_string(doc.size()) + " characters)");
      }
      return ToolResult{
          doc.substr(static_cast<size_t>(offset), static_cast<size_t>(a["length"].get<int64_t>())),
          false, 0};
    }
    ++searches_;
    const std::string query = Lower(a["query"].get<std::string>());
    if (Trim(query).empty()) return ToolError("empty query");
    if (lower_.empty()) lower_ = Lower(doc);
    std::string out;
    int found = 0;
    for (size_t pos = lower_.find(query); pos != std::string::npos && found < 5;
         pos = lower_.find(query, pos + 1)) {
      const size_t from = pos > 60 ? pos - 60 : 0;
      out += "offset " + std::to_string(pos) + ": ..." +
             doc.substr(from, pos - from + query.size() + 60) + "...\n";
      ++found;
    }
    return ToolResult{found == 0 ? "no matches" : out, false, 0};
  }

  RetrievalTask task_;
  RetrievalDocument document_;
  std::string lower_;  // lower-cased document, built on the first search
  std::vector<ChatMessage> messages_;
  std::vector<ToolSpec> tools_;
  double searches_ = 0, reads_ = 0;
};

class RetrievalEnv : public Env {
 public:
  explicit RetrievalEnv(const RetrievalEnvOptions& o) : options_(o) {}
  std::string name() const override { return "retrieval"; }
  StatusOr<TaskRef> Task(Split split, uint64_t index) const override {
    const RetrievalEnvOptions& o = options_;
    const std::string length =
        o.doc_tokens_max > 0 ? std::to_string(o.doc_tokens) + "-" + std::to_string(o.doc_tokens_max)
                             : std::to_string(o.doc_tokens);
    return TaskRef{std::string("retrieval/") +
                       (o.document == RetrievalDocument::kInPrompt ? "in_prompt/" : "") +
                       std::string(SplitName(split)) + "/" + length + "/" + std::to_string(o.seed) +
                       "/" + std::to_string(index),
                   split, o.seed, index};
  }
  StatusOr<std::unique_ptr<Episode>> Reset(const TaskRef& ref, Deadline) override {
    RetrievalEnvOptions o = options_;
    o.seed = ref.seed;
    ORRERY_ASSIGN_OR_RETURN(RetrievalTask task, MakeRetrievalTask(o, ref.split, ref.index));
    return std::unique_ptr<Episode>(
        new RetrievalEpisode(std::move(task), o.document, o.max_read_chars));
  }

 private:
  RetrievalEnvOptions options_;
};

}  // namespace

StatusOr<RetrievalTask> MakeRetrievalTask(const RetrievalEnvOptions& o, Split split,
                                          uint64_t index) {
  if (o.doc_tokens < 1000 || o.doc_tokens > kRetrievalMaxDocTokens) {
    return InvalidArgumentError("retrieval: doc_tokens = " + std::to_string(o.doc_tokens) +
                                " is outside [1000, " + std::to_string(kRetrievalMaxDocTokens) +
                                "]");
  }
  if (o.doc_tokens_max != 0 &&
      (o.doc_tokens_max < o.doc_tokens || o.doc_tokens_max > kRetrievalMaxDocTokens)) {
    return InvalidArgumentError("retrieval: doc_tokens_max = " + std::to_string(o.doc_tokens_max) +
                                " is outside [doc_tokens = " + std::to_string(o.doc_tokens) + ", " +
                                std::to_string(kRetrievalMaxDocTokens) + "] (or 0)");
  }
  if (o.num_facts < 1 || o.num_facts > 1000) {
    return InvalidArgumentError("retrieval: num_facts must be in [1, 1000]");
  }
  PhiloxGenerator rng(o.seed, (index << 1) | (split == Split::kTest ? 1 : 0));
  // A drawn length only when there is a range, so fixed-length tasks keep their documents.
  const int64_t words =
      o.doc_tokens_max > o.doc_tokens
          ? o.doc_tokens + static_cast<int64_t>(rng.UniformInt(
                               static_cast<uint64_t>(o.doc_tokens_max - o.doc_tokens + 1)))
          : o.doc_tokens;
  // Facts: distinct (entity, attribute) pairs with random values, planted at sorted word positions.
  struct Fact {
    std::string text, question, value;
    int64_t at;
  };
  std::vector<Fact> facts;
  std::vector<std::string> used;
  while (static_cast<int>(facts.size()) < o.num_facts) {
    const std::string entity = std::string("the ") +
                               kAdjectives[rng.UniformInt(std::size(kAdjectives))] + " " +
                               kNouns[rng.UniformInt(std::size(kNouns))];
    const std::string attribute = kAttributes[rng.UniformInt(std::size(kAttributes))];
    if (std::find(used.begin(), used.end(), attribute + entity) != used.end()) continue;
    used.push_back(attribute + entity);
    const std::string value = std::to_string(1000 + rng.UniformInt(9000));
    const int64_t at = static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(words)));
    std::string sentence = "The " + attribute + " of " + entity + " is " + value + ".";
    facts.push_back({sentence, "What is the " + attribute + " of " + entity + "?", value, at});
  }
  const size_t asked = rng.UniformInt(facts.size());
  const Fact asked_fact = facts[asked];
  std::sort(facts.begin(), facts.end(), [](const Fact& a, const Fact& b) { return a.at < b.at; });
  RetrievalTask task;
  task.document.reserve(static_cast<size_t>(words) * 7);
  task.doc_words = words;
  size_t next = 0;
  bool sentence_start = true;
  for (int64_t w = 0; w < words; ++w) {
    while (next < facts.size() && facts[next].at == w) {
      if (!sentence_start) task.document += ". ";
      if (facts[next].value == asked_fact.value && facts[next].text == asked_fact.text) {
        task.answer_offset = task.document.size();
      }
      task.document += facts[next].text + " ";
      sentence_start = true;
      ++next;
    }
    std::string word = kWords[rng.UniformInt(std::size(kWords))];
    if (sentence_start) word[0] = static_cast<char>(std::toupper(word[0]));
    task.document += word;
    sentence_start = rng.UniformInt(12) == 0;
    task.document += sentence_start ? ". " : " ";
  }
  task.question = asked_fact.question;
  task.answer = asked_fact.value;
  return task;
}

std::vector<ChatMessage> RetrievalInitialMessages(const RetrievalTask& task,
                                                  RetrievalDocument document) {
  if (document == RetrievalDocument::kInPrompt) {
    return {ChatMessage{ChatRole::kSystem,
                        "Answer the question about the document. Finish with a line \"Answer: "
                        "<value>\".",
                        {},
                        "",
                        ""},
            ChatMessage{ChatRole::kUser,
                        "Document:\n" + task.document + "\n\nQuestion: " + task.question,
                        {},
                        "",
                        ""}};
  }
  return {ChatMessage{ChatRole::kSystem,
                      "A long document is available through the tools search(query) and "
                      "read(offset, length); it is " +
                          std::to_string(task.document.size()) +
                          " characters long. Finish with a line \"Answer: <value>\".",
                      {},
                      "",
                      ""},
          ChatMessage{ChatRole::kUser, task.question, {}, "", ""}};
}

RetrievalEnvOptions ReadRetrievalEnvOptions(ConfigTable& table) {
  RetrievalEnvOptions o;
  o.seed = static_cast<uint64_t>(table.Int("seed", 0, 0));
  const std::string document = table.Enum("document", "tools", {"tools", "in_prompt"});
  o.document = document == "in_prompt" ? RetrievalDocument::kInPrompt : RetrievalDocument::kTools;
  o.doc_tokens = table.Int("doc_tokens", 20000, 1000, kRetrievalMaxDocTokens);
  o.doc_tokens_max = table.Int("doc_tokens_max", 0, 0, kRetrievalMaxDocTokens);
  if (o.doc_tokens_max != 0 && o.doc_tokens_max < o.doc_tokens) {
    table.Fail("doc_tokens_max",
               "expected 0 (every document doc_tokens long) or at least "
               "env.retrieval.doc_tokens = " +
                   std::to_string(o.doc_tokens) + ", got " + std::to_string(o.doc_tokens_max));
  }
  o.num_facts = static_cast<int>(table.Int("num_facts", 8, 1, 1000));
  if (o.document == RetrievalDocument::kInPrompt && table.Has("max_read_chars")) {
    table.Fail("max_read_chars",
               "is only read with document = \"tools\" (document = \"in_prompt\" has no read "
               "tool)");
  }
  o.max_read_chars = table.Int("max_read_chars", 4096, 16, 1 << 20);
  return o;
}

std::unique_ptr<Env> MakeRetrievalEnv(const RetrievalEnvOptions& options) {
  return std::make_unique<RetrievalEnv>(options);
}

}  // namespace orrery::env
