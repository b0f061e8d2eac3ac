# ndmesh_layer(<name> [SOURCES ...] [DEPS ...] [PRIVATE_DEPS ...])
# Declares the static library ndmesh_<name> (alias ndmesh::<name>) with the public
# headers in include/. With no SOURCES, every .cpp in the calling folder is used.
# The library requires C++20 of whoever links it and joins the export set ndmeshTargets, so an installed ndmesh gives
# find_package(ndmesh) users the same ndmesh::<name> target (EXPORT_NAME <name>).
function(ndmesh_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT L_SOURCES)
    file(GLOB_RECURSE L_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  endif()
  add_library(ndmesh_${name} STATIC ${L_SOURCES})
  add_library(ndmesh::${name} ALIAS ndmesh_${name})
  target_include_directories(ndmesh_${name} PUBLIC $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
                                                   $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
                                            PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(ndmesh_${name} PUBLIC ${L_DEPS} PRIVATE ${L_PRIVATE_DEPS})
  # The public headers need C++20 (concepts, std::span): the exported target says so, so a
  # consumer that never sets CMAKE_CXX_STANDARD still compiles them.
  target_compile_features(ndmesh_${name} PUBLIC cxx_std_20)
  set_target_properties(ndmesh_${name} PROPERTIES EXPORT_NAME ${name})
  # Unity sources (NDMESH_UNITY_LAYERS): 669 -> 345 CPU-s for the libraries of a CUDA-less
  # Release build. A source's file-local names (anonymous namespace, static) share a unit with
  # 7 others, so they must not clash (a compile error in every build, not a silent one); g++'s
  # -Wsubobject-linkage, which takes every included .cpp for a header, is off for them.
  if(NDMESH_UNITY_LAYERS)
    set_target_properties(ndmesh_${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    target_compile_options(ndmesh_${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
  endif()
  set_property(GLOBAL APPEND PROPERTY NDMESH_LAYERS ndmesh_${name})
endfunction()
