# opguard_add_test(NAME LABEL <unit|integration|e2e|browser> [TSAN] SOURCES ... LIBS ...)
# A GoogleTest binary registered with ctest, one ctest entry per test case.
# Unit-test binaries also join opguard_unit_tests, the target that builds
# everything `ctest -L unit` runs (scripts/test.sh's sanitizer pass).
# TSAN: the test exercises threads and is in the ThreadSanitizer pass of
# scripts/test.sh (label tsan, target opguard_tsan_tests).
add_custom_target(opguard_unit_tests)
add_custom_target(opguard_tsan_tests)
function(opguard_add_test name)
  cmake_parse_arguments(T "TSAN" "LABEL;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT T_LABEL)
    set(T_LABEL unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main opguard_options)
  # The test files themselves without optimization: their own code runs for
  # milliseconds, while optimizing GoogleTest's expanded macros is most of
  # their compile time (about half of a test file's CPU at -O2). The code
  # under test comes from the libraries, built as the build type says.
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>)
  if(T_LABEL STREQUAL "unit")
    add_dependencies(opguard_unit_tests ${name})
  endif()
  if(T_TSAN)
    add_dependencies(opguard_tsan_tests ${name})
    # In the ThreadSanitizer build, also the whole binary as one entry
    # labelled tsan (gtest_discover_tests takes one label per test).
    if(OPGUARD_SANITIZE STREQUAL "thread")
      add_test(NAME ${name}_tsan COMMAND ${name})
      set_tests_properties(${name}_tsan PROPERTIES LABELS tsan TIMEOUT ${T_TIMEOUT})
    endif()
  endif()
  gtest_discover_tests(${name}
    PROPERTIES LABELS ${T_LABEL} TIMEOUT ${T_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()
