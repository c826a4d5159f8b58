# ctest QsaSm70.SimpleKernelAssembles: the C8 simple kernel's TU (src/qsa/qsa_simple.cu) uses
# nothing sm_70 (V100) lacks. CUDA 13's nvcc cannot target sm_70, so: nvcc -> PTX for compute_75
# (the lowest it knows), relabel the PTX as ISA 7.0 for sm_70, assemble it with CUDA 12's ptxas
# (scripts/setup.sh puts it in third_party/nvcc12) for sm_70. ptxas rejects any instruction or
# PTX feature sm_70 / PTX 7.0 lacks; spills are reported. It checks the device code, not a full
# CUDA 12 build (the wheel has no nvcc driver).
#   -DNVCC=... -DPTXAS=... -DSOURCE_DIR=... -DWORK_DIR=...
foreach(v NVCC PTXAS SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "qsa_sm70_check.cmake: -D${v}= is required")
  endif()
endforeach()
file(MAKE_DIRECTORY "${WORK_DIR}")
execute_process(
  COMMAND "${NVCC}" -std=c++17 -O3 -arch=compute_75 -ptx "-I${SOURCE_DIR}/src" "-I${SOURCE_DIR}/include"
          "${SOURCE_DIR}/src/qsa/qsa_simple.cu" -o "${WORK_DIR}/qsa_simple_75.ptx"
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nvcc -ptx (compute_75) failed:\n${err}")
endif()
file(READ "${WORK_DIR}/qsa_simple_75.ptx" ptx)
string(REGEX REPLACE "\n\\.version [0-9.]+" "\n.version 7.0" ptx "${ptx}")
string(REGEX REPLACE "\n\\.target sm_75" "\n.target sm_70" ptx "${ptx}")
# CUDA 13's nvcc marks partly used vector loads with a ptxas hint (PTX 8.3+); a hint, not an
# instruction, so it is dropped rather than the kernel bent around it.
string(REGEX REPLACE "\n[ \t]*\\.pragma \"used_bytes_mask [0-9]+\";" "" ptx "${ptx}")
if(NOT ptx MATCHES "\n\\.target sm_70")
  message(FATAL_ERROR "could not retarget the PTX to sm_70")
endif()
file(WRITE "${WORK_DIR}/qsa_simple_70.ptx" "${ptx}")
execute_process(
  COMMAND "${PTXAS}" -arch=sm_70 -O3 -v --warn-on-spills "${WORK_DIR}/qsa_simple_70.ptx"
          -o "${WORK_DIR}/qsa_simple_70.cubin"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ptxas (CUDA 12) -arch=sm_70 rejected the QSA simple kernel")
endif()
