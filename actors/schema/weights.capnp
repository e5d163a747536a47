@0xc3924eb3699ba2c8;
# The weight service (actors/rl/weight_server.h): learner rank 0 serves the policy versions it
# publishes to rollout actors that do not share its filesystem ([rl.rollout] weights = "learner").
#
# Methods ("weights.<Name>": request -> reply):
#   weights.Info    WeightsInfoRequest -> WeightsInfoReply         the newest version: size and checksum
#   weights.Read    WeightsReadRequest -> WeightsReadReply         one chunk of a version's file
#   weights.Shared  WeightsSharedRequest -> WeightsSharedReply     ([rl.rollout] weights = "shared")
#                                                                  the newest version in a shared
#                                                                  buffer on the learner's host, leased
#   weights.Release WeightsReleaseRequest -> WeightsReleaseReply   ends that lease: is the copy whole?
#
# A version is its safetensors file (learner/rl/weight_store.h), immutable once published. A reader
# fetches it in chunks, each with its own CRC-32C (a chunk damaged in transit is read again), checks
# the whole file against Info's CRC-32C, and resumes an interrupted fetch at the bytes it already
# holds. Errors are the envelope's status code and one line: NotFound when no version is published
# yet or the version asked for was pruned (the learner keeps only the newest few: ask Info again);
# InvalidArgument for a range outside the file.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("orrery::schema");

struct WeightsInfoRequest {}

struct WeightsInfoReply {
  version @0 :Int64;       # the newest published version
  bytes @1 :Int64;         # its file's size
  crc32 @2 :UInt32;        # CRC-32C (core/crc32c.h) of the whole file
  maxChunkBytes @3 :Int64; # the largest `length` a Read may ask for
}

struct WeightsReadRequest {
  version @0 :Int64;
  offset @1 :Int64;
  length @2 :Int64;        # 1..maxChunkBytes; the last chunk may be shorter than asked
}

struct WeightsReadReply {
  data @0 :Data;
  crc32 @1 :UInt32;        # CRC-32C of data
}

# Shared buffers (model/shared_weights.h): a reader on the learner's host maps the buffer the
# handle names (CUDA IPC or a memfd), copies the version into its own weights and releases the
# lease; the learner rewrites a buffer only once its leases are released or expired.
struct WeightsSharedRequest {
  newerThan @0 :Int64;     # the reader's version: nothing is leased unless newer
  host @1 :Text;           # the reader's host (its boot id): another host's reader gets reason
  withLayout @2 :Bool;     # send the layout text (the reader has none, or its CRC changed)
}

struct WeightsSharedReply {
  version @0 :Int64;       # -1: nothing newer (lease 0), or nothing shared for this reader (reason)
  lease @1 :UInt64;
  handle @2 :Text;         # core/shared_buffer.h's handle text
  publishedAt @3 :Float64; # Unix seconds on the learner's clock when the version's copy began
  layoutCrc @4 :UInt32;    # CRC-32C of the layout text
  layout @5 :Text;         # the layout text, when asked for
  reason @6 :Text;         # why nothing is shared for this reader (another host, none on this learner)
}

struct WeightsReleaseRequest {
  lease @0 :UInt64;
}

struct WeightsReleaseReply {
  intact @0 :Bool;         # the lease was live to the end: the buffer was not rewritten meanwhile
}
