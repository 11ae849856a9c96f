# Installs one backend's kernel sources (mllm_kernel/<backend>/csrc) where the
# JIT loader looks for them in an installed package: <pkg>/<backend>/sources.
# (wheel.exclude drops the checkout's csrc/ so this option alone decides, and
# it would drop CMake output under the same path too, hence the other name.)
function(mllm_kernel_install_sources backend)
  set(src ${CMAKE_CURRENT_SOURCE_DIR}/mllm_kernel/${backend}/csrc)
  if(NOT IS_DIRECTORY ${src})
    message(FATAL_ERROR "kernel sources for '${backend}' not found at ${src}")
  endif()
  install(DIRECTORY ${src}/ DESTINATION ${MLLM_KERNEL_PKG_DIR}/${backend}/sources)
  message(STATUS "mllm-kernel: installing ${backend} kernel sources")
endfunction()
