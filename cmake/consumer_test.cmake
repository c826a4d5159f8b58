# ctest driver (cmake -P): install the build tree into a scratch prefix, then configure, build and
# run tests/consumer against it with find_package(selkv). Any step failing fails the test.
#   -DBUILD_DIR -DSOURCE_DIR -DWORK_DIR -DGENERATOR -DCXX_COMPILER -DCUDA_ROOT -DEXPECTED_VERSION
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER EXPECTED_VERSION)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "consumer_test.cmake: -D${v}=... is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit ${rc}):\n${out}")
  endif()
  message(STATUS "${what}: ok")
  set(STEP_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
# Only the C++ package (the torch extension and the CLI are other components).
run_step("cmake --install (component selkv_dev)"
  "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" --component selkv_dev)
foreach(f include/selkv/selkv.h include/selkv/version.h)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "not installed: ${prefix}/${f}")
  endif()
endforeach()
if(EXISTS "${prefix}/include/reference" OR EXISTS "${prefix}/include/common")
  message(FATAL_ERROR "private headers (src/) were installed under ${prefix}/include")
endif()

set(cuda_arg)
if(CUDA_ROOT)
  set(cuda_arg "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
endif()
run_step("configure tests/consumer with find_package(selkv ${EXPECTED_VERSION})"
  "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}"
  "-DSELKV_EXPECTED_VERSION=${EXPECTED_VERSION}" ${cuda_arg})
run_step("build the consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run_step("run the consumer" "${WORK_DIR}/build/selkv_consumer")
message(STATUS "${STEP_OUTPUT}")
