# ctest driver (cmake -P): run CMD with ARGS (arguments separated by |) and require exit status
# EXPECT; with a non-empty EXPECT_STDERR, also require that regex to match stderr.
string(REPLACE "|" ";" ARGS "${ARGS}")
execute_process(COMMAND "${CMD}" ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL EXPECT)
  message(FATAL_ERROR "${CMD} ${ARGS}: exit ${rc}, expected ${EXPECT}\nstderr: ${err}")
endif()
if(NOT EXPECT_STDERR STREQUAL "" AND NOT err MATCHES "${EXPECT_STDERR}")
  message(FATAL_ERROR "${CMD} ${ARGS}: stderr lacks '${EXPECT_STDERR}':\n${err}")
endif()
message(STATUS "${CMD} ${ARGS}: exit ${rc} as expected. ${err}")
