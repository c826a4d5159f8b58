# Torch extension: built when SELKV_BUILD_TORCH=ON, or AUTO and a CUDA-enabled torch is importable.
#
# Produces `_selkv_ops.so`, a plain shared library (not a Python module: no pybind, no
# libtorch_python) whose static initializers register the `torch.ops.selkv.*` operators
# (TORCH_LIBRARY). `python/selkv/_ops.py` loads it with `torch.ops.load_library`.
#
#   build tree:  ${CMAKE_BINARY_DIR}/python/selkv/_selkv_ops.so
#                (use it with SELKV_OPS_LIBRARY=<that path> and PYTHONPATH=<repo>/python)
#   wheel:       <site-packages>/selkv/_selkv_ops.so   (scikit-build-core, pyproject.toml)
#   cmake --install: <prefix>/python/selkv/{*.py,_selkv_ops.so}  (PYTHONPATH=<prefix>/python)
#
# Sources: python/selkv/csrc/*.cpp (and *.cu). Each op family is one file holding its schema
# (TORCH_LIBRARY_FRAGMENT) and its CPU / CUDA / Meta kernels; adding an op needs no change here.
find_package(Python3 COMPONENTS Interpreter QUIET)
# Why the extension cannot be built, as one sentence with the fix; empty when it can.
set(_selkv_no_torch "")
if(NOT Python3_Interpreter_FOUND)
  string(CONCAT _selkv_no_torch "no Python 3 interpreter found: install python3, or name the one "
                                "that has torch with -DPython3_EXECUTABLE=/path/to/python")
else()
  # Prints the cmake prefix, or the reason on stderr (exit 2 = not importable, 3 = CPU-only build).
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c [=[
import sys
try:
    import torch
except Exception as e:
    sys.stderr.write(f"{type(e).__name__}: {e}"); sys.exit(2)
if not torch.version.cuda:
    sys.stderr.write(torch.__version__); sys.exit(3)
sys.stdout.write(torch.utils.cmake_prefix_path)
]=]
    OUTPUT_VARIABLE SELKV_TORCH_PREFIX ERROR_VARIABLE _selkv_torch_err RESULT_VARIABLE _rc)
  string(STRIP "${_selkv_torch_err}" _selkv_torch_err)
  if(_rc EQUAL 3)
    string(CONCAT _selkv_no_torch "torch ${_selkv_torch_err} of ${Python3_EXECUTABLE} is a CPU-only "
           "build: the extension needs a CUDA build of torch (on Linux, `pip install torch` from PyPI is one)")
  elseif(NOT _rc EQUAL 0 OR NOT SELKV_TORCH_PREFIX)
    string(REGEX REPLACE "\n.*" "" _selkv_torch_err "${_selkv_torch_err}")
    string(CONCAT _selkv_no_torch "torch is not importable by ${Python3_EXECUTABLE} (${_selkv_torch_err}): "
           "install torch for it first (`${Python3_EXECUTABLE} -m pip install torch`)")
    if(SKBUILD)
      string(APPEND _selkv_no_torch ", then build without isolation, which never has torch: "
                                    "`pip install --no-build-isolation .`")
    endif()
  endif()
endif()
if(_selkv_no_torch)
  if(SELKV_BUILD_TORCH STREQUAL "ON")
    if(SKBUILD)
      message(FATAL_ERROR "selkv: ${_selkv_no_torch}.")
    endif()
    message(FATAL_ERROR "selkv: SELKV_BUILD_TORCH=ON but ${_selkv_no_torch}; or configure with "
                        "-DSELKV_BUILD_TORCH=OFF to build the C++ library only.")
  endif()
  message(STATUS "selkv: torch extension not built: ${_selkv_no_torch}")
  return()
endif()

# Torch's CMake config (Caffe2/public/cuda.cmake) appends -gencode flags to CMAKE_CUDA_FLAGS,
# resets CMAKE_CUDA_ARCHITECTURES and sets other directory variables. Finding it inside a
# function keeps all of that local, so the core library's flags (sm_90a only) stay untouched;
# the imported targets (torch, c10, torch_cuda, ...) are visible to the whole project anyway.
function(selkv_find_torch prefix)
  list(APPEND CMAKE_PREFIX_PATH "${prefix}")
  # No GPU at configure time on CI machines: name the arch instead of letting torch probe.
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "9.0a")
  endif()
  find_package(Torch REQUIRED CONFIG)
  set(SELKV_TORCH_LIBRARIES ${TORCH_LIBRARIES} PARENT_SCOPE)
  set(SELKV_TORCH_VERSION "${Torch_VERSION}" PARENT_SCOPE)
endfunction()
selkv_find_torch("${SELKV_TORCH_PREFIX}")
message(STATUS "selkv: building the torch extension against torch ${SELKV_TORCH_VERSION} "
               "(${SELKV_TORCH_PREFIX})")

file(GLOB SELKV_TORCH_SOURCES CONFIGURE_DEPENDS
  "${CMAKE_CURRENT_SOURCE_DIR}/python/selkv/csrc/*.cpp"
  "${CMAKE_CURRENT_SOURCE_DIR}/python/selkv/csrc/*.cu")
add_library(_selkv_ops SHARED ${SELKV_TORCH_SOURCES})
target_include_directories(_selkv_ops PRIVATE
  "${CMAKE_CURRENT_SOURCE_DIR}/src" "${CMAKE_CURRENT_SOURCE_DIR}/python/selkv/csrc")
# selkv links the CUDA runtime statically. --exclude-libs keeps every symbol of the static
# archives (selkv, selkv_reference, cudart_static) local to this library, so our calls bind to
# our own runtime copy and nothing we carry interposes on torch's libcudart.so (the NCCL
# arrangement). Streams are driver handles, so torch's current stream and graph capture work
# across the two runtimes. --no-undefined turns a missing symbol into a link error here rather
# than an import error on the GPU machine.
target_link_libraries(_selkv_ops PRIVATE selkv selkv_reference ${SELKV_TORCH_LIBRARIES})
target_link_options(_selkv_ops PRIVATE "LINKER:--exclude-libs,ALL" "LINKER:--no-undefined")
target_compile_options(_selkv_ops PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:${SELKV_CUDA_FLAGS}>
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
set_target_properties(_selkv_ops PROPERTIES
  PREFIX ""
  OUTPUT_NAME _selkv_ops
  CXX_VISIBILITY_PRESET hidden
  CUDA_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/python/selkv"
  # Installed next to torch in site-packages: find libtorch*.so / libc10*.so there (torch is
  # normally imported, hence loaded, first anyway).
  INSTALL_RPATH "$ORIGIN/../torch/lib")

if(SKBUILD)
  # Wheel: scikit-build-core installs into the platlib root and packs python/selkv itself.
  install(TARGETS _selkv_ops LIBRARY DESTINATION selkv COMPONENT selkv_python)
else()
  install(TARGETS _selkv_ops LIBRARY DESTINATION python/selkv COMPONENT selkv_python)
  install(DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}/python/selkv" DESTINATION python
          COMPONENT selkv_python FILES_MATCHING PATTERN "*.py" PATTERN "csrc" EXCLUDE
          PATTERN "__pycache__" EXCLUDE)
endif()
