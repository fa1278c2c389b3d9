// mixtrain._C: the extension module of the Python package (docs/python.md). Built against one
// torch (MIXTRAIN_TORCH_VERSION); python/mixtrain/__init__.py refuses to load it under another
// before importing it, since its C++ symbols bind to that torch's libraries.
#include <torch/csrc/utils/pybind.h>

#include "mixtrain/core/build_info.h"

namespace py = pybind11;

namespace mixtrain::python {
void bind_optim(py::module_& m);
void bind_checkpoint(py::module_& m);
}  // namespace mixtrain::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "mixtrain's C++ optimizer stack (use mixtrain.optim, not this module)";
  m.attr("torch_version") = MIXTRAIN_TORCH_VERSION;
  const mixtrain::BuildInfo info = mixtrain::build_info();
  m.attr("version") = info.version;
  m.attr("commit") = info.commit;
  m.attr("build_kind") = info.kind;
  m.attr("cpu_capability") = info.cpu_capability;
  mixtrain::python::bind_optim(m);
  mixtrain::python::bind_checkpoint(m);
}
