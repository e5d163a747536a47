# Finds Orrery's dependencies (all Debian packages; scripts/setup.sh installs them).
# Pitfalls with these exact versions are in docs/architecture.md and ../shared/spec/deps.md.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(GTest REQUIRED)
include(GoogleTest)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(ORRERY_TOMLPP_INCLUDE toml++/toml.h REQUIRED)  # used header-only by core/config.cc

if(NOT ORRERY_GPU_ONLY)
  find_package(benchmark REQUIRED)
  find_package(CLI11 REQUIRED)
  find_package(cppzmq REQUIRED)
  find_package(CapnProto REQUIRED)
  find_package(RocksDB REQUIRED)
  find_package(Gloo REQUIRED)
  find_package(prometheus-cpp REQUIRED)
  pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)  # ABI flags: pitfall 3
  find_package(OpenSSL REQUIRED)  # cpp-httplib's HTTPS (libssl-dev, a dependency of its -dev)
  pkg_check_modules(SECCOMP REQUIRED IMPORTED_TARGET libseccomp)
endif()

# NCCL (CUDA builds; no CMake config and no static library: deps.md): NCCL::nccl when libnccl and
# nccl.h are found, else the NCCL communicator is compiled out (learner/comm).
if(ORRERY_WITH_CUDA)
  find_library(ORRERY_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(ORRERY_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(ORRERY_NCCL_LIBRARY AND ORRERY_NCCL_INCLUDE)
    add_library(NCCL::nccl SHARED IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION ${ORRERY_NCCL_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${ORRERY_NCCL_INCLUDE})
  endif()
  message(STATUS "Orrery NCCL: ${ORRERY_NCCL_LIBRARY}")
endif()
