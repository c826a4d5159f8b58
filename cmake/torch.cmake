# Torch extension: built when SELKV_BUILD_TORCH=ON, or AUTO and a CUDA-enabled torch is importable.
# (Filled in by the torch-binding work; this stub only detects torch.)
find_package(Python3 COMPONENTS Interpreter QUIET)
set(SELKV_TORCH_FOUND OFF)
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c "import torch,sys; sys.stdout.write(torch.utils.cmake_prefix_path if torch.version.cuda else '')"
    OUTPUT_VARIABLE SELKV_TORCH_PREFIX RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0 AND SELKV_TORCH_PREFIX)
    set(SELKV_TORCH_FOUND ON)
  endif()
endif()
if(NOT SELKV_TORCH_FOUND)
  if(SELKV_BUILD_TORCH STREQUAL "ON")
    message(FATAL_ERROR "SELKV_BUILD_TORCH=ON but no CUDA-enabled torch is importable")
  endif()
  message(STATUS "selkv: no CUDA-enabled torch importable; torch extension not built")
  return()
endif()
