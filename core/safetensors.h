// safetensors files: read through mmap with the header validated, written atomically.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data buffer. Reading checks every claim of the header against the file: the length
// fits, the JSON parses, dtypes are known, each tensor's byte range matches its shape and lies in
// the buffer, ranges do not overlap and cover the buffer without holes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace orrery {

class SafetensorsFile {
 public:
  static StatusOr<SafetensorsFile> Open(const std::string& path);

  // Tensor names in file order of their data.
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(const std::string& name) const { return entries_.count(name) != 0; }
  // A CPU tensor viewing the mapped file (copy-on-write: writing to it never changes the file).
  StatusOr<Tensor> Get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    size_t begin;
    size_t end;
  };
  std::string path_;
  std::shared_ptr<void> mapping_;  // munmap on release
  const char* data_ = nullptr;     // start of the data buffer
  std::vector<std::string> names_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes CPU tensors (any devices are copied to CPU first) to `path` atomically: a temporary
// file in the same directory is written, fsync'ed and renamed over `path`.
Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Writes `contents` to `path` atomically (temp file + fsync + rename + directory fsync).
Status WriteFileAtomic(const std::string& path, const std::string& contents);

}  // namespace orrery
