# NCCL for step 09's ring across GPUs, found at configure time, nothing downloaded:
# NCCL_ROOT (variable or environment), the CUDA Toolkit's folders, the system's, or the
# copy PyTorch's CUDA wheels ship (the Python package nvidia.nccl). Sets FA_HAVE_NCCL and
# makes the imported target fa_nccl. Without it step 09's model and one-process ring
# still build and are tested; its multi-GPU tests report Not Run.
set(FA_HAVE_NCCL OFF)
if(FA_HAVE_CUDA)
  set(hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import nvidia.nccl as n; print(list(n.__path__)[0])"
                    OUTPUT_VARIABLE wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(wheel)
      list(APPEND hints ${wheel})
    endif()
  endif()
  find_path(FA_NCCL_INCLUDE_DIR nccl.h HINTS ${hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(FA_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(FA_NCCL_INCLUDE_DIR AND FA_NCCL_LIBRARY)
    file(STRINGS "${FA_NCCL_INCLUDE_DIR}/nccl.h" version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE "[^0-9;]" "" version "${version}")
    string(REPLACE ";" "." version "${version}")
    add_library(fa_nccl INTERFACE IMPORTED)
    target_include_directories(fa_nccl SYSTEM INTERFACE ${FA_NCCL_INCLUDE_DIR})
    target_link_libraries(fa_nccl INTERFACE ${FA_NCCL_LIBRARY})
    set(FA_HAVE_NCCL ON)
    message(STATUS "NCCL ${version}: ${FA_NCCL_LIBRARY} (step 09's ring across GPUs is built)")
  else()
    message(STATUS "NCCL: not found (set NCCL_ROOT); step 09's ring across GPUs is not built, its tests report Not Run")
  endif()
endif()
