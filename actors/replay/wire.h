// Conversions between the replay store's C++ types and its Cap'n Proto wire messages
// (actors/schema/replay.capnp), shared by the replay actor and its client.
#pragma once

#include <vector>

#include "actors/replay/table.h"
#include "actors/schema/replay.capnp.h"

namespace orrery::replay {

void FillTableInfo(const TableInfo& info, schema::TableInfo::Builder out);
TableInfo ReadTableInfo(schema::TableInfo::Reader in);

void FillSampledItem(const SampledItem& item, schema::SampledItem::Builder out);
SampledItem ReadSampledItem(schema::SampledItem::Reader in);

// The error reply of a request, and the Status of an error reply.
void FillError(const Status& status, schema::Error::Builder out);
Status ReadError(schema::Error::Reader in);

std::string_view CountUnitName(CountUnit unit);

}  // namespace orrery::replay
