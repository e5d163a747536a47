// configs/demo.toml, compiled into the binary: what `orrery launch` runs when no config is given.
// Its relative paths are meant against the repository's configs/ directory.
#pragma once

namespace orrery {

extern const char kEmbeddedDemoConfig[];

}  // namespace orrery
