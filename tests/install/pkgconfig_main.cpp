// Built with `pkg-config --cflags --libs ndmesh` against an installed ndmesh: prints the
// tp groups of mesh dp=2,pp=2,tp=2, which the test compares with its own closed form.
#include <cstdio>

#include "ndmesh/mesh/mesh.hpp"

int main() {
  ndmesh::Mesh mesh = ndmesh::Mesh::parse("dp=2,pp=2,tp=2");
  mesh.for_each_group(mesh.dims_of("tp"), [](std::int64_t, const ndmesh::GroupView& g) {
    for (std::int64_t r : g) std::printf("%lld ", (long long)r);
    std::printf("\n");
  });
  return 0;
}
