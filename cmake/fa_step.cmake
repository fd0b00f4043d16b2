# fa_add_step(<NN> <name> MODEL <cpu sources> [KERNELS <cuda sources>] [DEPENDS <steps>]
#             TESTS <test sources> [TEST_DEPENDS <earlier steps the tests compare with>]
#             [MIN_SM <cc×10: the oldest GPU its kernels run on, e.g. 80>] [EXACT_SM] [CPU_ONLY])
#
# Makes, for step NN:
#   stepNN         the step's library: its CPU model always, its kernels when CUDA is on
#   stepNN_tests   one Catch2 executable for the step's tests
#   ctest "stepNN cpu"   the tests tagged [cpu]: they run everywhere
#   ctest "stepNN gpu"   the tests tagged [gpu] (CUDA builds only). With no usable GPU the
#                        executable exits 77, which CTest reports as "Not Run", never "Passed";
#                        so does a GPU older than MIN_SM (with EXACT_SM: any GPU but
#                        MIN_SM, for architecture-specific code such as sm_90a).
#                        CPU_ONLY: no such entry (a step that has no kernels yet).
function(fa_add_step number name)
  cmake_parse_arguments(FA "EXACT_SM;CPU_ONLY" "MIN_SM" "MODEL;KERNELS;DEPENDS;TESTS;TEST_DEPENDS" ${ARGN})
  set(lib step${number})
  set(sources ${FA_MODEL})
  if(FA_HAVE_CUDA)
    list(APPEND sources ${FA_KERNELS})
  endif()
  add_library(${lib} STATIC ${sources})
  target_link_libraries(${lib} PUBLIC fa_common ${FA_DEPENDS})
  fa_warnings(${lib})
  if(FA_HAVE_CUDA)
    target_compile_options(${lib} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
    if(FA_PTXAS_VERBOSE)  # registers, shared memory and spills of every kernel, on request
      target_compile_options(${lib} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
    endif()
  endif()
  set_property(GLOBAL APPEND PROPERTY FA_STEPS ${lib})

  if(BUILD_TESTING AND FA_TESTS)
    if(NOT FA_MIN_SM)
      set(FA_MIN_SM 0)
    endif()
    set(exact)
    if(FA_EXACT_SM)
      set(exact EXACT_SM)
    endif()
    set(gpu GPU)
    if(FA_CPU_ONLY)
      set(gpu)
    endif()
    fa_add_tests(${lib} ${gpu} MIN_SM ${FA_MIN_SM} ${exact} ${FA_TESTS})
    target_link_libraries(${lib}_tests PRIVATE ${lib} ${FA_TEST_DEPENDS})
  endif()
endfunction()

# fa_add_tests(<name> [GPU] [MIN_SM <cc×10>] [EXACT_SM] <sources>): a test executable <name>_tests
# and its CTest entries ("<name> cpu", and "<name> gpu" when GPU is given and CUDA is on).
function(fa_add_tests name)
  cmake_parse_arguments(FA "GPU;EXACT_SM" "MIN_SM" "" ${ARGN})
  if(NOT FA_MIN_SM)
    set(FA_MIN_SM 0)
  endif()
  add_executable(${name}_tests ${FA_UNPARSED_ARGUMENTS})
  target_link_libraries(${name}_tests PRIVATE fa_test_main fa_reference)
  fa_warnings(${name}_tests)
  add_test(NAME "${name} cpu" COMMAND ${name}_tests "[cpu]")
  set_tests_properties("${name} cpu" PROPERTIES LABELS cpu)
  if(FA_HAVE_CUDA AND FA_GPU)
    set(exact)
    if(FA_EXACT_SM)
      set(exact --gpu-exact-sm)
    endif()
    add_test(NAME "${name} gpu" COMMAND ${name}_tests --gpu --gpu-min-sm ${FA_MIN_SM} ${exact} "[gpu]")
    set_tests_properties("${name} gpu" PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)
  endif()
endfunction()
