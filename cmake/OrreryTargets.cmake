# Helpers that give every Orrery target the same warnings, include root and sanitizers.

set(ORRERY_WARNINGS -Wall -Wextra -Werror)

function(orrery_target_defaults target)
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${ORRERY_WARNINGS}>
                                           $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror>)
  if(ORRERY_FUZZ)  # every library instrumented for libFuzzer's coverage, with ASan and UBSan
    target_compile_options(${target} PUBLIC $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer>)
    target_link_options(${target} PUBLIC -fsanitize=address,undefined)
  elseif(ORRERY_SANITIZE)
    target_compile_options(${target} PUBLIC $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer>)
    target_link_options(${target} PUBLIC -fsanitize=address,undefined)
  endif()
endfunction()

# orrery_library(NAME SOURCES ... DEPS ...)
function(orrery_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  orrery_target_defaults(${name})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# orrery_test(NAME SOURCES ... DEPS ... LABELS label): a GoogleTest binary registered with CTest.
# One label: gtest_discover_tests passes PROPERTIES as flat key/value pairs, so a second label
# would shift ENVIRONMENT out of its place (the tests would run without ORRERY_SOURCE_DIR).
function(orrery_test name)
  cmake_parse_arguments(ARG "" "LABELS" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  orrery_target_defaults(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS "${ARG_LABELS}"
                       ENVIRONMENT "ORRERY_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()
