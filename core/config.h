// TOML configuration with strict validation.
//
// A ConfigDocument is one parsed file. Code reads it through ConfigTable views with typed getters
// that state the default and the allowed range. Every getter records the resolved value (for
// `orrery config check`), and the first problem becomes the document's error: a wrong type, a value
// out of range, a failed cross-field check (ConfigTable::Fail) and, at Finish(), any key nobody
// read. The error is one line naming the file, the line, the dotted key and what was expected:
//
//   configs/model/tiny.toml:7: model.kda.heads: expected an integer in [1, 4096], got 0
//
// Usage:
//   ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::ParseFile(path));
//   ConfigTable model = doc.root().Table("model");
//   cfg.hidden = model.Int("hidden_size", 256, 1, 1 << 20);
//   ORRERY_RETURN_IF_ERROR(doc.Finish());
//
// The same getters describe the keys: a document in recording mode (RecordKeys) lists every key
// read with its type, default and allowed values, which `orrery config keys` turns into the key
// reference (docs/config-reference.md), so the reference is the readers themselves.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace orrery {

class ConfigDocument;
struct ConfigState;

// One key as a reader reads it (ConfigDocument::RecordKeys).
struct ConfigKeySpec {
  std::string key;            // dotted path; an array of tables' elements as "env.mcp[]"
  std::string type;           // "integer", "number", "boolean", "string", "path", "array of ..."
  std::string default_value;  // TOML text; "required" for a required key, "unset" for optional
  std::string allowed;        // "[1, 4096]", ">= 1", "\"grpo\", \"rloo\""; empty: any value
};

// A view of one TOML table (possibly absent: then every getter returns its default).
class ConfigTable {
 public:
  static constexpr int64_t kIntMin = std::numeric_limits<int64_t>::min();
  static constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();

  bool present() const { return table_ != nullptr; }
  bool Has(std::string_view key) const;
  // "model.kda.heads" for key "heads" of table "model.kda".
  std::string KeyPath(std::string_view key) const;

  int64_t Int(std::string_view key, int64_t def, int64_t min = kIntMin, int64_t max = kIntMax);
  int64_t RequiredInt(std::string_view key, int64_t min = kIntMin, int64_t max = kIntMax);
  std::optional<int64_t> OptionalInt(std::string_view key, int64_t min = kIntMin,
                                     int64_t max = kIntMax);
  // Accepts integers too. Bounds are inclusive.
  double Float(std::string_view key, double def, double min = -1e308, double max = 1e308);
  double RequiredFloat(std::string_view key, double min = -1e308, double max = 1e308);
  std::optional<double> OptionalFloat(std::string_view key, double min = -1e308,
                                      double max = 1e308);
  bool Bool(std::string_view key, bool def);
  std::string String(std::string_view key, std::string def);
  std::string RequiredString(std::string_view key);
  // One of `choices`.
  std::string Enum(std::string_view key, std::string def, const std::vector<std::string>& choices);
  // A path; relative paths are resolved against the directory of the config file.
  std::string Path(std::string_view key, std::string def);
  std::string RequiredPath(std::string_view key);
  std::vector<int64_t> IntList(std::string_view key, std::vector<int64_t> def,
                               int64_t min = kIntMin, int64_t max = kIntMax);
  std::vector<double> FloatList(std::string_view key, std::vector<double> def);
  std::vector<std::string> StringList(std::string_view key, std::vector<std::string> def);

  // A sub-table; absent gives an absent view (defaults apply).
  ConfigTable Table(std::string_view key);
  // An array of tables ([[stages]]); absent gives an empty vector.
  std::vector<ConfigTable> TableArray(std::string_view key);

  // Records an error for `key` of this table (its line when present, else the table's line):
  // used for checks that involve several keys.
  void Fail(std::string_view key, std::string_view message);

 private:
  friend class ConfigDocument;
  ConfigTable(ConfigState* state, const void* table, std::string path)
      : state_(state), table_(table), path_(std::move(path)) {}

  const void* Node(std::string_view key) const;  // toml::node*, marked as read; null if absent
  void Record(std::string_view key, std::string value, bool is_default);
  // Appends `key` to the recorded keys when the document records them (first reading wins).
  void Spec(std::string_view key, std::string type, std::string def, std::string allowed);
  void TypeError(std::string_view key, const void* node, std::string_view expected);

  ConfigState* state_;
  const void* table_;  // const toml::table*, or null when absent
  std::string path_;
};

class ConfigDocument {
 public:
  // Relative paths in the file resolve against its directory, or against `base_dir` when it is
  // not empty (a config written elsewhere on behalf of another location: the embedded default of
  // `orrery launch`).
  static StatusOr<ConfigDocument> ParseFile(const std::string& path,
                                            const std::string& base_dir = "");
  // `source_name` stands in for the file name in messages.
  static StatusOr<ConfigDocument> ParseString(std::string_view text, std::string source_name,
                                              std::string base_dir = ".");
  ConfigDocument(ConfigDocument&&) noexcept;
  ConfigDocument& operator=(ConfigDocument&&) noexcept;
  ~ConfigDocument();

  ConfigTable root();
  const std::string& source_name() const;
  // The first error recorded so far, else the first key (in file order) that nobody read.
  Status Finish();
  // "key = value" for every value read, in reading order; defaults are marked "# default".
  std::string ResolvedText() const;
  // True when the top-level key exists.
  bool HasTopLevel(std::string_view key) const;
  // The first error recorded so far (a wrong type or range, a Fail), without Finish()'s check for
  // unread keys: for a caller whose own failure left keys unread, so that it reports its own.
  Status error() const;

  // From now on every getter appends the key it reads to recorded_keys(), whether present or not.
  void RecordKeys();
  const std::vector<ConfigKeySpec>& recorded_keys() const;

 private:
  ConfigDocument() = default;
  std::unique_ptr<ConfigState> state_;
};

// The validators `orrery config check` runs: each claims one top-level key ("model", "stages",
// "fleet", ...) and reads it from the root table. Modules add theirs at CLI start-up.
class ConfigSections {
 public:
  using Validator = std::function<void(ConfigTable& root)>;
  void Add(std::string key, Validator validator);
  // Runs the validator of every top-level key present, then Finish() (unknown keys included).
  Status Validate(ConfigDocument& doc) const;
  std::vector<std::string> keys() const;

  // A document the key listing reads besides the empty one, for keys read only in some
  // configurations (each environment's options, an element of [[env.mcp]] or [[stages]]).
  void AddKeyExample(std::string toml);
  // Every key the validators read (all of them, present or not) from an empty document and from
  // each example, in reading order, each key once.
  StatusOr<std::vector<ConfigKeySpec>> ListKeys() const;

 private:
  std::vector<std::pair<std::string, Validator>> sections_;
  std::vector<std::string> key_examples_;
};

}  // namespace orrery
