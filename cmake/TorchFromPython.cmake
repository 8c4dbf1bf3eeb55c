# opguard_torch_from_python(PYTHON): the torch that PYTHON imports (a pip
# torch in a venv), as the INTERFACE target opguard_torch_libs, with
# OPGUARD_TORCH_VERSION set to its torch.__version__.
#
# torch.utils.cmake_prefix_path names the wheel's CMake folder; its headers and
# libraries sit beside it. find_package(Torch) is not used on them: for a CUDA
# wheel it insists on a CUDA toolkit, which the adapter (CPU libraries only:
# libtorch, libtorch_cpu, libc10) does not need and many venvs lack.
#
# Under `pip install` with build isolation the build runs with PYTHONPATH
# pointing into a temporary environment that hides the target venv's
# packages; when torch cannot be imported so, PYTHON runs again without
# those variables, i.e. as the venv it belongs to.
function(opguard_torch_from_python python)
  set(_script [=[
import os, torch, torch.utils
root = os.path.dirname(os.path.dirname(torch.utils.cmake_prefix_path))
print(torch.__version__, int(torch._C._GLIBCXX_USE_CXX11_ABI), root, sep=";", end="")
]=])
  execute_process(COMMAND ${python} -c "${_script}"
                  OUTPUT_VARIABLE _out RESULT_VARIABLE _rc ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
                            ${python} -c "${_script}"
                    OUTPUT_VARIABLE _out RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  endif()
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${python} cannot import torch: ${_err}")
  endif()
  list(GET _out 0 _version)
  list(GET _out 1 _abi)
  list(GET _out 2 _root)
  if(NOT EXISTS ${_root}/include/torch/library.h OR NOT EXISTS ${_root}/lib/libtorch_cpu.so)
    message(FATAL_ERROR "torch ${_version} at ${_root} has no C++ headers or libraries")
  endif()
  add_library(opguard_torch_libs INTERFACE)
  target_include_directories(opguard_torch_libs SYSTEM INTERFACE
    ${_root}/include ${_root}/include/torch/csrc/api/include)
  target_compile_definitions(opguard_torch_libs INTERFACE _GLIBCXX_USE_CXX11_ABI=${_abi})
  target_link_directories(opguard_torch_libs INTERFACE ${_root}/lib)
  target_link_libraries(opguard_torch_libs INTERFACE torch torch_cpu c10)
  set(OPGUARD_TORCH_VERSION ${_version} PARENT_SCOPE)
  set(OPGUARD_TORCH_LIBDIR ${_root}/lib PARENT_SCOPE)
  message(STATUS "OpGuard: torch ${_version} from ${python} (${_root})")
endfunction()
