// See graph.h.

#include "graph.h"

#include "check.h"

namespace pagoda_cpu {

namespace {
thread_local CpuGraph* current = nullptr;
}  // namespace

CpuGraph* CpuGraph::capturing() { return current; }

void CpuGraph::begin_capture() {
  PAGODA_CHECK(current == nullptr, "a CPU graph is already being captured on this thread");
  PAGODA_CHECK(nodes_.empty(), "this CPU graph was already captured");
  current = this;
}

void CpuGraph::end_capture() {
  PAGODA_CHECK(current == this, "this CPU graph is not being captured");
  current = nullptr;
}

void CpuGraph::replay() const {
  PAGODA_CHECK(current == nullptr, "cannot replay a CPU graph while capturing one");
  for (const auto& node : nodes_) node();
}

}  // namespace pagoda_cpu
