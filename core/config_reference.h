// The configuration key reference: every key the config readers read (ConfigSections::ListKeys:
// the readers themselves, in recording mode), with its type, default and allowed values, and a
// one-line description from docs/config-keys.toml (compiled in). `orrery config keys` prints it;
// docs/config-reference.md is its markdown, regenerated and compared by the `config.reference`
// test, so neither the reference nor the descriptions can drift from the readers: a key without a
// description, or a description of a key no reader reads, is an error naming it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "core/status.h"

namespace orrery {

// docs/config-keys.toml as compiled in: one `"dotted.key" = "description"` line per key.
extern const char kConfigKeyDescriptions[];

// `keys` (all of them: descriptions are checked against the whole set) rendered for the keys of
// `section` ("rl" gives rl.*; empty: every key). `format`: "text" (one aligned line per key) or
// "md" (a markdown table per TOML table, docs/config-reference.md). `descriptions_name` names the
// descriptions in errors.
StatusOr<std::string> RenderConfigReference(const std::vector<ConfigKeySpec>& keys,
                                            std::string_view descriptions,
                                            const std::string& descriptions_name,
                                            const std::string& section, const std::string& format);

}  // namespace orrery
