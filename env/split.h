// Task splits: every task source keeps train and test disjoint.
#pragma once

#include <string_view>

#include "core/status.h"

namespace orrery::env {

enum class Split { kTrain, kTest };
std::string_view SplitName(Split split);            // "train", "test"
StatusOr<Split> ParseSplit(std::string_view name);  // InvalidArgument for anything else

}  // namespace orrery::env
