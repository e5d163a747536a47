// The dashboard's web assets (index.html, app.js, app.css), embedded into the binary at build time
// so the page needs no files and no network at run time. The sources are in actors/dashboard/src;
// the build bundles them with esbuild (charting library: uPlot, from the npm registry) and
// generates dashboard_assets.cc (embed_assets.cmake).
#pragma once

#include <cstddef>
#include <string_view>

namespace orrery {

struct DashboardAsset {
  const char* path;          // "/app.js"
  const char* content_type;  // "text/javascript; charset=utf-8"
  const unsigned char* data;
  size_t size;
};

// The asset served at `path`, or null.
const DashboardAsset* FindDashboardAsset(std::string_view path);

}  // namespace orrery
